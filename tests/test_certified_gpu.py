"""fused-certified (float16 conv2 with a certificate per image, the rest recomputed exactly) gives
fused-wgmma's labels: on testfull, the bundled model's sample, random weights and constructed near
ties, where trusting the float16 pass alone (every image certified) changes labels. Needs a Hopper GPU."""
import functools

import numpy as np
import pytest

from infer.data import loader
from infer.gpu import certify
from infer.bench.gpu import random_case, read_all
from infer.plan import for_backend
from tests.conftest import REPO, invoke
from tests.near_ties import near_ties

pytestmark = pytest.mark.gpu

CERTIFIED, EXACT = "fused-certified", "fused-wgmma"


def hopper(gpu):
    from infer.gpu.launch import needs_hopper

    why = needs_hopper(gpu.arch)
    if why:
        pytest.skip(why)


def labels_of(algo, model, x, chunk=None, scores=False):
    """(labels, scores or None, images the certificate left to the exact path or None)."""
    from infer.gpu.backend import CudaBackend

    b = CudaBackend(conv_algo=algo, chunk=chunk)
    try:
        host = b.host_buffers(x.shape, np.float32)[0]
        host[...] = x
        b.prepare(model, for_backend(b, model, x.shape, scores=scores))
        pipeline = b.executor.pipeline
        if algo == CERTIFIED:
            pipeline.recomputed()  # the warm-up's
        labels, s = b.forward(host)
        return labels, s, pipeline.recomputed() if algo == CERTIFIED else None
    finally:
        b.close()


def both(model, x, chunk=None):
    exact, _, _ = labels_of(EXACT, model, x, chunk)
    certified, _, recomputed = labels_of(CERTIFIED, model, x, chunk)
    return exact, certified, recomputed


@functools.lru_cache(maxsize=None)
def oracle_left(data, model_path, n):
    """The images the CPU oracle of the same bound (infer/gpu/certify.py, fc1 from float16 operands)
    leaves to the exact path."""
    model = loader.load_model(model_path)
    return int(np.count_nonzero(~certify.predict(read_all(data, model, n), model)[1]))


@pytest.mark.parametrize("chunk", [None, 333])
def test_testfull_labels_are_the_exact_paths(gpu, ece408, chunk):
    """The labels are the exact path's, and the GPU's certificate leaves about what the CPU oracle of
    the same bound leaves (1,198 and 1,197 of 10,000): a GPU bound looser recomputes more, one that
    is tighter than the oracle's (unsound: a term dropped or scaled down) recomputes fewer."""
    hopper(gpu)
    model = loader.load_model(ece408 / "model.hdf5")
    x = read_all(ece408 / "testfull.hdf5", model, 10000)
    exact, certified, recomputed = both(model, x, chunk)
    np.testing.assert_array_equal(certified, exact)
    left = oracle_left(ece408 / "testfull.hdf5", ece408 / "model.hdf5", len(x))
    assert 0.98 * left <= recomputed <= 1.02 * left, (recomputed, left)


def test_bundled_sample_labels_are_the_exact_paths(gpu):
    hopper(gpu)
    model = loader.load_model(REPO / "models" / "cnninfer-mnist.hdf5")
    x = read_all(REPO / "models" / "mnist-sample.hdf5", model, 1000)
    exact, certified, recomputed = both(model, x)
    np.testing.assert_array_equal(certified, exact)
    assert recomputed < 0.1 * len(x), recomputed


def test_the_pairs_stage_certifies_part_of_what_the_first_stage_lists(gpu, ece408, monkeypatch):
    """The certificate's first stage (certify_kernel4 and 5) lists the (image, class) pairs its cheaper
    bound fails (their images stay provisionally certified; an image whose margin cannot cover even
    the rest of the full bound is left out at once); pair_kernel2 (or 1) clears the images of the
    pairs that the full bound fails too: some listed images end certified, some recomputed."""
    import pycuda.driver as cuda

    from infer.gpu import launch

    hopper(gpu)
    monkeypatch.setenv("CNNINFER_GRAPHS", "0")  # the wrapper below waits for each chunk's certificate
    model = loader.load_model(ece408 / "model.hdf5")
    x = read_all(ece408 / "testfull.hdf5", model, 3000)
    certify, seen = launch.Certify.__call__, []

    def watched(self, stream, *args, pairs=None, **kw):
        certify(self, stream, *args, pairs=pairs, **kw)
        stream.synchronize()
        ok, n = np.zeros(args[-1], np.int32), args[-1]
        cuda.memcpy_dtoh(ok, args[-2])
        count = np.zeros(1, np.int32)
        cuda.memcpy_dtoh(count, pairs[2])
        listed = np.zeros((max(int(count[0]), 1), 4), np.float32)
        cuda.memcpy_dtoh(listed, pairs[0])
        seen.append((ok, set(listed[:count[0], 0].view(np.int32).tolist()), n))

    monkeypatch.setattr(launch.Certify, "__call__", watched)
    exact, certified, recomputed = both(model, x, chunk=len(x))
    np.testing.assert_array_equal(certified, exact)
    ok, listed, n = seen[-1]  # the measured run: one chunk
    assert n == len(x) and recomputed == np.count_nonzero(ok == 0)
    failed = set(np.flatnonzero(ok == 0).tolist())
    assert listed - failed and listed & failed, "the pair kernel certified none or all of the listed images"
    assert recomputed < len(listed) < 0.4 * n, (recomputed, len(listed))


@pytest.mark.parametrize("spec", ["28x28x1,5:32,5:64,128", "28x28x3,3:32,5:64,128", "28x44x2,5:32,5:64,128"])
@pytest.mark.parametrize("scale", [1.0, 1e-3, 200.0])
def test_random_networks_labels_are_the_exact_paths(gpu, spec, scale):
    hopper(gpu)
    model, x = random_case(spec, 517, seed=11)
    exact, certified, _ = both(model, x * np.float32(scale))
    np.testing.assert_array_equal(certified, exact)


def test_near_ties_need_the_certificate(gpu, ece408, monkeypatch):
    """Near ties: the certified labels are the exact path's; with every image certified (the bound
    forced to 0: ok = 1 after the certificate's kernels) the float16 pass's labels differ on some."""
    import pycuda.driver as cuda

    from infer.gpu import launch

    hopper(gpu)
    model = loader.load_model(ece408 / "model.hdf5")
    ties, _ = near_ties(read_all(ece408 / "testfull.hdf5", model, 2000), model, pairs=8)
    exact, certified, recomputed = both(model, ties)
    np.testing.assert_array_equal(certified, exact)
    assert recomputed >= 16  # at least the bisected pair of each segment

    certify = launch.Certify.__call__

    def trusting(self, stream, *args, **kw):
        certify(self, stream, *args, **kw)  # versions 4 and 5 compute the float16 pass's scores and labels here
        cuda.memset_d32_async(args[-2], 1, args[-1], stream)

    monkeypatch.setattr(launch.Certify, "__call__", trusting)
    trusted, _, none_left = labels_of(CERTIFIED, model, ties)
    assert none_left == 0
    assert np.count_nonzero(trusted != exact) >= 2, "float16 alone never changed a near tie's label"


def test_scores_are_the_float16_pass_within_its_error(gpu, ece408):
    hopper(gpu)
    model = loader.load_model(ece408 / "model.hdf5")
    x = read_all(ece408 / "testfull.hdf5", model, 1000)
    _, exact, _ = labels_of(EXACT, model, x, scores=True)
    _, certified, _ = labels_of(CERTIFIED, model, x, scores=True)
    np.testing.assert_allclose(certified, exact, rtol=0, atol=2e-2 * np.abs(exact).max())


def test_precision_certified_through_the_session_and_the_command_line(gpu, ece408, monkeypatch):
    """--precision certified runs fused-certified (the exact path's labels) and reports the images it
    recomputed: Result.recomputed, --json's "recomputed", a line of --profile; exact reports none."""
    import json

    import cnninfer

    hopper(gpu)
    data, model = ece408 / "testfull.hdf5", ece408 / "model.hdf5"
    with cnninfer.Session(model, backend="cuda", precision="certified") as s:
        certified = s.evaluate(data)
        assert "fused-certified" in s.device
        again = s.evaluate(data, 1000)  # counted per call, from zero
    with cnninfer.Session(model, backend="cuda", precision="exact") as s:
        exact = s.evaluate(data)
        assert "fused-wgmma" in s.device
    np.testing.assert_array_equal(certified.predictions, exact.predictions)
    assert exact.recomputed is None and 0 < certified.recomputed < 0.4 * certified.n
    assert 0 < again.recomputed < certified.recomputed
    r = invoke("run", data, model, "--backend", "cuda", "--precision", "certified", "--json")
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["correct"] == 8722 and d["recomputed"] == certified.recomputed and d["precision"] == "certified"
    # the default: testfull's 10,000 images travel as 8-bit codes, so they are certified (from
    # CERTIFY_FROM); as float32 they run exactly
    d = json.loads(invoke("run", data, model, "--backend", "cuda", "--json").stdout)
    assert d["precision"] == "certified" and d["recomputed"] == certified.recomputed and d["correct"] == 8722
    monkeypatch.setenv("CNNINFER_CODES", "0")
    d = json.loads(invoke("run", data, model, "--backend", "cuda", "--json").stdout)
    assert d["precision"] == "exact" and "recomputed" not in d and "fused-certified" in d["device"]
    monkeypatch.delenv("CNNINFER_CODES")
    r = invoke("run", data, model, "--backend", "cuda", "--precision", "certified", "--profile", "--streams", "1")
    assert r.exit_code == 0, r.stderr
    assert f"certified: {10000 - certified.recomputed} of 10000 images in float16, {certified.recomputed} recomputed exactly" in r.stdout


def test_the_default_runs_float32_uploads_and_score_requests_exactly(gpu, ece408):
    """No --conv-algo, no --precision: float32 images run the exact path alone however many (their
    upload bounds both paths, and the certified tail ends later), with or without scores, which are
    then fused-wgmma's bits."""
    from infer.gpu.backend import CudaBackend
    from infer.gpu.pipelines import FusedCertified

    hopper(gpu)
    model = loader.load_model(ece408 / "model.hdf5")
    base = read_all(ece408 / "testfull.hdf5", model, 10000)
    n = 2 * FusedCertified.CERTIFY_FROM
    x = np.concatenate([base] * -(-n // len(base)))[:n]

    def default_run(x, scores):
        b = CudaBackend()
        try:
            host = b.host_buffers(x.shape, np.float32)[0]
            host[...] = x
            b.prepare(model, for_backend(b, model, x.shape, scores=scores))
            assert "fused-certified" in b.device and "else exact" in b.device
            labels, s = b.forward(host)
            return labels, s, b.recomputed()
        finally:
            b.close()

    exact, exact_scores, _ = labels_of(EXACT, model, x, scores=True)
    for scores in (False, True):
        labels, s, recomputed = default_run(x, scores)
        assert recomputed is None
        np.testing.assert_array_equal(labels, exact)
    np.testing.assert_array_equal(s, exact_scores)


def test_images_uploaded_a_byte_a_pixel_are_certified_from_certify_from(gpu, ece408):
    """8-bit codes (and uint8): the default certifies from CERTIFY_FROM images, with the exact path's
    labels (and counts what it recomputed); one fewer, or scores asked for, runs the exact path alone."""
    from infer.data import codes
    from infer.gpu.backend import CudaBackend
    from infer.gpu.pipelines import FusedCertified

    hopper(gpu)
    model = loader.load_model(ece408 / "model.hdf5")
    n = FusedCertified.CERTIFY_FROM
    x = read_all(ece408 / "testfull.hdf5", model, n)
    exact, _, _ = labels_of(EXACT, model, x)
    for count, certified, scores in ((n, True, False), (n - 1, False, False), (n, False, True)):
        b = CudaBackend()
        try:
            host = b.host_buffers((count,) + x.shape[1:], codes.MUL)[0]
            host.view(np.uint8)[...] = codes.pack(x[:count], codes.MUL)
            b.prepare(model, for_backend(b, model, host.shape, wire=codes.MUL, scores=scores))
            b.recomputed()  # the warm-up's
            labels, _ = b.forward(host)
            recomputed = b.recomputed()
        finally:
            b.close()
        np.testing.assert_array_equal(labels, exact[:count])
        assert (recomputed is not None and 0 < recomputed < 0.15 * count) if certified else recomputed is None
