"""The fused pipelines' launchers: conv1 -> pool -> conv2 -> pool in one kernel (Fused, versions 1-6), and the
classifier (FullyConnected; FullyConnectedWarpgroup on Hopper)."""
from typing import NamedTuple

import numpy as np

from .. import certify, operands
from ...data import codes
from .base import Launcher, ceil_div, needs_hopper, version_of


class FusedLayout(NamedTuple):
    """One block's shared memory in a fused kernel, in floats: the pooled conv1 output p1 (IMGS images,
    strides pstr between pixels, rstr between rows, istr between images), then the stage area (the
    images, and version 3's split conv1 weights from w1_at, in phase 1; `slabs` w2 slabs in phase 2)."""
    imgs: int
    pstr: int
    rstr: int
    istr: int
    stage: int
    w1_at: int = 0
    slabs: int = 2  # version 3's w2 slab buffers

    @property
    def shared(self):
        return 4 * (self.imgs * self.istr + self.stage)


class Fused(Launcher):
    """conv1 -> ReLU -> pool -> conv2 -> ReLU -> pool for IMGS images per 256-thread block;
    fused_kernel1 on FP32 FFMA (cuda/fused1.cu), fused_kernel2 on the tensor cores in 3xTF32
    (mma.sync, sm_80 and later: fused2.cu), fused_kernel3 on Hopper's warpgroup MMA (wgmma, sm_90a
    only: fused3.cu; conv2 in 3xFP16); fused_kernel4 and 6 the certified pass's float16 conv2 with a bound per
    feature (fused4.cu, fused6.cu: docs/certified.md). The host owns the shared-memory layout (plan)
    and passes it as -D options; the kernels static_assert what they rely on."""
    arg_types = "PPPiP"  # version 3 adds a count and an image list, versions 4 and 6 a bound output,
    # versions 3-6 the images' scaling and scale (8-bit codes staged as they are read; ARG_TYPES)
    ARG_TYPES = {3: "PPPiPPPif", 4: "PPPPiPif", 6: "PPPPiPif"}
    THREADS = 256
    SMEM_LIMIT = 227 * 1024
    ARCH = {3: "sm_90a", 4: "sm_90a", 6: "sm_90a"}  # versions compiled for a target other than the GPU's own

    VERSIONS = (1, 2, 3, 4, 6)  # fused_kernel<version> in cuda/fused<version>.cu
    BOUNDED = (4, 6)  # the certified pass's: a bound output beside the features, every bound rounded up
    IMGS3 = (4, 2)  # version 3's images a block: 4, or 2 for a shorter block (the recomputation)
    SLABS3 = (4, 3, 2)  # version 3's w2 slab buffers, the most that leave two blocks an SM (2 at least)

    @classmethod
    def plan(cls, g, version=1, imgs=4):
        """(FusedLayout, None) for geometry g, or (None, why the kernel cannot run it); imgs: version
        3's images a block (IMGS3; the other versions fix theirs)."""
        if version not in cls.VERSIONS:
            raise ValueError(f"no fused_kernel{version}: the versions are {', '.join(map(str, cls.VERSIONS))}")
        if imgs != 4 and (version != 3 or imgs not in cls.IMGS3):
            raise ValueError(f"fused_kernel{version} takes {' or '.join(map(str, cls.IMGS3)) if version == 3 else 4} "
                             f"images a block, not {imgs}")
        (p1h, p1w), (p2h, p2w) = g.pool1_out, g.pool2_out
        images = lambda imgs: imgs * g.h * g.w * g.c  # noqa: E731
        if g.k1 * g.k1 * g.c > 64 or cls.THREADS % g.c1:
            return None, "it needs conv1 channels dividing 256 and at most 64 conv1 weights per channel"
        if version == 1:
            if p2w % 2 or g.c1 % 4 or g.c2 % 8 or (g.c1 * g.c2) % (4 * cls.THREADS):
                return None, "it needs an even pooled conv2 width, conv1 channels a multiple of 4, conv2 channels of 8"
            groups = p2h * (p2w // 2) * (g.c2 // 8)
            if cls.THREADS % groups or (cls.THREADS // groups) * p2h * (p2w // 2) % 16 or (g.c2 // 8) % 2:
                return None, f"its 256-thread micro-tiling does not divide {p2h}x{p2w}x{g.c2} pooled conv2 outputs"
            # A pixel stride of C1 + 4 floats and an image stride of 4 mod 32 spread the 8 float4
            # reads of a quarter warp over all 32 banks.
            imgs, pstr = cls.THREADS // groups, g.c1 + 4
            rstr = p1w * pstr
            istr = p1h * rstr + (36 - p1h * rstr % 32) % 32
            layout = FusedLayout(imgs, pstr, rstr, istr, max(images(imgs), 2 * g.c1 * g.c2))
        elif version == 2:
            if (p2h * p2w) % 16 or g.c2 % 16 or g.c2 > 64 or g.c1 % 8 or (2 * g.c1 * g.c2) % (4 * cls.THREADS):
                return None, ("it needs pooled conv2 outputs in groups of 16, conv2 channels a multiple of 16 "
                              "up to 64, conv1 channels a multiple of 8")
            # The A fragments' scalar loads (8 pixels x 4 channels): a pixel stride of C1 + 2 puts
            # columns 2 apart 4 banks apart, a row stride of 8 mod 16 rows 2 apart 16 banks apart, so
            # a warp's 32 loads hit 32 banks (4x4 pooled outputs, C1 = 32).
            pstr = g.c1 + 2
            rstr = p1w * pstr + (24 - p1w * pstr % 16) % 16
            layout = FusedLayout(4, pstr, rstr, p1h * rstr, max(images(4), 4 * g.c1 * g.c2))
        elif version == 6:
            if g.conv2_out != (8, 8) or g.c1 != 32 or g.c2 != 64:
                return None, "it needs 8x8 conv2 outputs, 32 conv1 channels and 64 conv2 channels"
            # p1 in halves, unpadded (the tensor cores read it through descriptors); the stage area holds
            # the images and conv1's weights, then the 2x2 means of p1 (fused6.cu's qb: (4, P1H - 1, 12,
            # 18) words), four float16 slabs and the images' largest qb. An image pair's rows are
            # interleaved: its chunks hold both images, istr is half a pair.
            w1_at = ceil_div(cls.staged_floats(g, 4), 32) * 32
            pstr, chunk = g.c1 // 2, 2 * p1h * p1w * 4  # chunks of 8 channels, 8 words mod 32 apart
            chunk += (8 - chunk) % 32
            layout = FusedLayout(4, pstr, p1w * pstr, g.c1 // 8 * chunk // 2,
                                 max(w1_at + cls.conv1_floats(g), 4 * (p1h - 1) * 12 * 18 + 4 * g.c1 * g.c2) + 4, w1_at)
        else:
            if (p2h * p2w) % 16 or g.c1 != 32 or g.c2 != 64:
                return None, "it needs pooled conv2 outputs in groups of 16, 32 conv1 channels and 64 conv2 channels"
            # A warp's 8 row-groups gather 8 adjacent pixels of a p1 row, 4 channels each: a pixel
            # stride of C1 + 4 puts them in 32 banks. conv1's split weights follow the images,
            # 128-byte aligned.
            # Version 4's float2 loads of float16 pairs: a pixel stride of C1 + 8 puts a half warp's
            # 4 pixels x 4 pairs in 32 banks. Its stage area ends in the images' largest conv1
            # outputs (4 floats) and holds two float16 slabs (C1 * C2 floats each) in phase 2.
            # Version 3's slabs: as many buffers as leave two blocks an SM (SLABS3), fetched all but
            # one ahead (at 2, a slab's copy had one slab's MMAs to land in: a recomputing block of 2
            # images, alone on a chunk, 24.1 -> 22.8 us in 3xTF32).
            pstr = g.c1 + (8 if version == 4 else 4)
            w1_at = ceil_div(cls.staged_floats(g, imgs), 32) * 32
            front = w1_at + cls.conv1_floats(g)
            if version == 4:
                layout = FusedLayout(imgs, pstr, p1w * pstr, p1h * p1w * pstr, max(front + 4, 2 * g.c1 * g.c2 + 4), w1_at)
            else:  # float16 slabs (hi and lo, C1 x C2 floats), then the images' largest p1 (4 floats)
                for slabs in cls.SLABS3:
                    layout = FusedLayout(imgs, pstr, p1w * pstr, p1h * p1w * pstr, max(front, slabs * g.c1 * g.c2) + 4,
                                         w1_at, slabs)
                    if 2 * (layout.shared + 1024) <= cls.SM_SHARED:
                        break
        if layout.shared > cls.SMEM_LIMIT:
            return None, f"it needs {layout.shared} bytes of shared memory per block, more than {cls.SMEM_LIMIT}"
        return layout, None

    @staticmethod
    def staged_floats(g, imgs):
        """Floats of a block's staged images in versions 3-6: float32, or 8-bit codes as two copies of
        float16 values (fused_conv1_wgmma.cuh's stage_codes: rows padded to even, 4 zeros after each)."""
        row = g.w * g.c + (g.w * g.c) % 2
        return max(imgs * g.h * g.w * g.c, imgs * g.h * row + 4)

    @classmethod
    def conv1_floats(cls, g):
        """Floats of conv1's weights in the stage area (the float32 form, the larger of fused_conv1_wgmma.cuh's two)."""
        steps, tail = cls.conv1_steps(g.k1 * g.k1 * g.c)
        return (16 * steps + tail) * g.c1

    @staticmethod
    def conv1_steps(k):
        """Version 3's conv1 of k = K1*K1*C products an output: (k8 steps on the tensor cores, padded;
        a tail of 1 or 2 k past the last whole step, on the FP32 cores; at least one step)."""
        tail = k % 8 if k > 8 and k % 8 <= 2 else 0
        return -(-(k - tail) // 8), tail

    @classmethod
    def defines(cls, g, version=1, imgs=4, feat_halves=False):
        """-D options for fused_kernel<version>; feat_halves (version 6): the features and their bounds
        out as float16 (certify_kernel5's input)."""
        layout, why = cls.plan(g, version, imgs)
        if layout is None:
            raise ValueError(f"the fused kernel cannot run this network: {why}")
        defines = dict(IN_H=g.h, IN_W=g.w, IN_C=g.c, K1=g.k1, C1=g.c1, K2=g.k2, C2=g.c2, IMGS=layout.imgs,
                       PSTR=layout.pstr, RSTR=layout.rstr, ISTR=layout.istr, STAGE_FLOATS=layout.stage)
        if version >= 3:
            defines.update(CONV1_TAIL=cls.conv1_steps(g.k1 * g.k1 * g.c)[1], X_PAD=layout.w1_at)
        if version == 3:
            defines.update(SLABS3=layout.slabs)
        if version == 6:
            defines.update(P1_HALVES=1)
        if feat_halves:
            if version != 6:
                raise ValueError(f"fused_kernel{version} writes float32 features; float16 ones are fused_kernel6's")
            defines.update(FEAT_HALVES=1, DSCALE_LOG2=certify.DSCALE_LOG2)
        return defines

    def __init__(self, build, g, kernel="fused_kernel1", imgs=4, feat_halves=False):
        self.kernel, version = kernel, version_of(kernel)
        self.source, self.version = f"fused{version}", version
        self.arg_types = self.ARG_TYPES.get(version, self.arg_types)
        self.DIRECTED_ROUNDING = version in self.BOUNDED
        super().__init__(build, self.ARCH.get(version), **self.defines(g, version, imgs, feat_halves))
        layout = self.plan(g, version, imgs)[0]
        self.imgs, self.shared = layout.imgs, layout.shared
        import pycuda.driver as cuda

        self.function.set_attribute(cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, self.shared)
        # All of the SM's memory as shared memory: two blocks of up to 113 KB fit only so.
        self.function.set_attribute(cuda.function_attribute.PREFERRED_SHARED_MEMORY_CARVEOUT, 100)
        self.c1 = g.c1

    def set_conv1(self, weights):
        """Upload conv1's weights as the pipeline lays them out (pipelines.Fused.conv1_weights, or
        FusedWarpgroup's for versions 3-5, whose last C1 values, codes' 2^-S, go to constant memory
        and the rest to global memory)."""
        import pycuda.driver as cuda

        w = np.ascontiguousarray(weights, np.float32)
        parts = {"c_w1": w[:-self.c1], "c_w1_scale": w[-self.c1:]} if self.version >= 3 else {"c_w1": w}
        for name, values in parts.items():
            at, size = self.module.get_global(name)
            if values.nbytes != size:
                raise ValueError(f"{self.kernel}'s {name} holds {size} bytes, not the {values.nbytes} given")
            cuda.memcpy_htod(at, np.ascontiguousarray(values))

    def __call__(self, stream, x, w2, feat, n, bad=0, count=0, dp=0, idx=0, scaling=-1):
        """bad: where not 0, the images are checked: *bad = min(*bad, first image with a non-finite value).
        count (version 3): a device int, the images to run of the n (0: all); idx (version 3): a device
        list, image i being x's image idx[i] (0: x's images in order); dp (versions 4, 6): where the
        features' bounds go; scaling (versions 3-6): -1 for float32 images, else x holds 8-bit codes
        of that scaling (codes.SCALINGS), conv1 computed from the codes (fused_conv1_wgmma.cuh)."""
        bounds, codes_in = self.version in self.BOUNDED, self.version >= 3
        if ((count or idx) and self.version != 3) or (dp != 0) != bounds or (scaling != -1 and not codes_in):
            raise ValueError(f"{self.kernel} takes {'a bound output' if bounds else 'no bound output'}"
                             f"{', and a count and an image list' if self.version == 3 else ''}"
                             f"{'' if codes_in else ', float32 images only'}")
        args = (x, w2, feat, dp, n, bad) if bounds else (x, w2, feat, n, bad) + ((count, idx) if self.version == 3 else ())
        if codes_in:
            args += (np.int32(scaling), codes.SCALE)
        self.launch(stream, (ceil_div(n, self.imgs), 1), (self.THREADS, 1, 1), *args, shared=self.shared)


class FullyConnectedWarpgroup(Launcher):
    """fc1 -> ReLU -> fc2 -> argmax on Hopper's warpgroup MMA in 3xTF32 (fc_kernel6, cuda/fc6.cu, sm_90a):
    64 images a block, two warpgroups of half the hidden units each; fc1 pre-split by the host
    (weights). The shapes it takes: 64, 128 or 256 hidden units, features in 4s; split over the
    features into partial sums where FullyConnected asks (its fc_kernel3 adds them)."""
    source, kernel, arg_types = "fc6", "fc_kernel6", "PPPPiPPPPPi"
    IMGS, THREADS, TK, STAGES, HIDDEN = 64, 256, 16, 4, (64, 128, 256)
    CHUNK = 16 * TK  # features summed in the tensor cores before each FP32 add (fc6.cu's CHUNK6 k-tiles)

    @classmethod
    def fits(cls, g, arch):
        """None where fc_kernel6 takes geometry g on architecture arch, else why not."""
        why = needs_hopper(arch)
        if why:
            return f"fc_kernel6 {why}"
        if g.hidden not in cls.HIDDEN or g.flat % 4:
            return (f"fc_kernel6 needs {' or '.join(map(str, cls.HIDDEN))} hidden units and features in 4s; "
                    f"the model has {g.hidden} and {g.flat}")
        return None

    @classmethod
    def shared(cls, g):
        """Dynamic shared bytes: the pipeline's stages (a feature tile, both column blocks' k-tile of
        weights), later the hidden layer and the scores."""
        stage = cls.IMGS * (cls.TK + 4) + 2 * cls.TK * g.hidden
        return 4 * max(cls.STAGES * stage, cls.IMGS * (g.hidden + 1 + g.classes))

    @classmethod
    def defines(cls, g):
        return dict(FEAT=g.flat, HIDDEN=g.hidden, CLASSES=g.classes, SHARED_FLOATS=cls.shared(g) // 4)

    def __init__(self, build, g):
        import pycuda.driver as cuda

        super().__init__(build, "sm_90a", **self.defines(g))
        self.bytes = self.shared(g)
        self.function.set_attribute(cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, self.bytes)

    @classmethod
    def weights(cls, fc1):
        """fc1 (features, hidden) as the kernel reads it: two column blocks of TF32 parts and remainders."""
        return operands.wgmma_column_blocks(np.ascontiguousarray(fc1, np.float32), fc1.shape[1] // 2, cls.TK)

    def __call__(self, stream, feat, fc1, fc2, labels, n, overflow, scores=0, z=0, count=0, partial=0, per_split=0, splits=1):
        """partial, per_split (a multiple of TK): the splits' sums into partial instead, splits of them."""
        self.launch(stream, (ceil_div(n, self.IMGS), splits), (self.THREADS, 1, 1), feat, fc1, fc2, labels, n, overflow,
                    scores, z, count, partial, per_split, shared=self.bytes)


class FullyConnected(Launcher):
    """fc1 -> ReLU -> fc2 -> argmax in one kernel: on Hopper's warpgroup MMA in 3xTF32 where its shapes
    fit (fc_kernel6, FullyConnectedWarpgroup), else on the tensor cores in 3xTF32 (fc_kernel5, sm_80
    and later, up to 256 hidden units) for 32 images a block, else register-tiled on the FP32 cores
    (fc_kernel4) for 32 images a block (16 where shared memory is short). For large feature counts
    and few images fc1 is split over blocks (fc_kernel6 or fc_kernel5, or fc_kernel2 for FC_IMGS images a block)
    and the splits added in order (fc_kernel3). fc1 goes to the GPU as fc1_operand lays it out."""
    source, kernel, arg_types = "fc", "fc_kernel4", "PPPPiPP"
    IMGS = 16
    SUM_IMGS = 4  # fc_kernel3's images a block (more blocks for the few images that take splits)
    TC_IMGS, TC_BK, TC_STAGES, TC_MAX_HIDDEN = 32, 32, 3, 256  # fc_kernel5's images a block, k-tile, depth, widest layer
    SPLIT_FEATURES = 4096  # from here on fc1 (at least 4096 x hidden) is split when blocks are few
    TARGET_BLOCKS = 264  # two per SM on an H100
    # a large fc1's feature split aims at an eighth of those, one chunk's share of the GPU when the
    # default 8 streams run chunks side by side (264: 4-8% slower GPU time on 64x64x1, 96x96x3, 128x128x3)
    SPLIT_BLOCKS = TARGET_BLOCKS // 8
    # fc_kernel6 splits at its FP32 adds for up to this many images: fewer blocks than TARGET_BLOCKS
    SPLIT_FC6_MAX = FullyConnectedWarpgroup.IMGS * (TARGET_BLOCKS - 1)

    @classmethod
    def shared(cls, g, imgs, tile, row):
        """Static shared bytes of an FP32 kernel with `imgs` images a block, fc1 tiles of `tile` rows
        and feature tile rows of `row` floats."""
        return 4 * (tile * g.hidden + max(row * imgs, imgs * (g.hidden + 1)) + imgs * g.classes)

    @classmethod
    def tc_shared(cls, g):
        """fc_kernel5's dynamic shared bytes: its pipeline stages, later the hidden layer and scores."""
        stage = cls.TC_IMGS * (cls.TC_BK + 4) + cls.TC_BK * (32 * ceil_div(g.hidden, 32) + 8)
        return 4 * max(cls.TC_STAGES * stage, cls.TC_IMGS * (g.hidden + 1 + g.classes))

    @classmethod
    def defines(cls, g):
        def fits(tile):  # fc_kernel2/3 and fc_kernel4 in the 48 KB of static shared memory
            return max(cls.shared(g, cls.IMGS, tile, tile), cls.shared(g, 16, tile, tile + 4)) <= 48 * 1024

        tile = next((t for t in (32, 16) if fits(t)), None)  # 16 for wide hidden layers
        if not 32 <= g.hidden <= 512 or g.hidden % 4 or tile is None:
            raise ValueError(f"the fused fc kernel needs 32..512 hidden units (a multiple of 4) and few classes; "
                             f"the model has {g.hidden} and {g.classes}")
        tiled = 32 if g.hidden >= 64 and cls.shared(g, 32, tile, tile + 4) <= 48 * 1024 else 16  # registers: 16 when small
        return dict(FEAT=g.flat, HIDDEN=g.hidden, CLASSES=g.classes, FC_IMGS=cls.IMGS, FC3_IMGS=cls.SUM_IMGS, FC_TILE=tile,
                    FC4_IMGS=tiled)

    def __init__(self, build, g, tensor_cores=None, wgmma=None):
        """tensor_cores: None picks fc_kernel5 wherever it runs; False or True forces the choice.
        wgmma (with the tensor cores): None picks fc_kernel6 wherever it runs; False or True forces it."""
        import pycuda.driver as cuda

        defines = self.defines(g)
        super().__init__(build, **defines)
        self.hidden, self.flat, self.tiled_imgs, self.tile = g.hidden, g.flat, defines["FC4_IMGS"], defines["FC_TILE"]
        fits = int(build.arch[3:]) >= 80 and g.hidden <= self.TC_MAX_HIDDEN
        if tensor_cores and not fits:
            raise ValueError(f"fc_kernel5 needs sm_80 and at most {self.TC_MAX_HIDDEN} hidden units")
        self.tensor_cores = fits if tensor_cores is None else tensor_cores
        why = FullyConnectedWarpgroup.fits(g, build.arch) if self.tensor_cores else "fc_kernel6 runs on the tensor cores"
        if wgmma and why:
            raise ValueError(why)
        self.warpgroup = FullyConnectedWarpgroup(build, g) if why is None and wgmma is not False else None
        self.add_splits = self.module.get_function("fc_kernel3")
        self.add_splits.prepare("PPPiPPiPP")
        if self.tensor_cores:
            self.tc, self.tc_bytes, self.tc_threads = self.module.get_function("fc_kernel5"), self.tc_shared(g), 32 * ceil_div(g.hidden, 32)
            self.tc.prepare("PPPPiPPPiPP")
            self.tc.set_attribute(cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, self.tc_bytes)
        else:
            self.split_sum = self.module.get_function("fc_kernel2")
            self.split_sum.prepare("PPPii")
        # the images a block of the kernel that sums the splits
        self.block_imgs = FullyConnectedWarpgroup.IMGS if self.warpgroup else self.TC_IMGS if self.tensor_cores else self.IMGS

    def fc1_operand(self, fc1):
        """fc1 (features, hidden) as this launcher's kernel reads it from the GPU."""
        return FullyConnectedWarpgroup.weights(fc1) if self.warpgroup else np.ascontiguousarray(fc1, np.float32)

    def splits(self, n):
        """Feature splits for n images: blocks enough for a chunk's share of the GPU (SPLIT_BLOCKS), each
        at least 4 tiles long; on fc_kernel6 below SPLIT_FEATURES, where its blocks of n images would not
        fill the GPU, one split per CHUNK of features it sums in the tensor cores before adding in FP32:
        the unsplit kernel's bits, a block's k-loop a quarter as long on ECE408's 1,024 features (a run's
        last chunks classified sooner; a streamed launch of 32,768 images ran 2% slower split)."""
        if self.flat < self.SPLIT_FEATURES:
            few = self.warpgroup and n <= self.SPLIT_FC6_MAX
            return ceil_div(self.flat, FullyConnectedWarpgroup.CHUNK) if few else 1
        return max(1, min(self.flat // (4 * self.tile), ceil_div(self.SPLIT_BLOCKS, ceil_div(n, self.block_imgs))))

    def per_split(self, splits):
        """The features each of `splits` splits sums (the last may sum fewer)."""
        if self.warpgroup and self.flat < self.SPLIT_FEATURES:
            return FullyConnectedWarpgroup.CHUNK
        return ceil_div(ceil_div(self.flat, splits), self.tile) * self.tile

    def partial_floats(self, chunk):
        """Scratch for the splits' partial sums of up to `chunk` images (large features: splits * n <=
        imgs * SPLIT_BLOCKS + n)."""
        if self.flat < self.SPLIT_FEATURES:
            most = min(chunk, self.SPLIT_FC6_MAX)  # the most images split
            splits = self.splits(most)
            return splits * most * self.hidden if splits > 1 else 0
        return (self.block_imgs * self.SPLIT_BLOCKS + chunk) * self.hidden

    def __call__(self, stream, feat, fc1, fc2, labels, n, overflow, scores=0, partial=0, z=0, count=0):
        """scores: a device pointer for the (n, classes) scores, or 0 for none; partial: scratch of
        partial_floats(n) floats; z: where fc1's sums before ReLU go (n, hidden), or 0; count: a
        device int, the images to classify of the n (0: all n). z and count need fc_kernel6 or fc_kernel5."""
        splits = self.splits(n)
        if self.warpgroup and splits == 1:
            return self.warpgroup(stream, feat, fc1, fc2, labels, n, overflow, scores, z, count)
        if (z or count) and not self.tensor_cores:
            raise ValueError("fc1's sums and a device-set count need fc_kernel5 or fc_kernel6")
        per_split = self.per_split(splits)
        splits = ceil_div(self.flat, per_split)
        if self.warpgroup:
            self.warpgroup(stream, feat, fc1, fc2, labels, n, overflow, count=count, partial=partial,
                           per_split=per_split, splits=splits)
        elif self.tensor_cores:
            self.launch(stream, (ceil_div(n, self.TC_IMGS), splits), (self.tc_threads, 1, 1), feat, fc1, fc2, labels, n,
                        overflow, scores, partial, per_split, z, count, shared=self.tc_bytes, function=self.tc, name="fc_kernel5")
        elif splits == 1:
            self.launch(stream, (ceil_div(n, self.tiled_imgs), 1), (self.hidden, 1, 1), feat, fc1, fc2, labels, n,
                        overflow, scores)
        else:
            self.launch(stream, (ceil_div(n, self.IMGS), splits), (self.hidden, 1, 1), feat, fc1, partial, n, per_split,
                        function=self.split_sum, name="fc_kernel2")
        if splits > 1:
            self.launch(stream, (ceil_div(n, self.SUM_IMGS), 1), (self.hidden, 1, 1), partial, fc2, labels, n, overflow,
                        scores, splits, z, count, function=self.add_splits, name="fc_kernel3")
