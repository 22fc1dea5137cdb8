"""Error of the 3xTF32 product with each way of splitting the activations (CPU, a few seconds):
rounded (cvt.rna: part = rna(v), remainder = rna(v - part)) against truncated (the kernels' split():
part = trunc(v), as the tensor cores read v's own bits, remainder = rna(v - trunc(v))), the weights
split rounded as the host does. Each is compared with an FP32 dot product summed in order, all
against float64, relative to sum |a| |w|. Usage: python tools/split_error.py [N] [K]"""
import sys

import numpy as np


def as_float(b):
    return b.astype(np.uint32).view(np.float32)


def rna(x):
    return as_float((x.view(np.uint32).astype(np.uint64) + 0x1000) & 0xFFFFE000)


def trunc(x):
    return as_float(x.view(np.uint32) & np.uint32(0xFFFFE000))


def split_rounded(x):
    hi = rna(x)
    return hi, rna(x - hi)


def split_truncated(x):
    hi = trunc(x)
    return hi, rna(x - hi)


def main(n=2000, k=800, seed=0):
    rng = np.random.default_rng(seed)
    a = (rng.random((n, k)) * 2).astype(np.float32)  # activations: after ReLU and pooling, >= 0
    w = (rng.standard_normal(k) * 0.05).astype(np.float32)
    exact = a.astype(np.float64) @ w.astype(np.float64)
    scale = np.abs(a.astype(np.float64)) @ np.abs(w.astype(np.float64))
    acc = np.zeros(n, np.float32)
    for j in range(k):
        acc = acc + a[:, j] * w[j]  # float32 throughout, in order, as the reference's sums
    rows = [("FP32 dot product, summed in order", np.abs(acc - exact) / scale)]
    wh, wl = split_rounded(w)
    for name, split in (("3xTF32 products, activations split rounded", split_rounded),
                        ("3xTF32 products, activations split truncated (kernels)", split_truncated)):
        ah, al = (p.astype(np.float64) for p in split(a))
        rows.append((name, np.abs(al @ wh + ah @ wl + ah @ wh - exact) / scale))  # the products' sums exact
    print(f"{n} dot products of length {k}: relative error (median, max)")
    for name, err in rows:
        print(f"  {name:56} {np.median(err):.2e}  {err.max():.2e}")


if __name__ == "__main__":
    main(*map(int, sys.argv[1:3]))
