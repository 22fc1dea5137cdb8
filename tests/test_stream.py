"""Inputs over the host-memory budget stream from the file through a ring of buffers: the same
predictions as reading everything, bounded buffers, and bad values still refused cleanly."""
import h5py
import numpy as np
import pytest

import infer
from infer.data import host, loader
from infer import plan as planning, progress, session
from infer.data.dataset import DataSet
from infer.gpu import plan
from tests.conftest import assert_refused, invoke


@pytest.fixture
def tiny_budget(monkeypatch):
    monkeypatch.setenv("CNNINFER_HOST_BUDGET_MB", "1")  # 1 MiB: ~330 MNIST images


def test_streamed_equals_in_memory(ece408, tiny_budget, monkeypatch):
    streamed = infer.run(ece408 / "testfull.hdf5", ece408 / "model.hdf5", 5001, backend="cpu")
    monkeypatch.setenv("CNNINFER_HOST_BUDGET_MB", "512")
    whole = infer.run(ece408 / "testfull.hdf5", ece408 / "model.hdf5", 5001, backend="cpu")
    assert streamed.streamed and not whole.streamed
    assert (streamed.predictions == whole.predictions).all() and (streamed.labels == whole.labels).all()
    assert set(streamed.timing) == {"load", "prepare", "forward", "read", "wait"}


def test_a_gpu_run_streams_past_two_blocks_within_the_budget(ece408, monkeypatch):
    """The GPU's plans stream past STREAM_FROM (two blocks) a data set the budget would read whole;
    testfull's 10,000 float32 images stay under it, so `cnninfer run testfull.hdf5 ...` times
    resident images. The CPU streams past the budget only, with the same predictions."""
    from infer.gpu.device import KNOWN
    from infer.network import geometry

    model = loader.load_model(ece408 / "model.hdf5")
    data = DataSet.open([ece408 / "testfull.hdf5"], model, 1000)
    try:
        size, d = 1000 * 28 * 28 * 4, planning.Data.of(data)
        budget = session.host_budget()
        assert not planning.streams(d, np.float32, budget) and not planning.streams(d, np.float32, budget, size)
        assert planning.streams(d, np.float32, budget, size - 1) and not planning.streams(d, np.uint8, budget, size - 1)
        g = geometry(model, (1000, 28, 28, 1))
        monkeypatch.setattr(plan, "STREAM_FROM", size - 1)
        assert planning.make(planning.Data(1000, (28, 28, 1)), g, KNOWN["H100"]).streamed
        monkeypatch.setattr(plan, "STREAM_FROM", size)
        assert not planning.make(planning.Data(1000, (28, 28, 1)), g, KNOWN["H100"]).streamed
        monkeypatch.setenv("CNNINFER_HOST_BUDGET_MB", "0")
        assert planning.streams(d, np.float32, session.host_budget()) and planning.streams(d, np.uint8, session.host_budget(), None)
    finally:
        data.close()
    monkeypatch.undo()
    assert 10000 * 28 * 28 * 4 < plan.STREAM_FROM
    monkeypatch.setenv("CNNINFER_HOST_BUDGET_MB", "0")
    by_budget = infer.run(ece408 / "testfull.hdf5", model, 1000, backend="cpu")
    monkeypatch.delenv("CNNINFER_HOST_BUDGET_MB")
    whole = infer.run(ece408 / "testfull.hdf5", model, 1000, backend="cpu")
    assert by_budget.streamed and not whole.streamed
    assert (by_budget.predictions == whole.predictions).all()


def test_streams_compressed_chunked_files(tmp_path, ece408, tiny_budget):
    with h5py.File(ece408 / "test100.hdf5") as f:
        x, y = f["x"][()], f["y"][()]
    big = tmp_path / "big.h5"
    with h5py.File(big, "w") as f:
        f.create_dataset("x", data=np.concatenate([x] * 30), compression="gzip", chunks=(64, 28, 28, 1))
        f.create_dataset("y", data=np.concatenate([y] * 30), compression="gzip", chunks=True)
    r = infer.run(big, ece408 / "model.hdf5", backend="cpu")
    assert r.streamed and r.n == 3000 and r.correct == 30 * 95


def test_bad_value_deep_in_a_streamed_file(tmp_path, ece408, tiny_budget):
    with h5py.File(ece408 / "testfull.hdf5") as f:
        x, y = f["x"][:3000], f["y"][:3000]
    x[2777, 3, 4, 0] = np.nan
    bad = tmp_path / "bad.h5"
    with h5py.File(bad, "w") as f:
        f["x"], f["y"] = x, y
    out = tmp_path / "p.npy"
    r = invoke("run", bad, ece408 / "model.hdf5", "--backend", "cpu", "--predictions", out)
    assert_refused(r, "bad.h5", "'x'", "(2777, 3, 4, 0)")
    assert not out.exists()


@pytest.mark.parametrize("step", [None, 7])
def test_bad_label_in_the_last_streamed_block(tmp_path, ece408, tiny_budget, monkeypatch, step):
    """Labels are waited for after the last block, not with each: a bad one is still refused,
    naming it, with nothing written (read in steps of 7 rows too)."""
    if step:
        monkeypatch.setattr("infer.data.dataset.LABEL_STEP", step)
    with h5py.File(ece408 / "testfull.hdf5") as f:
        x, y = f["x"][:3000], f["y"][:3000]
    y[2990, 4] = np.inf
    bad = tmp_path / "bad.h5"
    with h5py.File(bad, "w") as f:
        f["x"], f["y"] = x, y
    out = tmp_path / "p.npy"
    r = invoke("run", bad, ece408 / "model.hdf5", "--backend", "cpu", "--predictions", out)
    assert_refused(r, "bad.h5", "'y'", "(2990, 4)", "not a finite")
    assert not out.exists()


class CountingBackend(host.HostSide):
    """Records the host buffers it allocates; classifies everything as 0."""
    stream_block, ring_depth, checks_values = 100, 3, False

    def __init__(self, readers=None):
        self.buffers, self.readers = [], readers

    @staticmethod
    def wire_dtype(stored):
        return np.dtype(np.float32)

    def new_host_buffer(self, shape, dtype):
        self.buffers.append(shape)
        return np.empty(shape, dtype)

    def forward_stream(self, ring, progress, out):
        for _, x, buf in ring:
            ring.release(buf)
            progress.update(len(x))
        out[0][:] = 0


def test_host_memory_is_the_ring_whatever_the_size(ece408):
    model = loader.load_model(ece408 / "model.hdf5")
    data = DataSet.open([ece408 / "testfull.hdf5"], model)
    b = CountingBackend()
    try:
        out = host.outputs(10000, 10, scores=False)
        _, labels, _, read_s, _ = b.stream(data, 0, 10000, progress.NoProgress(), out)
        assert b.buffers == [(100, 28, 28, 1)] * 3  # 3 blocks of 100 images for 10,000 images
        assert labels is out[1] and read_s > 0
        with h5py.File(ece408 / "testfull.hdf5") as f:
            assert (labels == np.argmax(f["y"][()], axis=1)).all()
        again = b.stream(data, 0, 10000, progress.NoProgress(), host.outputs(10000, 10, False))[1]
        assert len(b.buffers) == 3 and (again == labels).all()  # the same shape again: nothing new
    finally:
        b.close_host()
        data.close()


def test_progress_bar_only_on_a_terminal_after_the_delay(monkeypatch):
    p = progress.Progress(10)
    assert not p.enabled  # pytest's stderr is not a terminal
    monkeypatch.setattr(progress.sys.stderr, "isatty", lambda: True, raising=False)
    p = progress.Progress(10)
    p.update(3)
    assert p.bar is None  # not before 2 s
    p.t0 -= 3
    p.update(3)
    assert p.bar is not None and p.done == 6
    p.close()
