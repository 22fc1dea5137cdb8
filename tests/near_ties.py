"""Images whose top two classes nearly tie on the exact path: on the segment between two images
that the exact path puts in different classes, bisected to where the two classes' scores cross,
then stepped away on both sides by distances that leave top-2 margins from about 1e-8 up."""
import numpy as np

from infer import reference


def near_ties(x, model, pairs=4, steps=np.geomspace(1e-7, 1e-1, 7), seed=0):
    """(images float32 (M, H, W, C), the exact path's top-2 margin of each)."""
    rng = np.random.default_rng(seed)
    labels = reference.forward(x, model)
    out = []
    for _ in range(pairs):
        i = rng.integers(len(x))
        j = rng.choice(np.flatnonzero(labels != labels[i]))
        a, b = x[i].astype(np.float64), x[j].astype(np.float64)
        point = lambda t: (a + t * (b - a)).astype(np.float32)[None]  # noqa: E731
        lo, hi = 0.0, 1.0  # the label at lo is labels[i]'s, at hi another's
        for _ in range(60):
            mid = (lo + hi) / 2
            if reference.forward(point(mid), model)[0] == labels[i]:
                lo = mid
            else:
                hi = mid
        out += [point(t)[0] for t in [lo, hi] + [t for d in steps for t in (lo - d, hi + d)]]
    images = np.stack(out)
    s = np.sort(reference.scores(images, model), axis=1)
    return images, s[:, -1] - s[:, -2]
