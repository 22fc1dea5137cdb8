"""The network on the GPU, one class per algorithm; ALGORITHMS feeds --conv-algo and the tests.

Each pipeline uploads the weights once (upload), says how much scratch memory a chunk of images
needs (scratch_floats), and enqueues one chunk on a stream: images in, labels (int32) out (and the
class scores, float32, where a scores pointer is given), and the chunk-relative index of its
first image with non-finite scores atomically min'ed into *overflow; where a bad pointer is given,
the index of the first image holding a non-finite value is min'ed into *bad (the fused kernels
check the images as they stage them, the other pipelines run check_kernel2 first).
"""
import numpy as np

from . import certify
from ..data import codes
from ..options import AUTO, CERTIFY_FROM, PRECISIONS, precision_conflict  # noqa: F401 (names of the registry)
from . import launch
from .operands import scaled_halves, tf32, wgmma_column_blocks, wgmma_halves, wgmma_operand


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

    def certifies(self, n, scores, narrow=False):
        """Whether a run of n images (scores asked for or not; uploaded a byte a pixel or not) takes
        a certified low-precision pass: only fused-certified has one."""
        return False

    def enqueue_exact(self, *args, **kwargs):
        """enqueue on the exact path alone: what every pipeline but fused-certified does anyway."""
        return self.enqueue(*args, **kwargs)

    STAGES_CODES = False  # its conv kernel stages 8-bit codes itself (enqueue's scaling)

    def staging(self, wire):
        """The scaling enqueue passes its kernels for images uploaded in byte wire type `wire`, read as
        uploaded (no conversion kernel, no float32 copy); None where they must be converted first."""
        return codes.staged_scaling(wire) if self.STAGES_CODES else None


def classify(stream, pipeline, s, n, labels, overflow, scores):
    """fc1 -> ReLU -> fc2 through the pipeline's gemm_fc1 and gemm_fc2, then argmax: scratch s has
    feat, hid and scores; the scores are copied out where a pointer is given."""
    g = pipeline.g
    pipeline.gemm_fc1(stream, s["feat"], pipeline.fc1, s["hid"], n, g.hidden, g.flat, True)
    pipeline.gemm_fc2(stream, s["hid"], pipeline.fc2, s["scores"], n, g.classes, g.hidden, False)
    pipeline.argmax(stream, s["scores"], labels, n, g.classes, overflow)
    if scores:
        import pycuda.driver as cuda

        cuda.memcpy_dtod_async(scores, s["scores"], 4 * n * g.classes, stream)


class Unroll(Algorithm):
    """The 2016 course pipeline: per conv layer unroll -> GEMM (+ReLU) -> placeIntoY -> pool; both
    fcs through the same GEMM (ReLU on fc1), then argmax. The GEMM is --gemm-algo's (on Hopper the
    wgmma one, elsewhere the 3xTF32 tensor-core one where the GPU has them), its block tile
    --tile-width's or sized to the layer. The wgmma GEMM computes the transposed product from the
    transposed unroll, so its output is already NHWC and placeIntoY has nothing to do."""
    NAME = "unroll"
    MAX_CHUNK = 2048
    SCRATCH_BYTES = 1 << 30  # per stream, for the transposed (wgmma) pipeline's chunks

    def __init__(self, build, g):
        self.g = g
        self.gemm_name, version = launch.gemm_choice(build.gemm, build.tile_width, build.arch)
        tile, self.transposed = build.tile_width, version == 4
        if self.transposed:  # rows = pixels or images, columns = channels or units
            self.gemm1 = launch.Gemm(build, version, tile, cols=g.c1)
            self.gemm2 = launch.Gemm(build, version, tile, cols=g.c2)
            self.gemm_fc1 = launch.Gemm(build, version, tile, cols=g.hidden)
            self.gemm_fc2 = launch.Gemm(build, version, tile, cols=g.classes)
        else:  # rows = output channels (conv) or images (fc)
            self.gemm1 = launch.Gemm(build, version, tile, rows=g.c1)
            self.gemm2 = launch.Gemm(build, version, tile, rows=g.c2)
            self.gemm_fc1 = self.gemm_fc2 = launch.Gemm(build, version, tile, rows=self.MAX_CHUNK)
            self.place = launch.Place(build)
        self.unroll = launch.Unroll(build, self.transposed)
        self.pool, self.argmax, self.check = launch.Pool(build), launch.Argmax(build), launch.Check(build)
        self.CHUNK = max(16, min(self.MAX_CHUNK, self._largest_chunk() if self.transposed else self._l2_chunk(build)))

    def _largest_chunk(self):
        """Measured (ECE408, H100, 4 streams, wgmma): 2048-image chunks 4.13 ms, 1024 4.33, 528 4.41, 256
        4.37: fewer, larger launches beat keeping the unrolled matrix in L2. So: the largest chunk whose
        scratch fits SCRATCH_BYTES."""
        return self.SCRATCH_BYTES // (4 * self.scratch_floats(1))

    def _l2_chunk(self, build):
        """Small enough that the larger unrolled matrix stays in half the L2 cache between the unroll
        that writes it and the GEMM that reads it, unless conv2's GEMM would then have too few blocks
        to fill the GPU (two per SM): filling the GPU matters more."""
        g = self.g
        (h1, w1), (h2, w2) = g.conv1_out, g.conv2_out
        unrolled = 4 * max(g.k1 * g.k1 * g.c * h1 * w1, g.k2 * g.k2 * g.c1 * h2 * w2)
        in_l2 = build.l2_bytes // 2 // unrolled
        row_blocks = -(-g.c2 // self.gemm2.tile)
        filled = -(-2 * build.sms * launch.Gemm.BN // (h2 * w2 * row_blocks))
        return max(in_l2, filled)

    @property
    def describe(self):
        tiles = sorted({self.gemm1.tile, self.gemm2.tile, self.gemm_fc1.tile})
        return f"{self.gemm_name} GEMM, tile {'/'.join(map(str, tiles))}"

    def upload(self, model, to_device):
        g = self.g
        if self.transposed:  # (K, K, C, M) is the (K*K*C, M) b operand, rows in the unroll's order
            self.w1 = to_device(self.gemm1.weights(model.conv1.reshape(-1, g.c1)))
            self.w2 = to_device(self.gemm2.weights(model.conv2.reshape(-1, g.c2)))
        else:  # re-laid as the a operand: (K, K, C, M) -> (M, K*K*C)
            self.w1 = to_device(model.conv1.reshape(-1, g.c1).T)
            self.w2 = to_device(model.conv2.reshape(-1, g.c2).T)
        self.fc1, self.fc2 = to_device(self.gemm_fc1.weights(model.fc1)), to_device(self.gemm_fc2.weights(model.fc2))

    def _layout(self, chunk):
        g = self.g
        (h1, w1), (p1h, p1w), (h2, w2) = g.conv1_out, g.pool1_out, g.conv2_out
        row = launch.Unroll.row
        placed = [] if self.transposed else [("y1", g.c1 * chunk * h1 * w1), ("y2", g.c2 * chunk * h2 * w2)]
        return placed + [("u1", row(g.k1, g.c) * chunk * h1 * w1), ("a1", chunk * h1 * w1 * g.c1),
                         ("p1", chunk * p1h * p1w * g.c1), ("u2", row(g.k2, g.c1) * chunk * h2 * w2),
                         ("a2", chunk * h2 * w2 * g.c2), ("feat", chunk * g.flat), ("hid", chunk * g.hidden),
                         ("scores", chunk * g.classes)]

    def scratch_floats(self, chunk):
        return Scratch.floats(self._layout(chunk))

    def enqueue(self, stream, x, n, labels, scratch_base, overflow, scores=0, bad=0):
        g, s = self.g, Scratch(scratch_base, self._layout(n)).ptr
        (h1, w1), (p1h, p1w), (h2, w2) = g.conv1_out, g.pool1_out, g.conv2_out
        if bad:
            self.check(stream, x, n, g.h * g.w * g.c, bad)
        self.conv(stream, self.gemm1, x, self.w1, s, "1", n, (g.h, g.w, g.c, g.k1, g.c1), h1 * w1)
        self.pool(stream, s["a1"], s["p1"], n, h1, w1, g.c1)
        self.conv(stream, self.gemm2, s["p1"], self.w2, s, "2", n, (p1h, p1w, g.c1, g.k2, g.c2), h2 * w2)
        self.pool(stream, s["a2"], s["feat"], n, h2, w2, g.c2)
        classify(stream, self, s, n, labels, overflow, scores)

    def conv(self, stream, gemm, x, w, s, layer, n, shape, pixels):
        """unroll -> GEMM (+ReLU) -> placeIntoY of one conv layer: x -> s["a" + layer], NHWC."""
        h, wd, c, k, c_out = shape
        u, a = s["u" + layer], s["a" + layer]
        self.unroll(stream, x, u, n, h, wd, c, k)
        if self.transposed:
            gemm(stream, u, w, a, n * pixels, c_out, launch.Unroll.row(k, c), True)
        else:
            y = s["y" + layer]
            gemm(stream, w, u, y, c_out, n * pixels, k * k * c, True)
            self.place(stream, y, a, c_out, n * pixels)


class Implicit(Algorithm):
    """Each conv layer -> ReLU -> pool as one implicit-GEMM kernel on the tensor cores in 3xTF32,
    for any geometry (the pooled conv1 output goes through global memory, L2-resident per chunk);
    then fc1 -> ReLU -> fc2 -> argmax in one kernel where it fits the hidden size, else two 3xTF32
    GEMMs and argmax."""
    NAME = "implicit-tc"
    MIN_ARCH = 80
    SCRATCH_BYTES = 64 << 20  # per stream: sets the chunk for large images
    CONV_KERNEL = "conv_kernel1"

    def __init__(self, build, g):
        self.g = g
        (p1h, p1w) = g.pool1_out
        layers = (g.h, g.w, g.c, g.k1, g.c1), (p1h, p1w, g.c1, g.k2, g.c2)
        self.conv1, self.conv2 = (launch.Conv(build, *layer, kernel=self.conv_kernel(*layer)) for layer in layers)
        self.check = launch.Check(build)
        try:
            self.fcs = launch.FullyConnected(build, g)
        except ValueError:
            self.fcs = None
            self.gemm_fc1 = self.gemm_fc2 = launch.Gemm(build, 3, rows=2048)
            self.argmax = launch.Argmax(build)
        per_image = 4 * (p1h * p1w * g.c1 + g.flat + g.hidden + g.classes)
        self.CHUNK = max(1, min(2048, self.SCRATCH_BYTES // per_image, (2**31 - 1) // (g.h * g.w * g.c)))

    @classmethod
    def conv_kernel(cls, h, w, c, k, c_out):
        """The kernel of one conv layer (input h x w x c, k x k, c_out channels)."""
        return cls.CONV_KERNEL

    @staticmethod
    def conv_weights(weights, bn, bk):
        return weights  # (K, K, C, M) is the (K*K*C, M) B operand as it is

    def upload(self, model, to_device):
        self.w1 = to_device(self.conv_weights(model.conv1, self.conv1.bn, self.conv1.bk))
        self.w2 = to_device(self.conv_weights(model.conv2, self.conv2.bn, self.conv2.bk))
        self.fc1 = to_device(self.fcs.fc1_operand(model.fc1) if self.fcs is not None else model.fc1)
        self.fc2 = to_device(model.fc2)

    def _layout(self, chunk):
        g = self.g
        p1h, p1w = g.pool1_out
        if self.fcs is not None:
            return [("p1", chunk * p1h * p1w * g.c1), ("feat", chunk * g.flat), ("partial", self.fcs.partial_floats(chunk))]
        return [("p1", chunk * p1h * p1w * g.c1), ("feat", chunk * g.flat), ("hid", chunk * g.hidden),
                ("scores", chunk * g.classes)]

    def scratch_floats(self, chunk):
        return Scratch.floats(self._layout(chunk))

    def enqueue(self, stream, x, n, labels, scratch_base, overflow, scores=0, bad=0):
        s = Scratch(scratch_base, self._layout(n)).ptr
        if bad:
            self.check(stream, x, n, self.g.h * self.g.w * self.g.c, bad)
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
    STREAM_CHUNK = 8192  # streamed: a whole host block per launch (plan.streamed_chunk), 3x fewer launches for the host
    KERNEL = "fused_kernel1"

    def __init__(self, build, g):
        self.g = g
        self.convs = launch.Fused(build, g, self.KERNEL)
        self.fcs = launch.FullyConnected(build, g)

    @classmethod
    def available(cls, g, arch):
        """None when the fused kernels can run geometry g on GPU architecture arch, else why not."""
        why = cls.runs_on(arch)
        if why:
            return why
        try:
            launch.Fused.defines(g, launch.version_of(cls.KERNEL))
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
        self.convs.set_conv1(self.conv1_weights(model.conv1))
        self.w2 = to_device(self.conv2_weights(model.conv2))
        self.fc1, self.fc2 = to_device(self.fcs.fc1_operand(model.fc1)), to_device(model.fc2)

    def _layout(self, chunk):
        return [("feat", chunk * self.g.flat), ("partial", self.fcs.partial_floats(chunk))]

    def scratch_floats(self, chunk):
        return Scratch.floats(self._layout(chunk))

    def enqueue(self, stream, x, n, labels, scratch_base, overflow, scores=0, bad=0, scaling=-1):
        s = Scratch(scratch_base, self._layout(n)).ptr
        self.convs(stream, x, self.w2, s["feat"], n, bad, scaling=scaling)
        self.fcs(stream, s["feat"], self.fc1, self.fc2, labels, n, overflow, scores, s["partial"])


class FusedTensorCores(Fused):
    """Fused with conv2 on the tensor cores in 3xTF32: operands split into a TF32 part and a TF32
    remainder, three products each, FP32-level accuracy."""
    NAME = "fused-tc"
    KERNEL = "fused_kernel2"
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


class Hopper:
    """Mixed into the algorithms whose kernels use sm_90a instructions (wgmma): not in later GPUs."""

    @classmethod
    def runs_on(cls, arch):
        why = launch.needs_hopper(arch)
        return why and f"it {why}"


class FusedWarpgroup(Hopper, FusedTensorCores):
    """Both convs on Hopper's warpgroup MMA (wgmma), conv1 in 3xTF32 (or exact from 8-bit codes),
    conv2 in 3xFP16 (scaled float16 parts: 3xTF32's accuracy at twice its rate), the weights read by
    the tensor cores from shared memory; sm_90 only."""
    NAME = "fused-wgmma"
    KERNEL = "fused_kernel3"
    STAGES_CODES = True

    @staticmethod
    def conv1_weights(conv1):
        """(K1, K1, C, C1) as K1*K1*C rows, for float32 images: those of the tensor-core steps
        (launch.Fused.conv1_steps) as one slab in wgmma order, zero-padded to whole steps, then the
        tail's rows as they are; then for 8-bit codes (cuda/fused_conv1_wgmma.cuh), each channel's
        rows times 2^S as float16 parts (operands.scaled_halves), each kernel row's K1*C padded to
        even with a zero row, zero-padded to whole k16 steps, lo then hi a step, in wgmma order, as
        float32 words; then 2^-S per channel."""
        k1, _, c, c1 = conv1.shape
        rows = np.ascontiguousarray(conv1, np.float32).reshape(-1, c1)
        steps, tail = launch.Fused.conv1_steps(len(rows))
        w = np.zeros((1, 8 * steps, c1), np.float32)
        w[0, : len(rows) - tail] = rows[: len(rows) - tail]
        hi, lo, scales = scaled_halves(rows)
        row = k1 * c + (k1 * c) % 2  # a kernel row's k, padded to even (a zero weight where odd)
        steps16 = -(-k1 * row // 16)
        parts = np.zeros((2, steps16 * 16, c1), np.float16)
        for p, half in enumerate((lo, hi)):
            parts[p, : k1 * row].reshape(k1, row, c1)[:, : k1 * c] = half.reshape(k1, k1 * c, c1)
        by_step = parts.reshape(2, steps16, 16, c1).transpose(1, 0, 2, 3).reshape(steps16 * 2, 16, c1)  # (ks, {lo, hi})
        words = wgmma_halves(by_step).reshape(-1).view(np.float32)
        return np.concatenate([wgmma_operand(w).ravel(), rows[len(rows) - tail:].ravel(), words, scales])

    @staticmethod
    def conv2_weights(conv2):
        """(K2, K2, C1, C2) for fused_kernel3's conv2 in 3xFP16: each channel's weights times 2^T as
        float16 parts hi + lo (operands.scaled_halves), K2*K2 slabs of C1 rows, each k16 step's hi then
        lo in wgmma order, (K2*K2, C1/16, {hi, lo}, C2/8, 2, 8, 8) halves as float32 words; then 2^-T
        per channel."""
        k2, _, c1, c2 = conv2.shape
        hi, lo, scales = scaled_halves(np.asarray(conv2, np.float32).reshape(-1, c2))
        slabs = np.stack([wgmma_halves(p.reshape(k2 * k2, c1, c2)) for p in (hi, lo)], axis=2)
        return np.concatenate([slabs.reshape(-1).view(np.float32), scales])


class FusedCertified(FusedWarpgroup):
    """Certified low precision (docs/certified.md): conv2 with float16 operands and a bound beside
    each feature (fused_kernel6, or fused_kernel4 where its shapes do not fit), then a certificate
    per image that computes the classifier itself, fc1 from float16 operands (certify_kernel5 on
    fused_kernel6's float16 features and bounds, or certify_kernel4 on fused_kernel4's float32 ones,
    then pair_kernel2 or 1 for the classes its first stage leaves); the images it leaves
    out are listed on the GPU and recomputed by fused-wgmma's kernels (fused_kernel3, 2 images a
    block, and its fc kernel) on a count the GPU set, so the labels are fused-wgmma's. The scores asked for are the
    float16 pass's where certified. Asked for by name it certifies every run; as the default
    (by_default) only those it makes faster, the rest run on the exact path alone (enqueue_exact)."""
    NAME = "fused-certified"
    KERNEL = "fused_kernel4"  # any geometry fused-wgmma runs; fused_kernel6 where its shapes fit (8x8 conv2 outputs)
    KERNELS = ("fused_kernel6", KERNEL)
    # certify_kernel5 (fc1 inside, on fused_kernel6's float16 outputs) and pair_kernel2; version 4 (the
    # same on float32 outputs) where fused_kernel4 runs the convs (versions 1-3: dev/cuda/certify_early.py)
    CERTIFY_VERSION = 5
    # The default precision certifies runs of at least this many images uploaded a byte a pixel (uint8,
    # 8-bit codes) that ask for no scores (docs/certified.md: below it the exact path's two kernels a
    # chunk end sooner than the eight). Float32 uploads stay exact: their upload bounds both paths end
    # to end, and the certified chain's tail ends them later (8,192-65,536 images measured). With
    # certify_kernel5: 5,120 codes ahead in GPU time (7%) and level to ahead end to end, 4,096 level
    CERTIFY_FROM = CERTIFY_FROM
    RECOMPUTE_IMGS = 2  # fused_kernel3's images a block when it recomputes a chunk's list

    @classmethod
    def kernel_for(cls, g):
        """The conv kernel for geometry g: the first of KERNELS whose shapes fit it."""
        return next(k for k in cls.KERNELS if launch.Fused.plan(g, launch.version_of(k))[0] is not None)

    @classmethod
    def available(cls, g, arch):
        return super().available(g, arch) or launch.Certify.fits(g)

    def __init__(self, build, g):
        self.g = g
        kernel = self.kernel_for(g)
        version = self.CERTIFY_VERSION
        if version in launch.Certify.HALVES and kernel != "fused_kernel6":
            version = 4  # the same certificate on fused_kernel4's float32 outputs
        self.halves = version in launch.Certify.HALVES  # the features and bounds travel as float16
        self.convs = launch.Fused(build, g, kernel, feat_halves=self.halves)
        self.exact = launch.Fused(build, g, FusedWarpgroup.KERNEL)
        # The recomputation: the same kernel 2 images a block, a shorter block at each chunk's end
        self.recompute = launch.Fused(build, g, FusedWarpgroup.KERNEL, imgs=self.RECOMPUTE_IMGS)
        self.fcs = launch.FullyConnected(build, g, tensor_cores=True)
        self.cert = launch.Certify(build, g, version)
        self.recomputed_dev = None
        self.default = False  # asked for by name: every run certified

    def by_default(self):
        """As the default precision runs it: only the runs certified_by_default names."""
        self.default = True
        return self

    @classmethod
    def certified_by_default(cls, n, scores, narrow=False):
        """Whether the default certifies a run of n images: uploaded a byte a pixel or less (narrow:
        uint8, 8-bit codes, or compressed chunks the GPU decodes), from CERTIFY_FROM, unless it asks
        for scores (those are then the exact path's bits)."""
        return narrow and n >= cls.CERTIFY_FROM and not scores

    def certifies(self, n, scores, narrow=False):
        return not self.default or self.certified_by_default(n, scores, narrow)

    @property
    def describe(self):
        if self.default:
            return (f"float16 certified from {self.CERTIFY_FROM} images uploaded a byte a pixel when no scores are "
                    "asked for, else exact")
        return "float16 certified"

    @staticmethod
    def conv2_halves(conv2):
        """(K2, K2, C1, C2) as K2*K2 slabs of C1 rows x 2*C2 columns of float16, the weights rounded
        to nearest then the bound's columns (certify.conv2_bound_columns), in wgmma's layout:
        (K2*K2, C1/16, 2*C2/8, 2, 8, 8)."""
        k2, _, c1, c2 = conv2.shape
        w = np.ascontiguousarray(conv2, np.float32).reshape(k2 * k2, c1, c2)
        with np.errstate(over="ignore"):
            both = np.concatenate([w.astype(np.float16), certify.conv2_bound_columns(conv2).reshape(k2 * k2, c1, c2)], axis=2)
        return wgmma_halves(both)

    def upload(self, model, to_device):
        import pycuda.driver as cuda

        def words(halves):  # float16 arrays travel as the float32 words holding them in pairs
            return to_device(np.ascontiguousarray(halves, np.float16).reshape(-1).view(np.float32))

        g, conv1 = self.g, self.conv1_weights(model.conv1)
        for k in (self.convs, self.exact, self.recompute):
            k.set_conv1(conv1)
        cuda.memcpy_htod(self.convs.module.get_global("c_conv2_bound")[0], certify.conv2_constants(model.conv2))
        cuda.memcpy_htod(self.cert.constants, certify.fc_constants(model.fc1))
        self.w2, self.w2h = to_device(self.conv2_weights(model.conv2)), words(self.conv2_halves(model.conv2))
        self.fc1, self.fc2 = to_device(self.fcs.fc1_operand(model.fc1)), to_device(model.fc2)
        with np.errstate(over="ignore"):
            self.w1abs = words(wgmma_halves(certify.half_up(np.abs(model.fc1))[None]))
            self.w1h = words(wgmma_halves(model.fc1.astype(np.float16).reshape(g.flat // 64, 64, g.hidden).transpose(0, 2, 1)))
            self.w1near = words(wgmma_halves(model.fc1.astype(np.float16)[None]))
        self.recomputed_dev = to_device(np.zeros(1, np.float32))  # an int32 counter (zero bits)

    def recomputed(self):
        """Images recomputed by the exact path since the last call (synchronizes)."""
        import pycuda.driver as cuda

        count = np.zeros(1, np.int32)
        cuda.memcpy_dtoh(count, self.recomputed_dev)
        cuda.memset_d32(self.recomputed_dev, 0, 1)
        return int(count[0])

    def _layout(self, chunk):
        """The chunk's scratch regions: feat, the recomputation's float32 features (and the float16
        pass's where they travel as float32); the pass's bounds dp, and where they travel as float16
        (self.halves) its features feat_h, half the floats each; then the certificate's."""
        g = self.g
        passed = [("feat_h", chunk * g.flat // 2), ("dp", chunk * g.flat // 2)] if self.halves else [("dp", chunk * g.flat)]
        return [("feat", chunk * g.flat)] + passed + [("scores", chunk * g.classes),
                ("ok", chunk), ("idx", chunk), ("count", 1), ("fb_overflow", 1), ("cert_overflow", 1),
                ("fb_labels", chunk), ("fb_scores", chunk * g.classes),
                ("partial", self.fcs.partial_floats(chunk))] + launch.Certify.pair_floats(g, chunk)

    def enqueue(self, stream, x, n, labels, scratch_base, overflow, scores=0, bad=0, scaling=-1):
        import pycuda.driver as cuda

        s, c = Scratch(scratch_base, self._layout(n)).ptr, self.cert
        passed = s["feat_h"] if self.halves else s["feat"]  # the float16 pass's features
        self.convs(stream, x, self.w2h, passed, n, bad, dp=s["dp"], scaling=scaling)
        self.certify(stream, s, passed, labels, n)
        c.compact_list(stream, s["ok"], n, s["idx"], s["count"], s["fb_overflow"], self.recomputed_dev)
        self.recompute(stream, x, self.w2, s["feat"], n, 0, count=s["count"], idx=s["idx"], scaling=scaling)
        self.fcs(stream, s["feat"], self.fc1, self.fc2, s["fb_labels"], n, s["fb_overflow"], s["fb_scores"] if scores else 0,
                 s["partial"], count=s["count"])
        if scores:
            cuda.memcpy_dtod_async(scores, s["scores"], 4 * n * self.g.classes, stream)
        c.scatter_labels(stream, n, s["idx"], s["count"], s["fb_labels"], labels, s["fb_scores"] if scores else 0, scores,
                         s["fb_overflow"], overflow)

    def certify(self, stream, s, passed, labels, n):
        """The certificate on the float16 pass's features (passed) and bounds: the classifier from float16
        operands, ok per image, the scores into s["scores"] and labels."""
        self.cert(stream, passed, s["dp"], s["scores"], labels, self.w1abs, self.w1h, self.fc2, s["ok"], n,
                  pairs=(s["pairs"], s["columns"], s["npairs"]), w1near=self.w1near)

    def enqueue_exact(self, stream, x, n, labels, scratch_base, overflow, scores=0, bad=0, scaling=-1):
        """fused-wgmma's two kernels (fused_kernel3, its fc kernel): for a run not certified."""
        s = Scratch(scratch_base, self._layout(n)).ptr
        self.exact(stream, x, self.w2, s["feat"], n, bad, scaling=scaling)
        self.fcs(stream, s["feat"], self.fc1, self.fc2, labels, n, overflow, scores, s["partial"])


class ImplicitWarpgroup(Hopper, Implicit):
    """Implicit with each conv layer on Hopper's warpgroup MMA (wgmma, conv_kernel2) in 3xTF32, the
    weights read by the tensor cores from shared memory; layers of 1 to 3 input channels whose weights
    fit in shared memory whole on conv_kernel3, and layers of a multiple of 32 whose block's stretch of
    the input fits on conv_kernel4 (both the same bits); sm_90 only."""
    NAME = "implicit-wgmma"
    CONV_KERNEL = "conv_kernel2"

    @classmethod
    def conv_kernel(cls, *layer):
        if launch.Conv.whole(*layer) is None:
            return "conv_kernel3"
        return "conv_kernel4" if launch.Conv.staged(*layer) is None else cls.CONV_KERNEL

    @staticmethod
    def conv_weights(weights, bn, bk):
        """(K, K, C, M) as the (K*K*C, M) B operand, in wgmma's layout per column block of bn channels
        (operands.wgmma_column_blocks; k padded to whole k-tiles of bk, the kernel's)."""
        return wgmma_column_blocks(weights.reshape(-1, weights.shape[-1]), bn, bk)


ALGORITHMS = {algo.NAME: algo for algo in (FusedWarpgroup, FusedTensorCores, ImplicitWarpgroup, Implicit, Fused, Unroll,
                                           FusedCertified)}  # auto's order of preference


def choose(name, g, arch, precision=None):
    """(algorithm class, None) for --conv-algo name (or the first that fits, for auto) and --precision,
    or (None, why none can), or (algorithm class, a notice): --precision certified runs
    fused-certified where it can, else the exact path auto picks (the same answers), and says so.
    --precision exact never runs the certified path. Neither given (auto, no precision): fused-certified
    where it can run, as its by_default() (the run decides), else the first that fits."""
    certified, conflict = FusedCertified, precision_conflict(name, precision)
    if conflict:
        return None, conflict
    if precision == "certified":
        why = certified.available(g, arch)
        if why is None:
            return certified, None
        if name == certified.NAME:
            return None, f"--conv-algo {name} cannot run this model: {why}"
        algo, why_not = choose(AUTO, g, arch)
        if algo is None:
            return None, why_not
        return algo, (f"cnninfer: --precision certified: {certified.NAME} cannot run this model ({why}); "
                      f"running the exact --conv-algo {algo.NAME} (the same answers)")
    if name == AUTO and precision is None and certified.available(g, arch) is None:
        return certified, None
    if name != AUTO:
        why = ALGORITHMS[name].available(g, arch)
        return (ALGORITHMS[name], None) if why is None else (None, f"--conv-algo {name} cannot run this model: {why}")
    for algo in ALGORITHMS.values():
        if algo.available(g, arch) is None:
            return algo, None
    return None, "no GPU algorithm can run this model"


def default_path(g, arch, n, scores=False, narrow=False):
    """The algorithm whose kernels the default (auto, no precision) runs on n images (uploaded a
    byte a pixel or not): fused-certified where it runs and certifies such a run (by_default), else
    the exact one auto picks."""
    algo, _ = choose(AUTO, g, arch)
    if algo is FusedCertified and not algo.certified_by_default(n, scores, narrow):
        algo, _ = choose(AUTO, g, arch, "exact")
    return algo
