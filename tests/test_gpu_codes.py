"""float32 files of 8-bit pixels travel to the GPU as their codes (infer/data/codes.py): the same labels
as float32 travel and scores within float32's accuracy of its (the fused kernels compute conv1 from
the codes), read whole or streamed, on one GPU or two; a value that is no code past the first image
sends the run back to float32, with float32's bits. Needs a GPU."""
import json

import h5py
import numpy as np
import pytest

import infer
from infer.data import codes
from infer.plan import for_backend
from tests.conftest import Dev, assert_refused, build, damaged_copy, invoke

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("wire", codes.WIRES, ids=["mul", "div", "one"])
def test_convert_kernel2_rebuilds_every_codes_float32(gpu, wire):
    from infer.gpu.launch import ConvertCodes

    k = np.tile(np.arange(256, dtype=np.uint8), 41)[:10_007]
    d = Dev()
    out = d.empty(len(k))
    ConvertCodes(build(gpu), wire)(None, d.put(k, np.uint8), out, len(k))
    assert np.array_equal(d.get(out, len(k)).view(np.uint32), codes.unpack(k, wire).view(np.uint32))


@pytest.fixture
def as_float32(monkeypatch):
    """Runs made with this travel as float32, as before codes."""
    def off():
        monkeypatch.setenv("CNNINFER_CODES", "0")
    return off


def runs(data, model, as_float32, **options):
    """(the run as it travels by default, the run travelling float32), scores kept."""
    with infer.Session(model, "cuda", **options) as s:
        a = s.evaluate(data, scores=True)
    as_float32()
    with infer.Session(model, "cuda", **options) as s:
        b = s.evaluate(data, scores=True)
    return a, b


def same(a, b):
    assert np.array_equal(a.predictions, b.predictions)
    assert np.array_equal(a.scores.view(np.uint32), b.scores.view(np.uint32))
    assert np.array_equal(a.labels, b.labels)


def alike(a, b):
    """Codes against float32 travel: conv1 from the codes is float32-accurate, not float32's bits."""
    assert np.array_equal(a.predictions, b.predictions) and np.array_equal(a.labels, b.labels)
    assert not np.array_equal(a.scores.view(np.uint32), b.scores.view(np.uint32))
    np.testing.assert_allclose(a.scores, b.scores, rtol=1e-4, atol=1e-5 * np.abs(b.scores).max())


@pytest.mark.parametrize("budget", ["512", "4"])  # read whole; 4 MiB: testfull's 7.8 MB of codes stream
def test_testfull_travels_as_codes_with_float32s_scores(ece408, monkeypatch, as_float32, budget):
    monkeypatch.setenv("CNNINFER_HOST_BUDGET_MB", budget)
    a, b = runs(ece408 / "testfull.hdf5", ece408 / "model.hdf5", as_float32)
    assert a.reader["wire"] == codes.NAMES[codes.MUL] and b.reader["wire"] == "float32"
    assert a.streamed == b.streamed == (budget == "4")
    alike(a, b)
    assert int((a.predictions == a.labels).sum()) == 8722


@pytest.mark.parametrize("budget", ["512", "4"])
@pytest.mark.parametrize("wire", [codes.DIV, codes.ONE], ids=["div", "one"])
def test_images_in_the_other_scalings_travel_as_codes_too(ece408, tmp_path, monkeypatch, as_float32, budget, wire):
    """testfull's pixels as torchvision and Keras scale them (code / 255: half the values other
    floats), and unscaled (0-255)."""
    monkeypatch.setenv("CNNINFER_HOST_BUDGET_MB", budget)
    with h5py.File(ece408 / "testfull.hdf5") as f:
        x, y = f["x"][()], f["y"][()]
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f["x"], f["y"] = codes.unpack(np.rint(x * 255).astype(np.uint8), wire), y
    a, b = runs(tmp_path / "d.h5", ece408 / "model.hdf5", as_float32)
    assert a.reader["wire"] == codes.NAMES[wire] and b.reader["wire"] == "float32"
    alike(a, b)


@pytest.mark.parametrize("budget", ["512", "4"])
def test_two_gpus_take_codes_too(ece408, monkeypatch, as_float32, budget):
    """Two contexts on GPU 0 stand in for two GPUs where only one exists (as test_gpu's split test);
    streamed, each reads its half as codes."""
    from infer.gpu import device
    from infer.gpu.multi import MultiGpuBackend

    monkeypatch.setenv("CNNINFER_HOST_BUDGET_MB", budget)
    pair = [0, 1] if device.visible_devices() > 1 else [0, 0]
    if pair == [0, 0]:  # two contexts on one GPU share its legacy stream: no graph capture
        monkeypatch.setenv("CNNINFER_GRAPHS", "0")
    monkeypatch.setattr("infer.gpu.create", lambda devices=None, **o: MultiGpuBackend(pair, **o))
    a, b = runs(ece408 / "testfull.hdf5", ece408 / "model.hdf5", as_float32)
    assert a.device.startswith("2 GPUs") and a.reader["wire"] == codes.NAMES[codes.MUL] and a.streamed == (budget == "4")
    alike(a, b)


@pytest.mark.parametrize("budget", ["512", "4"])
def test_a_value_that_is_no_code_sends_the_run_back_to_float32(ece408, tmp_path, monkeypatch, as_float32, budget):
    """The first image holds codes, the last one a value that is not: the read fails, the run
    starts again as float32 and gives float32's answers."""
    monkeypatch.setenv("CNNINFER_HOST_BUDGET_MB", budget)
    with h5py.File(ece408 / "testfull.hdf5") as f:
        x, y = f["x"][()], f["y"][()]
    x[-1, 14, 14, 0] = np.float32(0.3)  # no code: 0.3 * 255 = 76.5
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f["x"], f["y"] = x, y
    a, b = runs(tmp_path / "d.h5", ece408 / "model.hdf5", as_float32)
    assert a.reader["wire"] == b.reader["wire"] == "float32"
    same(a, b)


CUT = {"gzip": dict(compression="gzip", compression_opts=1), "shuffle + lzf": dict(compression="lzf", shuffle=True),
       "LZ4": "LZ4", "fletcher32": dict(fletcher32=True)}


@pytest.mark.parametrize("layout", CUT)
@pytest.mark.parametrize("late", [False, True], ids=["codes", "a late value no code"])
def test_chunks_cutting_images_travel_as_codes(ece408, tmp_path, monkeypatch, as_float32, layout, late):
    """testfull in chunks cutting each image in 4, streamed (4 MiB budget): the reader threads
    assemble the images as codes from their decoded chunks (a ring 3 blocks deep), the answers of
    the float32 travel; a value that is no code in the last chunk sends the run back to float32."""
    options = CUT[layout]
    if isinstance(options, str):
        options = dict(pytest.importorskip("hdf5plugin").LZ4())
    options = dict(options, chunks=(256, 7, 28, 1))
    monkeypatch.setenv("CNNINFER_HOST_BUDGET_MB", "4")
    with h5py.File(ece408 / "testfull.hdf5") as f:
        x, y = f["x"][()], f["y"][()]
    if late:
        x[-1, 14, 14, 0] = np.float32(0.3)
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f.create_dataset("x", data=x, **options)
        f["y"] = y
    from infer.gpu.backend import CudaBackend

    rings, host_buffers = [], CudaBackend.host_buffers

    def recorded(self, shape, dtype, count=1):
        rings.append((np.dtype(dtype), count))
        return host_buffers(self, shape, dtype, count)
    monkeypatch.setattr(CudaBackend, "host_buffers", recorded)
    with infer.Session(ece408 / "model.hdf5", "cuda", decode="host") as s:
        a = s.evaluate(tmp_path / "d.h5", scores=True)
    assert (codes.MUL, 3) in rings, rings  # the codes ring, whether or not the run went back to float32
    as_float32()
    with infer.Session(ece408 / "model.hdf5", "cuda", decode="host") as s:
        b = s.evaluate(tmp_path / "d.h5", scores=True)
    assert a.streamed and b.streamed and b.reader["wire"] == "float32"
    assert a.reader["wire"] == ("float32" if late else codes.NAMES[codes.MUL]), a.reader
    same(a, b) if late else alike(a, b)


@pytest.mark.parametrize("layout", ["gzip", "fletcher32"])
def test_a_damaged_chunk_cutting_images_is_one_line_and_nothing_written(ece408, tmp_path, layout):
    """A run of codes assembled from chunks cutting images (read whole), chunk 5's bytes damaged (its
    zlib header; a byte its checksum covers): exit 2, one line naming the chunk, no predictions."""
    path = damaged_copy(ece408, tmp_path / "d.h5", 3000, 5, chunks=(256, 7, 28, 1), **CUT[layout])
    out = tmp_path / "p.npy"
    r = invoke("run", path, ece408 / "model.hdf5", "--backend", "cuda", "--json", "--predictions", out)
    assert_refused(r, "d.h5", "'x'", "chunk 5")
    assert not out.exists()


def test_the_command_line_says_how_images_travelled(ece408):
    out = invoke("run", ece408 / "testfull.hdf5", ece408 / "model.hdf5", "--json", "-q")
    d = json.loads(out.stdout)
    assert d["reader"]["wire"] == codes.NAMES[codes.MUL] and d["correct"] == 8722


def test_bench_stream_reads_codes_as_the_run_reads(ece408):
    r = invoke("bench", "--stream", ece408 / "testfull.hdf5", ece408 / "model.hdf5")
    assert r.exit_code == 0, r.output
    assert "(pread, as 8-bit codes," in r.output, r.output


@pytest.mark.parametrize("algo,staged", [("fused-wgmma", True), ("fused-certified", True), ("implicit-wgmma", False)])
def test_the_fused_kernels_read_codes_as_uploaded(ece408, algo, staged):
    """fused-wgmma and fused-certified take testfull's codes (and uint8 images) with no conversion kernel
    and no float32 copy on the GPU, with the labels of float32 travel (certified: every run certified);
    the other pipelines convert first."""
    from infer.gpu.backend import CudaBackend
    from infer.gpu.pipelines import ALGORITHMS
    from infer.data.loader import load_model
    from infer.network import geometry

    model = load_model(ece408 / "model.hdf5")
    with h5py.File(ece408 / "testfull.hdf5") as f:
        x = f["x"][:3000]
    if ALGORITHMS[algo].available(geometry(model, x.shape), "sm_90"):
        pytest.skip(f"{algo} does not run here")
    u8 = np.rint(x * 255).astype(np.uint8)
    labels = []
    for wire, images in ((np.dtype(np.float32), x), (codes.MUL, codes.pack(x, codes.MUL)),
                         (np.dtype(np.float32), u8.astype(np.float32)), (np.dtype(np.uint8), u8)):
        b = CudaBackend(conv_algo=algo)
        try:
            if b.build.arch != "sm_90":
                pytest.skip("the fused wgmma kernels need Hopper")
            buf = b.host_buffers(x.shape, wire)[0]
            buf.view(images.dtype)[...] = images
            b.prepare(model, for_backend(b, model, x.shape, wire=wire))
            if wire != np.float32:
                ex = b.executor
                assert all(f is None for f in ex.run.floats) == staged and (wire in ex.converters) != staged
            labels.append(b.forward(buf)[0].copy())
        finally:
            b.close()
    assert np.array_equal(labels[0], labels[1]) and np.array_equal(labels[2], labels[3])
