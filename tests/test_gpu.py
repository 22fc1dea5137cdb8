"""Every kernel against the NumPy reference on seeded random odd-sized inputs, each tile width;
the whole forward on testfull for every algorithm, stream count and tile width. Needs a GPU."""
import numpy as np
import pytest

import infer
from infer import network, reference
from infer.bench.gpu import variants
from infer.gpu.launch import GEMMS, gemm_runs_on
from infer.gpu import launch
from infer.gpu.pipelines import ALGORITHMS
from infer.network import Geometry
from infer.plan import for_backend
from tests.conftest import TESTFULL_AGREE, TESTFULL_CORRECT, Dev, build

pytestmark = pytest.mark.gpu


def runs_here(algo, gemm=None):
    """Skip unless algorithm algo (with GEMM gemm) runs on this machine's GPU (wgmma: Hopper only)."""
    import pycuda.driver as cuda

    cuda.init()
    arch = "sm_{}{}".format(*cuda.Device(0).compute_capability())
    why = ALGORITHMS[algo].runs_on(arch) or (gemm_runs_on(gemm, arch) if gemm else None)
    if why:
        pytest.skip(f"{algo} {gemm or ''}: {why}")


def needs_arch(gpu, min_arch):
    if int(gpu.arch[3:]) < min_arch:
        pytest.skip(f"needs sm_{min_arch}, this GPU is {gpu.arch}")


def rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def test_unroll_kernel(gpu, rng):
    from infer.gpu.launch import Unroll

    x, k = rand(rng, 3, 11, 9, 5), 3
    d = Dev()
    expected = reference.unroll(x, k).T
    u = d.empty(expected.shape)
    Unroll(build(gpu))(None, d.put(x), u, 3, 11, 9, 5, k)
    np.testing.assert_array_equal(d.get(u, expected.shape), expected)


# rows padded (45 -> 48, 25 -> 28, 50 -> 52, 147 -> 148, 63 -> 64) or whole (72, 800: float4 runs)
@pytest.mark.parametrize("c,k", [(5, 3), (1, 5), (2, 5), (8, 3), (32, 5), (3, 7), (7, 3)])
def test_transposed_unroll_kernel(gpu, rng, c, k):
    from infer.gpu.launch import Unroll

    x = rand(rng, 3, 11, 9, c)
    d = Dev()
    windows = reference.unroll(x, k)
    expected = np.zeros((windows.shape[0], Unroll.row(k, c)), np.float32)
    expected[:, : k * k * c] = windows
    u = d.empty((expected.shape[0] + 1, expected.shape[1]))  # one row more than written: it must stay poisoned
    Unroll(build(gpu), transposed=True)(None, d.put(x), u, 3, 11, 9, c, k)
    out = d.get(u, (expected.shape[0] + 1, expected.shape[1]))
    np.testing.assert_array_equal(out[:-1], expected)
    assert np.isnan(out[-1]).all()


GEMM_TILES = [(name, spec.version, tile) for name, spec in GEMMS.items() for tile in spec.tiles]


@pytest.mark.parametrize("name,version,tile", GEMM_TILES, ids=[f"{n}-{t}" for n, _, t in GEMM_TILES])
@pytest.mark.parametrize("m,n,k", [(37, 53, 29), (150, 132, 45), (201, 301, 130), (300, 10, 28), (257, 64, 800)])  # vector and scalar paths; wgmma: every column block, K past a chunk
@pytest.mark.parametrize("relu", [False, True])
def test_gemm_kernel(gpu, rng, name, version, tile, m, n, k, relu):
    from infer.gpu.launch import Gemm, gemm_runs_on

    if gemm_runs_on(name, gpu.arch):
        pytest.skip(gemm_runs_on(name, gpu.arch))
    a, b = rand(rng, m, k), rand(rng, k, n)
    d = Dev()
    c = d.empty((m + 1, n))  # one row more than written: it must stay poisoned
    gemm = Gemm(build(gpu), version, tile, cols=n)
    gemm(None, d.put(a), d.put(gemm.weights(b)), c, m, n, k, relu)
    expected = a.astype(np.float64) @ b
    expected = np.maximum(expected, 0) if relu else expected
    out = d.get(c, (m + 1, n))
    np.testing.assert_allclose(out[:m], expected, rtol=1e-5, atol=1e-5 * np.sqrt(k))
    assert np.isnan(out[m]).all()


# conv layers (H, W, C, K, C_OUT): ECE408's two, odd sizes and channel counts, 3x3 and 7x7, more
# windows than one block, every BN (version 1: 32, 64, 128; 2: 16, 32, 64), K past one chunk of
# version 2's tensor-core sums (9x9x64x3: 36 k-tiles)
CONVS = [(28, 28, 1, 5, 32), (12, 12, 32, 5, 64), (29, 31, 3, 7, 12), (11, 12, 12, 3, 20), (13, 13, 7, 7, 50),
         (20, 17, 5, 3, 100), (9, 9, 64, 3, 256)]
@pytest.mark.parametrize("algo", ["implicit-tc", "implicit-wgmma"])  # conv_kernel1, conv_kernel2
@pytest.mark.parametrize("h,w,c,k,c_out", CONVS, ids=["x".join(map(str, v)) for v in CONVS])
def test_conv_kernel(gpu, rng, h, w, c, k, c_out, algo):
    from infer.gpu.launch import Conv

    needs_arch(gpu, 80)
    runs_here(algo)
    n = 9
    x, wt = rand(rng, n, h, w, c), rand(rng, k, k, c, c_out) * 0.2
    expected = reference.avgpool2(reference.relu(reference.conv2d(x, wt)))
    d = Dev()
    out = d.empty((n + 1,) + expected.shape[1:])
    conv = Conv(build(gpu), h, w, c, k, c_out, ALGORITHMS[algo].CONV_KERNEL)
    weights = ALGORITHMS[algo].conv_weights(wt, conv.bn, conv.bk)
    conv(None, d.put(x), d.put(weights), out, n)
    got = d.get(out, (n + 1,) + expected.shape[1:])
    np.testing.assert_allclose(got[:n], expected, rtol=1e-5, atol=1e-5 * np.sqrt(k * k * c))
    assert np.isnan(got[n]).all()


def conv_kernel2_bits(gpu, rng, h, w, c, k, c_out):
    """(n, x, the weights, Dev, output shape, conv_kernel2's outputs) for 7 random images of a layer: the
    bits conv_kernel3 and 4 must give (within float32's error of the reference), one poisoned image
    past them."""
    from infer.gpu.launch import Conv

    runs_here("implicit-wgmma")
    n = 7
    x, wt = rand(rng, n, h, w, c), rand(rng, k, k, c, c_out) * 0.2
    expected = reference.avgpool2(reference.relu(reference.conv2d(x, wt)))
    d, shape = Dev(), (n + 1,) + expected.shape[1:]
    exact = Conv(build(gpu), h, w, c, k, c_out, "conv_kernel2")
    before = d.empty(shape)
    exact(None, d.put(x), d.put(ALGORITHMS["implicit-wgmma"].conv_weights(wt, exact.bn, exact.bk)), before, n)
    bits = d.get(before, shape)
    np.testing.assert_allclose(bits[:n], expected, rtol=1e-5, atol=1e-5 * np.sqrt(k * k * c))
    return n, x, wt, d, shape, bits


# conv_kernel3's layers: 1- and 3-channel inputs, a 7x7 kernel, 25 windows an image (groups across
# images), 5 channels and k past one chunk of tensor-core sums (9x9x5: 52 k8 steps)
WHOLE_CONVS = [(32, 32, 3, 5, 32), (64, 64, 1, 5, 32), (29, 31, 3, 7, 12), (14, 14, 3, 5, 64), (30, 30, 5, 9, 16)]
@pytest.mark.parametrize("h,w,c,k,c_out", WHOLE_CONVS, ids=["x".join(map(str, v)) for v in WHOLE_CONVS])
def test_conv_kernel3_gives_conv_kernel2s_bits(gpu, rng, h, w, c, k, c_out):
    """From any alignment of x, with one block for all groups and with as many as fit."""
    from infer.gpu.launch import Conv

    assert Conv.whole(h, w, c, k, c_out) is None
    n, x, wt, d, shape, bits = conv_kernel2_bits(gpu, rng, h, w, c, k, c_out)
    conv = Conv(build(gpu), h, w, c, k, c_out, "conv_kernel3")
    weights = d.put(ALGORITHMS["implicit-wgmma"].conv_weights(wt, conv.bn, conv.bk))
    for skew in range(4):  # x starting 0 to 3 floats past a 16-byte boundary
        for blocks in (1, conv.blocks):
            conv.blocks = blocks
            out = d.empty(shape)
            conv(None, int(d.put(np.concatenate([np.zeros(skew, np.float32), x.ravel()]))) + 4 * skew, weights, out, n)
            got = d.get(out, shape)
            np.testing.assert_array_equal(got[:n].view(np.int32), bits[:n].view(np.int32), err_msg=f"skew {skew}, {blocks} blocks")
            assert np.isnan(got[n]).all()


# conv_kernel4's layers: BK 32 in 3 stages, 16 in 3 (46x46x32) and 4 (15x15x64), 128 channels in two
# column blocks, blocks across images (14x14: 25 windows an image), a 7x7 kernel and a partial column block
STAGED_CONVS = [(30, 30, 32, 5, 64), (46, 46, 32, 5, 64), (15, 15, 64, 3, 128), (14, 14, 32, 5, 64), (19, 17, 32, 7, 40)]
@pytest.mark.parametrize("h,w,c,k,c_out", STAGED_CONVS, ids=["x".join(map(str, v)) for v in STAGED_CONVS])
def test_conv_kernel4_gives_conv_kernel2s_bits(gpu, rng, h, w, c, k, c_out):
    """Bitwise conv_kernel2's sums, on a count whose last block is partial, and nothing written past it;
    x 4 bytes off 16 is refused."""
    from infer.gpu.launch import Conv

    assert Conv.staged(h, w, c, k, c_out) is None
    n, x, wt, d, shape, bits = conv_kernel2_bits(gpu, rng, h, w, c, k, c_out)
    conv = Conv(build(gpu), h, w, c, k, c_out, "conv_kernel4")
    weights = d.put(ALGORITHMS["implicit-wgmma"].conv_weights(wt, conv.bn, conv.bk))
    out = d.empty(shape)
    conv(None, d.put(x), weights, out, n)
    got = d.get(out, shape)
    np.testing.assert_array_equal(got[:n].view(np.int32), bits[:n].view(np.int32))
    assert np.isnan(got[n]).all()
    with pytest.raises(ValueError, match="16-byte aligned"):
        conv(None, int(d.put(np.concatenate([np.zeros(1, np.float32), x.ravel()]))) + 4, weights, out, n)


def test_place_kernel(gpu, rng):
    from infer.gpu.launch import Place

    y = rand(rng, 37, 71)
    d = Dev()
    out = d.empty((71, 37))
    Place(build(gpu))(None, d.put(y), out, 37, 71)
    np.testing.assert_array_equal(d.get(out, (71, 37)), y.T)


def test_pool_kernel_is_bit_identical(gpu, rng):
    from infer.gpu.launch import Pool

    x = rand(rng, 3, 9, 7, 5)
    d = Dev()
    out = d.empty((3, 4, 3, 5))
    Pool(build(gpu))(None, d.put(x), out, 3, 9, 7, 5)
    np.testing.assert_array_equal(d.get(out, (3, 4, 3, 5)), reference.avgpool2(x))


def test_argmax_kernel_takes_the_first_maximum(gpu, rng):
    from infer.gpu.launch import Argmax

    s = rng.integers(0, 3, (301, 7)).astype(np.float32)
    s[[200, 120], 3] = [np.inf, np.nan]
    d = Dev()
    labels, overflow = d.empty(301, np.int32, -1), d.put([2**31 - 1], np.int32)
    Argmax(build(gpu))(None, d.put(s), labels, 301, 7, overflow)
    np.testing.assert_array_equal(d.get(labels, 301, np.int32)[:120], reference.argmax(s)[:120])
    assert d.get(overflow, 1, np.int32)[0] == 120


class Weights:
    def __init__(self, rng, g):
        self.conv1 = rand(rng, g.k1, g.k1, g.c, g.c1) * 0.3
        self.conv2 = rand(rng, g.k2, g.k2, g.c1, g.c2) * 0.1
        self.fc1 = rand(rng, g.flat, g.hidden) * 0.05
        self.fc2 = rand(rng, g.hidden, g.classes) * 0.1


# conv1's k (K1*K1*C) for fused_kernel3: 25 and 50 (tensor-core steps + a tail of 1 and 2 on FFMA),
# 27 (padded steps), 2 (one padded step; a 1x1 conv1)
GEOMETRIES = [Geometry(28, 28, 1, 5, 32, 5, 64, 128, 10), Geometry(24, 24, 1, 5, 32, 3, 64, 128, 10),
              Geometry(28, 28, 2, 5, 32, 5, 64, 100, 7), Geometry(27, 29, 3, 3, 32, 5, 64, 100, 7),
              Geometry(24, 24, 2, 1, 32, 5, 64, 100, 7)]


FUSED = [name for name in ALGORITHMS if name.startswith("fused") and name != "fused-certified"]


@pytest.mark.parametrize("algo", FUSED)
@pytest.mark.parametrize("g", GEOMETRIES, ids=lambda g: f"{g.h}x{g.w}x{g.c}-k{g.k1}-{g.c1}-k{g.k2}-{g.c2}")
def test_fused_conv_kernel(gpu, rng, g, algo):
    from infer.gpu.launch import Fused

    runs_here(algo)
    pipeline = ALGORITHMS[algo]
    assert pipeline.available(g, gpu.arch) is None
    n = 7  # not a multiple of the images per block: the last block is partial
    x, w = rand(rng, n, g.h, g.w, g.c), Weights(rng, g)
    expected = reference.avgpool2(reference.relu(reference.conv2d(
        reference.avgpool2(reference.relu(reference.conv2d(x, w.conv1))), w.conv2)))
    d = Dev()
    k = Fused(build(gpu), g, pipeline.KERNEL)
    k.set_conv1(pipeline.conv1_weights(w.conv1))
    feat = d.empty((n + 1, g.flat))  # one row more than written: it must stay poisoned
    w2, bad = d.put(pipeline.conv2_weights(w.conv2)), d.put([2**31 - 1], np.int32)
    k(None, d.put(x), w2, feat, n, bad)
    out = d.get(feat, (n + 1, g.flat))
    np.testing.assert_allclose(out[:n], expected.reshape(n, -1), rtol=1e-4, atol=1e-5)
    assert np.isnan(out[n]).all() and d.get(bad, 1, np.int32)[0] == 2**31 - 1  # all finite: untouched
    # The images are checked as they are staged: *bad is the first image holding a NaN or an inf
    # (images 5, at its last value, and 6, both in the partial last block); with no flag, no check.
    x[5, -1, -1, -1], x[6, 0, 3, 0] = np.nan, -np.inf
    k(None, d.put(x), w2, feat, n, bad)
    k(None, d.put(x), w2, feat, n, 0)
    assert d.get(bad, 1, np.int32)[0] == 5


STAGED = [(g, v) for g in GEOMETRIES for v in (3, 4, 6) if launch.Fused.plan(g, v)[0] is not None]


@pytest.mark.parametrize("g,version", STAGED, ids=[f"v{v}-{g.h}x{g.w}x{g.c}-k{g.k1}-{g.c1}-k{g.k2}-{g.c2}" for g, v in STAGED])
def test_fused_kernels_compute_conv1_from_codes(gpu, rng, g, version):
    """Images uploaded as 8-bit codes (every scaling; uint8's is ONE) are staged by fused_kernel3, 4 and 6
    themselves, conv1 computed from the codes (cuda/fused_conv1_wgmma.cuh): version 3's features
    within float32's accuracy of its features of the codes' float32 values (a float32 image and a
    byte of codes not confused), the same bits on a listed subset (the recomputation); versions 4
    and 6 within their bound dp of version 3's on the same codes (the certificate's premise: both
    paths' conv1 the same). The scalings by 1/255 (MUL, DIV) give the same bits, as do ONE and uint8."""
    from infer.gpu import certify
    from infer.data import codes
    from infer.gpu.pipelines import FusedCertified, FusedWarpgroup

    runs_here("fused-wgmma")
    n = 9
    k8 = rng.integers(0, 256, size=(n, g.h, g.w, g.c), dtype=np.uint8)
    k8[2] = 255  # a whole image at the top code
    w = Weights(rng, g)
    d = Dev()
    exact = launch.Fused(build(gpu), g, "fused_kernel3")
    exact.set_conv1(FusedWarpgroup.conv1_weights(w.conv1))
    w2 = d.put(FusedWarpgroup.conv2_weights(w.conv2))
    if version != 3:
        k = launch.Fused(build(gpu), g, f"fused_kernel{version}")
        k.set_conv1(FusedCertified.conv1_weights(w.conv1))
        d.cuda.memcpy_htod(k.module.get_global("c_conv2_bound")[0], certify.conv2_constants(w.conv2))
        w2h = d.put(FusedCertified.conv2_halves(w.conv2).view(np.float32))
    listed, count = d.put([7, 2, 5], np.int32), d.put([3], np.int32)
    bits = {}
    for wire in codes.WIRES + (np.dtype(np.uint8),):
        scaling = codes.staged_scaling(wire)
        feat, some = d.empty((n, g.flat)), d.empty((n, g.flat))
        exact(None, d.put(codes.unpack(k8, wire if wire != np.uint8 else codes.ONE)), w2, feat, n)
        floats = d.get(feat, (n, g.flat))
        xs = d.put(k8, np.uint8)
        exact(None, xs, w2, feat, n, scaling=scaling)
        exact(None, xs, w2, some, n, count=count, idx=listed, scaling=scaling)
        got = [d.get(feat, (n, g.flat))]
        assert np.isfinite(floats).all() and floats.any()
        np.testing.assert_allclose(got[0], floats, rtol=1e-4, atol=1e-6 * np.abs(floats).max())
        np.testing.assert_array_equal(d.get(some, (n, g.flat))[:3].view(np.uint32), got[0].view(np.uint32)[[7, 2, 5]])
        if version != 3:
            half, dp = d.empty((n, g.flat)), d.empty((n, g.flat))
            k(None, xs, w2h, half, n, dp=dp, scaling=scaling)
            got += [d.get(half, (n, g.flat)), d.get(dp, (n, g.flat))]
            gap = np.abs(got[1].astype(np.float64) - got[0])
            assert np.isfinite(got[2]).all() and (gap <= got[2]).all() and (gap > 0).any()
        bits[wire] = [a.view(np.uint32) for a in got]
    for a, b in ((codes.MUL, codes.DIV), (codes.ONE, np.dtype(np.uint8))):
        for x, y in zip(bits[a], bits[b]):
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("g", [g for g in GEOMETRIES if launch.Fused.plan(g, 3)[0] is not None],
                         ids=lambda g: f"{g.h}x{g.w}x{g.c}-k{g.k1}-{g.c1}-k{g.k2}-{g.c2}")
def test_fused_kernel3_two_images_a_block_gives_the_same_bits(gpu, rng, g):
    """The certified path's recomputation runs fused_kernel3 2 images a block: every feature the same
    bits as 4 a block, on a listed subset (idx, a count) as on all images."""
    from infer.gpu.pipelines import FusedWarpgroup

    runs_here("fused-wgmma")
    n = 11
    x, w = rand(rng, n, g.h, g.w, g.c), Weights(rng, g)
    d = Dev()
    xs, w2 = d.put(x), d.put(FusedWarpgroup.conv2_weights(w.conv2))
    listed, count = d.put([9, 2, 7, 4, 0, 10, 5], np.int32), d.put([5], np.int32)
    outs = []
    for imgs in launch.Fused.IMGS3:
        k = launch.Fused(build(gpu), g, FusedWarpgroup.KERNEL, imgs=imgs)
        assert k.imgs == imgs
        k.set_conv1(FusedWarpgroup.conv1_weights(w.conv1))
        every, some = d.empty((n, g.flat)), d.empty((n, g.flat))
        k(None, xs, w2, every, n)
        k(None, xs, w2, some, n, count=count, idx=listed)
        outs.append((d.get(every, (n, g.flat)), d.get(some, (n, g.flat))))
    (every4, some4), (every2, some2) = outs
    assert np.isfinite(every4).all() and np.isfinite(some4[:5]).all() and np.isnan(some4[5:]).all()
    np.testing.assert_array_equal(every2.view(np.uint32), every4.view(np.uint32))
    np.testing.assert_array_equal(some2.view(np.uint32)[:5], some4.view(np.uint32)[:5])
    np.testing.assert_array_equal(some4.view(np.uint32)[:5], every4.view(np.uint32)[[9, 2, 7, 4, 0]])
    assert np.isnan(some2[5:]).all()


def geometry_id(g):
    return f"{g.h}x{g.w}x{g.c}-k{g.k1}-{g.c1}-k{g.k2}-{g.c2}"


BOUNDED = [(g, k) for g in GEOMETRIES for k in ALGORITHMS["fused-certified"].KERNELS
           if launch.Fused.plan(g, launch.version_of(k))[0] is not None]


@pytest.mark.parametrize("g,kernel", BOUNDED, ids=[f"{k}-{geometry_id(g)}" for g, k in BOUNDED])
@pytest.mark.parametrize("scale", [1.0, 3e-3, 300.0])
def test_certified_conv_features_lie_within_their_bounds(gpu, rng, g, kernel, scale):
    """The float16 pass's features are within dp of float32's (the exact path's rounding is inside
    the bound too), dp is within a few thousand times the difference (a worst case over rounding directions), and dp is not finite
    where the float16 inputs overflow."""
    from infer.gpu import certify
    from infer.gpu.launch import Fused
    from infer.gpu.pipelines import FusedCertified

    runs_here("fused-certified")
    n = 7
    x, w = rand(rng, n, g.h, g.w, g.c) * np.float32(scale), Weights(rng, g)
    expected = reference.avgpool2(reference.relu(reference.conv2d(
        reference.avgpool2(reference.relu(reference.conv2d(x, w.conv1))), w.conv2))).reshape(n, -1)
    d = Dev()
    k = Fused(build(gpu), g, kernel)
    k.set_conv1(FusedCertified.conv1_weights(w.conv1))
    d.cuda.memcpy_htod(k.module.get_global("c_conv2_bound")[0], certify.conv2_constants(w.conv2))
    feat, dp = d.empty((n + 1, g.flat)), d.empty((n + 1, g.flat))
    w2h, bad = d.put(FusedCertified.conv2_halves(w.conv2).view(np.float32)), d.put([2**31 - 1], np.int32)
    k(None, d.put(x), w2h, feat, n, bad, dp=dp)
    out, bound = d.get(feat, (n + 1, g.flat)), d.get(dp, (n + 1, g.flat))
    assert np.isnan(out[n]).all() and np.isnan(bound[n]).all() and d.get(bad, 1, np.int32)[0] == 2**31 - 1
    gap = np.abs(out[:n].astype(np.float64) - expected)
    assert np.isfinite(bound[:n]).all() and (gap <= bound[:n]).all()
    assert (gap > 0).any() and np.median(bound[:n][gap > 0] / gap[gap > 0]) < 5000
    x[3] = 1e6  # conv1's outputs past float16's range: no bound for that image
    k(None, d.put(x), w2h, feat, n, bad, dp=dp)
    assert not np.isfinite(d.get(dp, (n, g.flat))[3]).any()


LARGE_FC = Geometry(64, 64, 1, 5, 32, 5, 64, 128, 10)  # 10816 features: fc1 split over blocks


SMALL_FC = Geometry(28, 28, 1, 3, 16, 3, 13, 36, 10)  # 325 features: scalar loads; 36 hidden: 16 images a block
WIDE_FC = Geometry(28, 28, 1, 5, 64, 5, 128, 256, 10)  # 2048 features, 256 hidden: fc1 tiles of 16, 8 warps
HIDDEN64_FC = Geometry(28, 28, 1, 3, 16, 3, 20, 64, 7)  # 500 features (a k-tile cut), 64 hidden: fc_kernel6's m64n32


FC_KERNELS = {"fp32": (False, False), "mma-sync": (True, False), "wgmma": (True, True)}  # (tensor_cores, wgmma)


@pytest.mark.parametrize("kernel", list(FC_KERNELS))
@pytest.mark.parametrize("g", GEOMETRIES[:1] + GEOMETRIES[2:3] + [SMALL_FC, WIDE_FC, LARGE_FC, HIDDEN64_FC],
                         ids=["mnist", "odd", "small", "wide", "split", "hidden64"])
@pytest.mark.parametrize("n", [45, 131])
def test_fused_fc_kernel(gpu, rng, g, kernel, n):
    """Scores and labels against the NumPy reference (past the last image nothing is written), and
    with a count the GPU set only that many images: fc1's sums before ReLU too, where z is asked."""
    from infer.gpu.launch import FullyConnected, FullyConnectedWarpgroup

    tensor_cores, wgmma = FC_KERNELS[kernel]
    if tensor_cores:
        needs_arch(gpu, 80)
    if wgmma and FullyConnectedWarpgroup.fits(g, gpu.arch):
        pytest.skip(FullyConnectedWarpgroup.fits(g, gpu.arch))
    feat, w = rand(rng, n, g.flat), Weights(rng, g)
    d = Dev()
    labels, overflow = d.empty(n + 1, np.int32, -1), d.put([2**31 - 1], np.int32)
    scores = d.empty((n + 1, g.classes))
    fc = FullyConnected(build(gpu), g, tensor_cores, wgmma)
    # fc_kernel6 splits at its FP32 adds (the unsplit kernel's bits: test_fc_splits_keep_the_bits)
    assert (fc.splits(n) > 1) == (g is LARGE_FC or wgmma and g.flat > FullyConnectedWarpgroup.CHUNK)
    assert fc.tensor_cores == tensor_cores and bool(fc.warpgroup) == wgmma
    partial = d.empty(max(1, fc.partial_floats(n)))
    fc1 = d.put(fc.fc1_operand(w.fc1))
    fc(None, d.put(feat), fc1, d.put(w.fc2), labels, n, overflow, scores, partial)
    hidden = reference.fc(feat, w.fc1)
    expected = reference.fc(reference.relu(hidden), w.fc2)
    out = d.get(labels, n + 1, np.int32)
    got = d.get(scores, (n + 1, g.classes))
    np.testing.assert_allclose(got[:n], expected, rtol=1e-4, atol=1e-5 * np.abs(expected).max())
    assert (out[:n] == reference.argmax(expected)).mean() >= 0.97 and np.isnan(got[n]).all()
    assert out[n] == -1 and d.get(overflow, 1, np.int32)[0] == 2**31 - 1  # all finite: untouched
    if not tensor_cores:
        return
    live = n - 17  # a device-set count: the images past it are not touched
    labels, z = d.empty(n, np.int32, -1), d.empty((n, g.hidden))
    fc(None, d.put(feat), fc1, d.put(w.fc2), labels, n, overflow, 0, partial, z=z, count=d.put([live], np.int32))
    out = d.get(labels, n, np.int32)
    assert (out[live:] == -1).all() and (out[:live] == reference.argmax(expected[:live])).mean() >= 0.97
    zs = d.get(z, (n, g.hidden))
    np.testing.assert_allclose(zs[:live], hidden[:live], rtol=1e-4, atol=1e-5 * np.abs(hidden).max())
    assert np.isnan(zs[live:]).all()


@pytest.mark.parametrize("g", GEOMETRIES[:1] + [HIDDEN64_FC, WIDE_FC], ids=["mnist", "hidden64", "wide"])
def test_fc_splits_keep_the_bits(gpu, rng, g, monkeypatch):
    """fc_kernel6 split at its FP32 adds, then fc_kernel3: the scores, labels and fc1's sums are the
    unsplit kernel's bits, with and without a device-set count."""
    from infer.gpu.launch import FullyConnected

    needs_arch(gpu, 90)
    n, live = 131, 117
    feat, w = rand(rng, n, g.flat), Weights(rng, g)
    feat[5, : g.flat // 2] = 0  # sums of exact zeros: -0 and +0 alike
    d = Dev()
    fc = FullyConnected(build(gpu), g, True, True)
    assert fc.splits(n) == -(-g.flat // 256) > 1 and fc.splits(64 * 264) == 1  # split where 64-image blocks are few
    fc1, fc2, x = d.put(fc.fc1_operand(w.fc1)), d.put(w.fc2), d.put(feat)
    partial = d.empty(fc.partial_floats(n))
    runs = []
    for split in (True, False):
        if not split:
            monkeypatch.setattr(FullyConnected, "splits", lambda self, n: 1)
        for count in (None, live):
            labels, z, scores = d.empty(n, np.int32, -1), d.empty((n, g.hidden)), d.empty((n, g.classes))
            overflow = d.put([2**31 - 1], np.int32)
            fc(None, x, fc1, fc2, labels, n, overflow, scores, partial, z=z,
               count=0 if count is None else d.put([count], np.int32))
            runs.append([d.get(labels, n, np.int32), d.get(scores, (n, g.classes)).view(np.int32),
                         d.get(z, (n, g.hidden)).view(np.int32)])
    for got, want in zip(runs[:2], runs[2:]):
        for a, b in zip(got, want):
            assert (a == b).all()
    assert (runs[1][0][live:] == -1).all() and (runs[1][0][:live] == runs[0][0][:live]).all()


# whole networks: ECE408, the geometries, odd ones (hidden not a multiple of 4: the fc GEMMs)
NETWORKS = ["28x28x1,5:32,5:64,128", "32x32x3,5:32,5:64,256", "28x28x1,3:16,3:32,64", "29x31x3,7:12,3:20,50,7",
            "37x23x2,3:5,7:13,33,5", "64x64x1,5:32,5:64,128"]


@pytest.mark.parametrize("algo", list(ALGORITHMS))
@pytest.mark.parametrize("spec", NETWORKS)
def test_every_algorithm_on_every_geometry(gpu, spec, algo):
    """Scores against the NumPy reference on seeded random weights and images, for every algorithm
    that accepts the geometry (unroll with each GEMM)."""
    from infer.bench.gpu import random_case
    from infer.gpu.backend import CudaBackend

    model, x = random_case(spec, 37)
    g = network.geometry(model, x.shape)
    if ALGORITHMS[algo].available(g, gpu.arch) is not None:
        pytest.skip(f"{algo} does not take {spec}")
    expected = reference.scores(x, model)
    for gemm in (GEMMS if algo == "unroll" else ["auto"]):
        if gemm in GEMMS and gemm_runs_on(gemm, gpu.arch):
            continue
        b = CudaBackend(conv_algo=algo, gemm_algo=gemm, chunk=16)
        try:
            host = b.host_buffers(x.shape, np.float32)[0]
            host[...] = x
            b.prepare(model, for_backend(b, model, x.shape, scores=True))
            labels, scores = b.forward(host)
        finally:
            b.close()
        scale = np.abs(expected).max()
        if algo == "fused-certified":  # its scores are the float16 pass's (labels: test_certified_gpu.py)
            np.testing.assert_allclose(scores, expected, rtol=0, atol=2e-2 * scale)
            continue
        np.testing.assert_allclose(scores, expected, rtol=1e-4, atol=1e-5 * scale, err_msg=f"{algo} {gemm}")
        assert (labels == reference.argmax(expected)).mean() >= 0.97


@pytest.fixture(scope="module")
def cpu_testfull(ece408):
    return infer.run(ece408 / "testfull.hdf5", ece408 / "model.hdf5", backend="cpu").predictions


CONFIGS = [(algo, gemm, tw, s, None) for algo, gemm, tw in variants("sm_90") for s in (1, 4)] + [("fused", None, None, 3, 999)]


@pytest.mark.parametrize("algo,gemm,tile_width,streams,chunk", CONFIGS)
def test_testfull_on_the_gpu(ece408, cpu_testfull, algo, gemm, tile_width, streams, chunk):
    runs_here(algo, gemm)
    r = infer.run(ece408 / "testfull.hdf5", ece408 / "model.hdf5", backend="cuda", conv_algo=algo,
                   gemm_algo=gemm or "auto", tile_width=tile_width, streams=streams, chunk=chunk)
    assert r.correct == TESTFULL_CORRECT
    assert np.count_nonzero(r.predictions == cpu_testfull) >= TESTFULL_AGREE


@pytest.mark.parametrize("gemm,kernels", [("tf32x3", ("unroll_kernel2", "gemm_kernel3", "place_kernel1")),
                                          ("wgmma", ("unroll_kernel3", "gemm_kernel4"))])
def test_cli_profile_lists_kernels_and_copies(ece408, gemm, kernels):
    from tests.conftest import invoke

    runs_here("unroll", gemm)
    r = invoke("run", ece408 / "test100.hdf5", ece408 / "model.hdf5", "--backend", "cuda", "--profile",
               "--conv-algo", "unroll", "--gemm-algo", gemm)
    assert r.exit_code == 0, r.stderr
    for name in kernels + ("pool_kernel1", "argmax_kernel1", "memcpy HtoD (images)", "context set-up",
                           "compile / load kernels"):
        assert name in r.stdout
    assert gemm != "wgmma" or "place_kernel1" not in r.stdout


@pytest.mark.parametrize("algo", list(ALGORITHMS))
def test_streamed_equals_in_memory_on_the_gpu(ece408, cpu_testfull, monkeypatch, algo):
    runs_here(algo)
    monkeypatch.setenv("CNNINFER_HOST_BUDGET_MB", "4")  # testfull (31 MB) streams through the ring
    r = infer.run(ece408 / "testfull.hdf5", ece408 / "model.hdf5", backend="cuda", conv_algo=algo, chunk=700)
    assert r.streamed and r.correct == TESTFULL_CORRECT
    assert np.count_nonzero(r.predictions == cpu_testfull) >= TESTFULL_AGREE


@pytest.mark.parametrize("images", ["device ring", "staging"])
def test_streamed_blocks_wrap_around_the_device_ring(ece408, monkeypatch, images):
    """12 blocks of 900 images through 6 device slots (each slot reused twice), or, with the GPU
    too full for the ring, through the streams' staging buffers: labels and scores equal the
    in-memory run's, bit for bit."""
    import pycuda.driver as cuda

    from infer.gpu.backend import CudaBackend

    data, model = ece408 / "testfull.hdf5", ece408 / "model.hdf5"
    whole = infer.run(data, model, backend="cuda", chunk=300, scores=True)
    monkeypatch.setenv("CNNINFER_HOST_BUDGET_MB", "1")
    monkeypatch.setattr(CudaBackend, "STREAM_BYTES", 1000 * 28 * 28 * 4)
    if images == "staging":
        real = cuda.mem_alloc
        monkeypatch.setattr(cuda, "mem_alloc", lambda n: real(n) if n <= 4 << 20 else (_ for _ in ()).throw(
            cuda.MemoryError("cuMemAlloc failed: out of memory")))
    streamed = infer.run(data, model, backend="cuda", chunk=300, scores=True)
    assert streamed.streamed and not whole.streamed
    np.testing.assert_array_equal(streamed.predictions, whole.predictions)
    np.testing.assert_array_equal(streamed.scores, whole.scores)


@pytest.mark.parametrize("budget", ["512", "4"])
def test_split_over_gpus_equals_one_gpu(ece408, monkeypatch, budget):
    """Two contexts on GPU 0 stand in for two GPUs where only one exists; --devices 0,1 on the real thing."""
    from infer.gpu import device
    from infer.gpu.multi import MultiGpuBackend

    monkeypatch.setenv("CNNINFER_HOST_BUDGET_MB", budget)
    pair = [0, 1] if device.visible_devices() > 1 else [0, 0]
    if pair == [0, 0]:  # two contexts on one GPU share its legacy stream: one's graph capture fails the other's calls
        monkeypatch.setenv("CNNINFER_GRAPHS", "0")
    one = infer.run(ece408 / "testfull.hdf5", ece408 / "model.hdf5", 9999, backend="cuda", scores=True)
    monkeypatch.setattr("infer.gpu.create", lambda devices=None, **o: MultiGpuBackend(pair, **o))
    two = infer.run(ece408 / "testfull.hdf5", ece408 / "model.hdf5", 9999, backend="cuda", scores=True)
    assert two.device.startswith("2 GPUs") and two.streamed == (budget == "4")
    # streamed, each GPU reads its range with a pool of its own; in memory, the first GPU's reads all
    assert two.reader["threads"] == (2 if two.streamed else 1) * one.reader["threads"]
    assert (two.predictions == one.predictions).all() and (two.labels == one.labels).all()
    np.testing.assert_array_equal(two.scores, one.scores)


def test_streamed_blocks_are_sized_in_bytes(ece408):
    """About STREAM_BYTES a block whatever the stored type: 4x as many uint8 images as float32, each
    block one launch (a chunk)."""
    from infer.data import loader
    from infer.gpu.backend import CudaBackend

    model = loader.load_model(ece408 / "model.hdf5")
    b = CudaBackend()
    try:
        blocks = {}
        for stored in (np.float32, np.uint8):
            b.prepare(model, for_backend(b, model, (1_000_000, 28, 28, 1), wire=stored, streamed=True))
            blocks[stored] = b.stream_block
            assert b.stream_block * 28 * 28 * np.dtype(stored).itemsize <= CudaBackend.STREAM_BYTES
            assert b.executor.run.chunk == b.stream_block
        assert blocks[np.uint8] == 4 * blocks[np.float32]
    finally:
        b.close()


def test_out_of_device_memory_falls_back_to_smaller_chunks(ece408, cpu_testfull, monkeypatch):
    """Allocations over 4 MB fail as if the GPU were full: the run still ends correctly."""
    import pycuda.driver as cuda

    real = cuda.mem_alloc

    def small_only(nbytes):
        if nbytes > 4 << 20:
            raise cuda.MemoryError("cuMemAlloc failed: out of memory")
        return real(nbytes)

    monkeypatch.setattr(cuda, "mem_alloc", small_only)
    r = infer.run(ece408 / "testfull.hdf5", ece408 / "model.hdf5", backend="cuda", conv_algo="unroll")
    assert r.correct == TESTFULL_CORRECT and np.count_nonzero(r.predictions == cpu_testfull) >= TESTFULL_AGREE


def exact_default():
    """The exact path the default takes on this GPU (for runs it does not certify)."""
    from infer.gpu.device import Device

    gpu = Device(0)
    try:
        return "fused-wgmma" if launch.needs_hopper(gpu.arch) is None else "fused-tc"
    finally:
        gpu.close()


def test_bench_validates_and_times_every_algorithm(ece408):
    import json

    from tests.conftest import invoke

    r = invoke("bench", ece408 / "test100.hdf5", ece408 / "model.hdf5", "--warmup", 1, "--repeats", 3, "--json")
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    names = [row["name"] for row in d["rows"]]
    assert {"cnninfer fused", "cnninfer implicit-tc", "cnninfer unroll tiled tile 8", "cnninfer unroll blocked tile 64",
            "cnninfer unroll tf32x3 tile 128"} <= set(names)
    assert any("compiled + CUDA graph" in name for name in names)
    # 100 images: fewer than the default certifies, so its row is the exact path's
    assert [name for name in names if name.endswith(" (default)")] == [f"cnninfer {exact_default()} (default)"]
    for row in d["rows"]:
        assert row["gpu_ms"] > 0 and row["e2e_ms"] > 0 and row["identical"] >= 99
        # test100 holds 8-bit codes: the row the default runs for them (100 images: the exact path, the
        # float32 default's) also times them as `cnninfer run` uploads them
        assert ("e2e_codes_ms" in row) == ("gpu_codes_ms" in row) == row["name"].endswith(" (default)")


@pytest.mark.parametrize("algo", list(ALGORITHMS))
@pytest.mark.parametrize("budget", ["512", "1"])
def test_overflowing_scores_are_refused(ece408, tmp_path, monkeypatch, algo, budget):
    """Finite but huge pixels overflow float32 inside the network: refused, naming the image."""
    runs_here(algo)
    import h5py

    with h5py.File(ece408 / "testfull.hdf5") as f:
        x, y = f["x"][:1000], f["y"][:1000]
    x[777] = 3e38
    bad = tmp_path / "bad.h5"
    with h5py.File(bad, "w") as f:
        f["x"], f["y"] = x, y
    monkeypatch.setenv("CNNINFER_HOST_BUDGET_MB", budget)
    from infer.errors import ScoresOverflow

    with pytest.raises(ScoresOverflow) as e:
        infer.run(bad, ece408 / "model.hdf5", backend="cuda", conv_algo=algo, chunk=300)
    assert e.value.image == 777


@pytest.mark.parametrize("algo", list(ALGORITHMS))
def test_fast_math_keeps_the_predictions(ece408, cpu_testfull, algo):
    runs_here(algo)
    r = infer.run(ece408 / "testfull.hdf5", ece408 / "model.hdf5", backend="cuda", conv_algo=algo, fast_math=True)
    assert r.correct == TESTFULL_CORRECT
    assert np.count_nonzero(r.predictions == cpu_testfull) >= TESTFULL_AGREE


def test_check_on_the_gpu(ece408):
    from tests.conftest import invoke

    r = invoke("run", ece408 / "test100.hdf5", ece408 / "model.hdf5", "--backend", "cuda", "--check", "--json")
    assert r.exit_code == 0, r.stderr
    assert "check: 100 of 100 predictions equal the NumPy reference's" in r.stderr


def test_bench_on_a_random_geometry():
    import json

    from tests.conftest import invoke

    r = invoke("bench", "--random", "29x31x3,7:12,3:20,50,7", "300", "--warmup", 1, "--repeats", 3, "--json",
               "--no-torch-compile")
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["n"] == 300 and d["geometry"]["c1"] == 12
    assert "cnninfer implicit-tc" in [row["name"] for row in d["rows"]]
    assert all(row["identical"] >= 297 for row in d["rows"])


def test_tile_width_without_a_gemm_is_said_once(ece408):
    from tests.conftest import invoke

    r = invoke("run", ece408 / "test100.hdf5", ece408 / "model.hdf5", "--backend", "cuda", "--tile-width", "16")
    assert r.exit_code == 0, r.stderr
    assert r.stderr.count("--tile-width 16 has no effect") == 1


def test_tile_width_the_gemm_lacks_exits_2(ece408):
    from tests.conftest import invoke

    r = invoke("run", ece408 / "test100.hdf5", ece408 / "model.hdf5", "--backend", "cuda", "--conv-algo", "unroll",
               "--gemm-algo", "tf32x3", "--tile-width", "8")
    assert r.exit_code == 2 and "tile widths 32, 64, 128, not 8" in r.stderr and "Traceback" not in r.stderr



@pytest.mark.parametrize("graphs", ["1", "0"])
def test_a_forward_names_its_first_bad_image_then_forgets_it(ece408, monkeypatch, graphs):
    """The chunks' flags come back with the forward (a graph's last copy, or a copy after the
    kernels): a NaN in chunk 7 of 12 is named by its image, the earlier of two by the lower index, and
    the next forward of good images is not refused (the flags are cleared and copied again)."""
    from infer.data import loader
    from infer.bench.gpu import read_all
    from infer.errors import BadValue
    from infer.gpu.backend import CudaBackend

    monkeypatch.setenv("CNNINFER_GRAPHS", graphs)
    model = loader.load_model(ece408 / "model.hdf5")
    x = read_all(ece408 / "testfull.hdf5", model, 3000)
    b = CudaBackend(chunk=250)
    try:
        host = b.host_buffers(x.shape, np.float32)[0]
        host[...] = x
        b.prepare(model, for_backend(b, model, x.shape))
        good = b.forward(host)[0]
        for bad in ([1834], [2999, 1751]):
            for i in bad:
                host[i, 3, 4, 0] = np.nan
            with pytest.raises(BadValue) as e:
                b.forward(host)
            assert e.value.image == min(bad)
            host[...] = x
            np.testing.assert_array_equal(b.forward(host)[0], good)
        assert len(b.executor.graphs) == (graphs == "1")
    finally:
        b.close()

@pytest.mark.parametrize("algo", ["unroll", "implicit-tc"])
def test_graph_replay_equals_kernel_by_kernel(ece408, cpu_testfull, monkeypatch, algo):
    """The recorded graph replays the same work: equal labels and scores, with and without graphs,
    and a second forward on the same buffers replays (no new graph)."""
    from infer.data import loader
    from infer.bench.gpu import read_all
    from infer.gpu.backend import CudaBackend

    model = loader.load_model(ece408 / "model.hdf5")
    x = read_all(ece408 / "testfull.hdf5", model, 3000)
    outputs = []
    for graphs in ("1", "0"):
        monkeypatch.setenv("CNNINFER_GRAPHS", graphs)
        b = CudaBackend(conv_algo=algo, chunk=250)
        try:
            host = b.host_buffers(x.shape, np.float32)[0]
            host[...] = x
            b.prepare(model, for_backend(b, model, x.shape, scores=True))
            first = b.forward(host)
            second = b.forward(host)
            assert len(b.executor.graphs) == (graphs == "1") and b.executor.use_graphs == (graphs == "1")
        finally:
            b.close()
        np.testing.assert_array_equal(first[0], second[0])
        outputs.append(second)
    np.testing.assert_array_equal(outputs[0][0], outputs[1][0])
    np.testing.assert_array_equal(outputs[0][1], outputs[1][1])
    assert np.count_nonzero(outputs[0][0] == cpu_testfull[:3000]) >= 2998
