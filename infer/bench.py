"""`cnninfer bench`: validate every GPU algorithm against the NumPy reference, then time each in
one process on one GPU, beside the same network in PyTorch/cuDNN FP32 (TF32 off) when importable.

GPU time: CUDA events around the forward on device-resident images (warm-up, then the median of
`repeats`). End to end: host clock from page-locked host images to labels in host memory.
"""
import statistics
import time

import numpy as np

from . import engine, loader, reference
from .dataset import DataSet
from .reader import Reader, wait
from .errors import InputError
from .gpu.launch import TILE_WIDTHS
from .gpu.pipelines import ALGORITHMS

FP32_LANES_PER_SM = {(7, 0): 64, (7, 5): 64, (8, 0): 64, (8, 6): 128, (8, 7): 128, (8, 9): 128, (9, 0): 128}


def variants():
    """(algorithm, tile width) pairs: the tile width matters only where a tiled GEMM runs."""
    return [(a, tw) for a in ALGORITHMS for tw in (TILE_WIDTHS if a == "unroll" else (16,))]


def fp32_peak(gpu):
    import pycuda.driver as cuda

    attr = cuda.device_attribute
    sms = gpu.dev.get_attribute(attr.MULTIPROCESSOR_COUNT)
    clock_hz = gpu.dev.get_attribute(attr.CLOCK_RATE) * 1e3
    lanes = FP32_LANES_PER_SM.get(gpu.dev.compute_capability(), 128)
    return 2 * sms * lanes * clock_hz


def _median_events(enqueue, warmup, repeats):
    import pycuda.driver as cuda

    start, end = cuda.Event(), cuda.Event()
    times = []
    for i in range(warmup + repeats):
        start.record()  # legacy default stream: waits for, and is waited on by, the work streams
        enqueue()
        end.record()
        end.synchronize()
        if i >= warmup:
            times.append(end.time_since(start))
    return statistics.median(times)


def _median_host(fn, warmup, repeats):
    times = []
    for i in range(warmup + repeats):
        t = time.perf_counter()
        fn()
        if i >= warmup:
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def time_cnninfer(model, x_host_data, expected, algo, tile_width, streams, warmup, repeats):
    from .gpu.backend import CudaBackend

    b = CudaBackend(streams=streams, tile_width=tile_width, conv_algo=algo)
    try:
        x = b.host_buffers(x_host_data.shape, np.float32)[0]
        x[...] = x_host_data
        b.prepare(model, x.shape)
        labels, _ = b.forward(x)
        identical = int(np.count_nonzero(labels == expected))
        if identical < engine.MIN_AGREEMENT * len(x):
            raise InputError(f"bench: {algo} (tile {tile_width}) agrees with the reference on only "
                             f"{identical} of {len(x)} images; not timing it")
        run = b._run
        if run.x_dev is None:
            raise InputError(f"bench: {len(x)} images do not fit on the GPU at once; use a smaller N")
        gpu_ms = _median_events(lambda: b.enqueue(run), warmup, repeats)
        e2e_ms = _median_host(lambda: b.forward(x), warmup, repeats)
        return dict(name=f"cnninfer {algo}" + (f" tile {tile_width}" if algo == "unroll" else ""),
                    gpu_ms=gpu_ms, e2e_ms=e2e_ms, identical=identical, labels=labels)
    finally:
        b.close()


def time_torch(model, x_host, warmup, repeats):
    """The same network in PyTorch FP32, TF32 off (cuDNN convolutions), or None without torch."""
    try:
        import torch
    except ImportError:
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    F = torch.nn.functional
    dev = torch.device("cuda")
    w1 = torch.from_numpy(model.conv1).permute(3, 2, 0, 1).contiguous().to(dev)
    w2 = torch.from_numpy(model.conv2).permute(3, 2, 0, 1).contiguous().to(dev)
    f1, f2 = torch.from_numpy(model.fc1).to(dev), torch.from_numpy(model.fc2).to(dev)
    pinned = torch.from_numpy(x_host).pin_memory()

    def net(x):
        with torch.no_grad():
            a = F.avg_pool2d(F.relu(F.conv2d(x.permute(0, 3, 1, 2), w1)), 2)
            a = F.avg_pool2d(F.relu(F.conv2d(a, w2)), 2)
            return (F.relu(a.permute(0, 2, 3, 1).flatten(1) @ f1) @ f2).argmax(1)

    x_dev = pinned.to(dev)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for i in range(warmup + repeats):
        start.record()
        net(x_dev)
        end.record()
        end.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(end))
    e2e = _median_host(lambda: net(pinned.to(dev, non_blocking=True)).cpu(), warmup, repeats)
    labels = net(x_dev).cpu().numpy()
    return dict(name=f"PyTorch {torch.__version__} FP32 (cuDNN, TF32 off)", gpu_ms=statistics.median(times),
                e2e_ms=e2e, labels=labels)


def read_all(data_path, model, n=None):
    """The first n images of a data file as float32, checked."""
    data = DataSet.open([data_path], model, n)
    pool = Reader()
    try:
        x = np.empty((data.size,) + data.image_shape, np.float32)
        wait(data.submit_images(pool, 0, data.size, x, check=True))
        return x
    finally:
        pool.close()
        data.close()


def bench(data_path, model_path, n=None, streams=4, warmup=5, repeats=20):
    """Rows of the benchmark table, best first, and facts about the device."""
    from .gpu.device import Device

    model = loader.load_model(model_path)
    x = read_all(data_path, model, n)
    n = len(x)
    g = loader.geometry(model, x.shape)
    expected = np.concatenate([reference.forward(x[i:i + 512], model) for i in range(0, n, 512)])
    gpu = Device(0)
    try:
        peak, device, arch = fp32_peak(gpu), gpu.describe(), gpu.arch
    finally:
        gpu.close()
    rows = []
    for algo, tw in variants():
        if ALGORITHMS[algo].available(g, arch) is None:
            rows.append(time_cnninfer(model, x, expected, algo, tw, streams, warmup, repeats))
    torch_row = time_torch(model, x, warmup, repeats)
    if torch_row:
        torch_row["identical"] = int(np.count_nonzero(torch_row["labels"] == expected))
        rows.append(torch_row)
    flops = g.flops_per_image * n
    for r in rows:
        r.pop("labels")
        r.update(images_per_s=n / r["gpu_ms"] * 1e3, gflops=flops / r["gpu_ms"] / 1e6,
                 peak_share=flops / (r["gpu_ms"] * 1e-3) / peak,
                 vs_torch=torch_row["gpu_ms"] / r["gpu_ms"] if torch_row else None)
    rows.sort(key=lambda r: r["gpu_ms"])
    return dict(n=n, device=device, fp32_peak_tflops=peak / 1e12, mflop_per_image=g.flops_per_image / 1e6,
                warmup=warmup, repeats=repeats, streams=streams, rows=rows)


def table(result):
    lines = [f"{result['n']} images on {result['device']}; FP32 peak {result['fp32_peak_tflops']:.1f} TFLOP/s; "
             f"{result['mflop_per_image']:.2f} MFLOP/image; median of {result['repeats']} after {result['warmup']} warm-up",
             f"{'':44} {'GPU ms':>8} {'e2e ms':>8} {'images/s':>11} {'GFLOP/s':>9} {'% peak':>7} {'x PyTorch':>9} {'same':>6}"]
    for r in result["rows"]:
        ratio = f"{r['vs_torch']:9.2f}" if r["vs_torch"] else f"{'-':>9}"
        lines.append(f"{r['name']:44} {r['gpu_ms']:8.3f} {r['e2e_ms']:8.3f} {r['images_per_s']:11.0f} "
                     f"{r['gflops']:9.0f} {100 * r['peak_share']:6.1f}% {ratio} {r['identical']:6d}")
    return lines
