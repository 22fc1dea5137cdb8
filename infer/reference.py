"""The float32 NumPy reference: one function per layer, the single source of truth.

Layouts: activations NHWC float32; conv weights (K, K, C_in, C_out); fc weights (in, out).
The CPU backend runs these layers chunk by chunk; every GPU kernel is tested against them.
"""
import numpy as np
from numpy.lib.stride_tricks import as_strided

MIN_AGREEMENT = 0.9995  # share of predictions a GPU run must share with the reference (--check)


def unroll(x, k):
    """im2col: (N, H, W, C) -> (N*Ho*Wo, K*K*C), each row one output pixel's window in (kh, kw, c) order."""
    x = np.ascontiguousarray(x)
    n, h, w, c = x.shape
    ho, wo = h - k + 1, w - k + 1
    sn, sh, sw, _ = x.strides
    # One window row (kh fixed) is K*C contiguous floats in NHWC, so the view's last axis is dense.
    windows = as_strided(x, (n, ho, wo, k, k * c), (sn, sh, sw, sh, x.itemsize), writeable=False)
    return windows.reshape(n * ho * wo, k * k * c)


def conv2d(x, weights):
    """Valid convolution, stride 1: (N, H, W, C) x (K, K, C, M) -> (N, H-K+1, W-K+1, M)."""
    n, h, w, _ = x.shape
    k, _, c, m = weights.shape
    out = unroll(x, k) @ weights.reshape(k * k * c, m)
    return out.reshape(n, h - k + 1, w - k + 1, m)


def relu(x):
    return np.maximum(x, np.float32(0))


def avgpool2(x):
    """2x2 average pool, stride 2, odd sizes floored: ((a + b) + c) + d, times 0.25 (exact)."""
    n, h, w, c = x.shape
    q = x[:, : h // 2 * 2, : w // 2 * 2].reshape(n, h // 2, 2, w // 2, 2, c)
    return (((q[:, :, 0, :, 0] + q[:, :, 0, :, 1]) + q[:, :, 1, :, 0]) + q[:, :, 1, :, 1]) * np.float32(0.25)


def flatten(x):
    """(N, H, W, C) -> (N, H*W*C) in (h, w, c) order."""
    return x.reshape(len(x), -1)


def fc(x, weights):
    """(N, in) x (in, out) -> (N, out)."""
    return x @ weights


def argmax(scores):
    """The first index of each row's maximum."""
    return np.argmax(scores, axis=1)


def scores(x, model):
    """The whole network up to the last fc: (N, H, W, C) -> (N, classes) float32."""
    a = avgpool2(relu(conv2d(x, model.conv1)))
    a = avgpool2(relu(conv2d(a, model.conv2)))
    return fc(relu(fc(flatten(a), model.fc1)), model.fc2)


def forward(x, model):
    """Predicted class of each image."""
    return argmax(scores(x, model))
