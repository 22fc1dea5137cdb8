"""The CUDA backend: weights uploaded once, images in page-locked host memory uploaded chunk by
chunk over several streams so copies of one chunk overlap kernels of another, labels back."""
import collections
import time
from dataclasses import dataclass, field

import numpy as np
import pycuda.driver as cuda

from ..errors import InputError, ScoresOverflow
from ..loader import geometry
from ..stream import through
from . import pipelines
from .device import Device
from .launch import INT_MAX
from .profile import NullProfiler, Profiler


@dataclass
class Build:
    """What every kernel of one run is compiled and launched with."""
    arch: str
    fast_math: bool
    tile_width: int
    profiler: object
    modules: dict = field(default_factory=dict)  # loaded modules of this context, by (source, defines)


@dataclass
class Run:
    """The buffers of one batch size: images (resident, or per-stream staging), scratch, labels."""
    key: tuple
    chunk: int
    image_bytes: int
    x_dev: object
    staging: list
    scratch: list
    labels_dev: object
    labels: np.ndarray
    overflow_dev: object  # per chunk: its first image with non-finite scores, INT_MAX if none

    @property
    def chunks(self):
        return -(-len(self.labels) // self.chunk)


class CudaBackend:
    name = "cuda"

    def __init__(self, chunk=None, streams=4, tile_width=16, conv_algo=pipelines.AUTO, device=0,
                 fast_math=False, profile=False):
        t = time.perf_counter()
        if streams < 1:
            raise InputError(f"--streams must be at least 1, got {streams}")
        self.gpu = Device(device)
        self.profiler = Profiler() if profile else NullProfiler()
        self.build = Build(self.gpu.arch, fast_math, tile_width, self.profiler)
        self.algo, self.chunk, self.n_streams = conv_algo, chunk, streams
        self.pinned, self.device_buffers = [], []
        self.pipeline = self._run = None
        self._host("context set-up", t)

    def _host(self, step, since):
        if isinstance(self.profiler, Profiler):
            self.profiler.host[step] = self.profiler.host.get(step, 0.0) + (time.perf_counter() - since) * 1e3

    @property
    def device(self):
        algo = "" if self.pipeline is None else f", --conv-algo {self.pipeline.NAME}"
        return self.gpu.describe() + algo

    @property
    def profile(self):
        return self.profiler.rows() if isinstance(self.profiler, Profiler) else None

    def host_buffer(self, shape):
        """Page-locked host memory for the images, so uploads are asynchronous; freed by close()."""
        buf = cuda.pagelocked_empty(shape, np.float32, mem_flags=cuda.host_alloc_flags.PORTABLE)
        self.pinned.append(buf)
        return buf

    def to_device(self, array):
        """A device copy of `array` as float32, freed by close()."""
        array = np.ascontiguousarray(array, np.float32)
        buf = cuda.mem_alloc(max(array.nbytes, 4))
        self.device_buffers.append(buf)
        cuda.memcpy_htod(buf, array)
        return buf

    def prepare(self, model, x_shape):
        """Compile (or load cached) kernels for this network, upload the weights once, allocate
        the buffers for x_shape (n, H, W, C) and run the network once on zeros, so the timed
        forward pays neither allocation nor the first launch's module loading."""
        t = time.perf_counter()
        self.model_path = model.path
        g = geometry(model, x_shape, "data")
        algo, why = pipelines.choose(self.algo, g, self.gpu.arch)
        if why:
            raise InputError(f"{model.path}: {why}; --conv-algo unroll runs any consistent shapes")
        self.pipeline = algo(self.build, g)
        self._host("compile / load kernels", t)
        t = time.perf_counter()
        self.pipeline.upload(model, self.to_device)
        cuda.Context.synchronize()
        self._host("weights upload", t)
        t = time.perf_counter()
        self.streams = [cuda.Stream() for _ in range(self.n_streams)]
        run = self.buffers(x_shape[0], x_shape[1:])
        first = run.staging[0] if run.x_dev is None else run.x_dev
        cuda.memset_d32(first, 0, run.chunk * run.image_bytes // 4)
        self.pipeline.enqueue(self.streams[0], int(first), run.chunk, int(run.labels_dev), int(run.scratch[0]),
                              int(run.overflow_dev))
        cuda.Context.synchronize()
        self._host("buffers + warm-up", t)

    def _plan(self, n, image_bytes):
        """(chunk, inputs resident): the whole input on the device when it fits, chunks that fit."""
        free, _ = cuda.mem_get_info()
        budget = int(free * 0.8)
        resident = n * image_bytes <= budget // 2
        # By default enough chunks that every stream has work and copies hide behind kernels.
        chunk = self.chunk or min(self.pipeline.CHUNK, -(-n // self.n_streams))

        def need(c):
            per_stream = 4 * self.pipeline.scratch_floats(c) + (0 if resident else c * image_bytes)
            return self.n_streams * per_stream + (n * image_bytes if resident else 0) + 4 * n

        chunk = min(chunk, n)
        while chunk > 1 and need(chunk) > budget:
            chunk //= 2
        if need(chunk) > budget:
            raise InputError(f"the GPU has {free / 2**20:.0f} MiB free, too little for even one image per chunk")
        return chunk, resident

    def buffers(self, n, image_shape):
        """Device and page-locked buffers for n images, kept for repeated runs of the same size.
        If the device runs out of memory all the same, the images stop being resident, then
        chunks halve, down to one image."""
        key = (n, tuple(image_shape))
        if self._run is not None and self._run.key == key:
            return self._run
        image_bytes = 4 * int(np.prod(image_shape))
        chunk, resident = self._plan(n, image_bytes)
        while True:
            try:
                self._run = self._allocate(key, n, image_bytes, chunk, resident)
                return self._run
            except cuda.MemoryError:
                if resident:
                    resident = False
                elif chunk > 1:
                    chunk //= 2
                else:
                    raise InputError("the GPU ran out of memory even for one image per chunk") from None

    def _allocate(self, key, n, image_bytes, chunk, resident):
        """A Run's buffers, all or none: on failure what was taken is given back."""
        taken = []

        def alloc(nbytes):
            taken.append(cuda.mem_alloc(max(nbytes, 4)))
            return taken[-1]

        try:
            run = Run(key=key, chunk=chunk, image_bytes=image_bytes,
                      x_dev=alloc(n * image_bytes) if resident else None,
                      staging=[None if resident else alloc(chunk * image_bytes) for _ in self.streams],
                      scratch=[alloc(4 * self.pipeline.scratch_floats(chunk)) for _ in self.streams],
                      labels_dev=alloc(4 * n), labels=cuda.pagelocked_empty(n, np.int32),
                      overflow_dev=alloc(4 * -(-n // chunk)))
        except BaseException:
            for buf in taken:
                buf.free()
            raise
        self.device_buffers += taken
        self.pinned.append(run.labels)
        return run

    def forward(self, x, progress=None):
        """Labels of images x (n, H, W, C) float32 in page-locked host memory."""
        run = self.buffers(len(x), x.shape[1:])
        self._clear_overflow(run)
        self.enqueue(run, x)
        for s in self.streams:
            s.synchronize()
        self._check_overflow(run)
        return run.labels.astype(np.int64)

    def _clear_overflow(self, run):
        cuda.memset_d32(run.overflow_dev, INT_MAX, run.chunks)

    def _check_overflow(self, run):
        """ScoresOverflow for the first image whose scores the kernels found not finite."""
        first = np.empty(run.chunks, np.int32)
        cuda.memcpy_dtoh(first, run.overflow_dev)
        hit = np.flatnonzero(first != INT_MAX)
        if len(hit):
            raise ScoresOverflow(self.model_path, int(hit[0]) * run.chunk + int(first[hit[0]]))

    def enqueue(self, run, x=None):
        """Chunk i goes to stream i mod S; x None means the images are already resident."""
        n = len(run.labels)
        for i, start in enumerate(range(0, n, run.chunk)):
            stop = min(n, start + run.chunk)
            self._enqueue_chunk(run, i, start, stop - start, None if x is None else x[start:stop])

    def _enqueue_chunk(self, run, i, start, count, x=None):
        """Upload images [start, start + count) unless x is None, the network, labels back; on
        stream i mod S. Returns an event that completes when x may be overwritten."""
        stream = self.streams[i % len(self.streams)]
        dst = int(run.staging[i % len(self.streams)]) if run.x_dev is None else int(run.x_dev) + start * run.image_bytes
        uploaded = None
        if x is not None:
            self.profiler.start("memcpy HtoD (images)", stream)
            cuda.memcpy_htod_async(dst, x, stream)
            self.profiler.stop("memcpy HtoD (images)", stream)
            uploaded = cuda.Event(cuda.event_flags.DISABLE_TIMING)
            uploaded.record(stream)
        self.pipeline.enqueue(stream, dst, count, int(run.labels_dev) + 4 * start, int(run.scratch[i % len(self.streams)]),
                              int(run.overflow_dev) + 4 * (start // run.chunk))
        self.profiler.start("memcpy DtoH (labels)", stream)
        cuda.memcpy_dtoh_async(run.labels[start:start + count], int(run.labels_dev) + 4 * start, stream)
        self.profiler.stop("memcpy DtoH (labels)", stream)
        return uploaded

    @property
    def stream_block(self):
        """Images per block when streaming: one chunk, so a block is one upload on one stream."""
        return self._run.chunk

    @property
    def ring_depth(self):
        return len(self.streams) + 2

    def forward_stream(self, ring, progress):
        """Labels of images streamed from `ring`; each buffer goes back to the reader as soon as
        its upload is done, so reading, uploads and kernels of different blocks overlap."""
        run = self._run
        self._clear_overflow(run)
        pending = collections.deque()

        def hand_back():
            uploaded, buf, count = pending.popleft()
            uploaded.synchronize()
            ring.release(buf)
            progress.update(count)

        for i, (start, x, buf) in enumerate(ring):
            pending.append((self._enqueue_chunk(run, i, start - ring.start, len(x), x), buf, len(x)))
            while pending and (len(pending) >= ring.depth - 1 or pending[0][0].query()):
                hand_back()
        while pending:
            hand_back()
        for s in self.streams:
            s.synchronize()
        try:
            self._check_overflow(run)
        except ScoresOverflow as e:
            raise e.shifted(ring.start) from None
        return run.labels.astype(np.int64)

    def stream(self, data, n, progress):
        """Images [0, n) of an open data file, streamed: see stream.through."""
        return through(self, data, 0, n, progress)

    def close(self):
        """Free device and page-locked memory, then release the context."""
        if self.gpu.context is None:
            return
        if self.pipeline is not None:
            cuda.Context.synchronize()
        for buf in self.device_buffers:
            buf.free()
        for buf in self.pinned:
            buf.base.free()
        self.device_buffers, self.pinned, self.streams, self._run = [], [], [], None
        self.profiler = self.build.profiler = NullProfiler()  # its events die while the context lives
        self.gpu.close()
