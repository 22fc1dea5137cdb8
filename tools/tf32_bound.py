"""Issue 11's idea, measured on the CPU: compute conv2 in 1xTF32, bound each image's score error
provably, recompute only the images whose top-two margin lies inside the bound. How many would
need recomputing?

The bound (worst case, per output): conv2 |err| <= rho * sum_k |w_k| a_k with rho = 2u + u^2 plus
the accumulation terms (u = 2^-11, TF32 rounding of both operands; FP32 sums on both sides), through
ReLU (1-Lipschitz) and the average pool, then |fc1| and |fc2| (plus their own FP32 rounding).
Usage: python tools/tf32_bound.py [DATA.hdf5 MODEL.hdf5]   (default: ../shared's testfull and model)
"""
import sys
from pathlib import Path

import h5py
import numpy as np

from infer import reference as R
from infer.gpu.pipelines import tf32


def main(data, model):
    with h5py.File(model) as m:
        w1, w2, f1, f2 = (m[k][...] for k in ("conv1", "conv2", "fc1", "fc2"))
    with h5py.File(data) as f:
        x = f["x"][...]
    n, k2, c2 = len(x), w2.shape[0], w2.shape[3]
    a1 = R.avgpool2(R.relu(R.conv2d(x, w1)))
    z = R.unroll(a1, k2).astype(np.float64)
    w = w2.reshape(-1, c2).astype(np.float64)
    exact = R.conv2d(a1, w2)
    approx = (tf32(z.astype(np.float32)).astype(np.float64) @ tf32(w2.reshape(-1, c2))).astype(np.float32).reshape(exact.shape)

    def tail(c):
        a2 = R.flatten(R.avgpool2(R.relu(c)))
        h = R.relu(R.fc(a2, f1))
        return R.fc(h, f2), a2, h

    s_ref, _, _ = tail(exact)
    s_tf32, a2, h = tail(approx)
    u, kk = 2.0**-11, z.shape[1]
    rho = 2 * u + u * u + (kk + 1) * (2.0**-22 + 2.0**-24)  # TF32 operands; tensor-core and FP32 sums
    bound2 = (rho * (z @ np.abs(w))).reshape(exact.shape).astype(np.float32)
    e2 = R.flatten(R.avgpool2(bound2)).astype(np.float64)
    eh = e2 @ np.abs(f1) + 2 * (len(f1) + 1) * 2.0**-24 * (a2.astype(np.float64) @ np.abs(f1))
    es = (eh @ np.abs(f2) + 2 * (len(f2) + 1) * 2.0**-24 * (h.astype(np.float64) @ np.abs(f2))).max(axis=1)
    top = np.sort(s_tf32, axis=1)
    margin = top[:, -1] - top[:, -2]
    actual = np.abs(s_tf32 - s_ref).max(axis=1)
    print(f"{n} images; 1xTF32 conv2 changes {np.count_nonzero(R.argmax(s_tf32) != R.argmax(s_ref))} predictions")
    print(f"actual score error: max {actual.max():.2e}, median {np.median(actual):.2e}")
    print(f"provable bound: median {np.median(es):.3g}, {np.median(es / np.maximum(actual, 1e-30)):.0f}x the actual error "
          f"(never below it: {np.count_nonzero(es < actual)} exceptions)")
    print(f"top-two margin: median {np.median(margin):.3g}; inside twice the bound (recompute): "
          f"{np.count_nonzero(margin <= 2 * es)} of {n}")


if __name__ == "__main__":
    shared = Path(__file__).resolve().parents[2] / "shared" / "data" / "ece408"
    main(*(sys.argv[1:3] or (shared / "testfull.hdf5", shared / "model.hdf5")))
