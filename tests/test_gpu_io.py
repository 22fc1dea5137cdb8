"""The GPU's side of reading: integer images converted on the GPU exactly as on the host, float32
values checked there, scores out, the Session's buffers kept between calls. Needs a GPU."""
import h5py
import numpy as np
import pytest

import infer
from infer import Session, reference
from infer.errors import InputError
from tests.conftest import TESTFULL_AGREE, Dev, assert_refused, build, invoke

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", ["u1", "i1", "u2", "i2", "u4", "i4", "u8", "i8"])
def test_convert_kernel_equals_numpys_astype(gpu, rng, dtype):
    from infer.gpu.launch import Convert

    info = np.iinfo(dtype)
    values = rng.integers(info.min, info.max, 10007, dtype=dtype, endpoint=True)
    values[:4] = [info.min, info.max, 0, (1 << 24) + 1 if info.bits > 24 else 1]  # extremes; a rounding case
    d = Dev()
    out = d.empty(len(values))
    Convert(build(gpu), np.dtype(dtype))(None, d.put(values, dtype), out, len(values))
    np.testing.assert_array_equal(d.get(out, len(values)), values.astype(np.float32))


@pytest.mark.parametrize("skew", range(4))  # x starting 0 to 3 floats past a 16-byte boundary
def test_check_kernel_finds_the_first_bad_image(gpu, rng, skew):
    """Bad values in the scalar head (before x's first 16-byte boundary), the 16-byte body and the
    scalar tail: each is found alone, and the first bad image of several."""
    from infer.gpu.launch import Check

    d, check = Dev(), Check(build(gpu))
    x = rng.standard_normal((37, 5, 3, 1)).astype(np.float32)

    def first_bad(images):
        bad = d.put([2**31 - 1], np.int32)
        padded = np.concatenate([np.zeros(skew, np.float32), images.ravel()])
        check(None, int(d.put(padded)) + 4 * skew, 37, 15, bad)
        return d.get(bad, 1, np.int32)[0]

    assert first_bad(x) == 2**31 - 1
    for where, image in (((0, 0, 0, 0), 0), ((0, 0, 2, 0), 0), ((36, 4, 2, 0), 36), ((20, 3, 1, 0), 20)):
        y = x.copy()
        y[where] = np.nan
        assert first_bad(y) == image, where
    x[30, 4, 2, 0], x[11, 0, 1, 0], x[12, 2, 2, 0] = np.nan, -np.inf, np.inf
    assert first_bad(x) == 11


@pytest.fixture(scope="module")
def testfull_u8(ece408, tmp_path_factory):
    """testfull as uint8 pixels (0..255), contiguous and gzip-chunked."""
    with h5py.File(ece408 / "testfull.hdf5") as f:
        x, y = np.rint(f["x"][()] * 255).astype(np.uint8), f["y"][()]
    folder = tmp_path_factory.mktemp("u8")
    with h5py.File(folder / "plain.h5", "w") as f:
        f["x"], f["y"] = x, y
    with h5py.File(folder / "gzip.h5", "w") as f:
        f.create_dataset("x", data=x, chunks=(100, 28, 28, 1), compression="gzip", shuffle=True)
        f["y"] = y
    return folder


@pytest.mark.parametrize("name", ["plain.h5", "gzip.h5"])
@pytest.mark.parametrize("budget", ["512", "2"])
def test_uint8_images_on_the_gpu_equal_the_host_conversion(ece408, testfull_u8, monkeypatch, name, budget):
    monkeypatch.setenv("CNNINFER_HOST_BUDGET_MB", budget)  # 2 MiB: 7.8 MB of uint8 images stream
    gpu_run = infer.run(testfull_u8 / name, ece408 / "model.hdf5", backend="cuda")
    cpu_run = infer.run(testfull_u8 / name, ece408 / "model.hdf5", backend="cpu")
    assert gpu_run.streamed == (budget == "2")
    assert gpu_run.reader["layout"] == ("pread" if name == "plain.h5" else "chunks")
    assert np.count_nonzero(gpu_run.predictions == cpu_run.predictions) >= TESTFULL_AGREE
    assert (gpu_run.labels == cpu_run.labels).all()


def test_a_file_over_two_blocks_streams_within_the_budget(ece408, tmp_path):
    """The GPU streams 70,000 float32 images (219 MB, inside the 512 MiB budget; 55 MB as 8-bit codes)
    rather than pinning and filling one buffer first; testfull's 31 MB are read whole. Both give the
    reference's labels."""
    with h5py.File(ece408 / "testfull.hdf5") as f:
        x, y = f["x"][()], f["y"][()]
    tiled = tmp_path / "tiled.h5"
    with h5py.File(tiled, "w") as f:
        f["x"], f["y"] = np.concatenate([x] * 7), np.concatenate([y] * 7)
    with Session(ece408 / "model.hdf5", backend="cuda") as s:
        whole, streamed = s.evaluate(ece408 / "testfull.hdf5"), s.evaluate(tiled)
    assert not whole.streamed and streamed.streamed and set(streamed.timing) >= {"read", "wait"}
    assert (streamed.predictions == np.tile(whole.predictions, 7)).all() and streamed.correct == 7 * whole.correct


def test_a_streamed_run_pins_its_scores_only_where_it_keeps_them(ece408, monkeypatch):
    """Streamed without scores, no page-locked (images, classes) copy is made (40 MB of host memory
    for 1M images); with them, it is, and they are the in-memory run's."""
    import pycuda.driver as cuda

    model, data = ece408 / "model.hdf5", ece408 / "testfull.hdf5"
    whole = infer.run(data, model, backend="cuda", scores=True)
    pinned, real = [], cuda.pagelocked_empty
    monkeypatch.setattr(cuda, "pagelocked_empty", lambda shape, *a, **k: pinned.append(shape) or real(shape, *a, **k))
    monkeypatch.setenv("CNNINFER_HOST_BUDGET_MB", "0")
    plain = infer.run(data, model, backend="cuda")
    assert plain.streamed and plain.scores is None and (10000, 10) not in pinned and pinned
    scored = infer.run(data, model, backend="cuda", scores=True)
    assert scored.streamed and (10000, 10) in pinned
    np.testing.assert_allclose(scored.scores, whole.scores, rtol=1e-5, atol=1e-5)
    assert (plain.predictions == whole.predictions).all()


@pytest.mark.parametrize("budget", ["512", "4"])
def test_a_nan_in_the_last_block_is_refused_on_the_gpu(ece408, tmp_path, monkeypatch, budget):
    with h5py.File(ece408 / "testfull.hdf5") as f:
        x, y = f["x"][()], f["y"][()]
    x[9998, 27, 3, 0] = np.nan
    bad = tmp_path / "bad.h5"
    with h5py.File(bad, "w") as f:
        f["x"], f["y"] = x, y
    monkeypatch.setenv("CNNINFER_HOST_BUDGET_MB", budget)
    out = tmp_path / "p.npy"
    r = invoke("run", bad, ece408 / "model.hdf5", "--backend", "cuda", "--predictions", out, "-q")
    assert_refused(r, "bad.h5", "'x'", "(9998, 27, 3, 0)", "nan")
    assert not out.exists()


def test_session_keeps_its_buffers_and_gives_the_references_scores(ece408, monkeypatch):
    import pycuda.driver as cuda

    with h5py.File(ece408 / "testfull.hdf5") as f:
        x = f["x"][:3001]
    with Session(ece408 / "model.hdf5", backend="cuda") as s:
        first = s.scores(x)
        allocations = []
        for name in ("mem_alloc", "pagelocked_empty"):
            real = getattr(cuda, name)
            monkeypatch.setattr(cuda, name, lambda *a, _real=real, **k: allocations.append(a) or _real(*a, **k))
        again, labels = s.scores(x), s.predict(x)
        assert allocations == []
    expected = reference.scores(x, s.model)
    np.testing.assert_allclose(first, expected, rtol=1e-4, atol=1e-4)
    assert (again == first).all() and (labels == reference.argmax(expected)).all()


def test_batch_sizes_seen_before_keep_their_runs_and_answer_alike(ece408, monkeypatch):
    """A server's ladder: sizes alternating (and both wire types) allocate once each, then reuse
    their buffers and graphs; every answer is the reference's."""
    import pycuda.driver as cuda

    with h5py.File(ece408 / "testfull.hdf5") as f:
        x = f["x"][:513]
    u8 = np.rint(x * 255).astype(np.uint8)
    from infer.data.loader import load_model

    expected = reference.argmax(reference.scores(x, load_model(ece408 / "model.hdf5")))
    sizes = (1, 513, 64, 7)
    with Session(ece408 / "model.hdf5", backend="cuda") as s:
        for n in sizes:
            assert (s.predict(x[:n]) == expected[:n]).all() and (s.predict(u8[:n]) == expected[:n]).all()
        assert len(s.backend.executor.kept) >= len(sizes) - 1
        allocations = []
        for name in ("mem_alloc", "pagelocked_empty"):
            real = getattr(cuda, name)
            monkeypatch.setattr(cuda, name, lambda *a, _real=real, **k: allocations.append(a) or _real(*a, **k))
        for n in reversed(sizes):
            assert (s.predict(u8[:n]) == expected[:n]).all() and (s.classify(x[:n], True)[0] == expected[:n]).all()
        assert allocations == []


def test_session_refuses_a_nan_naming_the_array_index(ece408):
    x = np.ones((50, 28, 28, 1), np.float32)
    x[42, 1, 2, 0] = np.nan
    with Session(ece408 / "model.hdf5", backend="cuda") as s:
        with pytest.raises(InputError, match=r"value at index \(42, 1, 2, 0\) is nan"):
            s.predict(x)
        assert s.predict(x[:42]).shape == (42,)  # the session still works


def test_scores_file_on_the_gpu_equals_the_cpus(ece408, tmp_path):
    for backend in ("cuda", "cpu"):
        r = invoke("run", ece408 / "test100.hdf5", ece408 / "model.hdf5", "--backend", backend,
                   "--scores", tmp_path / f"{backend}.npy")
        assert r.exit_code == 0, r.stderr
    np.testing.assert_allclose(np.load(tmp_path / "cuda.npy"), np.load(tmp_path / "cpu.npy"), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("algo", ["unroll", "fused-tc"])
def test_scores_from_every_algorithm(ece408, algo):
    r = infer.run(ece408 / "test100.hdf5", ece408 / "model.hdf5", backend="cuda", conv_algo=algo, scores=True)
    c = infer.run(ece408 / "test100.hdf5", ece408 / "model.hdf5", backend="cpu", scores=True)
    np.testing.assert_allclose(r.scores, c.scores, rtol=1e-4, atol=1e-4)


def test_a_file_truncated_while_it_streams_is_refused(ece408, tmp_path, monkeypatch):
    """The file is cut after image 1000 once opened and checked: the native readers hit its end
    mid-dataset and the run ends with one line naming x, exit 2, nothing written."""
    import os
    import shutil

    from infer.data.dataset import DataSet

    data = tmp_path / "cut.h5"
    shutil.copy(ece408 / "testfull.hdf5", data)
    real = DataSet.open.__func__

    with h5py.File(data) as f:  # cut inside the first block's images (the labels are cut too)
        end = f["x"].id.get_offset() + 1000 * f["x"][0].nbytes

    def open_then_truncate(cls, paths, model, n=None):
        opened = real(cls, paths, model, n)
        os.truncate(data, end)
        return opened

    monkeypatch.setattr(DataSet, "open", classmethod(open_then_truncate))
    monkeypatch.setenv("CNNINFER_HOST_BUDGET_MB", "4")
    out = tmp_path / "p.npy"
    r = invoke("run", data, ece408 / "model.hdf5", "--backend", "cuda", "--predictions", out, "-q")
    assert_refused(r, "cut.h5", "'x'", "truncated")
    assert not out.exists()


def test_the_first_forward_replays_a_graph_recorded_in_prepare(ece408, monkeypatch):
    """Recording a forward's graph takes ~1 ms: prepare records the one of the buffer forward reads,
    so a fresh process's timed forward (`cnninfer run`'s elapsed) only launches it."""
    from infer.gpu import backend, graph

    if not graph.enabled():
        pytest.skip("CUDA graphs are off here (CNNINFER_GRAPHS=0)")
    made, during = [], []

    class Counted(graph.Graph):
        def __init__(self, *args, **kwargs):
            made.append(1)
            super().__init__(*args, **kwargs)

    forward = backend.CudaBackend.forward

    def counted_forward(self, x, progress=None):
        before = len(made)
        out = forward(self, x, progress)
        during.append(len(made) - before)
        return out

    monkeypatch.setattr(graph, "Graph", Counted)
    monkeypatch.setattr(backend.CudaBackend, "forward", counted_forward)
    r = infer.run(ece408 / "testfull.hdf5", ece408 / "model.hdf5", backend="cuda")
    assert r.correct == 8722 and not r.streamed
    assert made and during == [0]


@pytest.mark.parametrize("chunked", [False, True])
def test_the_ring_is_pinned_at_prepare_and_five_deep_where_the_host_decodes(ece408, tmp_path, monkeypatch, chunked):
    """Blocks the host decodes wait on their decoding, not on the ring: 5 pinned blocks there
    (Blosc2's peak RSS under 400 MB), 6 for plain reads; none pinned inside the timed stream."""
    from infer.gpu import backend

    monkeypatch.setenv("CNNINFER_HOST_BUDGET_MB", "4")
    data = ece408 / "testfull.hdf5"
    if chunked:
        with h5py.File(data) as f:
            x, y = f["x"][()], f["y"][()]
        data = tmp_path / "gzip.h5"
        with h5py.File(data, "w") as f:
            f.create_dataset("x", data=x, chunks=(1000, 28, 28, 1), compression="gzip")
            f["y"] = y
    rings, pinned_in_stream, streaming = [], [], []
    source, pin, stream = backend.CudaBackend.stream_source, backend.CudaBackend.new_host_buffer, backend.CudaBackend.stream

    def counted_source(self, *args):
        out = source(self, *args)
        rings.append(len(out[1]))
        return out

    def counted_pin(shape, dtype):
        if streaming:
            pinned_in_stream.append(shape)
        return pin(shape, dtype)

    def flagged_stream(self, *args, **kwargs):
        streaming.append(1)
        try:
            return stream(self, *args, **kwargs)
        finally:
            streaming.clear()

    monkeypatch.setattr(backend.CudaBackend, "stream_source", counted_source)
    monkeypatch.setattr(backend.CudaBackend, "new_host_buffer", staticmethod(counted_pin))
    monkeypatch.setattr(backend.CudaBackend, "stream", flagged_stream)
    r = infer.run(data, ece408 / "model.hdf5", backend="cuda", decode="host")
    assert r.streamed and r.correct == 8722 and r.reader["layout"] == ("chunks" if chunked else "pread")
    assert rings == [5 if chunked else 6] and pinned_in_stream == []
