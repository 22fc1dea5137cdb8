"""The CPU backend's native network (cpu_net.c) against the NumPy reference: odd geometries,
channel counts that are not a multiple of the vector width, blank regions (the skipped windows),
overflow, and the NumPy fallback."""
import numpy as np
import pytest

from infer import reference
from infer.cpu import net, winograd
from infer.cpu.backend import CpuBackend, NativeNet
from infer.errors import BadValue, InputError, ScoresOverflow
from infer.data.loader import Model

# (h, w, c, k1, c1, k2, c2, hidden, classes)
GEOMETRIES = [
    (28, 28, 1, 5, 32, 5, 64, 128, 10),   # the ECE408 network
    (19, 23, 3, 3, 20, 4, 36, 50, 7),     # odd sides (the pools floor), padded channels everywhere
    (32, 32, 3, 5, 32, 5, 64, 256, 10),
    (13, 11, 2, 2, 5, 2, 17, 9, 3),
    (30, 26, 1, 7, 48, 3, 80, 70, 12),    # three vectors of channels, conv1 tiles of two windows
    (21, 19, 2, 3, 12, 5, 20, 30, 5),     # conv2 5x5 (Winograd's) on padded channels, its pool floored
]


@pytest.fixture(scope="module")
def lib():
    lib = net.net_library()
    if lib is None:
        pytest.skip("no C compiler here: the CPU backend runs the NumPy layers (tested everywhere else)")
    return lib


def random_model(rng, g):
    h, w, c, k1, c1, k2, c2, hidden, classes = g
    h2, w2 = ((h - k1 + 1) // 2 - k2 + 1) // 2, ((w - k1 + 1) // 2 - k2 + 1) // 2
    he = lambda *shape: (rng.standard_normal(shape) * np.sqrt(2 / np.prod(shape[:-1]))).astype(np.float32)  # noqa: E731
    return Model("random.h5", he(k1, k1, c, c1), he(k2, k2, c1, c2), he(h2 * w2 * c2, hidden), he(hidden, classes))


def images(rng, n, g):
    """Random images with blank margins and blank blocks, as digits on a page have."""
    h, w, c = g[:3]
    x = rng.random((n, h, w, c), dtype=np.float32)
    x[:, : h // 4] = 0
    x[:, :, w - w // 3:] = 0
    x[1::3, h // 2:, : w // 2] = 0
    x[2] = 0
    return x


def assert_same_answers(labels, scores, x, model):
    expected = reference.scores(x, model)
    scale = np.abs(expected).max()
    np.testing.assert_allclose(scores, expected, rtol=0, atol=2e-5 * scale)
    # Summation order differs from BLAS's: labels must agree wherever the top two are apart
    top2 = np.sort(expected, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 1e-4 * scale
    assert clear.mean() > 0.9
    assert (labels[clear] == reference.argmax(expected)[clear]).all()


@pytest.mark.parametrize("g", GEOMETRIES, ids=lambda g: "x".join(map(str, g)))
def test_native_network_matches_the_reference(lib, rng, g):
    model, x = random_model(rng, g), images(rng, 45, g)
    net = NativeNet(lib, model, x.shape[1:])
    labels, scores = np.empty(len(x), np.int64), np.empty((len(x), g[-1]), np.float32)
    assert net(x, labels, scores) == -1
    assert_same_answers(labels, scores, x, model)


def test_a_blank_image_scores_exactly_zero(lib, rng):
    g = GEOMETRIES[0]
    model = random_model(rng, g)
    x = np.zeros((3, 28, 28, 1), np.float32)
    x[1, 13, 17] = 0.7  # one lit pixel: only the windows that see it are computed
    net = NativeNet(lib, model, x.shape[1:])
    labels, scores = np.empty(3, np.int64), np.empty((3, 10), np.float32)
    net(x, labels, scores)
    assert (scores[[0, 2]] == 0).all() and (labels[[0, 2]] == 0).all()
    np.testing.assert_allclose(scores[1], reference.scores(x[1:2], model)[0], rtol=1e-5, atol=1e-7)


def test_the_backend_runs_native_code_in_chunks_and_threads(lib, rng):
    g = GEOMETRIES[1]
    model, x = random_model(rng, g), images(rng, 101, g)
    whole = CpuBackend()
    whole.use(model)
    labels, scores = whole.forward(x)
    assert whole.net is not None and "native" in whole.device
    assert_same_answers(labels, scores, x, model)
    chunked = CpuBackend(chunk=7)
    chunked.use(model)
    assert [(a == b).all() for a, b in zip(chunked.forward(x), (labels, scores))] == [True, True]
    whole.close()
    chunked.close()


@pytest.mark.parametrize("chunk", [None, 4])
def test_overflow_names_the_first_image(lib, rng, chunk):
    g = GEOMETRIES[0]
    model, x = random_model(rng, g), images(rng, 12, g)
    x[9] *= np.float32(3e37)  # finite, but its scores are not
    x[10] *= np.float32(3e37)
    backend = CpuBackend(chunk=chunk)
    backend.use(model)
    with pytest.raises(ScoresOverflow, match="image 9 "):
        backend.forward(x)
    backend.close()


def test_without_native_code_the_numpy_layers_give_the_same_labels(lib, rng, monkeypatch):
    g = GEOMETRIES[0]
    model, x = random_model(rng, g), images(rng, 60, g)
    fast = CpuBackend()
    monkeypatch.setenv("CNNINFER_NATIVE", "0")
    net.net_library.cache_clear()
    try:
        slow = CpuBackend()
    finally:
        net.net_library.cache_clear()
    assert slow.lib is None and "NumPy" in slow.device
    for b in (fast, slow):
        b.use(model)
    (a, sa), (b, sb) = fast.forward(x), slow.forward(x)
    np.testing.assert_allclose(sa, sb, rtol=0, atol=2e-5 * np.abs(sb).max())
    assert (a == b).all()


# The code paths of other vector units, built here with the compiler's flags for them (x86); the
# AVX-512 one (16-float vectors, 24 accumulators) as GCC's generic 64-byte vectors on AVX2
OTHER_WIDTHS = {"avx2": (("-mavx2", "-mfma"), 8), "sse2": (("-mno-avx",), 4),
                "avx512-code": (("-mavx2", "-mfma", "-D__AVX512F__", "-Wno-psabi"), 16)}


@pytest.mark.parametrize("isa", OTHER_WIDTHS)
def test_other_vector_widths_give_the_same_answers(lib, rng, isa):
    import platform

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86 vector flags")
    flags, width = OTHER_WIDTHS[isa]
    built = net.load_net((*flags, *net.NET_COMMON))
    assert built is not None and built.cn_vector_width() == width
    for g in GEOMETRIES[:2] + GEOMETRIES[4:]:
        model, x = random_model(rng, g), images(rng, 20, g)
        labels, scores = np.empty(len(x), np.int64), np.empty((len(x), g[-1]), np.float32)
        assert NativeNet(built, model, x.shape[1:])(x, labels, scores) == -1
        assert_same_answers(labels, scores, x, model)


def test_taps_skipped_for_blank_pixels_give_the_dense_tiles_bits(lib, rng):
    """Layers whose input pixels are often all 0 (as conv2's on digits) run tap by tap, skipping
    those pixels' products: the scores are the dense tiles' to the bit (a build without it)."""
    dense = net.load_net(("-DCONV_TAPS=0", *net.NET_FLAGS[0]))
    assert dense is not None
    for g in GEOMETRIES:
        model, x = random_model(rng, g), images(rng, 30, g)
        x[:, 1::2] = 0  # every other row blank too: conv2's input gets blank pixels on every geometry
        out = []
        for built in (lib, dense):
            labels, scores = np.empty(len(x), np.int64), np.empty((len(x), g[-1]), np.float32)
            assert NativeNet(built, model, x.shape[1:])(x, labels, scores) == -1
            out.append(scores)
        assert np.array_equal(out[0].view(np.uint32), out[1].view(np.uint32)), g
        assert_same_answers(labels, out[0], x, model)


@pytest.mark.parametrize("chunk", [None, 5])
def test_a_value_that_is_not_finite_names_its_image_before_any_overflow(lib, rng, chunk):
    g = GEOMETRIES[0]
    model, x = random_model(rng, g), images(rng, 12, g)
    x[3] *= np.float32(3e37)  # overflows the scores
    x[8, 20, 5, 0] = np.inf
    x[11, 3, 3, 0] = np.nan
    backend = CpuBackend(chunk=chunk)
    backend.use(model)
    with pytest.raises(BadValue) as e:
        backend.forward(x)
    assert e.value.image == 8
    backend.close()


@pytest.mark.parametrize("at", [(0, 0), (29, 25), (29, 21), (15, 9)])
@pytest.mark.parametrize("bad", [np.nan, -np.inf])
def test_a_bad_value_in_any_pixel_of_a_one_channel_image_is_found(lib, rng, at, bad):
    """One-channel images are checked a vector of pixels at a time: the first, the last (past the
    whole vectors of 780 pixels), the last whole vector's and one inside."""
    g = GEOMETRIES[4]
    model, x = random_model(rng, g), images(rng, 5, g)
    x[3, at[0], at[1], 0] = bad
    backend = CpuBackend()
    backend.use(model)
    with pytest.raises(BadValue) as e:
        backend.forward(x)
    assert e.value.image == 3
    backend.close()


def test_the_session_reads_a_float32_array_in_place_and_names_a_bad_image(lib, rng):
    import cnninfer

    g = GEOMETRIES[0]
    model, x = random_model(rng, g), images(rng, 300, g)
    with cnninfer.Session(model, backend="cpu") as s:
        assert_same_answers(*s.classify(x, scores=True), x, model)
        assert_same_answers(*s.classify(x[::2], scores=True), x[::2], model)  # not contiguous: copied
        x[250, 1, 2, 0] = np.nan
        with pytest.raises(InputError, match=r"\(250, 1, 2, 0\) is nan, not a finite"):
            s.predict(x)


@pytest.mark.parametrize("data,model", [("testfull.hdf5", "model.hdf5"), (None, None)])
def test_the_real_files_get_the_references_predictions(lib, ece408, data, model):
    import h5py

    from infer.data import loader
    from tests.conftest import REPO

    data = ece408 / data if data else REPO / "models" / "mnist-sample.hdf5"
    m = loader.load_model(ece408 / model if model else REPO / "models" / "cnninfer-mnist.hdf5")
    with h5py.File(data) as f:
        x = f["x"][()].astype(np.float32)
    backend = CpuBackend()
    backend.use(m)
    labels, _ = backend.forward(x)
    backend.close()
    expected = np.concatenate([reference.forward(x[i:i + 1000], m) for i in range(0, len(x), 1000)])
    assert (labels == expected).all()


def test_winograds_transforms_give_the_valid_correlation(rng):
    """A^T [(G g G^T) * (B^T d B)] A is the 2x2 valid correlation of a 6x6 block with a 5x5 kernel."""
    for _ in range(20):
        d, g = rng.standard_normal((6, 6)), rng.standard_normal((5, 5))
        y = winograd.AT @ ((winograd.G @ g @ winograd.G.T) * (winograd.BT @ d @ winograd.BT.T)) @ winograd.AT.T
        direct = [[(d[i:i + 5, j:j + 5] * g).sum() for j in range(2)] for i in range(2)]
        np.testing.assert_allclose(y, direct, rtol=0, atol=1e-12 * np.abs(d).max() * np.abs(g).sum())


@pytest.mark.parametrize("g", [g for g in GEOMETRIES if g[5] == winograd.K], ids=lambda g: "x".join(map(str, g)))
def test_winograds_conv2_agrees_with_the_direct_tiles(lib, rng, g):
    """5x5 conv2s run by Winograd's F(2x2, 5x5); the direct tiles (u2 left out) give the same answers
    within float32's rounding, in other bits (so the two are different paths)."""
    model, x = random_model(rng, g), images(rng, 40, g)
    x[:, 1::2] = 0  # blank pixels in conv2's input too: skipped windows and blank blocks
    out = []
    for wino in (True, False):
        net = NativeNet(lib, model, x.shape[1:])
        assert (net.u2 is not None) and net.u2.shape == (36, *net.w2.shape[2:])
        if not wino:
            net.u2 = None
        labels, scores = np.empty(len(x), np.int64), np.empty((len(x), g[-1]), np.float32)
        assert net(x, labels, scores) == -1
        assert_same_answers(labels, scores, x, model)
        out.append(scores)
    np.testing.assert_allclose(out[0], out[1], rtol=0, atol=2e-5 * np.abs(out[1]).max())
    assert not np.array_equal(out[0], out[1])


def test_the_native_network_builds_wherever_there_is_a_compiler():
    """A compile error in cpu_net.c would otherwise turn the native tests into skips and the CPU
    backend into the NumPy fallback, silently."""
    from infer.data import native

    if native.compiler() is None:
        pytest.skip("no C compiler here")
    assert net.net_library() is not None, native.FAILED.get("cpu_net")
    assert net.net_status().startswith("native C (infer/cpu/cpu_net.c), ")


def test_a_network_that_does_not_build_is_the_numpy_fallback_and_info_says_why(tmp_path, monkeypatch):
    from infer.data import native
    from tests.conftest import invoke

    if native.compiler() is None:
        pytest.skip("no C compiler here")
    (tmp_path / "cpu_net.c").write_text("int cn_vector_width(void) { return undeclared_thing; }\n")
    monkeypatch.setattr(net, "HERE", tmp_path)
    monkeypatch.setenv("CNNINFER_CACHE", str(tmp_path / "cache"))
    net.net_library.cache_clear()
    try:
        status = net.net_status()
        assert status.startswith("NumPy layers, the fallback: cpu_net.c did not build with ")
        assert "undeclared_thing" in status and "\n" not in status
        r = invoke("info")
        assert r.exit_code == 0 and f"CPU backend: {status}" in r.stdout
    finally:
        net.net_library.cache_clear()
