"""Running a prepared pipeline over one batch: the batch's device and page-locked buffers (a Run),
chunk i on stream i mod S (upload, check or convert, the network, labels back), the whole queue
recorded once as a CUDA graph and replayed, and the per-chunk flags that name a bad image."""
from collections import OrderedDict
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pycuda.driver as cuda

from ..errors import BadValue, ScoresOverflow
from . import graph
from .launch import INT_MAX

CLEAR = np.int32(INT_MAX).tobytes()  # a flag's bytes where nothing was found
# Runs put aside for reuse (a server's ladder of batch sizes, per wire type): small ones only, so
# what is kept never takes the device memory a large batch would be resident in
KEPT_RUNS = 32
KEPT_BYTES = 256 << 20


class RunKey(NamedTuple):
    """What a run's device buffers depend on (a run plan's key): a run is kept per key."""
    n: int
    image_shape: tuple
    wire: str  # the NumPy type's str
    streamed: bool
    align: int  # rows of the file's chunk where streamed, else 1
    decoding: tuple  # the chunk codec's chunk_decode.Plan where the GPU decodes, else ()


@dataclass
class Run:
    """The buffers of one batch: images as uploaded (resident, or per-stream staging) in the wire
    type; resident images of a streamed batch are a ring of `slots` blocks of `block` images, a
    block of images [b * block, (b + 1) * block) in slot b mod slots (one slot of all images
    otherwise), per-stream float32 images where the wire type is an integer the pipeline's kernels do
    not read as uploaded (Algorithm.staging), scratch, labels, scores
    (40 bytes an image for 10 classes: always there, copied back only when asked for),
    and per chunk two flags: its first image with non-finite scores, its first image holding a
    non-finite value (INT_MAX if none), on the device and in page-locked memory (chunks, 2). A
    streamed run's scores get their page-locked copy when first asked for (the backend's prepare,
    where its plan keeps them): 40 MB of a 1M-image run's host memory that a run without scores
    never touches; a run in memory has its copy from the start, so a server's kept runs answer with
    or without scores and allocate nothing."""
    key: RunKey
    chunk: int
    block: int
    slots: int
    elems: int  # values per image
    wire: np.dtype
    x_dev: object
    staging: list
    floats: list
    scratch: list
    labels_dev: object
    labels: np.ndarray
    scores_dev: object
    classes: int
    flags_dev: object
    flags: np.ndarray
    buffers: list  # every device allocation above, freed when the run is replaced
    nbytes: int = 0  # device bytes of the buffers
    host_scores: np.ndarray = None

    @property
    def scores(self):
        """The scores' page-locked copy, (images, classes) float32."""
        if self.host_scores is None:
            self.host_scores = cuda.pagelocked_empty((len(self.labels), self.classes), np.float32)
            self.buffers.append(self.host_scores)
        return self.host_scores

    @property
    def wire_bytes(self):
        return self.elems * self.wire.itemsize

    @property
    def resident(self):
        return self.x_dev is not None

    def images(self, i, start, streams):
        """Where chunk i's images (from image start) are on the device, in the wire type."""
        if self.x_dev is None:
            return int(self.staging[i % streams])
        return int(self.x_dev) + ((start // self.block) % self.slots * self.block + start % self.block) * self.wire_bytes


class Executor:
    """The streams and the run of one CUDA backend. `pipeline` (the network's kernels) and
    `converters` (integer wire types to float32, by type) are set by the backend as it prepares."""

    def __init__(self, streams, profiler, use_graphs):
        self.streams = [cuda.Stream() for _ in range(streams)]
        self.profiler, self.use_graphs = profiler, use_graphs
        self.pipeline, self.converters, self.keep_scores, self.certify = None, {}, False, False
        self.run = None
        self.graphs = {}  # (x's address or None, scores kept) -> the run's recorded queue
        self.kept = OrderedDict()  # key -> (run, graphs) put aside for reuse, the latest last

    def allocate(self, key, n, elems, wire, chunk, resident, block, slots):
        """A Run's buffers, all or none: on failure what was taken is given back."""
        taken, pinned, size = [], [], [0]

        def alloc(nbytes):
            taken.append(cuda.mem_alloc(max(nbytes, 4)))
            size[0] += max(nbytes, 4)
            return taken[-1]

        def host(shape, dtype):
            pinned.append(cuda.pagelocked_empty(shape, dtype))
            return pinned[-1]

        classes, chunks = self.pipeline.g.classes, -(-n // chunk)
        try:
            return Run(key=key, chunk=chunk, block=block, slots=slots, elems=elems, wire=wire,
                       x_dev=alloc(block * slots * elems * wire.itemsize) if resident else None,
                       staging=[None if resident else alloc(chunk * elems * wire.itemsize) for _ in self.streams],
                       floats=[alloc(4 * chunk * elems) if wire != np.float32 and self.pipeline.staging(wire) is None
                               else None for _ in self.streams],
                       scratch=[alloc(4 * self.pipeline.scratch_floats(chunk)) for _ in self.streams],
                       labels_dev=alloc(4 * n), labels=host(n, np.int32),
                       scores_dev=alloc(4 * n * classes), classes=classes,
                       host_scores=None if key.streamed else host((n, classes), np.float32),
                       flags_dev=alloc(8 * chunks), flags=host((chunks, 2), np.int32), buffers=taken + pinned,
                       nbytes=size[0])
        except BaseException:
            for buf in taken:
                buf.free()
            for buf in pinned:
                buf.base.free()
            raise

    def put_aside(self, keep=True):
        """The current run and its graphs kept for use_run (at most KEPT_RUNS, the least recently
        used freed first), or freed (keep False: a streamed run's ring is used once)."""
        if self.run is None:
            return
        if not keep or self.run.nbytes > KEPT_BYTES // 8:
            self._free(self.run, self.graphs)
        else:
            self.kept[self.run.key] = (self.run, self.graphs)
            while len(self.kept) > KEPT_RUNS or sum(r.nbytes for r, _ in self.kept.values()) > KEPT_BYTES:
                self._free(*self.kept.popitem(last=False)[1])
        self.run, self.graphs = None, {}

    def use_run(self, key):
        """Make the run put aside under key current again (the current one put aside): whether one was."""
        if key not in self.kept:
            return False
        self.put_aside()
        self.run, self.graphs = self.kept.pop(key)
        return True

    def free_kept(self):
        """Free the runs put aside (the device ran short, or the model changed)."""
        while self.kept:
            self._free(*self.kept.popitem()[1])

    def free_run(self):
        """Free the current run and every run put aside."""
        self.put_aside(keep=False)
        self.free_kept()

    @staticmethod
    def _free(run, graphs):
        for g in graphs.values():
            g.close()
        cuda.Context.synchronize()
        for buf in run.buffers:
            if isinstance(buf, np.ndarray):
                buf.base.free()
            else:
                buf.free()

    def warm_up(self):
        """The network once over the run's first chunk of zeros: module loading and first-launch
        costs paid before anything is timed."""
        run = self.run
        count = min(run.chunk, len(run.labels))
        cuda.memset_d8(run.images(0, 0, len(self.streams)), 0, count * run.wire_bytes)
        self.clear_flags()
        self.enqueue_chunk(0, 0, count)
        cuda.Context.synchronize()

    def forward(self, x, model_path, in_place=False):
        """(labels, scores or None) of images x in page-locked host memory, of the run's wire type.
        in_place: x lies in memory registered as it is (hostmem) at an address of its own each call:
        one upload to the resident images, then the pass recorded over them (a graph a host buffer
        would be one a call)."""
        if in_place:
            self.upload(self.streams[0], 0, 0, x)
            uploaded = event(self.streams[0])
            for s in self.streams[1:]:
                s.wait_for_event(uploaded)
            x = None
        graphed = self.enqueue(x)
        for s in self.streams[:1] if graphed else self.streams:  # a graph runs as one unit on the first stream
            s.synchronize()
        self.check_flags(model_path, copied=graphed)
        return self.run.labels.astype(np.int64), self.run.scores.copy() if self.keep_scores else None

    def clear_flags(self, stream=None):
        """Every flag INT_MAX: on `stream` where given (a graph's first node), else now (a synchronous
        call took 11-13 us of a forward's host time)."""
        if stream is None:
            cuda.memset_d32(self.run.flags_dev, INT_MAX, self.run.flags.size)
        else:
            cuda.memset_d32_async(self.run.flags_dev, INT_MAX, self.run.flags.size, stream)

    def check_flags(self, model_path, copied=False):
        """BadValue for the first image holding a non-finite value, else ScoresOverflow for the
        first image whose scores the kernels found not finite. copied: the flags are in page-locked
        memory already (a graph's last step copies them back: a synchronous copy took ~25 us), else
        they are copied now."""
        run = self.run
        if not copied:
            cuda.memcpy_dtoh(run.flags, run.flags_dev)
        if run.flags.tobytes() == CLEAR * run.flags.size:  # the usual case in one comparison: numpy's
            return  # search below took ~28 us of a forward's host time
        for col, error in ((1, BadValue), (0, lambda i: ScoresOverflow(model_path, i))):
            hit = np.flatnonzero(run.flags[:, col] != INT_MAX)
            if len(hit):
                raise error(int(hit[0]) * run.chunk + int(run.flags[hit[0], col]))

    def enqueue(self, x=None):
        """Chunk i goes to stream i mod S; x None means the images are already resident. Replayed
        from a CUDA graph recorded on the first call for these host buffers, where graphs work:
        True then (the graph is queued on the first stream alone), else False. The flags are
        cleared first either way. A graph's first chunk is uploaded before the graph is launched: the
        copy runs while the driver takes the graph's launch (the GPU started ~15 us into it)."""
        recorded = self.record(x)
        if recorded is not None:
            try:
                if x is not None:
                    self.upload(self.streams[0], 0, 0, x[:self.run.chunk])
                recorded.launch(self.streams[0])
                return True
            except (graph.GraphError, AttributeError, OSError):
                self.give_up_graphs()
        self.clear_flags()
        self._enqueue_all(x)
        return False

    def record(self, x=None):
        """The graph of enqueue(x), recorded now where it is not yet (prepare records the one of
        the host buffer forward will read: recording takes ~1 ms, which the first timed forward of
        a fresh process paid); None where graphs do not work."""
        if not self.use_graphs:
            return None
        key = (None if x is None else x.ctypes.data, self.keep_scores, self.certify)
        try:
            if key not in self.graphs:
                self.graphs[key] = graph.Graph(self.streams[0], self.streams[1:], lambda: self._enqueue_all(x, first_uploaded=True),
                                               lambda: cuda.memcpy_dtoh_async(self.run.flags, self.run.flags_dev, self.streams[0]),
                                               start=lambda: self.clear_flags(self.streams[0]))
            return self.graphs[key]
        except (graph.GraphError, AttributeError, OSError):
            self.give_up_graphs()
            return None

    def give_up_graphs(self):
        self.use_graphs = False  # launch kernel by kernel from now on
        cuda.Context.synchronize()

    def _enqueue_all(self, x, first_uploaded=False):
        """Every chunk; first_uploaded: the first chunk's images are on the device (enqueue)."""
        n, chunk = len(self.run.labels), self.run.chunk
        for i, start in enumerate(range(0, n, chunk)):
            stop = min(n, start + chunk)
            self.enqueue_chunk(i, start, stop - start, None if x is None or (i == 0 and first_uploaded) else x[start:stop])

    def enqueue_chunk(self, i, start, count, x=None):
        """Upload images [start, start + count) unless x is None, convert or check them, the
        network, labels (and scores) back; all on stream i mod S."""
        stream = self.streams[i % len(self.streams)]
        if x is not None:
            self.upload(stream, i, start, x)
        self.compute(i, start, count)
        self.download(stream, start, count)

    def upload(self, stream, i, start, x):
        """Copy images x (from image start; chunk i's, or whole chunks from chunk i where resident)
        to the device on stream (a caller that waits for the copy records an event after it)."""
        self.profiler.start("memcpy HtoD (images)", stream)
        cuda.memcpy_htod_async(self.run.images(i, start, len(self.streams)), x, stream)
        self.profiler.stop("memcpy HtoD (images)", stream)

    def compute(self, i, start, count):
        """Check or convert chunk i's images, then the network (its certified pass where it
        certifies the run), on stream i mod S."""
        run, s = self.run, i % len(self.streams)
        stream = self.streams[s]
        src = run.images(i, start, len(self.streams))
        chunk_index = start // run.chunk
        bad, staged = 0, {}  # integer images convert to finite floats: nothing to check
        if run.wire == np.float32:
            images, bad = src, int(run.flags_dev) + 8 * chunk_index + 4
        elif run.floats[s] is None:  # read as uploaded by the kernels themselves
            images, staged = src, {"scaling": self.pipeline.staging(run.wire)}
        else:
            images = int(run.floats[s])
            self.converters[run.wire](stream, src, images, count * run.elems)
        enqueue = self.pipeline.enqueue if self.certifies() else self.pipeline.enqueue_exact
        enqueue(stream, images, count, int(run.labels_dev) + 4 * start, int(run.scratch[s]),
                int(run.flags_dev) + 8 * chunk_index, self._scores(start), bad, **staged)

    def certifies(self):
        """Whether the run takes the pipeline's certified low-precision pass: as its plan says."""
        return self.certify

    def _scores(self, start):
        return int(self.run.scores_dev) + 4 * start * self.pipeline.g.classes if self.keep_scores else 0

    def download(self, stream, start, count):
        """Labels (and scores) of images [start, start + count) back to the host."""
        run = self.run
        self.profiler.start("memcpy DtoH (labels)", stream)
        cuda.memcpy_dtoh_async(run.labels[start:start + count], int(run.labels_dev) + 4 * start, stream)
        if self.keep_scores:
            cuda.memcpy_dtoh_async(run.scores[start:start + count], self._scores(start), stream)
        self.profiler.stop("memcpy DtoH (labels)", stream)


def event(stream):
    """An event recorded on stream now (no timing: the cheapest kind)."""
    e = cuda.Event(cuda.event_flags.DISABLE_TIMING)
    e.record(stream)
    return e
