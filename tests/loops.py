"""Plain-loop float64 versions of each layer: slow, obvious, and the check on infer.reference."""
import numpy as np


def conv2d(x, w):
    n, h, wd, c = x.shape
    k, _, _, m = w.shape
    out = np.zeros((n, h - k + 1, wd - k + 1, m))
    for i in range(n):
        for oh in range(h - k + 1):
            for ow in range(wd - k + 1):
                for o in range(m):
                    s = 0.0
                    for kh in range(k):
                        for kw in range(k):
                            for ci in range(c):
                                s += float(x[i, oh + kh, ow + kw, ci]) * float(w[kh, kw, ci, o])
                    out[i, oh, ow, o] = s
    return out


def relu(x):
    out = np.array(x, np.float64)
    for idx in np.ndindex(out.shape):
        out[idx] = max(out[idx], 0.0)
    return out


def avgpool2(x):
    n, h, w, c = x.shape
    out = np.zeros((n, h // 2, w // 2, c))
    for i, oh, ow, ch in np.ndindex(out.shape):
        out[i, oh, ow, ch] = sum(float(x[i, 2 * oh + a, 2 * ow + b, ch]) for a in (0, 1) for b in (0, 1)) / 4
    return out


def flatten(x):
    n, h, w, c = x.shape
    out = np.zeros((n, h * w * c))
    for i, a, b, ch in np.ndindex(x.shape):
        out[i, (a * w + b) * c + ch] = x[i, a, b, ch]
    return out


def fc(x, w):
    n, fin = x.shape
    out = np.zeros((n, w.shape[1]))
    for i in range(n):
        for o in range(w.shape[1]):
            out[i, o] = sum(float(x[i, j]) * float(w[j, o]) for j in range(fin))
    return out


def argmax(scores):
    out = []
    for row in scores:
        best = 0
        for j in range(1, len(row)):
            if row[j] > row[best]:
                best = j
        out.append(best)
    return np.array(out)
