"""The fixed network's geometry: every layer size, derived from the model's and the data's shapes.

conv KxK (C -> C1) -> ReLU -> 2x2 average pool -> conv KxK (C1 -> C2) -> ReLU -> 2x2 average pool
-> flatten (h, w, c) -> fc (F -> hidden) -> ReLU -> fc (hidden -> classes) -> argmax.
Convolutions are valid (no padding, stride 1); pooling floors odd sizes.
"""
from dataclasses import dataclass

from .errors import InputError, where

# Shape limits checked before anything is read, so a file declaring absurd sizes is refused
# without allocating: far above this network's real sizes, far below what would exhaust memory.
MAX_KERNEL = 64
MAX_CHANNELS = 4096
MAX_SIDE = 4096
MAX_WEIGHT_ELEMENTS = 1 << 28


@dataclass(frozen=True)
class Geometry:
    h: int
    w: int
    c: int
    k1: int
    c1: int
    k2: int
    c2: int
    hidden: int
    classes: int

    @property
    def conv1_out(self):
        return self.h - self.k1 + 1, self.w - self.k1 + 1

    @property
    def pool1_out(self):
        h, w = self.conv1_out
        return h // 2, w // 2

    @property
    def conv2_out(self):
        h, w = self.pool1_out
        return h - self.k2 + 1, w - self.k2 + 1

    @property
    def pool2_out(self):
        h, w = self.conv2_out
        return h // 2, w // 2

    @property
    def flat(self):
        h, w = self.pool2_out
        return h * w * self.c2

    @property
    def flops_per_image(self):
        """Multiply-adds counted as two FLOPs (pooling, ReLU and argmax left out)."""
        h1, w1 = self.conv1_out
        h2, w2 = self.conv2_out
        return 2 * (h1 * w1 * self.c1 * self.k1 * self.k1 * self.c
                    + h2 * w2 * self.c2 * self.k2 * self.k2 * self.c1
                    + self.flat * self.hidden + self.hidden * self.classes)


def geometry(model, x_shape, path="data", dataset="x"):
    """The network's layer sizes for images of `x_shape` (N, H, W, C), checked to fit the model;
    messages name `path` and `dataset` (None: a request body, no dataset)."""
    _, h, w, c = x_shape
    k1, _, cin, c1 = model.conv1.shape
    k2, _, _, c2 = model.conv2.shape
    g = Geometry(h=h, w=w, c=c, k1=k1, c1=c1, k2=k2, c2=c2,
                 hidden=model.fc1.shape[1], classes=model.fc2.shape[1])
    if h > MAX_SIDE or w > MAX_SIDE:
        raise InputError(f"{where(path, dataset)}: images of {h}x{w} are larger than cnninfer supports ({MAX_SIDE})")
    if c != cin:
        raise InputError(f"{where(path, dataset)}: images have {c} channels but the model's conv1 takes {cin}")
    p1 = g.pool1_out
    p2 = g.pool2_out
    if min(g.conv1_out) < 2 or min(p1) < k2 or min(p2) < 1:
        raise InputError(f"{where(path, dataset)}: images of {h}x{w} are too small for the model's "
                         f"{k1}x{k1} and {k2}x{k2} convolutions with 2x2 pooling")
    if g.flat != model.fc1.shape[0]:
        raise InputError(f"{where(path, dataset)}: images of {h}x{w} flatten to {p2[0]}x{p2[1]}x{c2} = {g.flat} "
                         f"values before fc1, but the model's fc1 takes {model.fc1.shape[0]}")
    return g


def image_shape(model):
    """The (H, W, C) a model takes: C from conv1; H and W those of the model's training data,
    square, found from fc1's inputs (MNIST: 28)."""
    k1, _, c, _ = model.conv1.shape
    k2, _, _, c2 = model.conv2.shape
    for side in range(k1 + 2, 1025):
        p2 = ((side - k1 + 1) // 2 - k2 + 1) // 2
        if p2 >= 1 and p2 * p2 * c2 == model.fc1.shape[0]:
            return side, side, c
    raise InputError(f"{model.path}: no square image size fits its fc1 ({model.fc1.shape[0]} inputs)")
