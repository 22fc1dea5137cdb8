"""The fixed network's geometry: every layer size, derived from the model's and the data's shapes.

conv KxK (C -> C1) -> ReLU -> 2x2 average pool -> conv KxK (C1 -> C2) -> ReLU -> 2x2 average pool
-> flatten (h, w, c) -> fc (F -> hidden) -> ReLU -> fc (hidden -> classes) -> argmax.
Convolutions are valid (no padding, stride 1); pooling floors odd sizes.
"""
from dataclasses import dataclass

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
