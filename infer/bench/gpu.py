"""`cnninfer bench`: validate every GPU algorithm against the NumPy reference, then time each in
one process on one GPU, beside the same network in PyTorch FP32 (TF32 off) when importable: eager
(cuDNN) and torch.compile (inductor) replayed as a CUDA graph, the fastest a user could deploy.

GPU time: CUDA events around the forward on device-resident images (warm-up, then the median of
`repeats`). End to end: host clock from page-locked host images to labels in host memory.
`random_case` makes a model and images of any geometry (He-initialized weights, uniform pixels).
"""
import re
import statistics
import time

import numpy as np

from ..data import codes, loader
from .. import network, reference
from ..data.dataset import DataSet
from ..data.reader import Reader, wait
from ..errors import InputError
from ..gpu.launch import GEMMS, gemm_runs_on
from ..gpu.pipelines import ALGORITHMS, default_path
from ..options import STREAMS

GEOMETRY = re.compile(r"^(\d+)x(\d+)x(\d+),(\d+):(\d+),(\d+):(\d+),(\d+)(?:,(\d+))?$")

FP32_LANES_PER_SM = {(7, 0): 64, (7, 5): 64, (8, 0): 64, (8, 6): 128, (8, 7): 128, (8, 9): 128, (9, 0): 128}


def variants(arch):
    """(algorithm, GEMM, tile width) of every variant that runs on arch: the GEMM and its tile
    matter only to unroll."""
    rows = []
    for algo, pipeline in ALGORITHMS.items():
        if pipeline.runs_on(arch):
            continue
        if algo != "unroll":
            rows.append((algo, None, None))
            continue
        for gemm, spec in GEMMS.items():
            if gemm_runs_on(gemm, arch) is None:
                rows += [(algo, gemm, tile) for tile in spec.tiles]
    return rows


def parse_geometry(spec):
    """(h, w, c, k1, c1, k2, c2, hidden, classes) of "HxWxC,K1:C1,K2:C2,HIDDEN[,CLASSES]", checked."""
    m = GEOMETRY.match(spec.replace(" ", ""))
    if not m:
        raise InputError(f"--random {spec!r}: expected HxWxC,K1:C1,K2:C2,HIDDEN[,CLASSES], e.g. 32x32x3,5:32,5:64,256")
    sizes = tuple(int(v) for v in m.groups()[:8]) + (int(m.group(9) or 10),)
    h, w, c, k1, c1, k2, c2, hidden, classes = sizes
    p2h, p2w = ((h - k1 + 1) // 2 - k2 + 1) // 2, ((w - k1 + 1) // 2 - k2 + 1) // 2
    if min(sizes) < 1 or p2h < 1 or p2w < 1:
        raise InputError(f"--random {spec!r}: the layers leave no output (or a size is 0)")
    return sizes


def random_case(spec, n, seed=0):
    """(model, images) for a geometry "HxWxC,K1:C1,K2:C2,HIDDEN[,CLASSES]" such as
    "32x32x3,5:32,5:64,256": He-initialized weights and uniform [0, 1) pixels, seeded."""
    h, w, c, k1, c1, k2, c2, hidden, classes = parse_geometry(spec)
    if n < 1:
        raise InputError(f"--random: N must be at least 1, got {n}")
    rng = np.random.default_rng(seed)
    p2h, p2w = ((h - k1 + 1) // 2 - k2 + 1) // 2, ((w - k1 + 1) // 2 - k2 + 1) // 2

    def he(shape, fan_in):
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)

    model = loader.model_from_arrays(dict(conv1=he((k1, k1, c, c1), k1 * k1 * c), conv2=he((k2, k2, c1, c2), k2 * k2 * c1),
                                          fc1=he((p2h * p2w * c2, hidden), p2h * p2w * c2), fc2=he((hidden, classes), hidden)),
                                     label=f"random {spec}")
    return model, rng.random((n, h, w, c), dtype=np.float32)


def fp32_peak(gpu):
    import pycuda.driver as cuda

    attr = cuda.device_attribute
    sms = gpu.dev.get_attribute(attr.MULTIPROCESSOR_COUNT)
    clock_hz = gpu.dev.get_attribute(attr.CLOCK_RATE) * 1e3
    lanes = FP32_LANES_PER_SM.get(gpu.dev.compute_capability(), 128)
    return 2 * sms * lanes * clock_hz


WARM_S = 0.3  # warm-up lasts at least this long, so the GPU's clocks have ramped up before timing


def _warm_up(fn, warmup, sync):
    t, i = time.perf_counter(), 0
    while i < warmup or time.perf_counter() - t < WARM_S:
        fn()
        sync()
        i += 1


def _median_events(enqueue, warmup, repeats):
    import pycuda.driver as cuda

    start, end = cuda.Event(), cuda.Event()
    _warm_up(enqueue, warmup, cuda.Context.synchronize)
    times = []
    for _ in range(repeats):
        start.record()  # legacy default stream: waits for, and is waited on by, the work streams
        enqueue()
        end.record()
        end.synchronize()
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


def time_cnninfer(model, x_host_data, expected, algo, gemm, tile_width, streams, warmup, repeats, packed=None):
    """A row: GPU and end-to-end ms of float32 images; with `packed`, (the codes wire, the images'
    8-bit codes) where they are codes (codes.py), also GPU and end to end as `cnninfer run` uploads
    a file of them."""
    from ..gpu.backend import CudaBackend
    from ..plan import for_backend

    b = CudaBackend(streams=streams, tile_width=tile_width, gemm_algo=gemm or "auto", conv_algo=algo)
    try:
        x = b.host_buffers(x_host_data.shape, np.float32)[0]
        x[...] = x_host_data
        b.prepare(model, for_backend(b, model, x.shape))
        labels, _ = b.forward(x)
        identical = int(np.count_nonzero(labels == expected))
        if identical < reference.MIN_AGREEMENT * len(x):
            raise InputError(f"bench: {algo} {gemm or ''} (tile {tile_width}) agrees with the reference on only "
                             f"{identical} of {len(x)} images; not timing it")
        if not b.resident:
            raise InputError(f"bench: {len(x)} images do not fit on the GPU at once; use a smaller N")
        gpu_ms = _median_events(b.enqueue_resident, warmup, repeats)
        e2e_ms = _median_host(lambda: b.forward(x), warmup, repeats)
        row = dict(name=f"cnninfer {algo}" + (f" {gemm} tile {tile_width}" if gemm else ""),
                   gpu_ms=gpu_ms, e2e_ms=e2e_ms, identical=identical, labels=labels)
        if packed is not None:
            wire, k = packed
            xc = b.host_buffers(k.shape, wire)[0]  # (x's buffer is freed)
            xc.view(np.uint8)[...] = k
            b.prepare(model, for_backend(b, model, xc.shape, wire=wire))
            if not np.array_equal(b.forward(xc)[0], labels):
                raise InputError(f"bench: {algo} labels images sent as 8-bit codes otherwise than as float32")
            row["e2e_codes_ms"] = _median_host(lambda: b.forward(xc), warmup, repeats)
            row["gpu_codes_ms"] = _median_events(b.enqueue_resident, warmup, repeats)
        return row
    finally:
        b.close()


def torch_network(model, dev):
    """The network in PyTorch FP32 on device `dev`, TF32 off: NHWC float32 images in, labels out
    (the PyTorch rows here, and the plain endpoint of bench --serve)."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    F = torch.nn.functional
    w1 = torch.from_numpy(model.conv1).permute(3, 2, 0, 1).contiguous().to(dev)
    w2 = torch.from_numpy(model.conv2).permute(3, 2, 0, 1).contiguous().to(dev)
    f1, f2 = torch.from_numpy(model.fc1).to(dev), torch.from_numpy(model.fc2).to(dev)

    def net(x):
        a = F.avg_pool2d(F.relu(F.conv2d(x.permute(0, 3, 1, 2), w1)), 2)
        a = F.avg_pool2d(F.relu(F.conv2d(a, w2)), 2)
        return (F.relu(a.permute(0, 2, 3, 1).flatten(1) @ f1) @ f2).argmax(1)

    return net


def time_torch(model, x_host, warmup, repeats, compiled=True):
    """The same network in PyTorch FP32, TF32 off: eager (cuDNN convolutions), and unless
    compiled=False torch.compile (inductor) captured in a CUDA graph and replayed. [] without torch."""
    try:
        import torch
    except ImportError:
        return []
    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    net = torch_network(model, dev)
    pinned = torch.from_numpy(x_host).pin_memory()

    def timed(fn, x_dev):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        _warm_up(lambda: fn(x_dev), warmup, torch.cuda.synchronize)
        times = []
        for _ in range(repeats):
            start.record()
            fn(x_dev)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)

    version = torch.__version__
    rows = []
    with torch.no_grad():
        x_dev = pinned.to(dev)
        rows.append(dict(name=f"PyTorch {version} eager (cuDNN, TF32 off)", gpu_ms=timed(net, x_dev),
                         e2e_ms=_median_host(lambda: net(pinned.to(dev, non_blocking=True)).cpu(), warmup, repeats),
                         labels=net(x_dev).cpu().numpy()))
        if compiled:
            fast = torch.compile(net, dynamic=False)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # compile and warm up off the capture's stream
                for _ in range(3):
                    fast(x_dev)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                labels_dev = fast(x_dev)

            def replay(x_new=None):
                if x_new is not None:
                    x_dev.copy_(x_new, non_blocking=True)
                graph.replay()
                return labels_dev

            rows.append(dict(name=f"PyTorch {version} compiled + CUDA graph", gpu_ms=timed(lambda x: graph.replay(), x_dev),
                             e2e_ms=_median_host(lambda: replay(pinned).cpu(), warmup, repeats),
                             labels=replay().cpu().numpy()))
    return rows


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


def bench(data_path, model_path, n=None, streams=STREAMS, warmup=5, repeats=20, random=None, torch_compile=True):
    """Rows of the benchmark table, best first, and facts about the device: on the first n images
    of a data file, or (random: a geometry, see random_case) on n random images and weights."""
    if random:
        model, x = random_case(random, n or 10000)
    else:
        model = loader.load_model(model_path)
        x = read_all(data_path, model, n)
    return bench_arrays(model, x, streams, warmup, repeats, torch_compile)


def bench_arrays(model, x, streams=STREAMS, warmup=5, repeats=20, torch_compile=True):
    from ..gpu.device import Device

    n = len(x)
    g = network.geometry(model, x.shape)
    expected = np.concatenate([reference.forward(x[i:i + 512], model) for i in range(0, n, 512)])
    gpu = Device(0)
    try:
        peak, device, arch = fp32_peak(gpu), gpu.describe(), gpu.arch
    finally:
        gpu.close()
    rows, default = [], default_path(g, arch, n)
    packed = codes.packed(x)
    # the default where the images travel a byte a pixel, as `cnninfer run` sends a file of codes
    narrow_default = default_path(g, arch, n, narrow=True)
    for algo, gemm, tile in variants(arch):
        if ALGORITHMS[algo].available(g, arch) is None:
            # (unroll has a row per GEMM and tile)
            is_default, narrow = (d is ALGORITHMS[algo] and gemm is None for d in (default, narrow_default))
            rows.append(time_cnninfer(model, x, expected, algo, gemm, tile, streams, warmup, repeats,
                                      packed if narrow else None))
            if is_default:
                rows[-1]["name"] += " (default)"
    torch_rows = time_torch(model, x, warmup, repeats, torch_compile)
    for r in torch_rows:
        r["identical"] = int(np.count_nonzero(r["labels"] == expected))
    rows += torch_rows
    eager = torch_rows[0]["gpu_ms"] if torch_rows else None
    best = min(r["gpu_ms"] for r in torch_rows) if torch_rows else None
    flops = g.flops_per_image * n
    for r in rows:
        r.pop("labels")
        r.update(images_per_s=n / r["gpu_ms"] * 1e3, gflops=flops / r["gpu_ms"] / 1e6,
                 peak_share=flops / (r["gpu_ms"] * 1e-3) / peak,
                 vs_eager=eager / r["gpu_ms"] if eager else None, vs_best=best / r["gpu_ms"] if best else None)
    rows.sort(key=lambda r: r["gpu_ms"])
    return dict(n=n, model=model.path, geometry=g.__dict__, device=device, fp32_peak_tflops=peak / 1e12,
                mflop_per_image=g.flops_per_image / 1e6, warmup=warmup, repeats=repeats, streams=streams, rows=rows)


def table(result):
    lines = [f"{result['n']} images, {result['model']}, on {result['device']}; FP32 peak "
             f"{result['fp32_peak_tflops']:.1f} TFLOP/s; {result['mflop_per_image']:.2f} MFLOP/image; "
             f"median of {result['repeats']} after {result['warmup']} warm-up",
             f"{'':46} {'GPU ms':>8} {'e2e ms':>8} {'images/s':>11} {'GFLOP/s':>9} {'% peak':>7} "
             f"{'x eager':>8} {'x best PT':>9} {'same':>6}"]
    for r in result["rows"]:
        ratios = "".join(f"{r[k]:{w}.2f}" if r[k] else f"{'-':>{w}}" for k, w in (("vs_eager", 9), ("vs_best", 10)))
        lines.append(f"{r['name']:46} {r['gpu_ms']:8.3f} {r['e2e_ms']:8.3f} {r['images_per_s']:11.0f} "
                     f"{r['gflops']:9.0f} {100 * r['peak_share']:6.1f}%{ratios} {r['identical']:6d}")
    for r in result["rows"]:
        if "e2e_codes_ms" in r:
            lines.append(f"{r['name']}: GPU {r['gpu_codes_ms']:.3f} ms, e2e {r['e2e_codes_ms']:.3f} ms with the images "
                         "uploaded as their 8-bit codes, as `cnninfer run` uploads a file of them and the default "
                         "then runs (conv1 from the codes; the table: as float32, as PyTorch's rows)")
    return lines
