"""The CUDA backend: weights uploaded once, images in page-locked host memory uploaded chunk by
chunk over several streams so copies of one chunk overlap kernels of another, labels back."""
import collections
import time
from dataclasses import dataclass, field

import numpy as np
import pycuda.driver as cuda

from ..errors import BadValue, InputError, ScoresOverflow
from ..loader import geometry
from ..stream import HostSide
from . import graph, launch, pipelines, plan
from .device import Device
from .launch import INT_MAX
from .profile import NullProfiler, Profiler


@dataclass
class Build:
    """What every kernel of one run is compiled and launched with."""
    arch: str
    fast_math: bool
    tile_width: object  # --tile-width, or None for each GEMM's own choice
    profiler: object
    gemm: str = "auto"  # --gemm-algo
    l2_bytes: int = 32 << 20
    sms: int = 108
    modules: dict = field(default_factory=dict)  # loaded modules of this context, by (source, defines)


@dataclass
class Run:
    """The buffers of one batch: images as uploaded (resident, or per-stream staging) in the wire
    type; resident images of a streamed batch are a ring of `slots` blocks of `block` images, a
    block of images [b * block, (b + 1) * block) in slot b mod slots (one slot of all images
    otherwise), per-stream float32 images where the wire type is an integer, scratch, labels, scores
    (40 bytes an image for 10 classes: always there, copied back only when asked for),
    and per chunk two flags: its first image with non-finite scores, its first image holding a
    non-finite value (INT_MAX if none)."""
    key: tuple
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
    scores: np.ndarray
    flags_dev: object
    buffers: list  # every device allocation above, freed when the run is replaced

    @property
    def chunks(self):
        return -(-len(self.labels) // self.chunk)

    @property
    def wire_bytes(self):
        return self.elems * self.wire.itemsize


class CudaBackend(HostSide):
    name = "cuda"
    checks_values = True  # float32 images are checked on the GPU, by the pipeline (pipelines.py)
    # About the bytes per streamed block (a whole number of chunks): 8192 float32 MNIST images or
    # 32768 uint8 ones, so a block amortizes the reads and the Python work around it whatever the
    # stored type (uint8 in 8192-image blocks left two GPUs waiting on the host: 1.24x one GPU)
    STREAM_BYTES = 25 << 20

    def __init__(self, chunk=None, streams=4, tile_width=None, conv_algo=pipelines.AUTO, device=0,
                 fast_math=False, profile=False, readers=None, gemm_algo="auto", notice=None):
        t = time.perf_counter()
        if streams < 1:
            raise InputError(f"--streams must be at least 1, got {streams}")
        self.gpu = Device(device)
        self.profiler = Profiler() if profile else NullProfiler()
        self.build = Build(self.gpu.arch, fast_math, tile_width, self.profiler, gemm_algo, self.gpu.l2_bytes,
                           self.gpu.sms)
        self.notice = notice
        self.algo, self.chunk, self.n_streams, self.readers = conv_algo, chunk, streams, readers
        self.weights, self.converters = [], {}
        self.pipeline = self._run = self.model = None
        self.keep_scores = False
        self.graphs = {}  # (x's address or None, scores kept) -> the Run's recorded enqueue
        self.use_graphs = graph.enabled() and not profile
        self.streams = [cuda.Stream() for _ in range(self.n_streams)]
        self.copies = cuda.Stream()  # streamed uploads to resident images: never queued behind kernels
        self._host("context set-up", t)

    def _host(self, step, since):
        if isinstance(self.profiler, Profiler):
            self.profiler.host[step] = self.profiler.host.get(step, 0.0) + (time.perf_counter() - since) * 1e3

    @property
    def device(self):
        algo = "" if self.pipeline is None else f", --conv-algo {self.pipeline.NAME}"
        if hasattr(self.pipeline, "describe"):
            algo += f" ({self.pipeline.describe})"
        return self.gpu.describe() + algo

    @property
    def profile(self):
        return self.profiler.rows() if isinstance(self.profiler, Profiler) else None

    @staticmethod
    def wire_dtype(stored):
        """Integer images travel in their own type and are converted on the GPU; float32 as it is;
        other floats are converted (and checked) by the reader threads."""
        if stored is not None and stored.kind in "iu" and stored.isnative:
            return np.dtype(stored)
        return np.dtype(np.float32)

    @staticmethod
    def new_host_buffer(shape, dtype):
        """Page-locked host memory, so uploads are asynchronous (portable: any context may copy)."""
        return cuda.pagelocked_empty(shape, dtype, mem_flags=cuda.host_alloc_flags.PORTABLE)

    @staticmethod
    def free_host_buffer(buf):
        buf.base.free()

    def _to_device(self, array):
        """A device copy of `array` as float32, freed with the weights."""
        array = np.ascontiguousarray(array, np.float32)
        buf = cuda.mem_alloc(max(array.nbytes, 4))
        self.weights.append(buf)
        cuda.memcpy_htod(buf, array)
        return buf

    def prepare(self, model, x_shape, scores=False, wire=np.float32, streamed=False, align=1):
        """Compile (or load cached) kernels for this network and upload the weights (once per
        model and image shape), allocate the buffers for x_shape (n, H, W, C) images of type wire
        (once per batch shape; streamed: the images arrive block by block, see forward_stream, in
        blocks on multiples of `align` rows, the file's chunk, so no chunk is decoded twice) and
        run the network once, so the timed forward pays neither allocation nor the first launch's
        module loading."""
        t = time.perf_counter()
        g = geometry(model, x_shape, "data")
        if self.model is not model or self.pipeline.g != g:  # a new model or image shape
            algo, why = pipelines.choose(self.algo, g, self.gpu.arch)
            if why:
                raise InputError(f"{model.path}: {why}; --conv-algo unroll runs any consistent shapes")
            if algo is not pipelines.Unroll and self.notice is not None:
                for name, value in (("--tile-width", self.build.tile_width), ("--gemm-algo", self.build.gemm)):
                    if value not in (None, "auto"):
                        self.notice(f"cnninfer: {name} {value} has no effect: --conv-algo {algo.NAME} has no "
                                    f"tiled GEMM (it shapes --conv-algo unroll's)")
            try:
                self.pipeline = algo(self.build, g)
            except ValueError as e:
                raise InputError(f"--conv-algo {algo.NAME}: {e}") from None
            self._host("compile / load kernels", t)
            t = time.perf_counter()
            for buf in self.weights:
                buf.free()
            self.weights = []
            self.pipeline.upload(model, self._to_device)
            cuda.Context.synchronize()
            self.model, self._run = model, None
            self._drop_graphs()
            self._host("weights upload", t)
        t = time.perf_counter()
        wire = np.dtype(wire)
        if wire != np.float32 and wire not in self.converters:
            self.converters[wire] = launch.Convert(self.build, wire)
        self.keep_scores = scores
        key = (x_shape[0], tuple(x_shape[1:]), wire.str, bool(streamed), align if streamed else 1)
        if self._run is None or self._run.key != key:
            run = self.buffers(key)
            count = min(run.chunk, x_shape[0])
            cuda.memset_d8(self._images(run, 0, 0), 0, count * run.wire_bytes)
            self._clear_flags(run)
            self._enqueue_chunk(run, 0, 0, count)
            cuda.Context.synchronize()
        if streamed:  # the ring's page-locked buffers (pinning 150 MB takes tens of ms), the readers
            self.host_buffers((self.stream_block,) + tuple(x_shape[1:]), wire, self.ring_depth)
            _ = self.reader
        self._host("buffers + warm-up", t)

    def _ring(self, n, chunk, streamed, image_bytes):
        """(images per resident block, blocks): see plan.ring; blocks about STREAM_BYTES, the ring
        as deep as the host's."""
        return plan.ring(n, chunk, streamed, image_bytes, self.STREAM_BYTES, self.ring_depth)

    def _plan(self, n, wire_bytes, float_bytes, streamed, align=1):
        """(chunk, inputs resident): the whole input on the device when it fits (streamed: a ring
        of blocks), chunks that fit."""
        free, _ = cuda.mem_get_info()
        budget = int(free * 0.8)
        # By default enough chunks that every stream has work and copies hide behind kernels.
        best = getattr(self.pipeline, "STREAM_CHUNK", self.pipeline.CHUNK) if streamed else self.pipeline.CHUNK
        if streamed:
            best = plan.aligned_chunk(best, align)
        chunk = min(self.chunk or min(best, -(-n // self.n_streams)), n)
        resident = self._images_bytes(n, chunk, streamed, wire_bytes) <= budget // 2
        converts = wire_bytes != float_bytes

        def need(c):
            per_stream = (4 * self.pipeline.scratch_floats(c) + (0 if resident else c * wire_bytes)
                          + (c * float_bytes if converts else 0))
            return (self.n_streams * per_stream + (self._images_bytes(n, c, streamed, wire_bytes) if resident else 0)
                    + 4 * n * (1 + self.pipeline.g.classes))

        while chunk > 1 and need(chunk) > budget:
            chunk //= 2
        if need(chunk) > budget:
            raise InputError(f"the GPU has {free / 2**20:.0f} MiB free, too little for even one image per chunk")
        return chunk, resident

    def _images_bytes(self, n, chunk, streamed, wire_bytes):
        block, slots = self._ring(n, chunk, streamed, wire_bytes)
        return block * slots * wire_bytes

    def buffers(self, key):
        """Device and page-locked buffers for a batch (n, image shape, wire type), kept for
        repeated runs of the same key. If the device runs out of memory all the same, the images
        stop being resident, then chunks halve, down to one image."""
        if self._run is not None and self._run.key == key:
            return self._run
        n, image_shape, wire, streamed, align = key
        wire = np.dtype(wire)
        elems = int(np.prod(image_shape))
        self._free_run()
        chunk, resident = self._plan(n, elems * wire.itemsize, 4 * elems, streamed, align)
        while True:
            try:
                self._run = self._allocate(key, n, elems, wire, chunk, resident)
                return self._run
            except cuda.MemoryError:
                if resident:
                    resident = False
                elif chunk > 1:
                    chunk //= 2
                else:
                    raise InputError("the GPU ran out of memory even for one image per chunk") from None

    def _allocate(self, key, n, elems, wire, chunk, resident):
        """A Run's buffers, all or none: on failure what was taken is given back."""
        taken, pinned = [], []
        block, slots = self._ring(n, chunk, key[3], elems * wire.itemsize)

        def alloc(nbytes):
            taken.append(cuda.mem_alloc(max(nbytes, 4)))
            return taken[-1]

        def host(shape, dtype):
            pinned.append(cuda.pagelocked_empty(shape, dtype))
            return pinned[-1]

        classes = self.pipeline.g.classes
        try:
            return Run(key=key, chunk=chunk, block=block, slots=slots, elems=elems, wire=wire,
                       x_dev=alloc(block * slots * elems * wire.itemsize) if resident else None,
                       staging=[None if resident else alloc(chunk * elems * wire.itemsize) for _ in self.streams],
                       floats=[alloc(4 * chunk * elems) if wire != np.float32 else None for _ in self.streams],
                       scratch=[alloc(4 * self.pipeline.scratch_floats(chunk)) for _ in self.streams],
                       labels_dev=alloc(4 * n), labels=host(n, np.int32),
                       scores_dev=alloc(4 * n * classes), scores=host((n, classes), np.float32),
                       flags_dev=alloc(8 * -(-n // chunk)), buffers=taken + pinned)
        except BaseException:
            for buf in taken:
                buf.free()
            for buf in pinned:
                buf.base.free()
            raise

    def _drop_graphs(self):
        for g in self.graphs.values():
            g.close()
        self.graphs = {}

    def _free_run(self):
        self._drop_graphs()
        if self._run is not None:
            cuda.Context.synchronize()
            for buf in self._run.buffers:
                if isinstance(buf, np.ndarray):
                    buf.base.free()
                else:
                    buf.free()
            self._run = None

    def forward(self, x, progress=None):
        """(labels, scores or None) of images x (n, H, W, C) in page-locked host memory, of the
        wire type prepare() was given."""
        run = self._run
        assert run is not None and run.key[:3] == (len(x), tuple(x.shape[1:]), x.dtype.str), "prepare() first"
        self._clear_flags(run)
        self.enqueue(run, x)
        for s in self.streams:
            s.synchronize()
        self._check_flags(run)
        if progress is not None:
            progress.update(len(x))
        return self._outputs(run)

    def _outputs(self, run):
        return run.labels.astype(np.int64), run.scores.copy() if self.keep_scores else None

    def _clear_flags(self, run):
        cuda.memset_d32(run.flags_dev, INT_MAX, 2 * run.chunks)

    def _check_flags(self, run):
        """BadValue for the first image holding a non-finite value, else ScoresOverflow for the
        first image whose scores the kernels found not finite."""
        flags = np.empty((2, run.chunks), np.int32)
        cuda.memcpy_dtoh(flags, run.flags_dev)
        for row, error in ((1, BadValue), (0, lambda i: ScoresOverflow(self.model.path, i))):
            hit = np.flatnonzero(flags[row] != INT_MAX)
            if len(hit):
                raise error(int(hit[0]) * run.chunk + int(flags[row, hit[0]]))

    def enqueue(self, run, x=None):
        """Chunk i goes to stream i mod S; x None means the images are already resident. Replayed
        from a CUDA graph recorded on the first call for these host buffers, where graphs work."""
        if self.use_graphs:
            key = (None if x is None else x.ctypes.data, self.keep_scores)
            try:
                if key not in self.graphs:
                    self.graphs[key] = graph.Graph(self.streams[0], self.streams[1:], lambda: self._enqueue_all(run, x))
                self.graphs[key].launch(self.streams[0])
                return
            except (graph.GraphError, AttributeError, OSError):
                self.use_graphs = False  # launch kernel by kernel from now on
                cuda.Context.synchronize()
        self._enqueue_all(run, x)

    @property
    def resident(self):
        """Whether the images of the last prepare() stay on the device (they fit at once)."""
        return self._run is not None and self._run.x_dev is not None

    def enqueue_resident(self):
        """Queue the forward pass over the images the last forward() left on the device: no
        upload, no labels back. What `cnninfer bench` times with CUDA events."""
        if not self.resident:
            raise InputError("the images are not resident on the GPU: prepare() and forward() fewer of them first")
        self.enqueue(self._run)

    def _enqueue_all(self, run, x):
        n = len(run.labels)
        for i, start in enumerate(range(0, n, run.chunk)):
            stop = min(n, start + run.chunk)
            self._enqueue_chunk(run, i, start, stop - start, None if x is None else x[start:stop])

    def _enqueue_chunk(self, run, i, start, count, x=None):
        """Upload images [start, start + count) unless x is None, convert or check them, the
        network, labels (and scores) back; all on stream i mod S."""
        stream = self.streams[i % len(self.streams)]
        if x is not None:
            self._upload(run, stream, i, start, x)
        self._compute(run, i, start, count)
        self._download(run, stream, start, count)

    def _images(self, run, i, start):
        """Where chunk i's images (from image start) are on the device, in the wire type."""
        if run.x_dev is None:
            return int(run.staging[i % len(self.streams)])
        return int(run.x_dev) + ((start // run.block) % run.slots * run.block + start % run.block) * run.wire_bytes

    def _upload(self, run, stream, i, start, x):
        """Copy images x (from image start; chunk i's, or whole chunks from chunk i where resident)
        to the device on stream; the event that completes with the copy."""
        self.profiler.start("memcpy HtoD (images)", stream)
        cuda.memcpy_htod_async(self._images(run, i, start), x, stream)
        self.profiler.stop("memcpy HtoD (images)", stream)
        return _event(stream)

    def _compute(self, run, i, start, count):
        """Check or convert chunk i's images, then the network, on stream i mod S."""
        s = i % len(self.streams)
        stream = self.streams[s]
        src = self._images(run, i, start)
        chunk_index = start // run.chunk
        bad = 0  # integer images convert to finite floats: nothing to check
        if run.floats[s] is None:
            images, bad = src, int(run.flags_dev) + 4 * (run.chunks + chunk_index)
        else:
            images = int(run.floats[s])
            self.converters[run.wire](stream, src, images, count * run.elems)
        scores = self._scores(run, start)
        self.pipeline.enqueue(stream, images, count, int(run.labels_dev) + 4 * start, int(run.scratch[s]),
                              int(run.flags_dev) + 4 * chunk_index, scores, bad)

    def _scores(self, run, start):
        return int(run.scores_dev) + 4 * start * self.pipeline.g.classes if self.keep_scores else 0

    def _download(self, run, stream, start, count):
        """Labels (and scores) of images [start, start + count) back to the host."""
        self.profiler.start("memcpy DtoH (labels)", stream)
        cuda.memcpy_dtoh_async(run.labels[start:start + count], int(run.labels_dev) + 4 * start, stream)
        if self.keep_scores:
            cuda.memcpy_dtoh_async(run.scores[start:start + count], self._scores(run, start), stream)
        self.profiler.stop("memcpy DtoH (labels)", stream)

    @property
    def stream_block(self):
        """Images per streamed block: whole chunks, about STREAM_BYTES, so each block amortizes
        the reads and the Python work around it (see _plan)."""
        assert self._run.key[3], "prepare(..., streamed=True) first"
        return self._run.block

    @property
    def ring_depth(self):
        return len(self.streams) + 2

    def forward_stream(self, ring, progress, out):
        """Labels found (and scores) of images streamed from `ring`, into out (see stream.outputs);
        each buffer goes back to the reader as soon as its upload is done, so reading, uploads and
        kernels overlap. Where the images are resident a block is one upload on its own stream
        and its chunks' kernels wait for it; the labels come back once, at the end: little Python
        work per block."""
        run = self._run
        self._clear_flags(run)
        # The outputs are written only after the last kernel, on this thread; their fresh pages are
        # faulted in on a reader thread while the GPU works (1M images, H100 machine: the time
        # from the GPU done to the outputs in place fell from 3.4-3.8 ms to 1.4-1.7).
        faulted = self.reader.aside(_fault_in, out[0], out[2])
        pending = collections.deque()
        computed = collections.deque()  # per block: events after its kernels, on every stream used

        def hand_back():
            uploads, buf, count = pending.popleft()
            for e in uploads:
                e.synchronize()
            ring.release(buf)
            progress.update(count)

        for start, x, buf in ring:
            at = start - ring.start
            first = at // run.chunk
            uploads = []
            if run.x_dev is not None:
                if len(computed) == run.slots:  # the slot's previous block must be computed
                    for e in computed.popleft():
                        self.copies.wait_for_event(e)
                uploads.append(self._upload(run, self.copies, first, at, x))
            for offset in range(0, len(x), run.chunk):
                i, count = first + offset // run.chunk, min(run.chunk, len(x) - offset)
                stream = self.streams[i % len(self.streams)]
                if run.x_dev is None:  # through the stream's staging buffer, chunk by chunk
                    uploads.append(self._upload(run, stream, i, at + offset, x[offset:offset + count]))
                else:
                    stream.wait_for_event(uploads[0])
                self._compute(run, i, at + offset, count)
            if run.x_dev is not None:
                used = min(len(self.streams), -(-len(x) // run.chunk))
                computed.append([_event(self.streams[(first + j) % len(self.streams)]) for j in range(used)])
            pending.append((uploads, buf, len(x)))
            while pending and (len(pending) >= ring.depth - 1 or all(e.query() for e in pending[0][0])):
                hand_back()
        while pending:
            hand_back()
        for s in self.streams:
            s.synchronize()
        try:
            self._check_flags(run)
        except (ScoresOverflow, BadValue) as e:
            raise e.shifted(ring.start) from None
        n = ring.stop - ring.start
        self._download(run, self.streams[0], 0, n)
        self.streams[0].synchronize()
        faulted.result()
        np.copyto(out[0], run.labels)
        if out[2] is not None:
            np.copyto(out[2], run.scores)

    def close(self):
        """Free device and page-locked memory, stop the readers, then release the context."""
        if self.gpu.context is None:
            return
        cuda.Context.synchronize()
        self._free_run()
        self._drop_graphs()
        self.close_host()
        for buf in self.weights:
            buf.free()
        self.weights, self.streams, self.copies = [], [], None
        self.profiler = self.build.profiler = NullProfiler()  # its events die while the context lives
        self.gpu.close()


def _event(stream):
    """An event recorded on stream now (no timing: the cheapest kind)."""
    e = cuda.Event(cuda.event_flags.DISABLE_TIMING)
    e.record(stream)
    return e


def _fault_in(*arrays):
    """Touch every page of the arrays (None skipped) so writing them later takes no page faults;
    NumPy fills large arrays without the interpreter lock."""
    for a in arrays:
        if a is not None:
            a.fill(0)
