"""The CUDA backend: the algorithm chosen and its kernels built for the model, weights uploaded
once, the batch's memory planned (plan.memory) and allocated with fallbacks, then images run by the
executor (chunks over several streams, CUDA graphs) or streamed block by block (streamer)."""
import time

import numpy as np
import pycuda.driver as cuda

from ..errors import InputError
from ..backend import Backend
from ..data import codes
from ..data.host import HostSide
from ..network import geometry
from ..options import STREAMS, Options
from . import chunk_decode, graph, hostmem, launch, pipelines, plan, shuffled
from .device import DECODE_QUEUES, Device
from .executor import Executor, RunKey
from .launch import Build
from .profile import NullProfiler, Profiler
from .streamer import forward_stream


class CudaBackend(HostSide, Backend):
    name = "cuda"
    checks_values = True  # float32 images are checked on the GPU, by the pipeline (pipelines.py)
    STREAM_BYTES = plan.STREAM_BYTES
    ring_depth = plan.RING_DEPTH
    decoded_ring_depth = plan.DECODED_RING_DEPTH

    def host_ring_depth(self, data):
        if data.kind != "chunks":
            return self.ring_depth
        cut = any(getattr(rows, "cut", False) for _, rows, _, _ in data.parts)
        return plan.DECODED_CODES_RING_DEPTH if cut and self.stream_wire(data) in codes.WIRES else self.decoded_ring_depth

    def __init__(self, chunk=None, streams=STREAMS, tile_width=None, conv_algo=pipelines.AUTO, device=0,
                 fast_math=False, profile=False, readers=None, gemm_algo="auto", decode="host",
                 precision=None):
        t = time.perf_counter()
        # Decoding on the GPU keeps ~16 streams busy at once (up to 8 decoding, the network's, the uploads'):
        # 16 hardware queues, which cost the context ~80 MB more host memory (H100, 1M Blosc lz4 file:
        # peak RSS 392 MB against 311 with 8 queues, at 6.3-6.7M images/s against 3.8M), so only then
        self.gpu = Device(device, hardware_queues=DECODE_QUEUES if decode in ("gpu", "auto") else None)
        self.profiler = Profiler() if profile else NullProfiler()
        self.build = Build(self.gpu.arch, fast_math, tile_width, self.profiler, gemm_algo, self.gpu.l2_bytes,
                           self.gpu.sms)
        # The options its runs are planned with (infer.plan), --decode as made (plan.decode_mode)
        self.options = Options.of(chunk=chunk, streams=streams, tile_width=tile_width, conv_algo=conv_algo,
                                  device=device, fast_math=fast_math, profile=profile, readers=readers,
                                  gemm_algo=gemm_algo, decode=decode, precision=precision)
        self.readers = readers
        self.decoder = None  # the GPU decoder (chunk_decode.Decoder): made as a run is prepared, kept while it fits
        self.decoder_shape = None  # the decode streams and blocks a group it was made for
        self.placer, self.placing = None, []  # its GPU unshuffle (shuffled.Placer), and the placer's buffers
        self.unshuffling = None  # the placer the ring streaming now hands its blocks to, or None
        self.decoding = "host"  # where the last stream's chunks were decoded, for --json
        self.weights, self.model = [], None
        self.prepared = None  # (plan, model, pipeline, run) of the last in-memory prepare (prepared_for)
        self.executor = Executor(streams, self.profiler, graph.enabled() and not profile)
        self.pinned = hostmem.Registered()  # the callers' memory forward may read in place (pin)
        self.copies = cuda.Stream()  # streamed uploads to resident images: never queued behind kernels
        self._host("context set-up", t)

    def _host(self, step, since):
        if isinstance(self.profiler, Profiler):
            self.profiler.host[step] = self.profiler.host.get(step, 0.0) + (time.perf_counter() - since) * 1e3

    @property
    def pipeline(self):
        return self.executor.pipeline

    @property
    def keep_scores(self):
        return self.executor.keep_scores

    @property
    def device(self):
        algo = "" if self.pipeline is None else f", --conv-algo {self.pipeline.NAME}"
        if hasattr(self.pipeline, "describe"):
            algo += f" ({self.pipeline.describe})"
        return self.gpu.describe() + algo

    @property
    def profile(self):
        return self.profiler.rows() if isinstance(self.profiler, Profiler) else None

    def recomputed(self):
        """Images the certified pipeline recomputed exactly since the last call (synchronizes), or
        None where the run computes every image exactly."""
        counter = getattr(self.pipeline, "recomputed", None)
        return None if counter is None or not self.executor.certifies() else counter()

    wire_dtype = staticmethod(plan.wire_dtype)
    records_forward_graph = True  # prepare records the graph of forward over host_buffers(x_shape, wire)[0]

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

    def prepare(self, model, plan, source=None):
        """Make ready the run `plan` (infer.plan's Plan) describes, choosing nothing itself: compile (or
        load cached) the kernels of its algorithm and upload the weights (once per model and image
        shape), allocate its buffers (once per plan key: its images' count, shape and wire type,
        streamed or not; kept for a later run of the same key) and run the network once, so the
        timed forward pays neither allocation nor the first launch's module loading. source: the
        DataSet a streamed plan reads (the GPU decodes its chunks where the plan says so)."""
        t = time.perf_counter()
        ex = self.executor
        g = geometry(model, (plan.n,) + tuple(plan.image_shape), "data")
        algo = pipelines.ALGORITHMS[plan.pipeline]
        if (self.model is not model or self.pipeline.g != g or type(self.pipeline) is not algo
                or getattr(self.pipeline, "default", False) != plan.by_default):  # a new model, shape or algorithm
            try:
                launch.prefetch(self.build, lambda build: algo(build, g))
                pipeline = algo(self.build, g)
                if plan.by_default:
                    pipeline.by_default()
            except ValueError as e:
                raise InputError(f"--conv-algo {algo.NAME}: {e}") from None
            self._host("compile / load kernels", t)
            t = time.perf_counter()
            ex.free_run()
            for buf in self.weights:
                buf.free()
            self.weights = []
            ex.pipeline = pipeline
            pipeline.upload(model, self._to_device)
            cuda.Context.synchronize()
            self.model = model
            self._host("weights upload", t)
        t = time.perf_counter()
        wire = np.dtype(plan.wire)
        if wire != np.float32 and ex.pipeline.staging(wire) is None and wire not in ex.converters:
            ex.converters[wire] = launch.converter(self.build, wire)
        ex.keep_scores, ex.certify = plan.scores, plan.precision == "certified"
        key = RunKey(*plan.key)
        if (ex.run is None or ex.run.key != key) and not ex.use_run(key):
            self._allocate(key, plan)
            ex.warm_up()
            if key.decoding:
                chunk_decode.warm_up(self.build, source.parts[0][1])
        if plan.scores:
            _ = ex.run.scores  # a streamed run's page-locked copy made here, not in the timed run
        if key.decoding and not ex.run.resident:
            raise InputError(f"{source.parts[0][0]}: --decode gpu: the GPU has too little free memory for the "
                             "decoded blocks")
        # The ring's page-locked buffers, here rather than in the timed run: pinning a 25 MB buffer
        # takes ~17 ms (--decode gpu pinned its ring in the run: a 1M shuffled gzip 1 file on an
        # H100 streamed at 2.5-3.1M images/s, 3.7-4.2M since)
        if key.decoding:
            self.host_buffers((self._decoder_for(source.parts[0][1]).capacity,), np.uint8, key.decoding.ring)
        elif plan.streamed:
            self.host_buffers((self.stream_block,) + tuple(plan.image_shape), wire,
                              self.ring_depth if source is None else self.host_ring_depth(source))
        elif self.records_forward_graph:  # the buffer forward reads (Session's, bench's): its graph recorded now
            ex.record(self.host_buffers((plan.n,) + tuple(plan.image_shape), wire)[0])
        if plan.streamed:
            _ = self.reader
            if not key.decoding and source is not None:  # its staging block, here rather than in the timed run
                self._placer_for(source)
        self._host("buffers + warm-up", t)
        self.prepared = None if plan.streamed else (plan, model, ex.pipeline, ex.run)

    def prepared_for(self, model, plan):
        """The last prepare was of this plan (an in-memory one) and model, and its pipeline and run
        are still the executor's (any other prepare, or freeing the run, changes one of them)."""
        ex = self.executor
        return self.prepared is not None and all(a is b for a, b in zip(self.prepared, (plan, model, ex.pipeline, ex.run)))

    def description(self):
        """This GPU as a run plan sees it (gpu.device.Description), its memory free now."""
        return self.gpu.description()

    @property
    def devices(self):
        return (self.gpu.ordinal,)

    def _allocate(self, key, plan):
        """Device and page-locked buffers for the run of `key` as `plan` sizes them (chunk,
        resident, the ring). If the device runs out of memory all the same, the runs put aside go,
        then the images stop being resident, then chunks halve, down to one image."""
        ex = self.executor
        wire = np.dtype(key.wire)
        elems = int(np.prod(key.image_shape))
        self._free_decoder()
        self._free_placer()
        ex.put_aside(keep=not ex.run.key.streamed if ex.run is not None else False)  # streamed runs are not kept
        chunk, resident, block, slots = plan.chunk, plan.resident, plan.block or key.n, plan.slots
        while True:
            try:
                ex.run = ex.allocate(key, key.n, elems, wire, chunk, resident, block, slots)
                return
            except cuda.MemoryError:
                if ex.kept:
                    ex.free_kept()
                elif resident:
                    resident = False
                elif chunk > 1:
                    chunk //= 2
                    if key.streamed:  # a block stays a whole number of chunks
                        block = max(chunk, block - block % chunk)
                else:
                    raise InputError("the GPU ran out of memory even for one image per chunk") from None

    def pin(self, array):
        return self.pinned.add(array)

    def unpin(self, array):
        self.pinned.remove(array)

    def reads_in_place(self, x):
        run = self.executor.run
        return run is not None and run.resident and run.block >= len(x) and self.pinned.holds(x)

    def forward(self, x, progress=None, in_place=False):
        """(labels, scores or None) of images x (n, H, W, C) in page-locked host memory, of the
        wire type prepare() was given; in_place: x lies in pinned memory (reads_in_place), not
        in host_buffers'."""
        run = self.executor.run
        assert run is not None and run.key[:3] == (len(x), tuple(x.shape[1:]), x.dtype.str), "prepare() first"
        out = self.executor.forward(x, self.model.path, in_place)
        if progress is not None:
            progress.update(len(x))
        return out

    @property
    def resident(self):
        """Whether the images of the last prepare() stay on the device (they fit at once)."""
        return self.executor.run is not None and self.executor.run.resident

    def enqueue_resident(self):
        """Queue the forward pass over the images the last forward() left on the device: no
        upload, no labels back. What `cnninfer bench` times with CUDA events."""
        if not self.resident:
            raise InputError("the images are not resident on the GPU: prepare() and forward() fewer of them first")
        self.executor.enqueue()

    @property
    def stream_block(self):
        """Images per streamed block: whole chunks, about STREAM_BYTES, so each block amortizes
        the reads and the Python work around it (see plan.ring)."""
        assert self.executor.run.key.streamed, "prepare() a streamed plan first"
        return self.executor.run.block

    def stream_source(self, data, start, stop):
        """(what the ring reads, its buffers, how a buffer is cut to a block): the file's chunks as
        stored, for the GPU to decode, where prepare() planned it; else the images (host.HostSide),
        their whole chunks left shuffled where the GPU can unshuffle them as it places the blocks
        (shuffled.Placer; without the device memory for its staging block, the host unshuffles)."""
        run = self.executor.run
        self.unshuffling = None
        if not run.key.decoding:
            self.decoding = "host"
            source = super().stream_source(data, start, stop)
            self.unshuffling = self._placer_for(data)  # None for a file it cannot unshuffle, though one is kept
            if self.unshuffling is None:
                return source
            self.decoding = "host, unshuffled on the GPU"
            return (shuffled.Source(data),) + source[1:]
        self._decoder_for(data.parts[0][1])
        self.decoder.start()
        self.decoding = self.decoder.describe()
        buffers = self.host_buffers((self.decoder.capacity,), np.uint8, run.key.decoding.ring)
        return chunk_decode.Blocks(data, self.decoder), buffers, chunk_decode.Block

    def stream_wire(self, data):
        """The type the prepared run's images travel in."""
        return self.executor.run.wire

    def _placer_for(self, data):
        """The GPU unshuffle (shuffled.Placer) of DataSet `data` for the prepared run: the one kept
        where its staging block fits, else a new one; None where the GPU cannot unshuffle `data`'s
        chunks, or has no memory for the staging block (the host unshuffles, as without a GPU). Every
        use of the block is queued on the copy stream, so a kept one needs no wait between runs."""
        run = self.executor.run
        if not run.resident or shuffled.unsupported(data, run.wire, self.reader.native):
            return None
        rows = data.parts[0][1]
        if self.placer is not None and self.placer.fits(rows, run.block):
            return self.placer
        self._free_placer()
        try:
            self.placer = shuffled.Placer(self.build, rows, run.block, self._alloc_placing)
        except cuda.MemoryError:
            self._free_placer()
        return self.placer

    def _decoder_for(self, rows):
        """The GPU decoder of `rows` (a ChunkedRows) for the prepared run: the one kept where it
        fits, else a new one, on fewer streams where the device memory is short."""
        run = self.executor.run
        blocks = -(-run.key.n // run.block)
        streams, group = chunk_decode.shape(run.slots, run.key.decoding.group, blocks)
        # every chunk in flight at once: a chunk's latency bounds the run, and deflate's streams are
        # split in parts (H200, 1M images: shuffled gzip 4-9% sooner); a ring used again is bound
        # by the decoder's throughput, which splitting lowers (1,000 shuffled chunks: 81 ms, not 74)
        split = blocks <= run.slots
        kept = self.decoder
        if (kept is not None and self.decoder_shape == (streams, group)
                and (kept.rows is rows or kept.fits(rows, run.block))):
            if kept.rows is not rows:  # prepare() bound it to this run's file: not again in the timed stream
                kept.bind(rows)
            kept.split = split
            return kept
        self._free_decoder()
        self.decoder_shape = (streams, group)  # asked for: one on fewer streams, where memory was short, still fits
        taken = []

        def alloc(nbytes):
            taken.append(cuda.mem_alloc(max(nbytes, 4)))
            return taken[-1]

        while True:
            try:
                self.decoder = chunk_decode.Decoder(self.build, rows, run.block, streams, alloc, taken, group,
                                                    self.copies)
                self.decoder.split = split
                return self.decoder
            except cuda.MemoryError:
                for buf in taken:
                    buf.free()
                taken.clear()
                if streams == 1:
                    raise InputError("the GPU ran out of memory for decoding even one block of chunks") from None
                streams //= 2

    def _free_decoder(self):
        if self.decoder is not None:
            self.decoder.free()
            self.decoder = None

    def forward_stream(self, ring, progress, out):
        """Labels found (and scores) of images streamed from `ring`, into out (see host.outputs)."""
        try:
            forward_stream(self.executor, self.copies, ring, progress, out, self.reader.aside, self.model.path,
                           self.decoder, self.unshuffling)
        finally:
            if self.decoder is not None:
                self.decoder.synchronize()

    def _alloc_placing(self, nbytes):
        self.placing.append(cuda.mem_alloc(max(nbytes, 4)))
        return self.placing[-1]

    def _free_placer(self):
        if self.placing:
            self.copies.synchronize()
        for buf in self.placing:
            buf.free()
        self.placer, self.placing = None, []

    def close(self):
        """Free device and page-locked memory, stop the readers, then release the context."""
        if self.gpu.context is None:
            return
        cuda.Context.synchronize()
        self.pinned.clear()
        self._free_decoder()
        self._free_placer()
        self.executor.free_run()
        self.close_host()
        for buf in self.weights:
            buf.free()
        self.weights, self.executor.streams, self.copies = [], [], None
        self.profiler = self.build.profiler = self.executor.profiler = NullProfiler()  # its events die while the context lives
        self.gpu.close()
