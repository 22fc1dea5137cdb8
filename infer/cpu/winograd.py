"""Winograd's F(2x2, 5x5) for the CPU path's 5x5 convolutions (cpu_net.c's conv_winograd): a 2x2
block of outputs, one 2x2 pool window, from a 6x6 block of inputs in 36 products per channel pair
instead of 100. Points 0, 1, -1, 2, -2 and infinity (Lavin and Gray's construction); with those,
B^T and A^T have small integer entries, and the 1/f factors all sit in G.

    y = A^T [(G g G^T) * (B^T d B)] A      for one (input, output) channel pair

cpu_net.c applies B^T and A^T with these coefficients written out; G is applied here, once per
model, in float64 and rounded to float32 (the weights' own rounding, as the direct path has none:
~1/4 ulp more error per product). In a float32 NumPy emulation of this path, testfull's pooled
conv2 outputs are within 5.8e-6 of exact arithmetic against the direct float32 sums' 1.2e-6 (their
largest: 3.7), against a smallest top-2 margin of 7.8e-5; cpu_net.c's 10,000 labels are the
reference's (docs/performance.md)."""
import numpy as np

K = 5  # the kernel size it serves
TILE = K + 1  # the input block per 2x2 output block

BT = np.array([[4, 0, -5, 0, 1, 0],
               [0, -4, -4, 1, 1, 0],
               [0, 4, -4, -1, 1, 0],
               [0, -2, -1, 2, 1, 0],
               [0, 2, -1, -2, 1, 0],
               [0, 4, 0, -5, 0, 1]], np.float64)
G = np.array([[1 / 4, 0, 0, 0, 0],
              [-1 / 6, -1 / 6, -1 / 6, -1 / 6, -1 / 6],
              [-1 / 6, 1 / 6, -1 / 6, 1 / 6, -1 / 6],
              [1 / 24, 1 / 12, 1 / 6, 1 / 3, 2 / 3],
              [1 / 24, -1 / 12, 1 / 6, -1 / 3, 2 / 3],
              [0, 0, 0, 0, 1]], np.float64)
AT = np.array([[1, 1, 1, 1, 1, 0],
               [0, 1, -1, 2, -2, 1]], np.float64)


def weights(w):
    """(K, K, C, M) conv weights -> (36, C, M) float32: G w G^T for each channel pair, the 6x6
    position (a, b) at row 6a + b."""
    assert w.shape[:2] == (K, K)
    u = np.einsum("ak,klcm,bl->abcm", G, w.astype(np.float64), G)
    return np.ascontiguousarray(u.reshape(TILE * TILE, *w.shape[2:]), dtype=np.float32)
