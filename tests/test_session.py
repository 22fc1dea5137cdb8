"""The Python API (Session) and the command line's new outputs: arrays of any number type, the
same validation as files, buffers kept between calls, shards, scores, per-class results."""
import json

import h5py
import numpy as np
import pytest

import cnninfer
import infer
from infer import reference
from infer.errors import InputError
from tests.conftest import invoke


@pytest.fixture(scope="module")
def images(ece408):
    with h5py.File(ece408 / "testfull.hdf5") as f:
        return f["x"][:300], np.argmax(f["y"][:300], axis=1)


@pytest.fixture
def session(ece408):
    with cnninfer.Session(ece408 / "model.hdf5", backend="cpu") as s:
        yield s


def test_three_lines_do_what_run_does(ece408, images, session):
    x, labels = images
    run = infer.run(ece408 / "testfull.hdf5", ece408 / "model.hdf5", 300, backend="cpu")
    assert (session.predict(x) == run.predictions).all()
    # The backend runs the reference layers on chunks: BLAS may sum a chunk in another order
    np.testing.assert_allclose(session.scores(x), reference.scores(x, session.model), rtol=1e-5, atol=1e-5)
    assert session.evaluate(ece408 / "testfull.hdf5", 300).as_dict()["correct"] == run.correct


@pytest.mark.parametrize("dtype", ["u1", "i2", "i8", "f2", "f8", ">f4"])
def test_any_number_type_is_converted_as_numpy_does(session, rng, dtype):
    x = (rng.random((37, 28, 28, 1)) * 100).astype(dtype)
    assert (session.predict(x) == reference.forward(x.astype(np.float32), session.model)).all()


@pytest.mark.parametrize("x,words", [
    (np.ones((2, 28, 28), np.float32), "shape (2, 28, 28), expected (N, H, W, C)"),
    (np.ones((2, 28, 28, 1), bool), "not a number type"),
    (np.ones((2, 28, 28, 3), np.float32), "3 channels"),
    (np.full((2, 28, 28, 1), 1e39), "(0, 0, 0, 0) is 1e+39, not a finite float32"),
])
def test_bad_arrays_raise_one_line(session, x, words):
    with pytest.raises(InputError) as e:
        session.predict(x)
    assert words in e.value.message and "\n" not in e.value.message
    assert isinstance(e.value, ValueError)


def test_no_images_no_work(session):
    assert session.predict(np.empty((0, 28, 28, 1))).shape == (0,)
    assert session.scores(np.empty((0, 28, 28, 1))).shape == (0, 10)


@pytest.mark.gpu
def test_repeated_cuda_calls_allocate_no_new_buffers(ece408, images):
    with cnninfer.Session(ece408 / "model.hdf5", backend="cuda") as s:
        s.predict(images[0])
        buffers = dict(s.backend._host_buffers)
        s.predict(images[0])
        s.scores(images[0])
        assert s.backend._host_buffers == buffers


@pytest.mark.gpu
def test_a_small_call_repeated_runs_the_prepared_run_with_the_same_answers(ece408, rng):
    """classify again on an array of an earlier call's shape, type and scores runs the run prepared
    for it, with no new plan or prepare (Session._repeat), and answers equal to the first call's
    and the reference's; a call of another kind between them prepares again, and so does the
    repeated call after it; a value that is not finite is still refused naming its image."""
    x = rng.random((7, 28, 28, 1), np.float32)
    u = (rng.random((5, 28, 28, 1)) * 255).astype(np.uint8)
    with cnninfer.Session(ece408 / "model.hdf5", backend="cuda") as s:
        first = s.classify(x, scores=True)
        prepares, prepare = [], s.backend.prepare
        s.backend.prepare = lambda *a, **k: (prepares.append(a[1].n), prepare(*a, **k))[1]
        for _ in range(2):
            again = s.classify(x.copy(), scores=True)
            np.testing.assert_array_equal(again[0], first[0])
            np.testing.assert_array_equal(again[1], first[1])
        assert prepares == []
        assert (s.predict(u) == reference.forward(u.astype(np.float32), s.model)).all()
        assert prepares == [5]
        np.testing.assert_array_equal(s.classify(x, scores=True)[1], first[1])
        assert prepares == [5, 7]
        assert (first[0] == reference.forward(x, s.model)).all()
        bad = x.copy()
        bad[4, 3, 5, 0] = np.nan
        with pytest.raises(InputError, match=r"\(4, 3, 5, 0\) is nan"):
            s.classify(bad, scores=True)
        assert prepares == [5, 7]  # refused on the repeated run's own pass
        np.testing.assert_array_equal(s.classify(x, scores=True)[0], first[0])


def test_cpu_calls_keep_no_buffers_between_them(session, images):
    """Each in-memory CPU call has its own image buffer, so threads' calls run at once."""
    session.predict(images[0])
    session.scores(images[0][:7])
    assert not session.backend.__dict__.get("_host_buffers")


def test_a_model_from_arrays(ece408, images):
    with h5py.File(ece408 / "model.hdf5") as f:
        weights = {k: f[k][()] for k in ("conv1", "conv2", "fc1", "fc2")}
    with cnninfer.Session(weights, backend="cpu") as s:
        assert (s.predict(images[0][:50]) == reference.forward(images[0][:50], s.model)).all()
    del weights["fc2"]
    with pytest.raises(InputError, match="no weights named fc2"):
        cnninfer.Session(weights, backend="cpu")


def test_a_closed_session_says_so(session, images):
    session.close()
    with pytest.raises(InputError, match="closed"):
        session.predict(images[0])


@pytest.fixture(scope="module")
def shards(ece408, tmp_path_factory):
    with h5py.File(ece408 / "testfull.hdf5") as f:
        x, y = f["x"][:700], f["y"][:700]
    folder = tmp_path_factory.mktemp("shards")
    for i, (lo, hi) in enumerate([(0, 250), (250, 251), (251, 700)]):
        with h5py.File(folder / f"s{i}.h5", "w") as f:
            f["x"], f["y"] = x[lo:hi].astype(np.float64), y[lo:hi]
    return folder


def test_several_files_are_one_data_set(ece408, shards):
    whole = json.loads(invoke("run", ece408 / "testfull.hdf5", ece408 / "model.hdf5", 700, "--backend", "cpu", "--json").stdout)
    r = invoke("run", shards / "s*.h5", ece408 / "model.hdf5", "--backend", "cpu", "--json")
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert (d["n"], d["correct"]) == (700, whole["correct"])
    assert [(s["n"], s["data"].endswith(f"s{i}.h5")) for i, s in enumerate(d["shards"])] == [(250, True), (1, True), (449, True)]
    assert sum(s["correct"] for s in d["shards"]) == d["correct"]
    r = invoke("run", shards / "s0.h5", shards / "s2.h5", ece408 / "model.hdf5", 300, "--backend", "cpu", "--json")
    assert [s["n"] for s in json.loads(r.stdout)["shards"]] == [250, 50]
    # files past the first N images are not opened: one that is not there is no error
    r = infer.run([shards / "s0.h5", shards / "absent.h5"], ece408 / "model.hdf5", 200, backend="cpu")
    assert r.n == 200 and [s[0] for s in r.shards] == [str(shards / "s0.h5")]


def test_shards_that_disagree_or_match_nothing_are_refused(ece408, shards, tmp_path):
    with h5py.File(tmp_path / "odd.h5", "w") as f:
        f["x"], f["y"] = np.ones((3, 32, 32, 1), np.float32), np.eye(10)[:3]
    r = invoke("run", shards / "s0.h5", tmp_path / "odd.h5", ece408 / "model.hdf5", "--backend", "cpu")
    assert r.exit_code == 2 and "odd.h5: dataset 'x'" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    # 29x29 images fit the model too (its pools round down), but not beside 28x28 ones
    with h5py.File(tmp_path / "wide.h5", "w") as f:
        f["x"], f["y"] = np.ones((3, 29, 29, 1), np.float32), np.eye(10)[:3]
    r = invoke("run", shards / "s0.h5", tmp_path / "wide.h5", ece408 / "model.hdf5", "--backend", "cpu")
    assert r.exit_code == 2 and "wide.h5: dataset 'x'" in r.stderr and "must agree" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = invoke("run", tmp_path / "none*.h5", ece408 / "model.hdf5", "--backend", "cpu")
    assert r.exit_code == 2 and "no file matches" in r.stderr


def test_scores_file_and_per_class_table(ece408, tmp_path):
    out = tmp_path / "s.npy"
    r = invoke("run", ece408 / "test100.hdf5", ece408 / "model.hdf5", "--backend", "cpu", "--scores", out, "--per-class")
    assert r.exit_code == 0, r.stderr
    scores = np.load(out)
    assert scores.shape == (100, 10) and scores.dtype == np.float32
    table = r.stdout.splitlines()[2:]
    assert table[0].startswith("class") and len(table) == 11
    d = json.loads(invoke("run", ece408 / "test100.hdf5", ece408 / "model.hdf5", "--backend", "cpu", "--json").stdout)
    confusion = np.array(d["confusion"])
    assert confusion.sum() == 100 and np.trace(confusion) == d["correct"] == 95
    assert [c["correct"] for c in d["per_class"]] == list(np.diag(confusion))
    # rows are the true labels, columns the predictions; each class's most frequent mistake its row's
    with h5py.File(ece408 / "test100.hdf5") as f:
        labels = np.argmax(f["y"][()], axis=1)
    predictions = infer.run(ece408 / "test100.hdf5", ece408 / "model.hdf5", backend="cpu").predictions
    expected = np.zeros((10, 10), np.int64)
    np.add.at(expected, (labels, predictions), 1)
    assert (confusion == expected).all() and [c["n"] for c in d["per_class"]] == np.bincount(labels, minlength=10).tolist()
    for c, row in zip(d["per_class"], expected):
        wrong = row.copy()
        wrong[c["class"]] = 0
        assert c["confused_with"] == (int(np.argmax(wrong)) if wrong.any() else None)
    assert any(c["confused_with"] is None for c in d["per_class"]) and any(c["confused_with"] is not None
                                                                           for c in d["per_class"])
    run = infer.run(ece408 / "test100.hdf5", ece408 / "model.hdf5", backend="cpu")
    assert (np.argmax(scores, axis=1) == run.predictions).all()
    r = invoke("run", ece408 / "test2.hdf5", ece408 / "model.hdf5", "--backend", "cpu", "--scores", tmp_path / "s.csv")
    assert r.exit_code == 2 and "written as .npy" in r.stderr
