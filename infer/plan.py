"""The run plan: every choice a run makes, and why, made in one place before anything runs.

`make` is a pure function of the data's description (Data), the model's geometry, the device's
description (a GPU's gpu.device.Description, or the CPU's cpu.backend.Description) and the options;
nothing is compiled, uploaded or computed. Session calls it for each run (so do `run`, `serve`
through its Session, `bench` and `cnninfer plan`), and the backends take the Plan it returns and
choose nothing again: the algorithm they build, the precision, the type the images travel in,
where chunks are decoded, the chunk, resident or streamed, the ring.
"""
import functools
from dataclasses import dataclass, field

import numpy as np

from . import env
from .errors import InputError
from .options import AUTO, Options


@dataclass(frozen=True)
class Data:
    """What a plan needs to know of a data set."""
    size: int
    image_shape: tuple
    dtype: object = np.dtype(np.float32)  # the stored NumPy type (None: shards of different types)
    codes: object = None  # the codes wire (data/codes.py) its float32 values are 8-bit codes in, or None
    layout: str = "array"  # contiguous, chunks, array (ArrayRows.kind), or several joined by +
    filters: str = "none"
    align: int = 1  # rows per chunk of a single chunked file
    label: str = "x"  # for messages: the (first) file
    source: object = field(default=None, compare=False, repr=False)  # the DataSet: GPU decoding checks its chunks

    @classmethod
    def of(cls, data):
        """A DataSet's description (its first images read to tell 8-bit codes, see codes_wire)."""
        return cls(data.size, tuple(data.image_shape), data.dtype, data.codes_wire(), data.kind, data.filters,
                   data.align, data.parts[0][0], data)

    def image_bytes(self, wire):
        return int(np.prod(self.image_shape)) * np.dtype(wire).itemsize


@dataclass(frozen=True)
class Plan:
    backend: str  # cuda or cpu
    device: str
    devices: tuple  # GPU numbers (empty on the CPU)
    n: int  # images a device runs (of several GPUs: the largest share)
    image_shape: tuple
    scores: bool
    algorithm: str  # what computes the answers
    pipeline: str  # the algorithm the GPU backend builds (fused-certified's default also runs the exact path)
    by_default: bool  # the default precision: fused-certified certifies only the runs it makes faster
    precision: str  # certified or exact
    wire: object  # NumPy type the images travel in (codes.py's for 8-bit codes)
    wire_name: str
    streamed: bool  # read from the files block by block, overlapped with compute
    resident: bool  # every image (or the streamed ring) on the device at once
    decode: str  # where a streamed file's compressed chunks are decoded: gpu, host, or none
    layout: str
    chunk: int  # images a launch (the CPU: a thread's piece)
    streams: int  # CUDA streams (0 on the CPU)
    block: int = 0  # images a streamed block
    slots: int = 1  # blocks of the device ring
    align: int = 1  # streamed blocks start on multiples of this (the file's chunk rows)
    shares: tuple = ()  # each GPU's [lo, hi) of the images
    decoding: tuple = ()  # the chunk codec's gpu.chunk_decode.Plan where the GPU decodes, else ()
    reasons: dict = field(default_factory=dict, compare=False)
    notices: tuple = ()  # lines to say once: an option with no effect, a precision not available

    @property
    def key(self):
        """What the device buffers of a run depend on (the executor keeps a run per key)."""
        return (self.n, tuple(self.image_shape), np.dtype(self.wire).str, self.streamed,
                self.align if self.streamed else 1, self.decoding)

    def as_dict(self):
        """The plan as `cnninfer plan --json` and `run --json` print it."""
        return dict(backend=self.backend, device=self.device, devices=list(self.devices), images=self.n,
                    image_shape=list(self.image_shape), algorithm=self.algorithm, pipeline=self.pipeline,
                    precision=self.precision, wire=self.wire_name, decode=self.decode, layout=self.layout,
                    chunk=self.chunk, streams=self.streams, resident=self.resident, streamed=self.streamed,
                    block=self.block, reasons=dict(self.reasons))

    def rows(self):
        """(field, value, reason) lines for `cnninfer plan`."""
        d = self.as_dict()
        out = []
        for name in ("backend", "device", "devices", "algorithm", "precision", "wire", "streamed", "decode", "layout",
                     "resident", "chunk", "streams", "block"):
            value = d[name]
            if (name == "devices" and not value or name == "block" and not self.streamed
                    or name == "streams" and self.backend == "cpu"):
                continue
            shown = ", ".join(map(str, value)) if isinstance(value, list) else ("yes" if value is True else "no" if value is False else value)
            out.append((name, str(shown), self.reasons.get(name, "")))
        return out


def _wire_name(wire):
    from .data import codes

    return codes.NAMES.get(np.dtype(wire), str(np.dtype(wire)))


def streams(data, wire, budget, stream_from=None):
    """Whether data's images, travelling as `wire`, stream rather than being read whole: past the
    host budget, or past `stream_from` bytes where the backend has one (the GPU's: from two blocks
    on, reading, uploads and compute overlap, where a whole read pins and fills one buffer first)."""
    size = data.size * data.image_bytes(wire)
    return size > budget or (stream_from is not None and size > stream_from)


def decode_mode(data, options, budget):
    """--decode for a GPU backend about to be made for its first run's `data` (None: no data yet).
    With auto: "auto" (on the GPU where it can) where that file streams past the host budget and
    the GPU decodes its chunks, else "host". Made once a backend: GPU decoding needs more hardware
    queues, asked for as the driver starts, which cost the process ~80 MB of host memory (H100);
    its start-up (~0.2 s) outweighs its speed on files within the budget."""
    if options.decode != "auto":
        return options.decode
    if data is None or data.source is None:
        return "host"
    from .gpu import chunk_decode, plan as gpu_plan

    wire = gpu_plan.wire_dtype(data.dtype)
    return "auto" if streams(data, wire, budget) and chunk_decode.declined(data.source, wire, "auto") is None else "host"


def make(data, g, device, options=None, scores=False, *, budget=None, backend_reason="", decoding_mode=None,
         devices=(0,), model_path="model", streamed=None):
    """The Plan of a run of `data` (a Data) through a network of geometry g on `device` (a GPU's
    Description, or the CPU's) with `options` (an Options), scores asked for or not. budget: the
    host budget in bytes (env's by default); decoding_mode: the GPU backend's --decode as made
    (decode_mode); devices: the GPU numbers the images split over. InputError where the options
    cannot run this model here. streamed: True or False to impose it (a backend's direct callers)."""
    options = options or Options()
    budget = env.host_budget_mb() * 2**20 if budget is None else budget
    if hasattr(device, "arch"):
        return _gpu(data, g, device, options, scores, budget, backend_reason, decoding_mode or options.decode,
                    tuple(devices) or (0,), model_path, streamed)
    return _cpu(data, device, options, scores, budget, backend_reason, streamed)


def _cpu(data, cpu, options, scores, budget, backend_reason, streamed):
    from .cpu.backend import CpuBackend, chunk_for

    wire = np.dtype(np.float32)
    streamed = streams(data, wire, budget) if streamed is None else streamed
    n = data.size
    chunk = chunk_for(min(n, CpuBackend.stream_block) if streamed else n, cpu.threads, bool(cpu.vector_bits),
                      options.chunk)
    algorithm = "native" if cpu.vector_bits else "numpy"
    reasons = dict(
        backend=backend_reason or "--backend cpu",
        algorithm=cpu.status,
        precision="float32 throughout, as the NumPy reference",
        wire="the CPU computes on float32; other stored types are converted as they are read",
        streamed=(f"{n * data.image_bytes(wire) / 2**20:,.0f} MiB of images past the host budget "
                  f"({budget / 2**20:,.0f} MiB, CNNINFER_HOST_BUDGET_MB): read in blocks of {CpuBackend.stream_block:,}"
                  if streamed else f"{n * data.image_bytes(wire) / 2**20:,.1f} MiB of images, within the host budget: read whole"),
        decode="by the reader threads" if data.layout == "chunks" else "nothing to decode",
        chunk="--chunk" if options.chunk else (f"about four chunks a thread ({cpu.threads} threads)" if cpu.vector_bits
                                               else "small chunks keep each thread's buffers in cache"),
        resident="in host memory" if not streamed else "a ring of host blocks",
    )
    return Plan("cpu", cpu.describe(), (), n, tuple(data.image_shape), bool(scores), algorithm, algorithm, False,
                "exact", wire, _wire_name(wire), streamed, not streamed, "host" if data.layout == "chunks" else "none",
                _layout(data), chunk, 0, block=CpuBackend.stream_block if streamed else 0, shares=((0, n),),
                reasons=reasons)


def _layout(data):
    return data.layout + ("" if data.filters == "none" else f" ({data.filters})")


def _gpu_decodes(data, wire, budget, decoding_mode, streamed):
    """Whether a GPU backend decoding `decoding_mode` would decode data's chunks as they travel in
    `wire`: its images then travel so, whatever codes the reader threads could make of them (chunks
    cutting float32 images, which the threads would assemble as 8-bit codes)."""
    from .gpu import chunk_decode, plan as gpu_plan

    if decoding_mode == "host" or data.layout != "chunks" or data.source is None:
        return False
    if streamed is None:
        streamed = streams(data, wire, budget, gpu_plan.STREAM_FROM)
    return streamed and chunk_decode.declined(data.source, wire, decoding_mode) is None


def _host_first(data):
    """Why --decode auto leaves data's chunks, which the GPU decodes, to the reader threads; None
    where it does not (or the GPU cannot decode them)."""
    from .gpu import chunk_decode, plan as gpu_plan

    if data.layout != "chunks" or data.source is None:
        return None
    return (chunk_decode.unsupported(data.source, gpu_plan.wire_dtype(data.dtype)) is None
            and chunk_decode.host_by_default(data.source)) or None


def _not_codes(data, stored, as_stored):
    """Why a file's float32 images do not travel as 8-bit codes, as a clause ("" for arrays)."""
    if data.layout == "array" or stored != np.float32:
        return ""
    if as_stored:
        return "; the GPU decodes the chunks (compressed bytes cross PCIe)"
    if not env.codes():
        return "; CNNINFER_CODES=0"
    if data.source is not None and not all(x.takes_codes for _, x, _, _ in data.source.parts):
        return ("; a codec decodes its chunks straight into place as float32 (the reader threads read as 8-bit codes "
                "only chunks stored without one, or cutting images)")
    return "; its values are not all 8-bit codes"


def _gpu(data, g, gpu, options, scores, budget, backend_reason, decoding_mode, devices, model_path, streamed):
    from .gpu import chunk_decode, pipelines, plan as gpu_plan

    reasons = dict(backend=backend_reason or "--backend cuda")
    notices = []
    n_all = data.size

    # The type the images travel in
    stored = data.dtype
    wire = gpu_plan.wire_dtype(stored)
    as_stored = _gpu_decodes(data, wire, budget, decoding_mode, streamed)
    if as_stored and data.codes is not None:
        reasons["wire"] = ("as stored: the GPU decodes the chunks, which cut images, and assembles the images "
                           "(compressed bytes cross PCIe, not 8-bit codes the readers would assemble)")
    elif wire == np.float32 and data.codes is not None:
        wire = np.dtype(data.codes)
        reasons["wire"] = ("its float32 values are 8-bit pixels (checked on the first images of each file, and "
                           "every value as it is read): a quarter of the bytes read and uploaded, the same float32 "
                           "values rebuilt on the GPU")
    elif wire == np.float32:
        reasons["wire"] = ("as stored" if stored == np.float32 else
                           f"{stored} converted and checked by the reader threads") + _not_codes(data, stored, as_stored)
    else:
        reasons["wire"] = f"{wire} as stored, converted to float32 on the GPU"

    # Read whole or streamed, and where compressed chunks are decoded
    streamed = streams(data, wire, budget, gpu_plan.STREAM_FROM) if streamed is None else streamed
    nbytes = n_all * data.image_bytes(wire)
    reasons["streamed"] = (f"{nbytes / 2**20:,.0f} MiB of images, past " + (
        f"the host budget ({budget / 2**20:,.0f} MiB, CNNINFER_HOST_BUDGET_MB)" if nbytes > budget else
        f"two blocks ({gpu_plan.STREAM_FROM / 2**20:.0f} MiB): reading, uploads and compute overlap")
        if streamed else f"{nbytes / 2**20:,.1f} MiB of images: read whole into page-locked memory, then run")
    decoding = ()
    if data.layout != "chunks" or not streamed:
        decode = "host" if data.layout == "chunks" else "none"
        reasons["decode"] = ("read whole: the reader threads decode the chunks" if data.layout == "chunks" else
                             "nothing to decode")
    elif decoding_mode == "host":
        decode = "host"
        # why auto decodes this file on the host: what the GPU declines of it, else the backend was
        # made for a file within the host budget (decode_mode)
        why = (options.decode == "auto" and data.source is not None
               and chunk_decode.declined(data.source, gpu_plan.wire_dtype(data.dtype), "auto"))
        reasons["decode"] = ("--decode host" if options.decode == "host" else f"by the reader threads: {why}" if why
                             else "by the reader threads: the file is within the host budget, where GPU decoding's "
                             "start-up outweighs its speed" if data.source is not None else "by the reader threads")
    else:
        why = (None if as_stored else "no file to decode" if data.source is None else  # (_gpu_decodes asked the same
               decoding_mode == "auto" and _host_first(data) or chunk_decode.unsupported(data.source, wire))  # of this wire)
        if why and decoding_mode == "gpu":
            raise InputError(f"{data.label}: --decode gpu: {why}")
        decode = "host" if why else "gpu"
        if not why:
            decoding = chunk_decode.plan(data.source.parts[0][1])
        reasons["decode"] = f"by the reader threads: {why}" if why else (
            f"on the GPU: the chunks are uploaded as stored ({data.filters})" + (
                ", each chunk's fletcher32 checked by the reader threads as they read it"
                if data.source.parts[0][1].summed else ""))

    # The algorithm and the precision
    algo, why = pipelines.choose(options.conv_algo, g, gpu.arch, options.precision)
    if algo is None:
        raise InputError(f"{model_path}: {why}; --conv-algo unroll runs any consistent shapes")
    if why:
        notices.append(why)
    if algo is not pipelines.Unroll:
        for name, value in (("--tile-width", options.tile_width), ("--gemm-algo", options.gemm_algo)):
            if value not in (None, "auto"):
                notices.append(f"cnninfer: {name} {value} has no effect: --conv-algo {algo.NAME} has no tiled GEMM "
                               "(it shapes --conv-algo unroll's)")
    by_default = algo is pipelines.FusedCertified and options.precision is None and options.conv_algo == AUTO
    shares = gpu_plan.split(n_all, len(devices), data.align if streamed else 1)
    n = max(hi - lo for lo, hi in shares)
    # At most a byte a pixel crosses PCIe (uint8, 8-bit codes, or chunks the GPU decodes: their
    # compressed bytes): the upload does not bound the run, so the certified pass's speed shows
    narrow = np.dtype(wire).itemsize == 1 or decode == "gpu"
    certified = algo is pipelines.FusedCertified and (not by_default or algo.certified_by_default(n, scores, narrow))
    algorithm = algo.NAME if certified or algo is not pipelines.FusedCertified else pipelines.FusedWarpgroup.NAME
    arch_words = f"{gpu.arch}" + (" (Hopper)" if gpu.arch.startswith("sm_9") else "")
    if options.conv_algo != AUTO:
        reasons["algorithm"] = f"--conv-algo {options.conv_algo}"
    elif options.precision == "certified" and why:
        reasons["algorithm"] = why.split(": ", 1)[-1]
    else:
        reasons["algorithm"] = f"the fastest algorithm that runs this model on {arch_words}"
    if certified and by_default:
        carried = "compressed chunks the GPU decodes" if decode == "gpu" else "a byte a pixel"
        reasons["precision"] = (f"certified by default: {n:,} images of {'8-bit codes' if np.dtype(wire).kind == 'V' else wire}"
                                f" ({carried}, {pipelines.CERTIFY_FROM:,} or more), {arch_words}, no --scores; "
                                "float16 where certified, the rest recomputed exactly: the same answers")
    elif certified:
        reasons["precision"] = "--precision certified" if options.precision else f"--conv-algo {algo.NAME}"
    elif by_default:
        missing = [what for what, ok in ((f"{pipelines.CERTIFY_FROM:,} images or more", n >= pipelines.CERTIFY_FROM),
                                         ("a byte a pixel (uint8, 8-bit codes, or chunks the GPU decodes)", narrow), ("no --scores", not scores)) if not ok]
        reasons["precision"] = ("exact: the default certifies runs of " + ", ".join(missing) +
                                " only (below, the exact path ends sooner)")
    else:
        why_not = pipelines.FusedCertified.available(g, gpu.arch)
        reasons["precision"] = ("--precision exact" if options.precision == "exact" else
                                f"exact: --conv-algo {algo.NAME}" if options.conv_algo != AUTO else
                                f"exact: fused-certified cannot run here ({why_not})")

    # The device memory: chunk, resident, the streamed ring
    facts = _pipeline_facts(algo, g, gpu, options)
    elems = int(np.prod(data.image_shape))
    wire_bytes = elems * np.dtype(wire).itemsize
    align = data.align if streamed else 1
    block_bytes, depth = ((decoding.block_bytes, chunk_decode.slots(gpu.free, decoding)) if decoding
                          else (gpu_plan.STREAM_BYTES, gpu_plan.RING_DEPTH))
    best = facts.chunk
    if streamed and facts.stream_chunk:  # a block a launch, a decoded block's (chunk_decode.Plan) too
        best = gpu_plan.streamed_chunk(facts.stream_chunk, wire_bytes, block_bytes)
    chunk, resident = gpu_plan.memory(n, gpu.free, options.streams, options.chunk,
                                      gpu_plan.aligned_chunk(best, align) if streamed else best, facts.scratch_floats,
                                      g.classes, wire_bytes, 4 * elems, streamed, block_bytes, depth)
    block, slots = gpu_plan.ring(n, chunk, streamed, wire_bytes, block_bytes, depth)
    if decoding and not resident:
        raise InputError(f"{data.label}: --decode gpu: the GPU has too little free memory for the decoded blocks")
    share = n * wire_bytes
    reasons["resident"] = ((f"a ring of {slots} blocks of {block:,} images on the device" if streamed else
                            f"{share / 2**20:,.1f} MiB of images") + f", within 40% of the {gpu.free / 2**30:,.1f} GiB free"
                           if resident else f"{share / 2**20:,.0f} MiB of images past 40% of the "
                           f"{gpu.free / 2**30:,.1f} GiB free: each stream uploads its chunk")
    reasons["chunk"] = ("--chunk" if options.chunk else
                        f"a host block a launch ({block:,} images)" if streamed and facts.stream_chunk else
                        f"{n:,} images over {options.streams} streams, at most {best:,} a launch")
    reasons["streams"] = "--streams" if options.streams != Options().streams else "the default"
    if len(devices) > 1:
        reasons["devices"] = f"the images split over {len(devices)} GPUs in contiguous shares of about {n:,}"
    return Plan("cuda", gpu.describe(), devices, n, tuple(data.image_shape), bool(scores), algorithm, algo.NAME,
                by_default, "certified" if certified else "exact", np.dtype(wire), _wire_name(wire), streamed, resident,
                decode, _layout(data), chunk, options.streams, block=block if streamed else 0, slots=slots,
                align=align, shares=tuple(shares), decoding=decoding, reasons=reasons, notices=tuple(notices))


def _pipeline_facts(algo, g, gpu, options):
    return _facts(algo, g, gpu.arch, options.fast_math, options.tile_width, options.gemm_algo, gpu.l2_bytes, gpu.sms)


@functools.lru_cache(maxsize=64)
def _facts(algo, g, arch, fast_math, tile_width, gemm_algo, l2_bytes, sms):
    """(CHUNK, STREAM_CHUNK or 0, scratch_floats) of algorithm `algo` built for geometry g as the
    backend builds it: the pipeline made on stand-in modules (nothing compiled or loaded)."""
    from .gpu import launch
    from .gpu.profile import NullProfiler

    build = launch.Build(arch, fast_math, tile_width, NullProfiler(), gemm_algo, l2_bytes, sms)
    try:
        pipeline, _ = launch.recorded(build, lambda b: algo(b, g))
    except ValueError as e:
        raise InputError(f"--conv-algo {algo.NAME}: {e}") from None
    return _PipelineFacts(pipeline.CHUNK, getattr(pipeline, "STREAM_CHUNK", 0), pipeline.scratch_floats)


@dataclass(frozen=True)
class _PipelineFacts:
    chunk: int
    stream_chunk: int
    scratch_floats: object


def for_backend(backend, model, x_shape, scores=False, wire=np.float32, streamed=False, source=None):
    """The plan of x_shape images of type `wire` (codes.py's for 8-bit codes) on `backend` with its
    own options, in memory or streamed as told: what a backend's direct callers (bench, tests)
    prepare. source: the DataSet a streamed run reads (its layout and chunks planned for)."""
    from .network import geometry

    wire = np.dtype(wire)
    if source is not None:
        data = Data.of(source)
    elif wire.kind == "V":  # 8-bit codes of float32 images
        data = Data(x_shape[0], tuple(x_shape[1:]), np.dtype(np.float32), wire)
    else:
        data = Data(x_shape[0], tuple(x_shape[1:]), wire)
    return make(data, geometry(model, tuple(x_shape), "data"), backend.description(), backend.options, scores,
                decoding_mode=backend.options.decode, devices=backend.devices, model_path=model.path,
                streamed=streamed)
