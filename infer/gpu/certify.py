"""Certified low precision, the NumPy oracle (docs/certified.md has the derivation).

The low-precision pass computes conv2, 85% of the network's multiply-adds, with float16 weights
and inputs and float32 accumulation; conv1 and the fc layers are computed exactly as the exact
path computes them (`--conv-algo fused-wgmma`: 3xTF32 on the GPU, float32 here), so conv1's outputs are
the same bits on both paths. Beside the scores it bounds, per image and per pair (top class t,
other class c), how far (s_t - s_c) can lie from the exact path's: conv2's fresh rounding on both
paths, pushed through ReLU, pooling and the fc layers with the image's own ReLU pattern (a unit
whose sign the error could flip is bounded on its own). Where every pair's score difference
exceeds its bound, the exact path must give the same first maximum; every other image is
recomputed on it.

A bound pushed through |W| alone (interval arithmetic) is sound but useless here: on testfull it
came out ~4000x the observed error, larger than most top-2 margins (0 of 2000 images certified).
"""
import numpy as np

from .. import reference

U16 = 2.0**-11  # float16: unit roundoff (10 fraction bits, round to nearest)
ETA16 = 2.0**-25  # half float16's subnormal spacing: the absolute error where values underflow
F16_MAX = 65504.0
U32 = 2.0**-24
UACC = 2.0**-23  # one float32 addition on tensor cores (they may truncate: a whole ulp, not half)
# 3xTF32 products (and 3xFP16's, fused_kernel3's conv2, past EXACT_ABS): the dropped and rounded terms
# stay under 3 * 2^-22 |w||a|
U_EXACT = 2.0**-20
SPLIT = 1 + 2.0**-8  # the three products of a multiply-add: their magnitudes sum to at most this * |w||a|
TINY = 2.0**-120  # per |w| and per |a|: what TF32 splits and float32 lose to underflow, with room
# The exact path's conv2 in 3xFP16 (fused_kernel3: inputs times 2^s and weights times 2^T as float16
# parts) drops terms under float16's subnormals: per output at most this times (amax sum |w| + max |w|
# sum a), amax the image's largest conv1 output, max |w| the channel's largest weight (docs/certified.md)
EXACT_ABS = 2.0**-38
RESCALE = 2.0**-147  # per output: the exact path's sums times 2^-s, then 2^-T, may underflow (twice 2^-150)
BLOCK = 256  # images per block of the oracle (conv2's windows in float64: 105 MB)
STYLES = ("componentwise", "window-max")


def gamma(n, u=UACC):
    """Higham's gamma_n: |float sum of n terms - exact sum| <= gamma_n * the sum of their magnitudes."""
    if n * u >= 0.5:
        raise ValueError(f"{n} terms are too many for a float32 accumulation bound")
    return n * u / (1 - n * u)


def to_half(v):
    """v rounded to float16 (nearest, ties to even), as float32 values: what the kernels feed the MMA."""
    with np.errstate(over="ignore"):
        return v.astype(np.float16).astype(np.float32)


def _windows(a, k):
    """(N, Ho, Wo, K*K*C): each output pixel's receptive field, (kh, kw, c) order."""
    n, h, w, c = a.shape
    return reference.unroll(a, k).reshape(n, h - k + 1, w - k + 1, k * k * c)


def conv2_weight_bound(w2):
    """Per weight (n, C2) in float64: what conv2's gap counts per unit of |fl16(a)| in that weight's
    product. float16 rounds the weight by r = fl16(w) - w (known: the weights are fixed, |r| averages
    about a third of u|w|) and the input by at most u|fl16(a)| + eta; float32 sums n products of
    |fl16(w)| <= |w| + |r| on the float16 path, 3xTF32 keeps 3 * 2^-22 and sums 3n on the exact one,
    whose |a| is at most (1 + u)|fl16(a)| + eta. inf where a weight overflows float16."""
    n = w2[..., 0].size
    w = np.asarray(w2, np.float32).reshape(n, -1)
    with np.errstate(over="ignore", invalid="ignore"):
        r = np.abs(to_half(w).astype(np.float64) - w)
    return r * (1 + gamma(n)) + np.abs(w).astype(np.float64) * (U16 + gamma(n) + exact_rounding(n) * (1 + U16))


def conv2_gap(a1, w2, style):
    """Bound on |float16 conv2 - exact path's conv2| per output (N, Ho, Wo, C2), both fed the same
    conv1 outputs a1 (not negative): conv2_weight_bound per |fl16(a)|, the inputs' eta (and what the
    exact path's products lose of it) per |w|, what splits and float32 lose to underflow (TINY) per |w|
    and per |a|, and the exact path's float16 parts' subnormals (EXACT_ABS) and rescaling (RESCALE)."""
    k, n = w2.shape[0], w2[..., 0].size
    b = conv2_weight_bound(w2)
    w_abs = np.abs(w2).reshape(n, -1).astype(np.float64)
    with np.errstate(over="ignore"):
        ah = _windows(np.abs(to_half(a1)).astype(np.float64), k)
    if style == "componentwise":  # the bound's weights as 64 more output channels
        through = ah @ b
    else:  # every term at its window's largest |fl16(a)|: the window's maximum times the bound's column sums
        through = ah.max(axis=-1, keepdims=True) * b.sum(axis=0)
    a_sum = _windows(np.abs(a1).astype(np.float64), k).sum(axis=-1, keepdims=True)
    amax = np.abs(a1).astype(np.float64).reshape(len(a1), -1).max(axis=1)[:, None, None, None]
    exact16 = EXACT_ABS * (amax * w_abs.sum(axis=0) + w_abs.max(axis=0) * a_sum) + RESCALE
    return through + ((1 + exact_rounding(n)) * ETA16 + TINY) * w_abs.sum(axis=0) + TINY * a_sum + exact16


def exact_rounding(n):
    """The exact path's sum of n products (3xTF32 where the GPU uses it, float32 sums): at most this
    times the sum of |w||a| from exact arithmetic. Used for conv2 and both fc layers, on either path."""
    return gamma(3 * n) * SPLIT + U_EXACT


FC1 = ("exact", "half")


def half_pass(x, model, style="componentwise", fc1="half"):
    """The low-precision pass over float32 images x (N, H, W, C): (scores (N, classes) float32,
    gap (N, classes) float64). gap[i, c] bounds |(s_t - s_c) - (s'_t - s'_c)| for image i's top
    class t (s: these scores, s': the exact path's); gap[i, t] = 0. inf where anything overflowed.
    fc1="half": fc1 from float16 operands (fl16(p) fl16(fc1), float32 sums), as certify_kernel4 and 5 compute
    it; "exact": float32 sums, as the exact path (and certify_kernel1-3's fc kernel) computes them."""
    if style not in STYLES:
        raise ValueError(f"no bound style {style!r}: {', '.join(STYLES)}")
    if fc1 not in FC1:
        raise ValueError(f"no fc1 mode {fc1!r}: {', '.join(FC1)}")
    x = np.asarray(x, np.float32)
    parts = [_half_pass(x[i:i + BLOCK], model, style, fc1) for i in range(0, len(x), BLOCK)]
    return np.concatenate([s for s, _ in parts]), np.concatenate([g for _, g in parts])


def half_fc1_rounding(p, fc1):
    """(z, r): fc1's sums before ReLU from float16 operands, fl16(p) fl16(fc1) summed in float32, and per
    hidden unit a bound on |z - p fc1| (exact arithmetic) for p >= 0: each product is within (2u + u^2)
    |w| p + eta (1 + u)(|w| + p) + eta^2 of w p, and the float32 sum of n within gamma_n of their
    magnitudes, each at most (1 + u)^2 |w| p + eta (1 + u)(|w| + p) + eta^2."""
    n = fc1.shape[0]
    with np.errstate(over="ignore", invalid="ignore"):
        z = (to_half(p) @ to_half(fc1)).astype(np.float32)
    w_abs, p64 = np.abs(fc1).astype(np.float64), np.asarray(p, np.float64)
    g = gamma(n)
    r = (2 * U16 + U16**2 + g * (1 + U16)**2) * (p64 @ w_abs)
    r += (1 + g) * (ETA16 * (1 + U16) * (w_abs.sum(axis=0)[None, :] + p64.sum(axis=1)[:, None]) + n * ETA16**2)
    return z, r


def _half_pass(x, model, style, fc1_mode):
    n = len(x)
    a1 = reference.avgpool2(reference.relu(reference.conv2d(x, model.conv1)))  # the exact path's, bit for bit
    finite = np.isfinite(a1).reshape(n, -1).all(axis=1) & (np.abs(a1) <= F16_MAX).reshape(n, -1).all(axis=1)
    z2 = reference.conv2d(to_half(a1), to_half(model.conv2))
    d2 = conv2_gap(a1, model.conv2, style)
    v = reference.relu(z2)
    p = reference.flatten(reference.avgpool2(v))
    # Pooling is non-expansive; each path's three float32 additions add gamma_3 of its magnitudes
    # (the exact path's within d2 of these)
    v_abs = np.abs(v).astype(np.float64)
    d_p = reference.flatten(reference.avgpool2(d2) + gamma(3, U32) * reference.avgpool2(2 * v_abs + d2)) + 2.0**-148
    # fc1 on both paths, float32 sums of the same weights on inputs d_p apart
    w1, w2 = model.fc1.astype(np.float64), model.fc2.astype(np.float64)
    p_abs = np.abs(p).astype(np.float64)
    if fc1_mode == "exact":  # both paths' float32 sums, of inputs within d_p of each other
        z = reference.fc(p, model.fc1)
        r1 = exact_rounding(w1.shape[0]) * ((2 * p_abs + d_p) @ np.abs(w1))
    else:  # the exact path's float32 sums, and the float16 operands' sums
        z, r_half = half_fc1_rounding(p, model.fc1)
        r1 = exact_rounding(w1.shape[0]) * ((p_abs + d_p) @ np.abs(w1)) + r_half
    q = d_p @ np.abs(w1)
    e1 = q + r1  # |z - z'| per hidden unit
    h = reference.relu(z)
    scores = reference.fc(h, model.fc2)
    stable = np.abs(z) > e1  # same sign on both paths: ReLU is linear on the whole segment
    active = stable & (z > 0)
    top = reference.argmax(scores)
    rows = np.arange(n)
    dw = w2[:, top].T[:, :, None] - w2[None, :, :]  # (N, hidden, classes): w2_t - w2_c
    # ReLU's slope between the paths: h' - h = slope (z' - z), 1 on active units, 0 on the other stable
    # ones, somewhere in [0, 1] on the unstable: there 1/2 goes into g, the other +-1/2 at most q/2.
    slope = np.where(stable, active, 0.5)
    g = np.einsum("kj,njc->nkc", w1, slope[:, :, None] * dw)  # d(s_t - s_c)/dp through the slopes
    gap = np.einsum("nkc,nk->nc", np.abs(g), d_p)
    gap += np.einsum("njc,nj->nc", np.abs(dw), np.where(stable, active * r1, q / 2 + r1))
    # fc2's float32 sums on both paths, for s_t and s_c
    h_abs = np.abs(h).astype(np.float64)
    r2 = exact_rounding(w2.shape[0]) * ((2 * h_abs + np.where(stable, active * e1, e1)) @ np.abs(w2))
    gap += r2 + r2[rows, top][:, None]
    gap *= 1 + 2.0**-20  # the bound's own float64 arithmetic
    gap[rows, top] = 0
    finite &= np.isfinite(scores).all(axis=1)
    gap[~finite] = np.inf
    return scores, gap


def certified(scores, gap):
    """Per image: the first maximum of the scores is certainly the exact path's first maximum."""
    top = reference.argmax(scores)
    rows = np.arange(len(scores))
    margin = scores[rows, top][:, None].astype(np.float64) - scores - gap
    margin[rows, top] = np.inf
    return (margin > 0).all(axis=1)


def predict(x, model, style="componentwise", zero_bound=False, fc1="half"):
    """(labels, certified mask): the low-precision pass's answer where certified, the exact path's
    (float32 here) elsewhere. zero_bound trusts every low-precision answer: the tests' proof that
    the check matters."""
    scores, gap = half_pass(x, model, style, fc1)
    if zero_bound:
        gap = np.zeros_like(gap)
    sure = certified(scores, gap)
    labels = reference.argmax(scores)
    if not sure.all():  # the whole batch, as the exact path would run it: BLAS may sum a subset's rows otherwise
        labels[~sure] = reference.forward(np.asarray(x, np.float32), model)[~sure]
    return labels, sure


# The GPU's certificate (cuda/fused6.cu or fused4.cu, cuda/certify.cu) computes the bound above from float16
# sums rounded up; these are its constants, each rounded up to float32.
DSCALE_LOG2 = 12  # dp * 2^12 before float16: bounds down to 1.5e-8 stay normal, up to 16 finite


def up32(x):
    """float64 values as the float32 values at or above them."""
    x = np.asarray(x, np.float64)
    v = x.astype(np.float32)
    return np.where(v.astype(np.float64) < x, np.nextafter(v, np.float32(np.inf)), v).astype(np.float32)


def half_up(a):
    """Non-negative a rounded up to float16 (inf past its range)."""
    a = np.asarray(a, np.float32)
    with np.errstate(over="ignore"):
        h = a.astype(np.float16)
    low = h.astype(np.float64) < a
    h[low] = np.nextafter(h[low], np.float16(np.inf))
    return h


BOUND_LOG2 = 9  # conv2's bound columns scaled by 2^9 before float16: about 0.45-0.7 |w|, normal where w is


def conv2_bound_columns(w2):
    """conv2_weight_bound * 2^BOUND_LOG2 rounded up to float16, shaped as w2: the bound's B operand
    in fused_kernel4 and fused_kernel6 (the 64 columns beside the weights)."""
    b = conv2_weight_bound(w2) * 2.0**BOUND_LOG2
    with np.errstate(over="ignore"):
        return half_up(up32(b)).reshape(np.shape(w2))


def conv2_constants(w2):
    """fused_kernel4's and fused_kernel6's c_conv2_bound: [A1, BETA_N, G3Q, C[c] per output channel]
    (fused_kernel6 applies them per pool window: docs/certified.md). Per output it bounds
    conv2_gap by A1 S + C[c] + BETA_N amax, where S is the tensor cores' float32 sum of the bound
    columns times the float16 inputs (at least 1 - gamma_n of the exact sum, which is at least
    2^BOUND_LOG2 sum_k conv2_weight_bound |fl16(a)|) and amax the image's largest conv1 output (sum a
    <= n amax)."""
    n = w2[..., 0].size
    w = np.abs(np.asarray(w2, np.float32)).reshape(n, -1).astype(np.float64)
    chan = ((1 + exact_rounding(n)) * ETA16 + TINY) * w.sum(axis=0) + RESCALE
    # EXACT_ABS's terms are at most 2 n max|w| EXACT_ABS amax, and fused_kernel6's amax (p1's largest) at
    # most 4 (qmax + eta) / (1 - u): 2^-34 n max|w| covers both kernels' forms
    head = [2.0**-BOUND_LOG2 / (1 - gamma(n)), n * (TINY + 2.0**-34 * w.max()), gamma(3, U32) / 4]
    return up32(np.concatenate([head, chan]))


def fc_constants(fc1):
    """The certify kernels' c_fc_bound: [QS, MS, FR1, FR2, ALPHA2, KAPPA, ETA2H, DSCALE, HR, ETA1, E1C,
    MS4, ETAW]. q = dp
    |fc1| and m = |p| |fc1| come from float16 operands rounded up (dp scaled by DSCALE) summed by the
    tensor cores, so each is at most the sum over 1 - gamma_FEAT (QS, MS also undo the scale); FR1,
    FR2 are exact_rounding of fc1 and fc2. The product over the hidden units, fc1 diag(active) b with b
    fc2 (version 1) or fc2_t - fc2_c (version 2: the float32 difference, rounded to nearest again),
    both rounded to float16, is within ALPHA2 |fc1| |b| + KAPPA (|fc1| + |b|) + eta^2 (1 + gamma) of the
    exact product, per term: b's rounding u_d = u (1 + 2^-24) + 2^-24 covers both roundings.
    certify_kernel4 (and 5) computes z from float16 operands, its m from fl16(p) (p <= (1 + u) fl16(p) + eta):
    m = MS4 msum + ETAW bounds |p| |fc1|, and half_fc1_rounding's bound is at most HR m + ETA1 sum p +
    E1C, with the largest column sum of |fc1| for every hidden unit's."""
    feat, hidden = fc1.shape
    g_f, g_h = gamma(feat), gamma(hidden)
    u_d = U16 * (1 + U32) + U32
    w_max = float(np.abs(np.asarray(fc1, np.float64)).sum(axis=0).max())
    eta1 = (1 + g_f) * ETA16 * (1 + U16)
    return up32([2.0**-DSCALE_LOG2 / (1 - g_f), 1 / (1 - g_f), exact_rounding(feat), exact_rounding(hidden),
                 U16 + u_d + U16 * u_d + g_h * (1 + U16) * (1 + u_d), (1 + g_h) * (1 + U16) * (1 + u_d) * ETA16,
                 hidden * (1 + g_h) * ETA16 * ETA16, 2.0**DSCALE_LOG2,
                 2 * U16 + U16**2 + g_f * (1 + U16)**2, eta1, eta1 * w_max + (1 + g_f) * feat * ETA16**2,
                 (1 + U16) / (1 - g_f), ETA16 * w_max])
