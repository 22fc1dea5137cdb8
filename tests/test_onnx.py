"""`cnninfer export-onnx`: the graph onnxruntime runs gives the command line's predictions (and
scores within float tolerance: another summation order), on the ECE408 model, the bundled one,
and random weights of an odd geometry."""
import h5py
import numpy as np
import pytest

import infer
from infer.data import loader
from infer import reference
from tests.conftest import REPO, invoke

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")


def run_onnx(path, x):
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    scores, labels = s.run(["scores", "labels"], {"x": x})
    return scores, labels


@pytest.mark.parametrize("data,model,count", [
    ("testfull.hdf5", "model.hdf5", 10000),
    (None, None, 1000),  # the bundled model on the bundled sample
])
def test_onnxruntime_gives_the_command_lines_predictions(ece408, tmp_path, data, model, count):
    data = ece408 / data if data else REPO / "models" / "mnist-sample.hdf5"
    model = ece408 / model if model else REPO / "models" / "cnninfer-mnist.hdf5"
    out = tmp_path / "model.onnx"
    r = invoke("export-onnx", model, out)
    assert r.exit_code == 0, r.stderr
    assert "x (N, 28, 28, 1) float32 NHWC" in r.stderr
    assert onnx.load(str(out)).ir_version == 7  # what runtimes back to onnxruntime 1.6 read
    with h5py.File(data) as f:
        x = f["x"][()]
    scores, labels = run_onnx(out, x)
    run = infer.run(data, model, backend="cpu", scores=True)
    assert len(labels) == count and labels.dtype == np.int64
    assert (labels == run.predictions).all()
    np.testing.assert_allclose(scores, run.scores, rtol=1e-4, atol=1e-4)


def test_an_odd_geometry_matches_the_reference(tmp_path, rng):
    he = lambda shape, fan: (rng.standard_normal(shape) * np.sqrt(2 / fan)).astype(np.float32)
    m = loader.model_from_arrays({"conv1": he((3, 3, 3, 5), 27), "conv2": he((5, 5, 5, 7), 125),
                                  "fc1": he((3 * 2 * 7, 11), 42), "fc2": he((11, 7), 11)}, "random")
    from infer import onnx_export

    out = tmp_path / "odd.onnx"
    onnx_export.export(m, out, (23, 19, 3))  # conv 21x17 -> pool 10x8 -> conv 6x4 -> pool 3x2: 3*2*7 = 42
    x = rng.standard_normal((37, 23, 19, 3)).astype(np.float32)
    scores, labels = run_onnx(out, x)
    np.testing.assert_allclose(scores, reference.scores(x, m), rtol=1e-4, atol=1e-4)
    assert (labels == reference.forward(x, m)).all()


def test_bad_arguments_are_one_line_and_nothing_written(ece408, tmp_path):
    r = invoke("export-onnx", ece408 / "model.hdf5", tmp_path / "model.txt")
    assert r.exit_code == 2 and "written as .onnx" in r.stderr
    r = invoke("export-onnx", tmp_path / "none.hdf5", tmp_path / "m.onnx")
    assert r.exit_code == 2 and "no such file" in r.stderr and r.stderr.count("\n") == 1
    assert not list(tmp_path.iterdir())


def test_the_cpu_bench_compares_with_onnxruntime(ece408):
    import json

    r = invoke("bench", "--backend", "cpu", ece408 / "test100.hdf5", ece408 / "model.hdf5", "--repeats", "2", "--json")
    assert r.exit_code == 0, r.stderr
    rows = {row["name"].split(" ")[0]: row for row in json.loads(r.stdout)["rows"]}
    assert set(rows) == {"cnninfer", "onnxruntime", "NumPy"}
    assert all(row["identical"] == 100 and row["median_s"] > 0 for row in rows.values())
    # The ratio is onnxruntime's median over each row's own, and each median lies within its rounds
    for row in rows.values():
        assert row["vs_onnxruntime"] == pytest.approx(rows["onnxruntime"]["median_s"] / row["median_s"])
        assert row["min_s"] <= row["median_s"] <= row["max_s"]


def test_the_cpu_bench_takes_random_geometries():
    import json

    r = invoke("bench", "--backend", "cpu", "--random", "19x23x3,3:20,4:36,50,7", "40", "--repeats", "1", "--json")
    assert r.exit_code == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["n"] == 40 and result["geometry"] == "19x23x3,3:20,4:36,50,7"
    assert all(row["identical"] == 40 for row in result["rows"])
    r = invoke("bench", "--backend", "cpu", "--random", "19x23x3,3:20,4:36,50,7", "data.h5", "40")
    assert r.exit_code == 2 and "takes only N" in r.stderr


def test_the_cold_cpu_bench_runs_both_processes(ece408):
    import json

    r = invoke("bench", "--backend", "cpu", "--cold", ece408 / "test100.hdf5", ece408 / "model.hdf5", "--repeats", "1",
               "--json")
    assert r.exit_code == 0, r.stderr
    rows = json.loads(r.stdout)["rows"]
    assert [row["correct"] for row in rows] == [95, 95] and all(row["median_s"] > 0 for row in rows)
    r = invoke("bench", "--cold", ece408 / "test100.hdf5", ece408 / "model.hdf5")
    assert r.exit_code == 2 and "--backend cpu" in r.stderr
