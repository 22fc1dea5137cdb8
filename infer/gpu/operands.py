"""Weights split and laid out once by the host for the tensor-core kernels (3xTF32: every FP32 value
as its TF32 part plus a TF32 remainder; float16 parts of scaled weights for products with 8-bit
codes)."""
import numpy as np


def tf32(a):
    """a rounded to TF32 (10 mantissa bits; to nearest, ties away from zero), as float32."""
    bits = np.ascontiguousarray(a, np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def wgmma_operand(w):
    """(S, K, N) weights (K a multiple of 8) split into TF32 parts and remainders and laid out as
    wgmma's K-major core matrices (8 rows of N x 4 k, 16 bytes a row) for each k8 step: (S, K/8,
    [parts, remainders], N/8, 2 halves of k, 8, 4)."""
    s, k, n = w.shape
    hi = tf32(w)
    parts = np.stack([hi, tf32(w - hi)]).reshape(2, s, k // 8, 2, 4, n // 8, 8)  # k = 8 ks + 4 half + kk, n = 8 ni + r
    return np.ascontiguousarray(parts.transpose(1, 2, 0, 5, 3, 6, 4))


def wgmma_column_blocks(w, bn, bk=16):
    """(K, N) weights zero-padded to whole k-tiles of bk and whole column blocks of bn, in wgmma's
    layout per column block: (N / bn, KP / 8, 2, bn / 8, 2, 8, 4), KP = K rounded up to bk."""
    k, n = w.shape
    kp, np_ = -(-k // bk) * bk, -(-n // bn) * bn
    padded = np.zeros((kp, np_), np.float32)
    padded[:k, :n] = w
    return wgmma_operand(np.ascontiguousarray(padded.reshape(kp, np_ // bn, bn).transpose(1, 0, 2)))


def wgmma_halves(w):
    """(S, K, N) float16 values (K a multiple of 16, N of 8) as wgmma's K-major core matrices (8 rows
    of N x 8 k, 16 bytes a row) for each k16 step: (S, K/16, N/8, 2 halves of k, 8, 8)."""
    s, k, n = w.shape
    parts = np.asarray(w, np.float16).reshape(s, k // 16, 2, 8, n // 8, 8)  # k = 16 ks + 8 half + kk, n = 8 ni + r
    return np.ascontiguousarray(parts.transpose(0, 1, 4, 2, 5, 3))


def scaled_halves(w):
    """(K, N) float32 weights as each column's scale 2^S (its largest |w| 2^S in [2^14, 2^15], so an
    8-bit code times either part is exact in float32; S within [-113, 118], so 2^-S / 255 stays
    normal; 0 for a zero column) and float16 parts hi = fl16(w 2^S), lo = fl16(w 2^S - hi): (hi, lo,
    2^-S as float32). hi + lo is w 2^S within 2^-22 of it (lo within 2^-25 of float16's subnormals)."""
    w = np.asarray(w, np.float64)
    _, e = np.frexp(np.abs(w).max(axis=0))  # largest |w| in [2^(e - 1), 2^e)
    s = np.where(np.abs(w).max(axis=0) > 0, np.clip(15 - e, -113, 118), 0)
    scaled = w * np.exp2(s)
    hi = scaled.astype(np.float16)
    return hi, (scaled - hi).astype(np.float16), np.exp2(-s).astype(np.float32)
