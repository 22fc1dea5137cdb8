"""`cnninfer bench --backend cpu`: cnninfer's CPU path beside onnxruntime (the same network as an
ONNX graph, every graph optimisation, a thread per core; when installed) and the plain NumPy
reference, on the same float32 images in memory, alternated round by round; medians, the ratio to
onnxruntime, and how many predictions equal the reference's."""
import os
import platform
import statistics
import time

import numpy as np

from . import reference


def contenders(model, image_shape):
    """(name, fn(x) -> labels) of what is compared; the cnninfer Session is closed by the caller."""
    from .session import Session

    session = Session(model, "cpu")
    out = [("cnninfer cpu (Session.predict)", session.predict)]
    try:
        import onnxruntime as ort

        from .onnx_export import graph

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = os.cpu_count() or 1
        ort_session = ort.InferenceSession(graph(model, image_shape).SerializeToString(), options,
                                           providers=["CPUExecutionProvider"])
        out.append((f"onnxruntime {ort.__version__} (same graph, {options.intra_op_num_threads} threads)",
                    lambda x: ort_session.run(["labels"], {"x": x})[0]))
    except ImportError:
        pass
    out.append(("NumPy reference (one call)", lambda x: reference.forward(x, model)))
    return session, out


def cpu_bench(data_path, model_path, n=None, warmup=1, repeats=5):
    from . import loader
    from .bench import read_all

    model = loader.load_model(model_path)
    x = read_all(data_path, model, n)
    session, runs = contenders(model, x.shape[1:])
    try:
        expected = reference.forward(x, model)
        times = {name: [] for name, _ in runs}
        same = {}
        for name, fn in runs:
            for _ in range(warmup):
                same[name] = int((np.asarray(fn(x)) == expected).sum())
        for _ in range(repeats):  # alternated: each round runs every contender once
            for name, fn in runs:
                t = time.perf_counter()
                fn(x)
                times[name].append(time.perf_counter() - t)
    finally:
        session.close()
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    peer = next((m for name, m in medians.items() if name.startswith("onnxruntime")), None)
    rows = [dict(name=name, median_s=medians[name], min_s=min(times[name]), images_per_s=len(x) / medians[name],
                 vs_onnxruntime=peer / medians[name] if peer else None, identical=same.get(name))
            for name, _ in runs]
    return dict(n=len(x), device=f"{platform.machine()}, {os.cpu_count()} cores, NumPy {np.__version__}",
                repeats=repeats, warmup=warmup, rows=rows)


def table(result):
    lines = [f"{result['n']} images on the CPU ({result['device']}); median of {result['repeats']} alternated "
             f"rounds after {result['warmup']} warm-up",
             f"{'':52} {'median s':>9} {'min s':>7} {'images/s':>9} {'x onnxrt':>9} {'same':>6}"]
    for r in result["rows"]:
        ratio = f"{r['vs_onnxruntime']:9.2f}" if r["vs_onnxruntime"] else f"{'-':>9}"
        lines.append(f"{r['name']:52} {r['median_s']:9.3f} {r['min_s']:7.3f} {r['images_per_s']:9.0f} {ratio} "
                     f"{r['identical']:6d}")
    return lines
