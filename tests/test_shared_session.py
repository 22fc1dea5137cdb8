"""A Session shared by threads gives each call the answers it would get alone; options are typed;
every CNNINFER_* variable is checked with one line."""
import threading

import h5py
import numpy as np
import pytest

import cnninfer
from infer.errors import InputError
from tests.conftest import invoke

THREADS = 6


@pytest.fixture(scope="module")
def testfull(ece408):
    with h5py.File(ece408 / "testfull.hdf5") as f:
        return f["x"][:1500]


def hammer(session, jobs, rounds=3):
    """Run jobs (fn, args) from THREADS threads at once, each several rounds, started together;
    every result of each job, in order."""
    barrier = threading.Barrier(len(jobs))
    results = [[] for _ in jobs]
    errors = []

    def worker(i):
        fn, args = jobs[i]
        try:
            barrier.wait()
            for _ in range(rounds):
                results[i].append(fn(*args))
        except BaseException as e:  # reported in the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def slices(rng, n_images, count):
    """Overlapping slices, in pairs of one odd length: threads with batches of one shape (the
    backend's buffers are kept per shape) and threads with other shapes."""
    out = []
    for i in range(count):
        if i % 2 == 0:
            length = int(rng.integers(301, 700)) | 1
        lo = int(rng.integers(0, n_images - 700))
        out.append(slice(lo, lo + length))
    return out


def test_threads_sharing_a_session_get_the_sequential_answers(ece408, testfull, rng):
    with cnninfer.Session(ece408 / "model.hdf5", backend="cpu") as s:
        parts = slices(rng, len(testfull), THREADS)
        alone = [s.predict(testfull[p]) for p in parts]
        scores_alone = [s.scores(testfull[p]) for p in parts]
        jobs = [(s.predict, (testfull[p],)) if i % 3 else (s.scores, (testfull[p],)) for i, p in enumerate(parts)]
        for i, got in enumerate(hammer(s, jobs)):
            for r in got:
                expect = alone[i] if i % 3 else scores_alone[i]
                np.testing.assert_array_equal(r, expect)


def test_the_reported_case_four_threads_of_1000_images(ece408, testfull):
    with cnninfer.Session(ece408 / "model.hdf5", backend="cpu") as s:
        parts = [slice(lo, lo + 1000) for lo in (0, 150, 300, 450)]
        alone = [s.predict(testfull[p]) for p in parts]
        for i, got in enumerate(hammer(s, [(s.predict, (testfull[p],)) for p in parts], rounds=2)):
            for r in got:
                np.testing.assert_array_equal(r, alone[i])


def test_threads_mixing_evaluate_predict_and_dtypes(ece408, testfull, rng):
    with cnninfer.Session(ece408 / "model.hdf5", backend="cpu") as s:
        u8 = (testfull[:400] * 255).round().astype(np.uint8)
        jobs = [(lambda: s.evaluate(ece408 / "testfull.hdf5", 700).correct, ()),
                (s.predict, (u8,)), (s.predict, (testfull[:700],)), (s.predict, (testfull[800:1500],)),
                (lambda: s.evaluate(ece408 / "test100.hdf5").correct, ())]
        alone = [fn(*args) for fn, args in jobs]
        for i, got in enumerate(hammer(s, jobs)):
            for r in got:
                np.testing.assert_array_equal(r, alone[i])


def test_close_waits_for_the_call_in_flight_then_refuses_calls(ece408, testfull):
    """The interleaving forced: a call is held inside the backend's forward pass; close() must wait
    for it (it is still running while the call is held), a call made meanwhile is refused, and the
    held call then finishes with the answers it would have had alone."""
    s = cnninfer.Session(ece408 / "model.hdf5", backend="cpu")
    alone = s.predict(testfull[:300])
    entered, release = threading.Event(), threading.Event()
    real = s.backend.forward

    def held(x, progress):
        entered.set()
        assert release.wait(30)
        return real(x, progress)

    s.backend.forward = held
    outcomes = []
    caller = threading.Thread(target=lambda: outcomes.append(s.predict(testfull[:300])))
    caller.start()
    assert entered.wait(30), "the call reached the forward pass"
    closer = threading.Thread(target=s.close)
    closer.start()
    closer.join(0.5)
    assert closer.is_alive(), "close() returned while a call was in flight"
    late = []

    def late_call():
        try:
            late.append(s.predict(testfull[:5]))
        except InputError as e:
            late.append(e)

    latecomer = threading.Thread(target=late_call)  # made while close waits: refused once it is closed
    latecomer.start()
    release.set()
    for t in (caller, closer, latecomer):
        t.join(30)
        assert not t.is_alive()
    assert len(outcomes) == 1 and (outcomes[0] == alone).all()
    assert len(late) == 1 and isinstance(late[0], InputError) and "closed" in str(late[0])
    with pytest.raises(InputError, match="closed"):
        s.predict(testfull[:5])


@pytest.mark.parametrize("options,words", [
    (dict(conv_alg="unroll"), "unknown option conv_alg; the options are"),
    (dict(bogus=3, streems=2), "unknown options bogus, streems"),
])
def test_misspelt_options_are_a_type_error_naming_them(ece408, options, words):
    with pytest.raises(TypeError, match=words):
        cnninfer.Session(ece408 / "model.hdf5", backend="cpu", **options)


@pytest.mark.parametrize("options,words", [
    (dict(streams=0), "streams must be a whole number of at least 1"),
    (dict(chunk="32"), "chunk must be a whole number"),
    (dict(conv_algo="fastest"), "conv_algo must be one of auto, fused-wgmma"),
    (dict(tile_width=12), "tile_width must be one of"),
    (dict(devices=[0, 0]), "distinct"),
    (dict(fast_math="yes"), "fast_math must be True or False"),
    (dict(precision="half"), "precision must be one of exact, certified, not 'half'"),
    (dict(precision="certified", conv_algo="implicit-tc"), "--conv-algo implicit-tc computes exactly"),
])
def test_bad_option_values_raise_input_error(ece408, options, words):
    with pytest.raises(InputError, match=words):
        cnninfer.Session(ece408 / "model.hdf5", backend="cpu", **options)


def test_cuda_options_are_accepted_on_the_cpu(ece408, testfull):
    with cnninfer.Session(ece408 / "model.hdf5", backend="cpu", conv_algo="unroll", streams=2, chunk=7,
                          precision="exact") as s:
        assert s.predict(testfull[:20]).shape == (20,)
    with cnninfer.Session(ece408 / "model.hdf5", backend="cpu", precision="certified") as s:
        assert s.evaluate(ece408 / "test10.hdf5").recomputed is None  # the CPU computes every image exactly


@pytest.mark.parametrize("name,value,words", [
    ("CNNINFER_HOST_BUDGET_MB", "abc", "CNNINFER_HOST_BUDGET_MB: 'abc' is not a whole number of MiB"),
    ("CNNINFER_HOST_BUDGET_MB", "-5", "not a whole number"),
    ("CNNINFER_NATIVE", "yes", "CNNINFER_NATIVE: 'yes' must be 0 or 1"),
    ("CNNINFER_GRAPHS", "2", "CNNINFER_GRAPHS: '2' must be 0 or 1"),
    ("CNNINFER_CODES", "on", "CNNINFER_CODES: 'on' must be 0 or 1"),  # refused even where no file is streamed
])
def test_bad_environment_variables_are_one_line_exit_2(ece408, monkeypatch, name, value, words):
    monkeypatch.setenv(name, value)
    r = invoke("run", ece408 / "test10.hdf5", ece408 / "model.hdf5", "--backend", "cpu")
    assert r.exit_code == 2, r.output
    assert words in r.stderr and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    with pytest.raises(InputError, match=words):
        cnninfer.Session(ece408 / "model.hdf5", backend="cpu")


def test_a_cache_path_that_is_a_file_is_refused(ece408, monkeypatch, tmp_path):
    (tmp_path / "f").write_text("")
    monkeypatch.setenv("CNNINFER_CACHE", str(tmp_path / "f"))
    r = invoke("run", ece408 / "test10.hdf5", ece408 / "model.hdf5", "--backend", "cpu")
    assert r.exit_code == 2 and "CNNINFER_CACHE:" in r.stderr and "is not a folder" in r.stderr


def test_good_environment_values_work(ece408, monkeypatch):
    monkeypatch.setenv("CNNINFER_HOST_BUDGET_MB", " 0 ")  # streamed
    monkeypatch.setenv("CNNINFER_NATIVE", "0")
    r = invoke("run", ece408 / "test100.hdf5", ece408 / "model.hdf5", "--backend", "cpu", "--json")
    assert r.exit_code == 0, r.stderr
    assert '"streamed": true' in r.stdout and '"correct": 95' in r.stdout


@pytest.mark.gpu
def test_threads_sharing_a_cuda_session_get_the_sequential_answers(ece408, testfull, rng):
    """Calls from threads other than the one that made the context (it is made current for each),
    and a close from yet another thread."""
    s = cnninfer.Session(ece408 / "model.hdf5", backend="cuda")
    parts = slices(rng, len(testfull), THREADS)
    alone = [s.predict(testfull[p]) for p in parts]
    u8 = (testfull[:500] * 255).round().astype(np.uint8)
    jobs = [(s.predict, (testfull[p],)) for p in parts] + [(s.predict, (u8,))]
    alone.append(s.predict(u8))
    for i, got in enumerate(hammer(s, jobs)):
        for r in got:
            np.testing.assert_array_equal(r, alone[i])
    closer = threading.Thread(target=s.close)
    closer.start()
    closer.join()
    with pytest.raises(InputError, match="closed"):
        s.predict(testfull[:3])


def test_calls_at_once_leave_a_streamed_runs_settings_alone(ece408, testfull, monkeypatch):
    """A streamed run holds the lock from prepare to its outputs; in-memory calls running at once
    beside it must not change what it prepared (they once set keep_scores through prepare)."""
    monkeypatch.setenv("CNNINFER_HOST_BUDGET_MB", "1")  # 3000 images stream, 40 stay in memory
    with cnninfer.Session(ece408 / "model.hdf5", backend="cpu") as s:
        expected = s.evaluate(ece408 / "testfull.hdf5", 3000, scores=True).scores
        assert s.backend.keep_scores  # as the streamed run prepared it
        s.predict(testfull[:40])
        assert s.backend.keep_scores
        jobs = [(lambda: s.evaluate(ece408 / "testfull.hdf5", 3000, scores=True).scores, ())] + \
               [(s.predict, (testfull[:40],)) for _ in range(3)]
        for r in hammer(s, jobs, rounds=4)[0]:
            np.testing.assert_array_equal(r, expected)
