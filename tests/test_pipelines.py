"""Choosing the GPU algorithm, and the tensor-core weight layout: pure host code, no GPU needed."""
import numpy as np
import pytest

from infer.gpu import launch
from infer.gpu.launch import GEMMS, gemm_choice
from infer.gpu.operands import scaled_halves, tf32
from infer.gpu.pipelines import (ALGORITHMS, AUTO, Fused, FusedCertified, FusedTensorCores, FusedWarpgroup, Implicit, ImplicitWarpgroup, Unroll, choose, default_path)
from infer.network import Geometry

MNIST = Geometry(28, 28, 1, 5, 32, 5, 64, 128, 10)
ODD = Geometry(29, 29, 1, 5, 32, 5, 64, 128, 10)  # 25 -> 12 (floored) -> 8 -> 4x4 pooled: still fused-tc
NO_FUSED = Geometry(30, 30, 1, 3, 32, 3, 64, 128, 10)  # 28 -> 14 -> 12 -> 6x6 pooled: fits neither tiling


@pytest.mark.parametrize("g,arch,expected", [(MNIST, "sm_90", FusedWarpgroup), (MNIST, "sm_80", FusedTensorCores),
                                             (MNIST, "sm_100", FusedTensorCores), (MNIST, "sm_75", Fused),
                                             (ODD, "sm_90", FusedWarpgroup)])
def test_auto_takes_the_first_that_runs(g, arch, expected):
    """--precision exact: the first exact algorithm that runs; not given: fused-certified where it
    runs (its by_default decides per run, test_the_default_certifies_only_large_runs_without_scores)."""
    assert choose(AUTO, g, arch, "exact") == (expected, None)
    assert choose(AUTO, g, arch) == (FusedCertified if arch == "sm_90" else expected, None)


def test_the_default_certifies_only_large_runs_without_scores():
    """Named (--conv-algo fused-certified, --precision certified) every run is certified; as the
    default, runs of CERTIFY_FROM images or more uploaded a byte a pixel that ask for no scores, the
    rest run exactly."""
    named = FusedCertified.__new__(FusedCertified)
    named.default = False
    default = FusedCertified.__new__(FusedCertified).by_default()
    most = FusedCertified.CERTIFY_FROM
    assert named.certifies(1, False) and named.certifies(1, True) and named.describe == "float16 certified"
    # images uploaded a byte a pixel (uint8, 8-bit codes): from CERTIFY_FROM; float32 uploads never
    assert default.certifies(most, False, True) and default.certifies(10 * most, False, True)
    assert not default.certifies(most - 1, False, True) and not default.certifies(most, True, True)
    assert not default.certifies(10 * most, False) and not FusedWarpgroup.certifies(None, most, False, True)
    assert f"from {most} images uploaded a byte a pixel" in default.describe
    assert default_path(MNIST, "sm_90", most, narrow=True) is FusedCertified
    assert default_path(MNIST, "sm_90", most - 1, narrow=True) is FusedWarpgroup
    assert default_path(MNIST, "sm_90", 10 * most) is FusedWarpgroup
    assert default_path(MNIST, "sm_90", most, scores=True, narrow=True) is FusedWarpgroup
    assert default_path(MNIST, "sm_80", most, narrow=True) is FusedTensorCores


def test_auto_falls_back_to_implicit_then_unroll_and_named_algorithms_say_why():
    assert FusedTensorCores.available(NO_FUSED, "sm_90") is not None
    assert Fused.available(NO_FUSED, "sm_90") is not None
    assert choose(AUTO, NO_FUSED, "sm_90") == (ImplicitWarpgroup, None)
    assert choose(AUTO, NO_FUSED, "sm_80") == (Implicit, None)
    assert choose(AUTO, NO_FUSED, "sm_75") == (Unroll, None)
    algo, why = choose("fused-tc", MNIST, "sm_75")
    assert algo is None and "sm_80" in why and "--conv-algo fused-tc" in why


def test_wgmma_runs_on_hopper_only_and_says_so():
    assert FusedWarpgroup.runs_on("sm_90") is None and ImplicitWarpgroup.runs_on("sm_90") is None
    for arch in ("sm_80", "sm_89", "sm_100", "sm_120"):
        assert "Hopper GPU (sm_90)" in FusedWarpgroup.available(MNIST, arch)
        assert "Hopper GPU (sm_90)" in ImplicitWarpgroup.available(MNIST, arch)
    assert "64 conv2 channels" in FusedWarpgroup.available(Geometry(28, 28, 1, 5, 32, 5, 48, 128, 10), "sm_90")
    from infer.bench.gpu import variants

    assert "fused-wgmma" not in {a for a, _, _ in variants("sm_80")} and "fused-wgmma" in {a for a, _, _ in variants("sm_90")}


def test_every_algorithm_is_chosen_by_name():
    for name, algo in ALGORITHMS.items():
        assert choose(name, MNIST, "sm_90") == (algo, None)


def test_precision_certified_takes_the_certified_path_where_it_runs_else_the_exact_one_with_a_notice():
    assert choose(AUTO, MNIST, "sm_90", "certified") == (FusedCertified, None)
    assert choose("fused-certified", MNIST, "sm_90", "certified") == (FusedCertified, None)
    assert FusedCertified.kernel_for(MNIST) == "fused_kernel6"
    assert FusedCertified.kernel_for(Geometry(27, 29, 3, 3, 32, 5, 64, 128, 10)) == "fused_kernel4"  # 8x9 conv2 outputs
    algo, notice = choose(AUTO, MNIST, "sm_80", "certified")
    assert algo is FusedTensorCores and "fused-certified cannot run" in notice and "Hopper" in notice
    assert "fused-tc" in notice and "the same answers" in notice
    algo, notice = choose(AUTO, Geometry(28, 28, 1, 5, 32, 5, 64, 100, 10), "sm_90", "certified")
    assert algo is FusedWarpgroup and "128 hidden" in notice
    for name, precision, words in [("fused-wgmma", "certified", "computes exactly"),
                                   ("fused-certified", "exact", "certified float16 path"),
                                   ("fused-certified", "certified", "Hopper")]:
        algo, why = choose(name, MNIST, "sm_90" if precision == "exact" or name != "fused-certified" else "sm_80", precision)
        assert algo is None and words in why, why
    assert choose(AUTO, MNIST, "sm_90", "exact") == (FusedWarpgroup, None)  # exact: never float16


def test_tf32_split_keeps_fp32_accuracy(rng):
    w = rng.standard_normal(100_000).astype(np.float32)
    hi = tf32(w)
    lo = tf32(w - hi)
    assert not (hi.view(np.uint32) & 0x1FFF).any() and not (lo.view(np.uint32) & 0x1FFF).any()
    assert np.max(np.abs(hi.astype(np.float64) + lo - w) / np.abs(w)) < 2**-21


def test_conv2_weights_in_mma_fragment_order(rng):
    w = rng.standard_normal((5, 5, 32, 64)).astype(np.float32)
    f = FusedTensorCores.conv2_weights(w)
    assert f.shape == (25, 4, 8, 32, 4)
    hi = tf32(w).reshape(25, 32, 64)
    lo = tf32(w - tf32(w)).reshape(25, 32, 64)
    s, ks, nt, lane = 7, 2, 5, 13  # B fragment of mma.m16n8k8: rows k = lane % 4 (+4), column n = lane / 4
    k, n = ks * 8 + lane % 4, nt * 8 + lane // 4
    np.testing.assert_array_equal(f[s, ks, nt, lane], [hi[s, k, n], hi[s, k + 4, n], lo[s, k, n], lo[s, k + 4, n]])


@pytest.mark.parametrize("name,tile,arch,expected", [
    ("auto", None, "sm_90", ("wgmma", 4)), ("auto", None, "sm_100", ("tf32x3", 3)), ("auto", 64, "sm_90", ("tf32x3", 3)),
    ("auto", None, "sm_75", ("blocked", 2)),
    ("auto", 16, "sm_90", ("tiled", 1)), ("auto", 64, "sm_75", ("blocked", 2)),
    ("blocked", 128, "sm_90", ("blocked", 2)), ("tiled", None, "sm_90", ("tiled", 1))])
def test_gemm_choice_takes_the_fastest_with_the_tile(name, tile, arch, expected):
    assert gemm_choice(name, tile, arch) == expected


@pytest.mark.parametrize("name,tile,arch,message", [
    ("tf32x3", 16, "sm_90", "tile widths 32, 64, 128, not 16"), ("tf32x3", None, "sm_75", "needs sm_80"),
    ("tiled", 128, "sm_90", "tile widths 8, 16, 32, not 128"), ("wgmma", None, "sm_89", "needs a Hopper GPU"),
    ("wgmma", None, "sm_100", "needs a Hopper GPU"), ("wgmma", 64, "sm_90", "tile widths 128, not 64")])
def test_gemm_choice_says_why_not(name, tile, arch, message):
    with pytest.raises(ValueError, match=message):
        gemm_choice(name, tile, arch)


def test_every_gemm_tile_is_a_tile_width_choice():
    from infer.gpu.launch import TILE_WIDTHS

    assert set(TILE_WIDTHS) == {t for spec in GEMMS.values() for t in spec.tiles}


def test_conv2_weights_as_wgmma_core_matrices_of_scaled_halves(rng):
    """fused_kernel3's conv2 in 3xFP16: each channel's weights times 2^T as float16 parts, hi + lo
    within 2^-21 of them, laid out per k16 step as wgmma's core matrices; 2^-T per channel after."""
    w = rng.standard_normal((5, 5, 32, 64)).astype(np.float32) * np.exp2(rng.integers(-20, 20, 64)).astype(np.float32)
    f = FusedWarpgroup.conv2_weights(w)
    assert f.dtype == np.float32 and f.shape == (25 * 32 * 64 + 64,)
    halves, down = f[:-64].view(np.float16).reshape(25, 2, 2, 8, 2, 8, 8), f[-64:].astype(np.float64)
    parts = [halves[:, :, p].transpose(0, 1, 3, 5, 2, 4).reshape(25, 32, 64) for p in (0, 1)]  # back to (slab, k, n)
    # slab s, k16 step ks, part, 8-channel group ni, k half kc, channel row r, k within the half kk
    for s, ks, part, ni, kc, r, kk in [(7, 1, 0, 5, 1, 3, 2), (24, 0, 1, 7, 0, 7, 7), (0, 0, 0, 0, 0, 1, 0)]:
        assert halves[s, ks, part, ni, kc, r, kk] == parts[part][s, 16 * ks + 8 * kc + kk, 8 * ni + r]
    top = np.abs(parts[0].astype(np.float64)).max(axis=(0, 1))
    assert ((top >= 2**14) & (top <= 2**15)).all() and (np.log2(down) == np.round(np.log2(down))).all()
    rebuilt = (parts[0].astype(np.float64) + parts[1]) * down
    np.testing.assert_allclose(rebuilt, w.reshape(25, 32, 64), rtol=2**-21, atol=0)


def test_implicit_wgmma_weights_padded_per_column_block(rng):
    w = rng.standard_normal((3, 3, 5, 50)).astype(np.float32)  # k = 45 -> 48, 50 channels -> 2 blocks of 32
    f = ImplicitWarpgroup.conv_weights(w, 32, 16)
    assert f.shape == (2, 6, 2, 4, 2, 8, 4) and f.flags.c_contiguous
    flat = w.reshape(45, 50)
    # column block b, k8 step ks, part, 8-channel group ni, k half kc, channel row r, k within the half kk
    for b, ks, ni, kc, r, kk in [(0, 0, 0, 0, 0, 0), (1, 5, 1, 0, 1, 3), (0, 2, 3, 1, 7, 2)]:
        k, m = 8 * ks + 4 * kc + kk, 32 * b + 8 * ni + r
        assert f[b, ks, 0, ni, kc, r, kk] == tf32(flat[k, m])
        assert f[b, ks, 1, ni, kc, r, kk] == tf32(flat[k, m] - tf32(flat[k, m]))
    assert not f[1, :, :, 3].any() and not f[1, :, :, 2, :, 2:].any()  # channels 50..63: zero
    assert not f[:, 5, :, :, 1, :, 1:].any()  # k 45..47: zero


@pytest.mark.parametrize("k1,c,steps,tail", [(5, 1, 3, 1), (5, 2, 6, 2), (3, 3, 4, 0), (2, 2, 1, 0), (1, 2, 1, 0)])
def test_conv1_weights_steps_then_tail(rng, k1, c, steps, tail):
    """25 k: 3 tensor-core steps + 1 on the FP32 cores; 50: 6 + 2; 27: padded to 4 steps; 8: one
    step; 2: one padded step (never no step at all)."""
    w = rng.standard_normal((k1, k1, c, 32)).astype(np.float32)
    assert launch.Fused.conv1_steps(k1 * k1 * c) == (steps, tail)
    f = FusedWarpgroup.conv1_weights(w)
    flat, body = w.reshape(-1, 32), steps * 2 * 8 * 32
    row = k1 * c + (k1 * c) % 2  # codes: each kernel row's k padded to even
    steps16 = -(-k1 * row // 16)
    assert f.shape == (body + tail * 32 + steps16 * 16 * 32 + 32,)
    np.testing.assert_array_equal(f[body:body + tail * 32], flat[len(flat) - tail:].ravel())  # the tail as it is
    mma = f[:body].reshape(1, steps, 2, 4, 2, 8, 4)
    k = len(flat) - tail - 1  # the last k on the tensor cores: k = 8 ks + 4 kc + kk, channel 21 = 8*2 + 5
    ks, kc, kk = k // 8, k % 8 // 4, k % 4
    assert mma[0, ks, 0, 2, kc, 5, kk] == tf32(flat[k, 21])
    assert mma[0, ks, 1, 2, kc, 5, kk] == tf32(flat[k, 21] - tf32(flat[k, 21]))
    padded = mma.transpose(0, 1, 4, 6, 2, 3, 5).reshape(8 * steps, -1)[k + 1:]  # rows (ks, kc, kk) past k
    assert not padded.any()
    # For codes: k16 steps of float16 (lo, hi) of each channel's weights times 2^S, k = kh * row + kw * c
    # + ci (a zero where the row is padded), then 2^-S
    codes = f[body + tail * 32:]
    halves = codes[:-32].view(np.float16).reshape(steps16, 2, 4, 2, 8, 8)  # (ks, part, ni, kc, r, kk)
    scale = codes[-32:].astype(np.float64)
    k = k1 * row - row + k1 * c - 1  # the last weight's k, channel 21 = 8*2 + 5
    ks, kc, kk = k // 16, k % 16 // 8, k % 8
    lo, hi = halves[ks, 0, 2, kc, 5, kk], halves[ks, 1, 2, kc, 5, kk]
    assert hi == np.float16(flat[-1, 21] / scale[21]) and lo == np.float16(flat[-1, 21] / scale[21] - np.float64(hi))
    whole = halves.transpose(0, 3, 5, 1, 2, 4).reshape(16 * steps16, 2, 32).astype(np.float64)  # (k, part, channel)
    rows = whole[: k1 * row].reshape(k1, row, 2, 32)
    assert not whole[k1 * row:].any() and not rows[:, k1 * c:].any()
    np.testing.assert_allclose((rows[:, : k1 * c, 0] + rows[:, : k1 * c, 1]).reshape(-1, 32) * scale, flat, rtol=2**-21, atol=0)
    top = np.abs(whole[:, 1]).max(axis=0)
    assert ((top >= 2**14) & (top <= 2**15)).all() and (np.log2(scale) == np.rint(np.log2(scale))).all()


@pytest.mark.parametrize("magnitude", [1e-30, 3e-3, 1.0, 7e4, 1e30])
def test_scaled_halves_hold_every_channel_in_float16(rng, magnitude):
    """Each channel's weights times its 2^S as float16 hi + lo, the largest in [2^14, 2^15], so a code
    (up to 255) times either part is exact in float32; within 2^-21 of each weight (these have no
    weight 2^-20 below their channel's largest); a zero channel stays zero with 2^-S = 1."""
    w = (rng.standard_normal((25, 5)) * magnitude).astype(np.float32)
    w[:, 3] = 0
    hi, lo, scale = scaled_halves(w)
    assert np.isfinite(hi).all() and np.isfinite(lo).all() and scale[3] == 1 and not hi[:, 3].any() and not lo[:, 3].any()
    top = np.abs(hi.astype(np.float64)).max(axis=0)[[0, 1, 2, 4]]
    assert ((top >= 2**14) & (top <= 2**15)).all() and 255 * top.max() < 2**24
    np.testing.assert_allclose((hi.astype(np.float64) + lo) * scale, w, rtol=2**-21, atol=0)


def test_fused_plan_takes_two_or_four_images_a_block_only_for_version_3():
    """fused_kernel3 runs 2 images a block for the certified path's recomputation, a smaller layout."""
    four, two = launch.Fused.plan(MNIST, 3)[0], launch.Fused.plan(MNIST, 3, imgs=2)[0]
    assert (four.imgs, two.imgs) == (4, 2) and two.shared < four.shared
    assert launch.Fused.defines(MNIST, 3, imgs=2)["IMGS"] == 2
    with pytest.raises(ValueError, match="takes 4 images a block, not 2"):
        launch.Fused.plan(MNIST, 4, imgs=2)
    with pytest.raises(ValueError, match="takes 4 or 2 images a block, not 3"):
        launch.Fused.plan(MNIST, 3, imgs=3)


# (h, w, c, k): 1 and 3 channels, 25 windows an image (groups across images), a 7x7 kernel, odd widths
SPAN_LAYERS = [(32, 32, 3, 5), (64, 64, 1, 5), (14, 14, 3, 5), (29, 31, 3, 7), (13, 17, 2, 3), (9, 9, 1, 5)]


@pytest.mark.parametrize("h,w,c,k", SPAN_LAYERS)
def test_conv_kernel3s_span_holds_every_groups_reads(h, w, c, k):
    """conv_kernel3 copies SPAN floats of x from its 16-byte aligned start before a group's first
    window: every value each group's rows read lies inside, for each misalignment of x (a model of
    the kernel's addressing over n images, brute force)."""
    span, ph, pw = launch.Conv.span(h, w, c, k), (h - k + 1) // 2, (w - k + 1) // 2
    starts = ph * pw // np.gcd(32, ph * pw)  # the places in an image where groups start
    n = -(-32 * (starts + 1) // (ph * pw)) + 1  # images enough for a full group at each
    win = np.arange(n * ph * pw)
    img, rem = np.divmod(win, ph * pw)
    base = ((img * h + 2 * (rem // pw)) * w + 2 * (rem % pw)) * c
    kh, kw, ch = np.unravel_index(np.arange(k * k * c), (k, k, c))
    koff = (kh * w + kw) * c + ch
    reads = base[:, None, None] + np.array([0, c, w * c, (w + 1) * c])[None, :, None] + koff[None, None, :]
    widest = 0
    for mis in range(4):
        for first in range(0, len(win), 32):
            start = ((base[first] + mis) & ~3) - mis
            group = reads[first:first + 32]
            assert group.min() >= start and group.max() - start < span
            widest = max(widest, group.max() - start + 1)
    assert span - 4 < widest <= span  # no more than the alignment's slack over what is read


# (h, w, c, k): 25 windows an image (blocks across images), odd widths, a 7x7 kernel
STAGED_LAYERS = [(30, 30, 32, 5), (46, 46, 32, 5), (14, 14, 32, 5), (15, 15, 64, 3), (13, 17, 8, 3), (19, 17, 16, 7)]


@pytest.mark.parametrize("h,w,c,k", STAGED_LAYERS)
def test_conv_kernel4s_span_holds_every_blocks_reads(h, w, c, k):
    """conv_kernel4 copies SPAN_PIX pixels of x from its block's first window's top-left input: every
    pixel each block's rows read lies inside, and the last one read is the span's last (brute force
    over blocks starting at every place in an image)."""
    span, ph, pw = launch.Conv.span_pixels(h, w, k), (h - k + 1) // 2, (w - k + 1) // 2
    starts = ph * pw // np.gcd(32, ph * pw)
    n = -(-32 * (starts + 1) // (ph * pw)) + 1
    win = np.arange(n * ph * pw)
    img, rem = np.divmod(win, ph * pw)
    base = (img * h + 2 * (rem // pw)) * w + 2 * (rem % pw)
    kh, kw = np.unravel_index(np.arange(k * k), (k, k))
    reads = base[:, None, None] + np.array([0, 1, w, w + 1])[None, :, None] + (kh * w + kw)[None, None, :]
    widest = 0
    for first in range(0, len(win) - 31, 32):
        group = reads[first:first + 32]
        assert group.min() >= base[first] and group.max() - base[first] < span
        widest = max(widest, group.max() - base[first] + 1)
    assert widest == span


def test_implicit_wgmma_takes_conv_kernel4_for_inputs_of_8s_whose_span_fits():
    assert ImplicitWarpgroup.conv_kernel(30, 30, 32, 5, 64) == "conv_kernel4"  # 64x64x1's conv2: BK 32
    assert launch.Conv.defines(4, 30, 30, 32, 5, 64)["CONV_BK"] == 32
    assert ImplicitWarpgroup.conv_kernel(46, 46, 32, 5, 64) == "conv_kernel4"  # 96x96x3's: 3 stages of 16 to fit
    assert [launch.Conv.defines(4, 46, 46, 32, 5, 64)[key] for key in ("CONV_BK", "CONV_STAGES")] == [16, 3]
    assert [launch.Conv.defines(4, 15, 15, 64, 3, 128)[key] for key in ("CONV_BK", "CONV_STAGES")] == [16, 4]
    assert "multiple of 32" in launch.Conv.staged(13, 13, 16, 3, 32)  # 28x28x1,3:16,3:32's conv2
    assert ImplicitWarpgroup.conv_kernel(13, 13, 16, 3, 32) == "conv_kernel2"
    assert "shared memory" in launch.Conv.staged(61, 61, 32, 5, 64)  # 128x128x3's conv2
    assert ImplicitWarpgroup.conv_kernel(61, 61, 32, 5, 64) == "conv_kernel2"
    with pytest.raises(ValueError, match="multiple of 32"):
        launch.Conv(None, 11, 12, 12, 3, 20, "conv_kernel4")


def test_implicit_wgmma_takes_conv_kernel3_for_narrow_inputs_that_fit():
    assert ImplicitWarpgroup.conv_kernel(32, 32, 3, 5, 32) == "conv_kernel3"
    assert ImplicitWarpgroup.conv_kernel(28, 28, 1, 5, 32) == "conv_kernel3"
    assert ImplicitWarpgroup.conv_kernel(14, 14, 32, 5, 64) == "conv_kernel4"  # 32 channels: staged
    assert "shared memory" in launch.Conv.whole(64, 64, 3, 11, 64)  # 11x11x3 weights x 64 channels
    assert ImplicitWarpgroup.conv_kernel(64, 64, 3, 11, 64) == "conv_kernel2"
    assert Implicit.conv_kernel(32, 32, 3, 5, 32) == "conv_kernel1"
