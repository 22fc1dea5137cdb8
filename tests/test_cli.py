"""The command line, in-process (CliRunner) and once as the installed console script."""
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

import infer
from tests.conftest import invoke


def files(d, name="test100.hdf5"):
    return d / name, d / "model.hdf5"


def test_run_prints_the_original_format(ece408):
    r = invoke("run", *files(ece408), "--backend", "cpu")
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "input dimensions = 100 x 28 x 28 x 1"
    assert lines[1].startswith("Done with 100 queries in elapsed = ")
    assert lines[1].endswith(" milliseconds. Correctness: 0.95")


def test_n_takes_the_first_images(ece408):
    r = invoke("run", *files(ece408), 10, "--backend", "cpu", "--json")
    d = json.loads(r.stdout)
    assert (d["n"], d["correct"], d["input_shape"]) == (10, 10, [10, 28, 28, 1])


def test_json_has_the_result_and_timing(ece408):
    r = invoke("run", *files(ece408), "--backend", "cpu", "--json")
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert (d["n"], d["correct"], d["accuracy"], d["backend"]) == (100, 95, 0.95, "cpu")
    assert set(d["timing_ms"]) == {"load", "prepare", "forward"}
    assert d["elapsed_ms"] == d["timing_ms"]["forward"] > 0
    assert d["device"].startswith("CPU") and "recomputed" not in d  # only a certified GPU run counts
    assert d["precision"] == "exact"


def test_precision_takes_exact_or_certified(ece408):
    r = invoke("run", *files(ece408), "--backend", "cpu", "--precision", "half")
    assert r.exit_code == 2 and "'half' is not one of 'exact', 'certified'" in r.stderr
    r = invoke("run", *files(ece408), "--backend", "cpu", "--precision", "certified", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["correct"] == 95
    for precision, algo, words in [("exact", "fused-certified", "is the certified float16 path"),
                                   ("certified", "fused-wgmma", "--conv-algo fused-wgmma computes exactly")]:
        r = invoke("run", *files(ece408), "--backend", "cpu", "--precision", precision, "--conv-algo", algo)
        assert r.exit_code == 2 and words in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_auto_without_cuda_falls_back_with_one_notice(ece408, monkeypatch):
    from infer import gpu
    from infer.errors import BackendUnavailable

    def unavailable(**_):
        raise BackendUnavailable("no GPU here")

    monkeypatch.setattr(gpu, "create", unavailable)
    r = invoke("run", *files(ece408, "test2.hdf5"))
    assert r.exit_code == 0
    assert r.stderr.strip().splitlines() == ["cnninfer: CUDA backend not usable (no GPU here); using the CPU backend"]
    r = invoke("run", *files(ece408, "test2.hdf5"), "--backend", "cuda")
    assert r.exit_code == 2
    assert r.stderr.strip().splitlines() == ["Error: no GPU here"]


@pytest.mark.parametrize("expect,tolerance,code", [("0.95", "0", 0), ("0.9", "0.06", 0), ("0.96", "0", 1), ("0.9", "0.01", 1)])
def test_expect_accuracy(ece408, expect, tolerance, code):
    r = invoke("run", *files(ece408), "--backend", "cpu", "--expect-accuracy", expect, "--tolerance", tolerance)
    assert r.exit_code == code
    if code:
        assert "differs from the expected" in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("suffix", [".npy", ".csv"])
def test_predictions_file(ece408, tmp_path, suffix):
    out = tmp_path / ("p" + suffix)
    r = invoke("run", *files(ece408), "--backend", "cpu", "--predictions", out)
    assert r.exit_code == 0, r.stderr
    labels = np.load(out) if suffix == ".npy" else np.loadtxt(out, skiprows=1, dtype=np.int64)
    assert labels.shape == (100,) and labels.dtype == np.int64
    assert (labels == infer.run(*files(ece408), backend="cpu").predictions).all()
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # no temporary file left


def test_predictions_not_written_when_the_run_fails(ece408, tmp_path):
    out = tmp_path / "p.npy"
    r = invoke("run", ece408 / "test10.hdf5", ece408 / "model.hdf5", 11, "--predictions", out)
    assert r.exit_code == 2
    assert list(tmp_path.iterdir()) == []


def test_python_dash_m_and_help_work_without_a_gpu():
    r = subprocess.run([sys.executable, "-m", "infer", "run", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--backend" in r.stdout


def test_console_script(ece408):
    exe = shutil.which("cnninfer")
    if exe is None:
        pytest.skip("the cnninfer console script is not installed (pip install -e .)")
    r = subprocess.run([exe, "run", *map(str, files(ece408, "test10.hdf5")), "--backend", "cpu"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1].endswith("Correctness: 1")


def test_profile_on_the_cpu_says_there_is_none(ece408):
    r = invoke("run", *files(ece408, "test2.hdf5"), "--backend", "cpu", "--profile")
    assert r.exit_code == 0 and r.stdout.splitlines()[-1] == "(no GPU profile: the CPU backend ran)"


def test_check_compares_with_the_reference(ece408, monkeypatch):
    r = invoke("run", *files(ece408), "--backend", "cpu", "--check")
    assert r.exit_code == 0 and r.stderr.strip() == "check: 100 of 100 predictions equal the NumPy reference's (95 correct there)"
    from infer import session

    real, calls = session.run, []

    def off_by_one(*a, **k):  # the run under test (the first call) gets image 0 wrong
        result = real(*a, **k)
        if not calls:
            result.predictions[0] = (result.predictions[0] + 1) % 10
        calls.append(k["backend"])
        return result

    monkeypatch.setattr(session, "run", off_by_one)
    r = invoke("run", *files(ece408), "--backend", "cpu", "--check")
    assert r.exit_code == 1 and "only 99 of 100 predictions equal" in r.stderr


@pytest.mark.parametrize("spec,message", [("32x32x3,5:32", "expected HxWxC,K1:C1,K2:C2,HIDDEN"),
                                          ("8x8x1,5:4,5:4,16", "the layers leave no output"),
                                          ("28x28x0,5:32,5:64,128", "a size is 0")])
def test_bench_random_geometry_is_checked_before_the_gpu(spec, message):
    r = invoke("bench", "--random", spec)
    assert r.exit_code == 2 and message in r.stderr and "Traceback" not in r.stderr


def test_random_case_is_seeded_and_has_the_geometry():
    from infer import network
    from infer.bench.gpu import random_case

    model, x = random_case("29x31x3,7:12,3:20,50,7", 5)
    again, y = random_case("29x31x3,7:12,3:20,50,7", 5)
    g = network.geometry(model, x.shape)
    assert (g.h, g.w, g.c, g.k1, g.c1, g.k2, g.c2, g.hidden, g.classes) == (29, 31, 3, 7, 12, 3, 20, 50, 7)
    assert (x == y).all() and (model.conv2 == again.conv2).all() and x.dtype == np.float32


def test_the_library_is_free_of_click():
    """Python callers get plain exceptions; only the command line imports click."""
    import subprocess
    import sys

    code = ("import sys\nimport infer, infer.session, infer.data.reader, infer.serve.server, infer.gpu.certify\n"
            "from infer.errors import InputError\n"
            "assert 'click' not in sys.modules, 'click imported'\n"
            "e = InputError('x.h5: bad'); assert isinstance(e, ValueError) and e.message == str(e) == 'x.h5: bad'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_the_option_names_are_the_registries_names():
    """options.py names what the GPU package registers, without importing it (the command line's --help)."""
    from infer import backend as backends, options
    from infer.gpu.device import KNOWN
    from infer.gpu import launch, pipelines

    assert options.ALGORITHMS == tuple(pipelines.ALGORITHMS)
    assert options.CERTIFIED == pipelines.FusedCertified.NAME
    assert options.GEMMS == tuple(launch.GEMMS) and options.TILE_WIDTHS == launch.TILE_WIDTHS
    assert options.CERTIFY_FROM == pipelines.FusedCertified.CERTIFY_FROM
    assert options.BACKENDS == backends.NAMES
    assert options.DESCRIBED_GPUS == tuple(sorted(KNOWN))


def test_help_imports_no_engine():
    """`cnninfer --help` and a command's --help import neither NumPy nor the GPU package nor h5py."""
    import subprocess
    import sys

    from tests.conftest import REPO

    code = ("import sys\nfrom infer.cli import main\nsys.argv = ['cnninfer'] + sys.argv[1:]\ntry:\n    main()\n"
            "except SystemExit:\n    pass\nheavy = sorted(m for m in sys.modules if m.split('.')[0] in ('numpy', 'h5py', 'pycuda')"
            " or m.startswith(('infer.gpu', 'infer.cpu.backend', 'infer.session')))\nprint('HEAVY', heavy, file=sys.stderr)")
    for args in ([], ["--help"], ["run", "--help"], ["serve", "--help"], ["bench", "--help"]):
        p = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert "HEAVY []" in p.stderr, (args, p.stderr)


def test_the_cpu_bench_says_when_its_rounds_disagree():
    from infer.bench.cpu import spread_notes, table

    steady = dict(name="cnninfer", median_s=1.0, min_s=0.98, max_s=1.05, images_per_s=1e4, vs_onnxruntime=1.5,
                  identical=10)
    swinging = dict(steady, name="onnxruntime", min_s=0.9, max_s=1.2)
    assert spread_notes([steady]) == []
    [note] = spread_notes([steady, swinging])
    assert note.startswith("note: onnxruntime's rounds disagree by 33% (min 0.900 s, max 1.200 s)")
    lines = table(dict(n=10, geometry="28x28x1", device="x86_64", repeats=5, warmup=1, rows=[steady, swinging]))
    assert "max s" in lines[1] and lines[-1] == note


def test_the_stream_bench_compares_every_row_with_what_auto_runs():
    """Where --decode auto leaves a file the GPU decodes to the reader threads (LZ4's, say), the
    ratios are to the host's run, which is marked as the default."""
    from infer.bench.stream import table

    rates = {"raw parallel read (page-locked ring)": 3e7, "GPU alone, images resident": 4e7,
             "cnninfer run --decode host": 1e7, "cnninfer run --decode gpu": 8e6}
    result = dict(data="f.h5", n=10, correct=9, layout="chunks", readers=15, device="H200", timing_ms={"forward": 1},
                  rates=rates, default="cnninfer run --decode host")
    lines = table(result)
    assert lines[4].startswith("cnninfer run --decode host (the default)") and lines[4].endswith(" 1.00")
    assert lines[5].startswith("cnninfer run --decode gpu ") and lines[5].endswith(" 1.25")
    assert table(dict(result, default="cnninfer run --decode gpu"))[4].endswith(" 0.80")


def test_serve_workers_auto_is_one_process_on_the_cpu_and_front_ends_on_a_gpu(monkeypatch):
    from infer.serve import server

    assert server.auto_workers("cpu") == 1
    monkeypatch.setattr(server, "cuda_usable", lambda: False)
    assert server.auto_workers("auto") == 1
    monkeypatch.setattr(server, "cuda_usable", lambda: True)
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    assert server.auto_workers("auto") == 12 and server.auto_workers("cuda") == 12
    monkeypatch.setattr("os.cpu_count", lambda: 64)
    assert server.auto_workers("cuda") == 12
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert server.auto_workers("cuda") == 2
    # --max-batch by default: 4096 where passes run on a GPU (padded to a ladder), 256 on the CPU
    assert server.auto_max_batch("cuda") == server.auto_max_batch("auto") == 4096
    assert server.auto_max_batch("cpu") == 256
    monkeypatch.setattr(server, "cuda_usable", lambda: False)
    assert server.auto_max_batch("auto") == 256
