"""`cnninfer bench --backend cpu`: cnninfer's CPU path beside onnxruntime (the same network as an
ONNX graph, every graph optimisation, a thread per core; when installed) and the plain NumPy
reference, on the same float32 images in memory, alternated round by round; medians, the ratio to
onnxruntime, and how many predictions equal the reference's. With --cold: whole processes, as a
user runs them (`cnninfer run --backend cpu` against a plain onnxruntime script)."""
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from .. import env, reference
from ..errors import InputError


def contenders(model, image_shape):
    """(name, fn(x) -> labels) of what is compared; the cnninfer Session is closed by the caller."""
    from ..session import Session

    session = Session(model, "cpu")
    session.predict(np.zeros((1, *image_shape), np.float32))  # builds the backend, so its device is known
    how = "native" if "native" in session.device else "NumPy"
    out = [(f"cnninfer cpu ({how}, Session.predict)", session.predict)]
    try:
        import onnxruntime as ort

        from ..onnx_export import graph

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = env.cores()
        # Its threads spin after a run by default, taking the cores from whatever runs next in the
        # alternation (measured: cnninfer 0.342 s after it, 0.301 s alone); without spinning
        # onnxruntime itself ran faster too (0.347 -> 0.323 s), on 2 cores
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        ort_session = ort.InferenceSession(graph(model, image_shape).SerializeToString(), options,
                                           providers=["CPUExecutionProvider"])
        out.append((f"onnxruntime {ort.__version__} (same graph, {options.intra_op_num_threads} threads)",
                    lambda x: ort_session.run(["labels"], {"x": x})[0]))
    except ImportError:
        pass
    out.append(("NumPy reference (one call)", lambda x: reference.forward(x, model)))
    return session, out


RANDOM_N = 1000  # --random's default: the larger geometries cost 100x an MNIST image


SETTLE_S = 0.3  # a pause before each timed call: the previous contender's threads go idle


def cpu_bench(data_path, model_path, n=None, warmup=1, repeats=5, random=None, settle_s=SETTLE_S):
    """The comparison on the first n images of a data file, or (random: a geometry, see
    bench.random_case) on n random images and weights. Each timed call starts settle_s after the
    previous one ended: OpenBLAS's threads (the NumPy reference's) spin on the cores for a while
    after a call, and on 16 cores they slowed the contender timed next by 1.3-1.4x."""
    from ..data import loader
    from .gpu import random_case, read_all

    if random:
        model, x = random_case(random, n or RANDOM_N)
    else:
        model = loader.load_model(model_path)
        x = read_all(data_path, model, n)
    session, runs = contenders(model, x.shape[1:])
    try:
        expected = np.concatenate([reference.forward(x[i:i + 512], model) for i in range(0, len(x), 512)])
        times = {name: [] for name, _ in runs}
        same = {}
        for name, fn in runs:
            for _ in range(warmup):
                same[name] = int((np.asarray(fn(x)) == expected).sum())
        for _ in range(repeats):  # alternated: each round runs every contender once
            for name, fn in runs:
                time.sleep(settle_s)
                t = time.perf_counter()
                fn(x)
                times[name].append(time.perf_counter() - t)
    finally:
        session.close()
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    peer = next((m for name, m in medians.items() if name.startswith("onnxruntime")), None)
    rows = [dict(name=name, median_s=medians[name], min_s=min(times[name]), max_s=max(times[name]),
                 images_per_s=len(x) / medians[name], vs_onnxruntime=peer / medians[name] if peer else None,
                 identical=same.get(name)) for name, _ in runs]
    return dict(n=len(x), geometry="x".join(map(str, x.shape[1:])) + f",{model.conv1.shape[0]}:{model.conv1.shape[3]},"
                f"{model.conv2.shape[0]}:{model.conv2.shape[3]},{model.fc1.shape[1]},{model.fc2.shape[1]}",
                device=f"{platform.machine()}, {env.cores()} cores, NumPy {np.__version__}", repeats=repeats,
                warmup=warmup, rows=rows)


def table(result):
    lines = [f"{result['n']} images ({result['geometry']}) on the CPU ({result['device']}); median of "
             f"{result['repeats']} alternated rounds after {result['warmup']} warm-up",
             f"{'':52} {'median s':>9} {'min s':>7} {'max s':>7} {'images/s':>9} {'x onnxrt':>9} {'same':>6}"]
    for r in result["rows"]:
        ratio = f"{r['vs_onnxruntime']:9.2f}" if r["vs_onnxruntime"] else f"{'-':>9}"
        lines.append(f"{r['name']:52} {r['median_s']:9.3f} {r['min_s']:7.3f} {r['max_s']:7.3f} "
                     f"{r['images_per_s']:9.0f} {ratio} {r['identical']:6d}")
    return lines + spread_notes(result["rows"])


SPREAD = 0.10  # rounds further apart than this (max / min - 1) are said to disagree


def spread_notes(rows):
    """A line for each row whose rounds disagree by more than SPREAD: its ratio is then as
    uncertain as that (a shared machine's other load moves them)."""
    return [f"note: {r['name']}'s rounds disagree by {r['max_s'] / r['min_s'] - 1:.0%} (min {r['min_s']:.3f} s, "
            f"max {r['max_s']:.3f} s): more --repeats, or a quieter machine, for a firm ratio"
            for r in rows if r["max_s"] > r["min_s"] * (1 + SPREAD)]


# What a user of onnxruntime writes to do what `cnninfer run` does: read the file, run, count.
ORT_SCRIPT = """
import sys, h5py, numpy as np, onnxruntime as ort
with h5py.File(sys.argv[1], "r") as f:
    x, y = f["x"][:].astype(np.float32), f["y"][:]
session = ort.InferenceSession(sys.argv[2], providers=["CPUExecutionProvider"])
labels = session.run(["labels"], {"x": x})[0]
print(int((labels == y.argmax(axis=1)).sum()))
"""


def _timed(command):
    t = time.perf_counter()
    r = subprocess.run(command, capture_output=True, text=True)
    took = time.perf_counter() - t
    if r.returncode:
        raise InputError(f"bench --cold: {' '.join(command[:4])} ... failed: {(r.stderr or r.stdout).strip()[-300:]}")
    return took, r.stdout


def cold_bench(data_path, model_path, repeats=5):
    """Wall time of whole processes, alternated: `cnninfer run --backend cpu DATA MODEL` and a cold
    onnxruntime script on the exported graph; both must count the same correct answers."""
    from ..data import loader
    from ..onnx_export import export

    try:
        import onnxruntime  # noqa: F401  (the script's)
    except ImportError:
        raise InputError("bench --cold compares with onnxruntime: pip install onnxruntime") from None
    model = loader.load_model(model_path)
    with tempfile.TemporaryDirectory() as tmp:
        graph = Path(tmp) / "model.onnx"
        data = loader.open_data(data_path, model)
        shape = data.x.shape[1:]
        data.close()
        export(model, graph, shape)
        runs = [("cnninfer run --backend cpu", [sys.executable, "-m", "infer", "run", str(data_path), str(model_path),
                                                 "--backend", "cpu", "--json"],
                 lambda out: json.loads(out)["correct"]),
                (f"onnxruntime script ({onnxruntime.__version__})", [sys.executable, "-c", ORT_SCRIPT, str(data_path),
                                                                     str(graph)], int)]
        times, correct = {name: [] for name, _, _ in runs}, {}
        for round_ in range(repeats + 1):  # the first round warms the page cache and the build cache
            for name, command, count in runs:
                took, out = _timed(command)
                correct[name] = count(out)
                if round_:
                    times[name].append(took)
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    peer = medians[runs[1][0]]
    rows = [dict(name=name, median_s=medians[name], min_s=min(times[name]), max_s=max(times[name]),
                 vs_onnxruntime=peer / medians[name], correct=correct[name]) for name, _, _ in runs]
    return dict(data=str(data_path), device=f"{platform.machine()}, {env.cores()} cores", repeats=repeats, rows=rows)


def cold_table(result):
    lines = [f"cold processes on {result['data']} ({result['device']}); median of {result['repeats']} alternated rounds "
             "after 1 warm-up", f"{'':40} {'median s':>9} {'min s':>7} {'max s':>7} {'x onnxrt':>9} {'correct':>8}"]
    for r in result["rows"]:
        lines.append(f"{r['name']:40} {r['median_s']:9.3f} {r['min_s']:7.3f} {r['max_s']:7.3f} "
                     f"{r['vs_onnxruntime']:9.2f} {r['correct']:8d}")
    return lines + spread_notes(result["rows"])
