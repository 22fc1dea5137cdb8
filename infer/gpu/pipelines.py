"""The network on the GPU, one class per algorithm; ALGORITHMS feeds --conv-algo and the tests.

Each pipeline uploads the weights once (upload), says how much scratch memory a chunk of images
needs (scratch_floats), and enqueues one chunk on a stream: images in, labels (int32) out, and
the chunk-relative index of its first image with non-finite scores atomically min'ed into
*overflow.
"""
from . import launch


class Scratch:
    """Named float32 regions carved out of one device allocation."""

    def __init__(self, base, layout):
        self.ptr = {}
        offset = 0
        for name, floats in layout:
            self.ptr[name] = base + offset
            offset += 4 * ((floats + 63) // 64 * 64)  # 256-byte alignment for float4 access

    @staticmethod
    def floats(layout):
        return sum((f + 63) // 64 * 64 for _, f in layout)


class Unroll:
    """The 2016 course pipeline: per conv layer unroll -> tiled GEMM (+ReLU) -> placeIntoY -> pool;
    both fcs through the same tiled GEMM (ReLU on fc1), then argmax."""

    def __init__(self, build, g):
        self.g = g
        self.unroll, self.gemm = launch.Unroll(build), launch.Gemm(build)
        self.place, self.pool, self.argmax = launch.Place(build), launch.Pool(build), launch.Argmax(build)

    @staticmethod
    def available(g):
        return None

    def upload(self, model, to_device):
        # Weights re-laid once for the GEMM: (K, K, C, M) -> (M, K*K*C), rows in the unroll's order.
        self.w1 = to_device(model.conv1.reshape(-1, self.g.c1).T)
        self.w2 = to_device(model.conv2.reshape(-1, self.g.c2).T)
        self.fc1, self.fc2 = to_device(model.fc1), to_device(model.fc2)

    def _layout(self, chunk):
        g = self.g
        (h1, w1), (p1h, p1w), (h2, w2) = g.conv1_out, g.pool1_out, g.conv2_out
        return [("u1", g.k1 * g.k1 * g.c * chunk * h1 * w1), ("y1", g.c1 * chunk * h1 * w1), ("a1", chunk * h1 * w1 * g.c1),
                ("p1", chunk * p1h * p1w * g.c1), ("u2", g.k2 * g.k2 * g.c1 * chunk * h2 * w2),
                ("y2", g.c2 * chunk * h2 * w2), ("a2", chunk * h2 * w2 * g.c2), ("feat", chunk * g.flat),
                ("hid", chunk * g.hidden), ("scores", chunk * g.classes)]

    def scratch_floats(self, chunk):
        return Scratch.floats(self._layout(chunk))

    def enqueue(self, stream, x, n, labels, scratch_base, overflow):
        g, s = self.g, Scratch(scratch_base, self._layout(n)).ptr
        (h1, w1), (p1h, p1w), (h2, w2) = g.conv1_out, g.pool1_out, g.conv2_out
        self.unroll(stream, x, s["u1"], n, g.h, g.w, g.c, g.k1)
        self.gemm(stream, self.w1, s["u1"], s["y1"], g.c1, n * h1 * w1, g.k1 * g.k1 * g.c, True)
        self.place(stream, s["y1"], s["a1"], g.c1, n * h1 * w1)
        self.pool(stream, s["a1"], s["p1"], n, h1, w1, g.c1)
        self.unroll(stream, s["p1"], s["u2"], n, p1h, p1w, g.c1, g.k2)
        self.gemm(stream, self.w2, s["u2"], s["y2"], g.c2, n * h2 * w2, g.k2 * g.k2 * g.c1, True)
        self.place(stream, s["y2"], s["a2"], g.c2, n * h2 * w2)
        self.pool(stream, s["a2"], s["feat"], n, h2, w2, g.c2)
        self.gemm(stream, s["feat"], self.fc1, s["hid"], n, g.hidden, g.flat, True)
        self.gemm(stream, s["hid"], self.fc2, s["scores"], n, g.classes, g.hidden, False)
        self.argmax(stream, s["scores"], labels, n, g.classes, overflow)


class Fused:
    """conv1 -> pool -> conv2 -> pool in one implicit-GEMM kernel per group of images (intermediates
    in shared memory), then fc1 -> ReLU -> fc2 -> argmax in one kernel."""

    def __init__(self, build, g):
        self.g = g
        self.convs = launch.Fused(build, g)
        self.fcs = launch.FullyConnected(build, g)

    @staticmethod
    def available(g):
        """None when the fused kernels can run geometry g, else why not."""
        try:
            launch.Fused.defines(g)
            launch.FullyConnected.defines(g)
        except ValueError as e:
            return str(e)
        return None

    def upload(self, model, to_device):
        import pycuda.driver as cuda

        cuda.memcpy_htod(self.convs.conv1_constant, launch.as_f32(model.conv1))
        self.w2 = to_device(model.conv2)
        self.fc1, self.fc2 = to_device(model.fc1), to_device(model.fc2)

    def scratch_floats(self, chunk):
        return Scratch.floats([("feat", chunk * self.g.flat)])

    def enqueue(self, stream, x, n, labels, scratch_base, overflow):
        self.convs(stream, x, self.w2, scratch_base, n)
        self.fcs(stream, scratch_base, self.fc1, self.fc2, labels, n, overflow)


ALGORITHMS = {"fused": Fused, "unroll": Unroll}
DEFAULT = "fused"
DEFAULT_CHUNK = {"fused": 2048, "unroll": 256}
