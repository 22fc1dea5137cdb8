"""The certified pass's certificate (Certify): per image, the classifier from float16 operands and the bound
that proves its answer (docs/certified.md)."""
from .base import Launcher, ceil_div
from .fused import FullyConnected


class Certify(Launcher):
    """The certificate of the low-precision pass and the recomputation around it (cuda/certify.cu):
    certify_kernel4 (32 images a block) computes fc1 from float16 operands on fused_kernel4's or 6's
    float32 features and bounds, certify_kernel5 the same on fused_kernel6's float16 ones; then
    pair_kernel1 (or 2 after version 5) on the (image, class) pairs their first stage left, sm_90a;
    compact_kernel1 (one block) and scatter_kernel1 (the recomputation, fused_kernel3, reads the listed
    images where they lie). The shapes it takes: 10 classes, 128 hidden units, features in 64s.
    Versions 1-3 (fc1's sums from the fc kernel) live in dev/cuda/certify_early.py."""
    source = "certify"
    KERNELS = {4: "certify_kernel4", 5: "certify_kernel5"}
    ARG_TYPES = {4: "PPPPPPPPPPPi", 5: "PPPPPPPPPPPi"}
    HALVES = (5,)  # versions that read fused_kernel6's float16 features and bounds (FEAT_HALVES), with pair_kernel2
    DIRECTED_ROUNDING = True
    IMGS = {4: 32, 5: 32}
    PAIRS = 32  # pair_kernel1's pairs a round
    THREADS, MAX_IMAGES = 256, 1 << 20

    @staticmethod
    def shared(g, version=5):
        """certify_kernel<version>'s dynamic shared bytes: phase A's four stages (A rows of 32 features:
        float32 padded to 40, or float16 as words to 20), or Q, z and the slopes where they were; per
        image its sums of dp and p."""
        row = 40 if version == 4 else 20
        stages, q_z_and_slopes = 4 * (64 * row + 2 * 32 * g.hidden // 2), 96 * (g.hidden + 4) + 32 * g.hidden
        return 4 * (max(stages, q_z_and_slopes) + 2 * 32)

    @classmethod
    def pair_shared(cls, g, halves=False):
        """pair_kernel1's (or with halves 2's) dynamic shared bytes: two stages of two fc1 slabs and
        their dp (64 values a pair and 16 bytes), the columns."""
        half = 64 * g.hidden // 2 + cls.PAIRS * (36 if halves else 68)
        return 4 * (2 * 2 * half + g.hidden * cls.PAIRS // 2 + 9 * cls.PAIRS)

    @staticmethod
    def pair_floats(g, n):
        """Scratch for the pairs of n images (the first stage lists at most classes - 1 an image):
        [(name, floats)] for pairs (image, margin, rest, 0), columns (float16, hidden a pair), npairs."""
        most = (g.classes - 1) * n
        return [("pairs", 4 * most), ("columns", most * g.hidden // 2), ("npairs", 1)]

    @classmethod
    def defines(cls, g, version):
        """-D options: the shapes, the version built (with its pair kernel, compact and scatter), and
        both versions' shared floats (the kernels check theirs fit)."""
        return dict(FEAT=g.flat, HIDDEN=g.hidden, CLASSES=g.classes, SHARED_PAIRS=cls.pair_shared(g) // 4,
                    CERTIFY_VERSION=version, **{f"SHARED_V{v}": Certify.shared(g, v) // 4 for v in Certify.KERNELS})

    @staticmethod
    def fits(g):
        """None where the certificate's kernels take geometry g, else why not."""
        if g.classes != 10 or g.hidden != 128 or g.flat % 64 or g.flat >= FullyConnected.SPLIT_FEATURES:
            return (f"the certificate needs 10 classes, 128 hidden units and 64 to {FullyConnected.SPLIT_FEATURES - 64} "
                    f"features in 64s; the model has {g.classes}, {g.hidden} and {g.flat}")
        return None

    def __init__(self, build, g, version=5):
        import pycuda.driver as cuda

        self.version, self.kernel, self.arg_types = version, self.KERNELS[version], self.ARG_TYPES[version]
        super().__init__(build, "sm_90a", **self.defines(g, version))
        self.bytes, self.pair_bytes = self.shared(g, version), self.pair_shared(g, version in self.HALVES)
        self.pair_name = "pair_kernel2" if version in self.HALVES else "pair_kernel1"
        self.pair = self.module.get_function(self.pair_name)
        self.pair.prepare("PPPPPP")
        for f, size in ((self.function, self.bytes), (self.pair, self.pair_bytes)):
            f.set_attribute(cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, size)
            f.set_attribute(cuda.function_attribute.PREFERRED_SHARED_MEMORY_CARVEOUT, 100)
        self.compact, self.scatter = (self.module.get_function(f"{k}_kernel1") for k in ("compact", "scatter"))
        self.compact.prepare("PiPPPP")
        self.scatter.prepare("PPPPPPPP")
        self.constants = self.module.get_global("c_fc_bound")[0]

    def __call__(self, stream, feat, dp, scores, labels, w1abs, w1h, w2, ok, n, *, pairs, w1near):
        """ok[i] = 1 where image i is certified; the scores and labels of the float16 pass written (fc1
        from float16 operands: w1near, fc1 rounded to nearest, laid out as w1abs); pairs: the pointers
        pair_floats names. Version 5's feat and dp are float16 (fused_kernel6's FEAT_HALVES)."""
        import pycuda.driver as cuda

        listed, columns, npairs = pairs
        cuda.memset_d32_async(npairs, 0, 1, stream)
        self.launch(stream, (ceil_div(n, self.IMGS[self.version]), 1), (self.THREADS, 1, 1), feat, dp, scores, labels,
                    w1abs, w1near, w2, ok, listed, columns, npairs, n, shared=self.bytes)
        self.pairs(stream, n, listed, columns, npairs, dp, w1h, ok)

    def pairs(self, stream, n, listed, columns, npairs, dp, w1h, ok):
        """Stage two on the listed pairs. A round of pairs for each 32 images: the first stage lists
        about one pair in four images (testfull: 2,306 of 10,000); more take more rounds."""
        self.launch(stream, (ceil_div(n, self.PAIRS), 1), (self.THREADS, 1, 1), listed, columns, npairs, dp, w1h, ok,
                    shared=self.pair_bytes, function=self.pair, name=self.pair_name)

    def compact_list(self, stream, ok, n, idx, count, fb_overflow, total):
        """The images ok left out, in order, into idx; their number into *count and added to *total."""
        if n > self.MAX_IMAGES:
            raise ValueError(f"compact_kernel1 takes at most {self.MAX_IMAGES} images a chunk, not {n}")
        self.launch(stream, (1, 1), (1024, 1, 1), ok, n, idx, count, fb_overflow, total, function=self.compact,
                    name="compact_kernel1")

    def scatter_labels(self, stream, n, idx, count, fb_labels, labels, fb_scores, scores, fb_overflow, overflow):
        self.launch(stream, (ceil_div(n, 256), 1), (256, 1, 1), idx, count, fb_labels, labels, fb_scores, scores,
                    fb_overflow, overflow, function=self.scatter, name="scatter_kernel1")
