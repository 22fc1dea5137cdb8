"""The network on the GPU, one class per algorithm; ALGORITHMS feeds --conv-algo and the tests.

Each pipeline uploads the weights once (upload), says how much scratch memory a chunk of images
needs (scratch_floats), and enqueues one chunk on a stream: images in, labels (int32) out (and the
class scores, float32, where a scores pointer is given), and the chunk-relative index of its
first image with non-finite scores atomically min'ed into *overflow.
"""
import numpy as np

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


class Algorithm:
    """What every pipeline says before it is built: whether it runs on a GPU architecture, and on a
    geometry there (available: None, or why not)."""
    MIN_ARCH = 0

    @classmethod
    def runs_on(cls, arch):
        """None when the algorithm's kernels run on GPU architecture arch (sm_XY), else why not."""
        if int(arch[3:]) < cls.MIN_ARCH:
            return f"it needs sm_{cls.MIN_ARCH} or later, this GPU is {arch}"
        return None

    @classmethod
    def available(cls, g, arch):
        return cls.runs_on(arch)


def classify(stream, pipeline, s, n, labels, overflow, scores):
    """fc1 -> ReLU -> fc2 through the pipeline's gemm_fc, then argmax: scratch s has feat, hid and
    scores; the scores are copied out where a pointer is given."""
    g = pipeline.g
    pipeline.gemm_fc(stream, s["feat"], pipeline.fc1, s["hid"], n, g.hidden, g.flat, True)
    pipeline.gemm_fc(stream, s["hid"], pipeline.fc2, s["scores"], n, g.classes, g.hidden, False)
    pipeline.argmax(stream, s["scores"], labels, n, g.classes, overflow)
    if scores:
        import pycuda.driver as cuda

        cuda.memcpy_dtod_async(scores, s["scores"], 4 * n * g.classes, stream)


class Unroll(Algorithm):
    """The 2016 course pipeline: per conv layer unroll -> GEMM (+ReLU) -> placeIntoY -> pool; both
    fcs through the same GEMM (ReLU on fc1), then argmax. The GEMM is --gemm-algo's (the 3xTF32
    tensor-core one where the GPU has them), its block tile --tile-width's or sized to the layer."""
    NAME = "unroll"
    MAX_CHUNK = 2048

    def __init__(self, build, g):
        self.g = g
        self.gemm_name, version = launch.gemm_choice(build.gemm, build.tile_width, build.arch)
        tile = build.tile_width
        self.gemm1 = launch.Gemm(build, version, tile, rows=g.c1)
        self.gemm2 = launch.Gemm(build, version, tile, rows=g.c2)
        self.gemm_fc = launch.Gemm(build, version, tile, rows=self.MAX_CHUNK)
        self.unroll, self.place = launch.Unroll(build), launch.Place(build)
        self.pool, self.argmax = launch.Pool(build), launch.Argmax(build)
        # Chunks small enough that the larger unrolled matrix stays in half the L2 cache between the
        # unroll that writes it and the GEMM that reads it, unless conv2's GEMM would then have too
        # few blocks to fill the GPU (two per SM): filling the GPU matters more.
        (h1, w1), (h2, w2) = g.conv1_out, g.conv2_out
        unrolled = 4 * max(g.k1 * g.k1 * g.c * h1 * w1, g.k2 * g.k2 * g.c1 * h2 * w2)
        in_l2 = build.l2_bytes // 2 // unrolled
        row_blocks = -(-g.c2 // self.gemm2.tile)
        filled = -(-2 * build.sms * launch.Gemm.BN // (h2 * w2 * row_blocks))
        self.CHUNK = max(16, min(self.MAX_CHUNK, max(in_l2, filled)))

    @property
    def describe(self):
        tiles = sorted({self.gemm1.tile, self.gemm2.tile, self.gemm_fc.tile})
        return f"{self.gemm_name} GEMM, tile {'/'.join(map(str, tiles))}"

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

    def enqueue(self, stream, x, n, labels, scratch_base, overflow, scores=0):
        g, s = self.g, Scratch(scratch_base, self._layout(n)).ptr
        (h1, w1), (p1h, p1w), (h2, w2) = g.conv1_out, g.pool1_out, g.conv2_out
        self.unroll(stream, x, s["u1"], n, g.h, g.w, g.c, g.k1)
        self.gemm1(stream, self.w1, s["u1"], s["y1"], g.c1, n * h1 * w1, g.k1 * g.k1 * g.c, True)
        self.place(stream, s["y1"], s["a1"], g.c1, n * h1 * w1)
        self.pool(stream, s["a1"], s["p1"], n, h1, w1, g.c1)
        self.unroll(stream, s["p1"], s["u2"], n, p1h, p1w, g.c1, g.k2)
        self.gemm2(stream, self.w2, s["u2"], s["y2"], g.c2, n * h2 * w2, g.k2 * g.k2 * g.c1, True)
        self.place(stream, s["y2"], s["a2"], g.c2, n * h2 * w2)
        self.pool(stream, s["a2"], s["feat"], n, h2, w2, g.c2)
        classify(stream, self, s, n, labels, overflow, scores)


class Implicit(Algorithm):
    """Each conv layer -> ReLU -> pool as one implicit-GEMM kernel on the tensor cores in 3xTF32,
    for any geometry (the pooled conv1 output goes through global memory, L2-resident per chunk);
    then fc1 -> ReLU -> fc2 -> argmax in one kernel where it fits the hidden size, else two 3xTF32
    GEMMs and argmax."""
    NAME = "implicit-tc"
    MIN_ARCH = 80
    SCRATCH_BYTES = 64 << 20  # per stream: sets the chunk for large images
    CONV_VERSION = 1

    def __init__(self, build, g):
        self.g = g
        (p1h, p1w) = g.pool1_out
        self.conv1 = launch.Conv(build, g.h, g.w, g.c, g.k1, g.c1, self.CONV_VERSION)
        self.conv2 = launch.Conv(build, p1h, p1w, g.c1, g.k2, g.c2, self.CONV_VERSION)
        try:
            self.fcs = launch.FullyConnected(build, g)
        except ValueError:
            self.fcs = None
            self.gemm_fc = launch.Gemm(build, 3, rows=2048)
            self.argmax = launch.Argmax(build)
        per_image = 4 * (p1h * p1w * g.c1 + g.flat + g.hidden + g.classes)
        self.CHUNK = max(1, min(2048, self.SCRATCH_BYTES // per_image, (2**31 - 1) // (g.h * g.w * g.c)))

    @staticmethod
    def conv_weights(weights, bn):
        return weights  # (K, K, C, M) is the (K*K*C, M) B operand as it is

    def upload(self, model, to_device):
        self.w1 = to_device(self.conv_weights(model.conv1, self.conv1.bn))
        self.w2 = to_device(self.conv_weights(model.conv2, self.conv2.bn))
        self.fc1, self.fc2 = to_device(model.fc1), to_device(model.fc2)

    def _layout(self, chunk):
        g = self.g
        p1h, p1w = g.pool1_out
        if self.fcs is not None:
            return [("p1", chunk * p1h * p1w * g.c1), ("feat", chunk * g.flat), ("partial", self.fcs.partial_floats(chunk))]
        return [("p1", chunk * p1h * p1w * g.c1), ("feat", chunk * g.flat), ("hid", chunk * g.hidden),
                ("scores", chunk * g.classes)]

    def scratch_floats(self, chunk):
        return Scratch.floats(self._layout(chunk))

    def enqueue(self, stream, x, n, labels, scratch_base, overflow, scores=0):
        s = Scratch(scratch_base, self._layout(n)).ptr
        self.conv1(stream, x, self.w1, s["p1"], n)
        self.conv2(stream, s["p1"], self.w2, s["feat"], n)
        if self.fcs is not None:
            self.fcs(stream, s["feat"], self.fc1, self.fc2, labels, n, overflow, scores, s["partial"])
        else:
            classify(stream, self, s, n, labels, overflow, scores)


class Fused(Algorithm):
    """conv1 -> pool -> conv2 -> pool in one implicit-GEMM kernel per group of images (intermediates
    in shared memory, FP32 FFMA), then fc1 -> ReLU -> fc2 -> argmax in one kernel."""
    NAME = "fused"
    CHUNK = 2048  # in memory: chunks on 4 streams hide the upload of one behind the kernels of others
    STREAM_CHUNK = 8192  # streamed: a whole block per launch, 3x fewer launches for the host to make
    VERSION = 1

    def __init__(self, build, g):
        self.g = g
        self.convs = launch.Fused(build, g, self.VERSION)
        self.fcs = launch.FullyConnected(build, g)

    @classmethod
    def available(cls, g, arch):
        """None when the fused kernels can run geometry g on GPU architecture arch, else why not."""
        why = cls.runs_on(arch)
        if why:
            return why
        try:
            launch.Fused.defines(g, cls.VERSION)
            launch.FullyConnected.defines(g)
        except ValueError as e:
            return str(e)
        return None

    @staticmethod
    def conv1_weights(conv1):
        return np.ascontiguousarray(conv1, np.float32)

    @staticmethod
    def conv2_weights(conv2):
        return conv2

    def upload(self, model, to_device):
        import pycuda.driver as cuda

        cuda.memcpy_htod(self.convs.conv1_constant, self.conv1_weights(model.conv1))
        self.w2 = to_device(self.conv2_weights(model.conv2))
        self.fc1, self.fc2 = to_device(model.fc1), to_device(model.fc2)

    def _layout(self, chunk):
        return [("feat", chunk * self.g.flat), ("partial", self.fcs.partial_floats(chunk))]

    def scratch_floats(self, chunk):
        return Scratch.floats(self._layout(chunk))

    def enqueue(self, stream, x, n, labels, scratch_base, overflow, scores=0):
        s = Scratch(scratch_base, self._layout(n)).ptr
        self.convs(stream, x, self.w2, s["feat"], n)
        self.fcs(stream, s["feat"], self.fc1, self.fc2, labels, n, overflow, scores, s["partial"])


def tf32(a):
    """a rounded to TF32 (10 mantissa bits; to nearest, ties away from zero), as float32."""
    bits = np.ascontiguousarray(a, np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


class FusedTensorCores(Fused):
    """Fused with conv2 on the tensor cores in 3xTF32: operands split into a TF32 part and a TF32
    remainder, three products each, FP32-level accuracy."""
    NAME = "fused-tc"
    VERSION = 2
    MIN_ARCH = 80

    @staticmethod
    def conv2_weights(conv2):
        """(K2, K2, C1, C2) split into TF32 parts and remainders and laid out in mma fragment order:
        (K2*K2, C1/8, C2/8, 32 lanes, [part k, part k+4, remainder k, remainder k+4]) with k = 8*ks +
        lane % 4 and channel 8*nt + lane / 4, as the B operand of mma.m16n8k8 wants them."""
        k2, _, c1, c2 = conv2.shape
        w = conv2.reshape(k2 * k2, c1, c2)
        hi = tf32(w)
        lo = tf32(w - hi)
        lane = np.arange(32)
        k = np.arange(c1 // 8)[:, None, None] * 8 + lane % 4
        n = np.arange(c2 // 8)[None, :, None] * 8 + lane // 4
        return np.stack([hi[:, k, n], hi[:, k + 4, n], lo[:, k, n], lo[:, k + 4, n]], axis=-1)


def wgmma_operand(w):
    """(S, K, N) weights (K a multiple of 8) split into TF32 parts and remainders and laid out as
    wgmma's K-major core matrices (8 rows of N x 4 k, 16 bytes a row) for each k8 step: (S, K/8,
    [parts, remainders], N/8, 2 halves of k, 8, 4)."""
    s, k, n = w.shape
    hi = tf32(w)
    parts = np.stack([hi, tf32(w - hi)]).reshape(2, s, k // 8, 2, 4, n // 8, 8)  # k = 8 ks + 4 half + kk, n = 8 ni + r
    return np.ascontiguousarray(parts.transpose(1, 2, 0, 5, 3, 6, 4))


class Hopper:
    """Mixed into the algorithms whose kernels use sm_90a instructions (wgmma): not in later GPUs."""

    @classmethod
    def runs_on(cls, arch):
        return None if arch == "sm_90" else f"it needs a Hopper GPU (sm_90), this GPU is {arch}"


class FusedWarpgroup(Hopper, FusedTensorCores):
    """Both convs on Hopper's warpgroup MMA (wgmma) in 3xTF32, the weights read by the tensor cores
    from shared memory; sm_90 only."""
    NAME = "fused-wgmma"
    VERSION = 3

    @staticmethod
    def conv1_weights(conv1):
        """(K1, K1, C, C1) as one slab of K1*K1*C rows, zero-padded to a multiple of 8, in wgmma order."""
        k1, _, c, c1 = conv1.shape
        w = np.zeros((1, -(-k1 * k1 * c // 8) * 8, c1), np.float32)
        w[0, : k1 * k1 * c] = conv1.reshape(-1, c1)
        return wgmma_operand(w)

    @staticmethod
    def conv2_weights(conv2):
        """(K2, K2, C1, C2) as K2*K2 slabs of C1 rows in wgmma order: (K2*K2, C1/8, 2, C2/8, 2, 8, 4)."""
        k2, _, c1, c2 = conv2.shape
        return wgmma_operand(np.ascontiguousarray(conv2, np.float32).reshape(k2 * k2, c1, c2))


class ImplicitWarpgroup(Hopper, Implicit):
    """Implicit with each conv layer on Hopper's warpgroup MMA (wgmma, conv_kernel2) in 3xTF32, the
    weights read by the tensor cores from shared memory; sm_90 only."""
    NAME = "implicit-wgmma"
    CONV_VERSION = 2

    @staticmethod
    def conv_weights(weights, bn):
        """(K, K, C, M) with k = (kh, kw, c) zero-padded to whole k-tiles and M to whole column blocks
        of bn, split into TF32 parts and remainders in wgmma's layout per column block: (M / bn,
        KP / 8, 2, bn / 8, 2, 8, 4)."""
        k, _, c, m = weights.shape
        kp, mp = launch.ceil_div(k * k * c, launch.Conv.BK) * launch.Conv.BK, launch.ceil_div(m, bn) * bn
        w = np.zeros((kp, mp), np.float32)
        w[: k * k * c, :m] = weights.reshape(-1, m)
        return wgmma_operand(np.ascontiguousarray(w.reshape(kp, mp // bn, bn).transpose(1, 0, 2)))


ALGORITHMS = {algo.NAME: algo for algo in (FusedWarpgroup, FusedTensorCores, ImplicitWarpgroup, Implicit, Fused, Unroll)}  # auto's order of preference
AUTO = "auto"  # the first of ALGORITHMS that can run the model on the GPU at hand


def choose(name, g, arch):
    """The algorithm class for --conv-algo name (or the first that fits, for auto), or the reason none can."""
    if name != AUTO:
        why = ALGORITHMS[name].available(g, arch)
        return (ALGORITHMS[name], None) if why is None else (None, f"--conv-algo {name} cannot run this model: {why}")
    for algo in ALGORITHMS.values():
        if algo.available(g, arch) is None:
            return algo, None
    return None, "no GPU algorithm can run this model"
