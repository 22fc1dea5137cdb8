"""The certificate's oracle (infer/gpu/certify.py): its bound holds against the exact path on random
networks, tiny values and huge ones, comes within 2x of an error built to reach it, and the
certified answers equal the exact path's on near ties, where trusting float16 would not."""
import h5py
import numpy as np
import pytest

from infer.gpu import certify
from infer.data import defaults, loader
from infer import reference
from infer.bench.gpu import random_case

from tests.near_ties import near_ties


def observed_and_gap(x, model, style, fc1="half"):
    scores, gap = certify.half_pass(x, model, style, fc1)
    exact = reference.scores(x, model)
    rows, top = np.arange(len(x)), reference.argmax(scores)
    observed = np.abs((scores[rows, top][:, None] - scores) - (exact[rows, top][:, None] - exact))
    return observed, gap


@pytest.mark.parametrize("fc1", certify.FC1)
@pytest.mark.parametrize("style", certify.STYLES)
@pytest.mark.parametrize("spec,scale", [("13x11x3,3:7,3:9,17", 1.0), ("20x18x1,5:12,3:20,33", 1.0),
                                        ("13x11x3,3:7,3:9,17", 1e-4),  # conv1's outputs under float16's normals
                                        ("14x14x2,3:5,3:8,11", 300.0)])
def test_the_gap_bounds_the_paths_difference(spec, scale, style, fc1):
    model, x = random_case(spec, 61, seed=3)
    observed, gap = observed_and_gap(x * np.float32(scale), model, style, fc1)
    assert np.isfinite(gap).all() and (observed <= gap).all()
    assert (observed > 0).any()  # float16 changed something: the comparison had something to bound


V = np.float32(1 + 0.49 * 2**-10)  # float16 rounds it down to 1, by almost a unit roundoff


def built(conv1, conv2, fc1, fc2, mode="exact"):
    """A network on 10x10 images of ones: conv1 1x1 then conv2 3x3 leave one pooled pixel. The bound
    with fc1 summed as the exact path sums it (mode "exact"), where these tests build conv2's error;
    or as certify_kernel4 sums it ("half")."""
    model = loader.model_from_arrays(dict(conv1=np.full((1, 1, 1, 16), conv1, np.float32),
                                          conv2=np.stack([np.full((3, 3, 16), w, np.float32) for w in conv2], -1),
                                          fc1=np.asarray(fc1, np.float32), fc2=np.asarray(fc2, np.float32)))
    return observed_and_gap(np.ones((2, 10, 10, 1), np.float32), model, "componentwise", mode)


def test_the_gap_is_within_2x_of_an_error_built_to_reach_it():
    """Every conv2 operand V: all the products' errors have one sign, and the fc layers add them up."""
    observed, gap = built(V, [V] * 8, np.eye(8, 4) * 0.5, [[1, 0]] * 4)
    assert (observed <= gap).all()
    assert (observed[:, 1] >= 0.5 * gap[:, 1]).all(), (observed, gap)  # 0.90 here


def test_fc1s_float16_rounding_is_bounded_and_needed():
    """fc1's weights V, which float16 rounds down by 0.98 u, on features exact in float16: the float16
    sums lie 0.98 u below the exact ones, inside half_fc1_rounding's bound and within 4x of it (it
    counts p's rounding too, none here), and far outside the float32 sums' rounding that the bound
    for fc1 as the exact path computes it counts for both paths."""
    fc1 = np.full((8, 4), V, np.float32)
    p = np.array([[144] * 8, [0.5, 3, 0.25, 7, 1, 2, 6, 0.125]], np.float32)
    z, r = certify.half_fc1_rounding(p, fc1)
    exact = p.astype(np.float64) @ fc1.astype(np.float64)
    err = np.abs(z - exact)
    assert (err <= r).all() and (err >= r / 4).all(), (err, r)
    assert (err > 2 * certify.exact_rounding(8) * exact).all()


@pytest.mark.parametrize("mode", certify.FC1)
def test_a_hidden_unit_the_error_switches_off_is_bounded(mode):
    """Exact: z = 144 V (V - c) > 0; float16: 144 (1 - c) < 0. The unit is on for one path only."""
    observed, gap = built(V, [V, 1], [[1], [-(1 + 0.25 * 2**-10)]], [[1, 0]], mode)
    assert (observed[:, 1] > 0.03).all() and (observed <= gap).all()


def test_an_unstable_unit_at_full_slope_is_bounded():
    """ReLU's slope between the paths is 1/2 +- 1/2 on an unstable unit: here it is 1 (float16's z is
    -72 * 2^-20, the exact path's 0.10), and the errors of the unit's two features have opposite
    signs (conv1's channels rounded down and up), so half of q alone would not cover it."""
    up, down = np.float32(1 + 0.49 * 2**-10), np.float32(1 - 0.24 * 2**-10)  # float16 rounds both to 1
    conv2 = np.zeros((3, 3, 16, 2), np.float32)
    conv2[:, :, :8, 0], conv2[:, :, 8:, 1] = up, down
    model = loader.model_from_arrays(dict(conv1=np.array([up] * 8 + [down] * 8, np.float32).reshape(1, 1, 1, 16), conv2=conv2,
                                          fc1=np.array([[1], [-(1 + 2**-20)]], np.float32), fc2=np.array([[1, 0]], np.float32)))
    observed, gap = observed_and_gap(np.ones((2, 10, 10, 1), np.float32), model, "componentwise", "exact")
    assert (observed[:, 1] > 0.1).all() and (observed <= gap).all()
    assert (observed[:, 1] > 0.75 * gap[:, 1]).all(), (observed, gap)


@pytest.mark.parametrize("conv1,conv2", [(1.4 * 2**-24, 1), (1, 1.4 * 2**-24)], ids=["activations", "weights"])
def test_values_in_float16s_subnormals_are_bounded(conv1, conv2):
    """1.4 * 2^-24: float16 keeps 2^-24, 29% off, which no relative bound covers (fc1's 2^20 is past
    float16: with fc1 from float16 operands nothing would be certified)."""
    observed, gap = built(conv1, [conv2] * 2, np.eye(2) * 2**20, [[1, 0], [0, 0]])
    assert (observed[:, 1] > 1e-3).all() and (observed <= gap).all()


def test_values_beyond_float16_leave_no_certificate():
    model, x = random_case("13x11x3,3:7,3:9,17", 5, seed=1)
    x[2] *= np.float32(1e7)  # conv1's outputs past 65504
    with np.errstate(invalid="ignore", over="ignore"):
        scores, gap = certify.half_pass(x, model)
        labels, sure = certify.predict(x, model)
        exact = reference.forward(x, model)
    assert np.isinf(gap[2]).all() and np.isfinite(gap[[0, 1, 3, 4]]).all()
    assert not sure[2]
    np.testing.assert_array_equal(labels, exact)


@pytest.fixture(scope="module")
def bundled():
    with h5py.File(defaults.sample()) as f:
        return loader.load_model(str(defaults.model())), f["x"][:300]


def test_certified_answers_equal_the_exact_paths_on_near_ties(bundled):
    model, x = bundled
    images, margins = near_ties(x, model, pairs=5)
    assert margins.min() < 1e-6 and margins.max() > 1e-1
    exact = reference.forward(images, model)
    labels, sure = certify.predict(images, model)
    np.testing.assert_array_equal(labels, exact)
    assert 0 < sure.sum() < len(sure)  # both branches taken: certified, and recomputed
    trusting, _ = certify.predict(images, model, zero_bound=True)
    assert (trusting != exact).any(), "float16 alone never differed: the near ties are not near enough"


def test_most_of_the_bundled_sample_is_certified(bundled):
    model, x = bundled
    labels, sure = certify.predict(x, model)
    np.testing.assert_array_equal(labels, reference.forward(x, model))
    assert sure.mean() > 0.95  # 99.7% here: a bound that lost its tightness would recompute most images


@pytest.mark.parametrize("scale", [1.0, 1e-6, 500.0])
def test_the_gpu_constants_bound_the_oracles_conv2_gap(scale):
    """fused_kernel4's d2 = A1 S + C[c] + BETA_N amax, with S its float16 sum of the bound columns times fl16(a) at the
    low end of what float32 sums may give (S (1 - gamma_n)), is at least the oracle's conv2_gap; and
    fused_kernel6's, with S summed over the 2x2 means and the largest mean for amax, at least the gap's
    mean over each pool window."""
    rng = np.random.default_rng(5)
    a1 = (rng.random((3, 9, 9, 32)) * scale).astype(np.float32)
    w2 = (rng.standard_normal((5, 5, 32, 64)) * 0.05).astype(np.float32)
    a1[0, :2] = 0  # zeros and float16 subnormals among the inputs
    a1[1, 3] *= np.float32(1e-4)
    c = certify.conv2_constants(w2).astype(np.float64)
    n = 5 * 5 * 32
    w_up = certify.conv2_bound_columns(w2).astype(np.float64).reshape(n, -1)
    s = certify._windows(certify.to_half(a1).astype(np.float64), 5) @ w_up * (1 - certify.gamma(n))
    amax = a1.reshape(3, -1).max(axis=1)[:, None, None, None].astype(np.float64)
    gpu = c[0] * s + c[3:] + c[1] * amax
    oracle = certify.conv2_gap(a1, w2, "componentwise")
    assert (gpu >= oracle).all()
    assert np.median(gpu / oracle) < 1.01  # and no looser than the rounding up costs
    # fused_kernel6 bounds each 2x2 pool window's mean gap at once: S from qb, the 2x2 means of fl16(a)
    # rounded up to float16 (the GPU's float32 sums round up too, so its qb is at least this one).
    h = certify.to_half(a1).astype(np.float64)
    qb = certify.half_up((h[:, :-1, :-1] + h[:, :-1, 1:] + h[:, 1:, :-1] + h[:, 1:, 1:]) / 4).astype(np.float64)
    s_win = certify._windows(qb, 5)[:, ::2, ::2] @ w_up * (1 - certify.gamma(n))
    qmax = qb.reshape(3, -1).max(axis=1)[:, None, None, None]  # the image's largest qb stands in for amax
    window = c[0] * s_win + c[3:] + c[1] * (qmax + certify.ETA16) * (1 + 2.0**-10)
    pooled = (oracle[:, 0:-1:2, 0:-1:2] + oracle[:, 0:-1:2, 1::2] + oracle[:, 1::2, 0:-1:2] + oracle[:, 1::2, 1::2]) / 4
    assert window.shape == pooled.shape == (3, 2, 2, 64) and (window >= pooled).all()
    assert np.median(window / pooled) < 1.01


def test_the_fc_constants_are_rounded_up():
    fc1 = np.ones((1024, 128), np.float32)
    qs, ms, fr1, fr2, alpha2, kappa, eta2h, dscale, hr, eta1, e1c, ms4, etaw = certify.fc_constants(fc1).astype(np.float64)
    g, u, eta = certify.gamma(1024), certify.U16, certify.ETA16
    assert qs >= 2.0**-12 / (1 - g) and ms >= 1 / (1 - g) and dscale == 2.0**12
    assert fr1 >= certify.exact_rounding(1024) and fr2 >= certify.exact_rounding(128)
    assert alpha2 >= 2 * certify.U16 and kappa >= certify.ETA16 and eta2h >= 128 * certify.ETA16**2
    assert hr >= 2 * u + g and eta1 >= eta * (1 + u) and e1c >= 1024 * eta1 and ms4 >= (1 + u) / (1 - g) and etaw >= 1024 * eta


def test_the_gpu_constants_bound_the_float16_fc1s_rounding():
    """certify_kernel4's r1 part for fc1's float16 sums, HR m + ETA1 sum p + E1C with m = MS4 msum +
    ETAW (msum: |fc1|_up . fl16(p) at the low end of float32 sums), is at least the oracle's bound."""
    rng = np.random.default_rng(7)
    fc1 = (rng.standard_normal((256, 128)) * 0.05).astype(np.float32)
    p = (rng.random((5, 256)) * np.array([[1.0], [1e-6], [30.0], [1.0], [0.0]])).astype(np.float32)
    p[3, ::3] = 0  # zeros and float16 subnormals among the features
    c = certify.fc_constants(fc1).astype(np.float64)
    g = certify.gamma(256)
    msum = certify.to_half(p).astype(np.float64) @ np.abs(certify.half_up(np.abs(fc1)).astype(np.float64)) * (1 - g)
    m = c[11] * msum + c[12]
    gpu = c[8] * m + c[9] * p.astype(np.float64).sum(axis=1)[:, None] + c[10]
    _, oracle = certify.half_fc1_rounding(p, fc1)
    assert (m >= np.abs(p).astype(np.float64) @ np.abs(fc1).astype(np.float64)).all()
    assert (gpu >= oracle).all()


def test_certify_kernel5s_sums_from_float16_bound_the_float32_sums():
    """certify_kernel5 reads fused_kernel6's features rounded to nearest float16 and dp * 2^12 rounded
    up, and bounds the float32 sums certify_kernel4 took: sum dp <= 2^-12 sum fl16_up(dp 2^12), sum p
    <= (sum fl16(p) + FEAT eta) (1 + 2^-10), p across float16's subnormals, normals and near its top;
    each row's worst case (every value rounded down by its most) is in it."""
    rng = np.random.default_rng(5)
    feat = 1024
    scale = np.array([[1e-7], [3e-5], [1.0], [40.0], [6e4]])  # under float16's normals .. near 65504
    p = (rng.random((5, feat)) * scale).astype(np.float32)
    # values just under a float16 rounding boundary: fl16 rounds them down by almost half an ulp
    h = p.astype(np.float16).astype(np.float64)
    ulp = np.spacing(p.astype(np.float16)).astype(np.float64)
    p[:, ::2] = np.minimum(h + 0.499 * ulp, 65504).astype(np.float32)[:, ::2]
    bound = (p.astype(np.float16).astype(np.float64).sum(axis=1) + feat * certify.ETA16) * (1 + 2.0**-10)
    assert (bound >= p.astype(np.float64).sum(axis=1)).all()
    assert (p.astype(np.float16).astype(np.float64).sum(axis=1) < p.astype(np.float64).sum(axis=1)).all()  # the bound has work to do
    dp = (rng.random((5, feat)) * scale * 1e-3).astype(np.float32)
    scaled = certify.half_up(dp * np.float32(2.0**certify.DSCALE_LOG2)).astype(np.float64)
    assert (2.0**-certify.DSCALE_LOG2 * scaled.sum(axis=1) >= dp.astype(np.float64).sum(axis=1)).all()


def test_a_margin_of_exactly_the_bound_is_not_certified():
    """certified() needs the top score to beat every other by more than the gap: a tie with the
    bound (the other class could reach it, and the first maximum could change) is left out, and a
    top class ahead of both others by more than their gaps is certified."""
    from infer.gpu.certify import certified

    scores = np.array([[3.0, 1.0, 2.0], [3.0, 1.0, 2.0], [2.0, 2.0, 0.0]], np.float32)
    gap = np.array([[0.0, 0.5, 1.0],    # class 2 is exactly at the bound: not certified
                    [0.0, 0.5, 0.999],  # ahead of both by more than their gaps: certified
                    [0.0, 0.0, 0.0]])   # a tie in the scores: the first maximum is not proven
    assert certified(scores, gap).tolist() == [False, True, False]
