"""The run plan (infer/plan.py), made on any machine for described devices (H200, H100, A100, L4,
T4, the CPU) and data (float32 8-bit codes, float32, uint8, compressed, larger than memory), and
the command line's `plan` against what `run --json` then reports."""
import json

import h5py
import numpy as np
import pytest

from infer import plan
from infer.cpu.backend import Description as Cpu
from infer.data import codes, native
from infer.errors import InputError
from infer.gpu.device import KNOWN
from infer.network import Geometry
from infer.options import Options
from tests.conftest import invoke

MNIST = Geometry(h=28, w=28, c=1, k1=5, c1=32, k2=5, c2=64, hidden=128, classes=10)
CODES = plan.Data(10_000, (28, 28, 1), np.dtype("f4"), codes.MUL, "pread")
FLOATS = plan.Data(10_000, (28, 28, 1), np.dtype("f4"), None, "pread")
BYTES = plan.Data(10_000, (28, 28, 1), np.dtype("u1"), None, "pread")
CPU = Cpu(2, 256, "native C")
BUDGET = 2 << 30


def make(data, device, scores=False, **options):
    return plan.make(data, MNIST, device, Options.of(**options), scores, budget=BUDGET)


@pytest.mark.parametrize("gpu", ["H200", "H100"])
def test_hopper_certifies_the_default_run_of_8bit_images(gpu):
    for data, wire in ((CODES, codes.MUL), (BYTES, np.dtype("u1"))):
        p = make(data, KNOWN[gpu])
        assert (p.backend, p.algorithm, p.pipeline, p.precision, p.by_default) == ("cuda", "fused-certified",
                                                                                  "fused-certified", "certified", True)
        assert p.wire == wire and p.resident and not p.streamed and p.decode == "none"
        assert p.chunk == 1250 and p.streams == 8  # 10,000 images in one round of 8 streams
        assert "10,000 images" in p.reasons["precision"] and "no --scores" in p.reasons["precision"]


def test_the_default_stays_exact_where_certifying_would_not_pay():
    """float32 uploads, scores asked for, fewer than CERTIFY_FROM images: fused-wgmma's kernels
    (built as fused-certified's exact path), each with the reason."""
    cases = [(FLOATS, False, "a byte a pixel"), (CODES, True, "no --scores"),
             (plan.Data(5119, (28, 28, 1), np.dtype("u1")), False, "5,120 images or more")]
    for data, scores, missing in cases:
        p = make(data, KNOWN["H100"], scores)
        assert (p.algorithm, p.pipeline, p.precision, p.by_default) == ("fused-wgmma", "fused-certified", "exact", True)
        assert missing in p.reasons["precision"], p.reasons["precision"]
    assert make(plan.Data(5120, (28, 28, 1), np.dtype("u1")), KNOWN["H100"]).precision == "certified"


def test_precision_and_algorithm_asked_for():
    p = make(FLOATS, KNOWN["H200"], precision="certified")
    assert (p.algorithm, p.precision, p.by_default) == ("fused-certified", "certified", False)
    p = make(CODES, KNOWN["H200"], precision="exact")
    assert (p.algorithm, p.precision) == ("fused-wgmma", "exact") and p.reasons["precision"] == "--precision exact"
    p = make(CODES, KNOWN["H200"], conv_algo="implicit-tc", tile_width=32)
    assert (p.algorithm, p.precision) == ("implicit-tc", "exact")
    assert p.notices == ("cnninfer: --tile-width 32 has no effect: --conv-algo implicit-tc has no tiled GEMM "
                         "(it shapes --conv-algo unroll's)",)


@pytest.mark.parametrize("gpu,algorithm", [("A100", "fused-tc"), ("L4", "fused-tc"), ("T4", "fused")])
def test_older_gpus_run_the_fastest_exact_algorithm_they_have(gpu, algorithm):
    p = make(CODES, KNOWN[gpu])
    assert (p.algorithm, p.precision, p.by_default) == (algorithm, "exact", False)
    assert "needs a Hopper GPU" in p.reasons["precision"]
    p = make(CODES, KNOWN[gpu], precision="certified")  # not available: the exact path, said once
    assert p.precision == "exact" and len(p.notices) == 1 and "--precision certified" in p.notices[0]
    with pytest.raises(InputError, match="--conv-algo fused-wgmma cannot run this model"):
        make(CODES, KNOWN[gpu], conv_algo="fused-wgmma")


def test_a_large_file_streams_through_a_ring_and_splits_over_gpus():
    big = plan.Data(1_000_000, (28, 28, 1), np.dtype("u1"), None, "pread")
    p = make(big, KNOWN["H100"])
    assert p.streamed and p.resident and p.block == 32768 and p.chunk == 32768 and p.slots == 6
    assert "748 MiB of images, past two blocks" in p.reasons["streamed"]
    two = plan.make(big, MNIST, KNOWN["H100"], Options(), budget=BUDGET, devices=(0, 1))
    assert two.devices == (0, 1) and two.shares == ((0, 500_000), (500_000, 1_000_000)) and two.n == 500_000


def test_images_past_the_devices_memory_are_not_resident():
    many = plan.Data(3_000_000, (28, 28, 1), np.dtype("f4"))  # 9.4 GB of float32 on a 15 GB T4
    p = plan.make(many, MNIST, KNOWN["T4"], Options(), budget=1 << 40, streamed=False)
    assert not p.resident and "past 40%" in p.reasons["resident"]
    assert plan.make(many, MNIST, KNOWN["H200"], Options(), budget=1 << 40, streamed=False).resident


def test_the_cpu_plan():
    p = make(CODES, CPU)
    assert (p.backend, p.algorithm, p.precision, p.wire, p.decode) == ("cpu", "native", "exact", np.float32, "none")
    assert p.chunk == 1024 and not p.streamed and p.devices == ()
    assert make(CODES, Cpu(2, 0, "NumPy layers")).algorithm == "numpy"
    assert make(CODES, CPU, chunk=77).chunk == 77
    streamed = plan.make(CODES, MNIST, CPU, Options(), budget=0)
    assert streamed.streamed and streamed.block == 4096 and streamed.chunk == 512  # 4,096 / (4 x 2 threads)


@pytest.fixture
def gzip_file(tmp_path, rng, ece408):
    with h5py.File(ece408 / "test100.hdf5") as f:
        x, y = f["x"][()], f["y"][()]
    path = tmp_path / "gzip.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x, chunks=(10, 28, 28, 1), compression="gzip")
        f.create_dataset("y", data=y)
    return path


def described(path, ece408, gpu="H100", **options):
    from infer.session import plan_for

    return plan_for(KNOWN[gpu], [str(path)], str(ece408 / "model.hdf5"), **options)


def test_where_a_compressed_file_is_decoded(gzip_file, ece408, monkeypatch):
    assert described(gzip_file, ece408).decode == "host"  # within the budget: read whole, the readers decode
    monkeypatch.setenv("CNNINFER_HOST_BUDGET_MB", "0")
    p = described(gzip_file, ece408)
    assert p.streamed and p.decode == "gpu" and p.decoding and p.align == 10 and p.layout == "chunks (deflate)"
    assert described(gzip_file, ece408, decode="host").decode == "host"


def test_chunks_the_gpu_decodes_are_certified_by_default_as_a_byte_a_pixel_is(tmp_path, ece408, monkeypatch):
    """A streamed run of 10,000 float32 images in gzip chunks: decoded on the GPU, only their
    compressed bytes cross PCIe, so the default certifies it as it does 8-bit codes, and a decoded
    block (128 MB of images at most) is one launch; decoded on the host, float32 crosses, the run
    stays exact, and a launch takes at most a host block's 25 MB (8,192 images)."""
    with h5py.File(ece408 / "testfull.hdf5") as f:
        x, y = f["x"][()], f["y"][()]
    path = tmp_path / "gz10000.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x, chunks=(1000, 28, 28, 1), compression="gzip")
        f["y"] = y
    monkeypatch.setenv("CNNINFER_HOST_BUDGET_MB", "0")
    gpu, host = described(path, ece408, "H200"), described(path, ece408, "H200", decode="host")
    assert (gpu.decode, gpu.precision, gpu.algorithm) == ("gpu", "certified", "fused-certified")
    assert "compressed chunks the GPU decodes" in gpu.reasons["precision"]
    assert (host.decode, host.precision, host.algorithm) == ("host", "exact", "fused-wgmma")
    assert "a byte a pixel" in host.reasons["precision"]
    assert described(path, ece408, "H200", scores=True).precision == "exact"
    one, host = described(path, ece408, "H200", streams=1), described(path, ece408, "H200", streams=1, decode="host")
    assert one.chunk == one.block == 10000 and "a host block a launch" in one.reasons["chunk"]
    assert host.chunk == host.block <= 8192


@pytest.mark.parametrize("options", [dict(fletcher32=True), {}, dict(chunks=(256, 7, 28, 1), compression="gzip")],
                         ids=["fletcher32", "no filter", "gzip, chunks cutting images"])
def test_chunks_the_readers_decode_travel_as_codes(tmp_path, ece408, monkeypatch, options):
    """float32 codes in chunks stored without a codec, or cutting images (assembled by the reader
    threads), are read as codes (a quarter of the bytes) and the default certifies them, as for the
    contiguous file; streamed too, decoded by the host, but for the chunks the GPU decodes and
    assembles: those travel as stored (their compressed bytes)."""
    if native.library() is None:
        pytest.skip("chunked files are read as codes on the native pool only")
    options = dict(dict(chunks=(1000, 28, 28, 1)), **options)
    with h5py.File(ece408 / "testfull.hdf5") as f:
        x, y = f["x"][:6000], f["y"][:6000]
    path = tmp_path / "raw.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x, **options)
        f.create_dataset("y", data=y)
    p = described(path, ece408, "H200")
    assert p.wire_name.startswith("8-bit codes") and p.decode == "host" and p.precision == "certified"
    monkeypatch.setenv("CNNINFER_HOST_BUDGET_MB", "0")
    p = described(path, ece408, "H200")
    if "compression" in options:
        assert p.streamed and p.wire_name == "float32" and p.decode == "gpu" and p.precision == "certified"
        assert "the GPU decodes the chunks, which cut images" in p.reasons["wire"]
        p = described(path, ece408, "H200", decode="host")
    assert p.streamed and p.wire_name.startswith("8-bit codes") and p.decode == "host"


def test_decode_gpu_refuses_a_file_the_gpu_cannot_decode(tmp_path, ece408, monkeypatch):
    hdf5plugin = pytest.importorskip("hdf5plugin")
    with h5py.File(ece408 / "test100.hdf5") as f:
        x, y = f["x"][()], f["y"][()]
    path = tmp_path / "bzip2.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x, chunks=(10, 28, 28, 1), **hdf5plugin.BZip2())
        f.create_dataset("y", data=y)
    monkeypatch.setenv("CNNINFER_HOST_BUDGET_MB", "0")
    assert described(path, ece408).decode == "host"
    with pytest.raises(InputError, match="--decode gpu: the GPU decodes deflate .* chunks, not bzip2$"):
        described(path, ece408, decode="gpu")
    # A backend that decodes on the GPU (made for an earlier file) leaves this one to the host
    from infer.data import loader
    from infer.data.dataset import DataSet

    model = loader.load_model(ece408 / "model.hdf5")
    data = DataSet.open([path], model)
    try:
        p = plan.make(plan.Data.of(data), MNIST, KNOWN["H100"], Options(), budget=0, decoding_mode="auto")
    finally:
        data.close()
    assert p.streamed and p.decode == "host" and p.decoding == () and "not bzip2" in p.reasons["decode"]


@pytest.mark.parametrize("options", [dict(compression="gzip"), dict(compression="lzf", shuffle=True)],
                         ids=["gzip", "shuffle + lzf"])
def test_chunks_with_fletcher32_are_decoded_on_the_gpu_their_checksums_checked_as_read(tmp_path, ece408, monkeypatch,
                                                                                      options):
    """fletcher32 after a codec: the reader threads check each chunk's checksum as they read its
    stored bytes (rp_submit_summed) and the GPU decodes the rest, as without one; the wire reason says
    so. (Without the native library, h5py reads such files.)"""
    if native.library() is None:
        pytest.skip("the native reader threads check the checksums")
    with h5py.File(ece408 / "test100.hdf5") as f:
        x, y = f["x"][()], f["y"][()]
    path = tmp_path / "summed.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x, chunks=(10, 28, 28, 1), fletcher32=True, **options)
        f.create_dataset("y", data=y)
    p = described(path, ece408, "H200")  # read whole: decoded by the reader threads, as float32
    assert p.decode == "host" and "a codec decodes its chunks straight into place as float32" in p.reasons["wire"]
    monkeypatch.setenv("CNNINFER_HOST_BUDGET_MB", "0")
    p = described(path, ece408, "H200")
    assert p.streamed and p.decode == "gpu" and "fletcher32 checked by the reader threads" in p.reasons["decode"]
    assert "the GPU decodes the chunks (compressed bytes cross PCIe)" in p.reasons["wire"]
    assert described(path, ece408, "H200", decode="host").decode == "host"


def plan_and_run(*args):
    planned = invoke("plan", *args, "--json")
    assert planned.exit_code == 0, planned.stderr
    ran = invoke("run", *args, "--json", "-q")
    assert ran.exit_code == 0, ran.stderr
    return json.loads(planned.stdout), json.loads(ran.stdout)["plan"]


@pytest.mark.parametrize("kind", ["testfull", "uint8", "gzip", "past the host budget"])
def test_plan_prints_what_run_then_reports(kind, ece408, gzip_file, tmp_path, monkeypatch):
    data = ece408 / "testfull.hdf5"
    if kind == "uint8":
        with h5py.File(data) as f:
            x, y = f["x"][:2000], f["y"][:2000]
        data = tmp_path / "uint8.h5"
        with h5py.File(data, "w") as f:
            f["x"], f["y"] = np.rint(x * 255).astype(np.uint8), y
    elif kind == "gzip":
        data = gzip_file
    elif kind == "past the host budget":
        monkeypatch.setenv("CNNINFER_HOST_BUDGET_MB", "1")
    planned, ran = plan_and_run(str(data), str(ece408 / "model.hdf5"), "100" if kind == "gzip" else "2000", "--backend",
                                "cpu")
    assert planned == ran and planned["backend"] == "cpu"
    assert planned["streamed"] == (kind == "past the host budget")


def test_plan_for_a_described_gpu_and_its_table(ece408):
    r = invoke("plan", str(ece408 / "testfull.hdf5"), str(ece408 / "model.hdf5"), "--gpu", "H200")
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("10,000 images (28 x 28 x 1) of ")
    rows = {line.split()[0]: line for line in lines[1:]}
    assert "fused-certified" in rows["algorithm"] and "certified by default" in rows["precision"]
    assert "8-bit codes" in rows["wire"] and rows["resident"].split()[1] == "yes"
    r = invoke("plan", str(ece408 / "testfull.hdf5"), str(ece408 / "model.hdf5"), "--gpu", "H200", "--precision", "exact",
               "--json")
    assert json.loads(r.stdout)["precision"] == "exact"


def in_processes(*args):
    """`cnninfer plan --json` and `cnninfer run --json` stdouts, each a process of its own (as a user
    runs them: the CUDA context made there, on the command's threads)."""
    import subprocess
    import sys

    out = []
    for command in (["plan", *args, "--json"], ["run", *args, "--json", "-q"]):
        r = subprocess.run([sys.executable, "-m", "infer", *command], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        out.append(r.stdout)
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["testfull", "uint8", "gzip", "past the host budget"])
def test_on_the_gpu_plan_prints_what_run_then_reports(kind, ece408, gzip_file, tmp_path, monkeypatch):
    """On a GPU: the plan of each layout equals the one run --json reports, and the run's answers
    are the reference's; the device's free memory may differ between the two processes' moments, so
    the reasons that quote it are left out."""
    data, n = ece408 / "testfull.hdf5", "10000"
    if kind == "uint8":
        with h5py.File(data) as f:
            x, y = f["x"][()], f["y"][()]
        data = tmp_path / "uint8.h5"
        with h5py.File(data, "w") as f:
            f["x"], f["y"] = np.rint(x * 255).astype(np.uint8), y
    elif kind == "gzip":
        data, n = gzip_file, "100"
        monkeypatch.setenv("CNNINFER_HOST_BUDGET_MB", "0")
    elif kind == "past the host budget":
        monkeypatch.setenv("CNNINFER_HOST_BUDGET_MB", "4")  # testfull's 7.5 MiB of codes
    planned, ran = (json.loads(r) for r in in_processes(str(data), str(ece408 / "model.hdf5"), n))
    ran = ran["plan"]
    for p in (planned, ran):
        p["reasons"].pop("resident")
    assert planned == ran and planned["backend"] == "cuda"
    expect = {"testfull": ("certified", False, "none"), "uint8": ("certified", False, "none"),
              "gzip": ("exact", True, "gpu"), "past the host budget": ("certified", True, "none")}[kind]
    assert (planned["precision"], planned["streamed"], planned["decode"]) == expect
