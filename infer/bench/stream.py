"""`cnninfer bench --stream`: how close a streamed run over a large file comes to its limits, in one
process: the raw parallel read of the same bytes into page-locked memory (the reader's ceiling),
the GPU on resident images (the compute ceiling), and `cnninfer run` itself (streamed: reading,
upload and compute overlapped), each in images/s, with the ratios."""
import os
import time

import numpy as np

from ..data import codes, loader
from .. import session
from ..data.dataset import DataSet
from ..data.reader import Reader, wait


def raw_read(data_path, model, readers, block):
    """Images/s reading every image of the file, in its stored type, into a ring of 4 page-locked
    blocks on `readers` threads (no compute, no checks), as the streamed run reads them (whole
    chunks left shuffled where the GPU unshuffles them; float32 images of 8-bit pixels packed to
    their codes): the reader's ceiling; and its layout."""
    import pycuda.driver as cuda

    from ..gpu import shuffled
    from ..gpu.backend import CudaBackend
    from ..gpu.device import Device

    gpu = Device(0)  # page-locked memory needs a context
    data = DataSet.open([data_path], model)
    pool = Reader(readers)
    block = max(data.align, block // data.align * data.align)  # whole chunks, as the run's blocks
    wire = data.codes_wire() or data.dtype or np.float32
    buffers = [cuda.pagelocked_empty((block,) + data.image_shape, wire) for _ in range(4)]
    kept = shuffled.unsupported(data, CudaBackend.wire_dtype(data.dtype), pool.native) is None
    source = shuffled.Source(data) if kept else data
    try:
        t = time.perf_counter()
        inflight = []
        for i, lo in enumerate(range(0, data.size, block)):
            if len(inflight) == len(buffers):
                wait(inflight.pop(0))
            hi = min(data.size, lo + block)
            inflight.append(source.submit_images(pool, lo, hi, buffers[i % len(buffers)][:hi - lo], check=False))
        for f in inflight:
            wait(f)
        return data.size / (time.perf_counter() - t), data.kind + (", left shuffled" if kept else "") + (
            ", as 8-bit codes" if wire in codes.WIRES else "")
    finally:
        pool.close()
        data.close()
        for b in buffers:
            b.base.free()
        gpu.close()


def gpu_resident(data_path, model, n, conv_algo, warmup=3, repeats=20):
    """Images/s of the GPU alone on n images already on it (CUDA events, median)."""
    from .gpu import _median_events, read_all
    from ..gpu.backend import CudaBackend
    from ..plan import for_backend

    x = read_all(data_path, model, n)
    b = CudaBackend(conv_algo=conv_algo)
    try:
        host = b.host_buffers(x.shape, np.float32)[0]
        host[...] = x
        b.prepare(model, for_backend(b, model, x.shape))
        b.forward(host)
        ms = _median_events(b.enqueue_resident, warmup, repeats)
        return len(x) / ms * 1e3
    finally:
        b.close()


def stream_bench(data_path, model_path, readers=None, devices=None, conv_algo="auto", resident_images=200_000):
    from ..gpu import create as create_cuda

    model = loader.load_model(model_path)
    rows = {}
    decodes, auto_gpu = gpu_decodes(data_path, model)
    # One clear line when there is no usable GPU; the process's first context, so with the hardware
    # queues decoding on the GPU wants (the driver takes their number once)
    create_cuda(chunk=None, decode="gpu" if decodes else "host").close()
    rate, layout = raw_read(data_path, model, readers, 8192)
    rows["raw parallel read (page-locked ring)"] = rate
    rows["GPU alone, images resident"] = gpu_resident(data_path, model, None if _size(data_path, model) <= resident_images
                                                      else resident_images, conv_algo)
    budget = os.environ.get("CNNINFER_HOST_BUDGET_MB")
    os.environ["CNNINFER_HOST_BUDGET_MB"] = "0"  # stream whatever the file's size
    try:
        # The host's decoding where the GPU decodes the file too
        r = session.run(data_path, model, backend="cuda", readers=readers, devices=devices, conv_algo=conv_algo,
                        decode="host" if decodes else "auto")
        rows["cnninfer run --decode host" if decodes else "cnninfer run (streamed)"] = r.n / r.timing["forward"] * 1e3
        if decodes:  # against the chunks decoded on the GPU
            gpu = session.run(data_path, model, backend="cuda", readers=readers, devices=devices,
                              conv_algo=conv_algo, decode="gpu")
            if (gpu.predictions != r.predictions).any():
                raise AssertionError(f"{data_path}: decoding on the host and on the GPU gave different predictions")
            rows["cnninfer run --decode gpu"] = gpu.n / gpu.timing["forward"] * 1e3
    finally:
        if budget is None:
            os.environ.pop("CNNINFER_HOST_BUDGET_MB")
        else:
            os.environ["CNNINFER_HOST_BUDGET_MB"] = budget
    default = ("cnninfer run --decode gpu" if auto_gpu else "cnninfer run --decode host" if decodes
               else "cnninfer run (streamed)")
    return dict(data=str(data_path), n=r.n, correct=r.correct, layout=layout, readers=r.reader["threads"],
                device=r.device, timing_ms=r.timing, rates=rows, default=default)


def gpu_decodes(data_path, model):
    """(whether --decode gpu can stream this file, whether --decode auto decodes it on the GPU as
    well: not where the codec leaves it to the reader threads, chunk_decode.host_by_default)."""
    from ..gpu import chunk_decode
    try:
        from ..gpu.backend import CudaBackend
    except ImportError:  # no PyCUDA: gpu.create says so in one line
        return False, False
    data = DataSet.open([data_path], model)
    try:
        if chunk_decode.unsupported(data, CudaBackend.wire_dtype(data.dtype)) is not None:
            return False, False
        return True, chunk_decode.host_by_default(data) is None
    finally:
        data.close()


def _size(data_path, model):
    data = DataSet.open([data_path], model)
    try:
        return data.size
    finally:
        data.close()


def table(result):
    rates = result["rates"]
    run = rates[result["default"]]  # what --decode auto runs
    lines = [f"{result['data']}: {result['n']} images ({result['layout']}, {result['readers']} reader threads), "
             f"{result['correct']} correct; {result['device']}",
             f"{'':50} {'images/s':>12} {'run / this':>11}"]
    for name, rate in rates.items():
        name += " (the default)" if name == result["default"] and len(rates) > 3 else ""
        lines.append(f"{name:50} {rate:12,.0f} {run / rate:11.2f}")
    t = result["timing_ms"]
    lines.append(f"forward {t['forward']:.0f} ms; reader threads busy {t.get('read', 0):.0f} ms on average; "
                 f"compute waited {t.get('wait', 0):.0f} ms for reads")
    return lines
