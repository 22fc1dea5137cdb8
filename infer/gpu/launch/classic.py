"""The classic pipeline's launchers (--conv-algo unroll, and the implicit-GEMM convs): unroll, the tiled GEMMs
(GEMMS: --gemm-algo), placeIntoY, pool, argmax, and Conv (implicit GEMM + ReLU + pool)."""
import functools
from typing import NamedTuple

import numpy as np

from .. import operands
from .base import Launcher, _check_int32, ceil_div, needs_hopper, version_of


class GemmSpec(NamedTuple):
    kernel: str  # its exported name, in cuda/gemm<version>.cu
    version: int
    tiles: tuple  # --tile-width: version 1's square tile; the rows of the block tile of 2, 3 and 4
    min_arch: int  # the oldest architecture it runs on
    hopper_only: bool = False  # sm_90a instructions (wgmma): Hopper and nothing later


# The classic pipeline's GEMMs (--gemm-algo), auto's order of preference. Versions 1-3 compute
# weights . unrolled (C_out x pixels, then placeIntoY); version 4 the transposed product, NHWC.
GEMMS = {"wgmma": GemmSpec("gemm_kernel4", 4, (128,), 90, True), "tf32x3": GemmSpec("gemm_kernel3", 3, (32, 64, 128), 80),
         "blocked": GemmSpec("gemm_kernel2", 2, (32, 64, 128), 0), "tiled": GemmSpec("gemm_kernel1", 1, (8, 16, 32), 0)}


TILE_WIDTHS = tuple(sorted({t for spec in GEMMS.values() for t in spec.tiles}))


def gemm_runs_on(name, arch):
    """None when --gemm-algo name runs on GPU architecture arch (sm_XY), else why not."""
    spec, why = GEMMS[name], needs_hopper(arch)
    if spec.hopper_only and why:
        return f"the {name} GEMM {why}"
    if int(arch[3:]) < spec.min_arch:
        return f"the {name} GEMM needs sm_{spec.min_arch} or later, this GPU is {arch}"
    return None


class Unroll(Launcher):
    """x (n, h, w, c) unrolled for a k x k conv: (k*k*c, pixels) for GEMM versions 1-3 (unroll_kernel2),
    or transposed, (pixels, row(k, c)) with zero-padded rows, for version 4 (unroll_kernel3)."""
    source = "unroll"
    SHORT_ROW = 64  # unroll_kernel3: rows up to this many floats get 8 or 16 lanes, longer ones a warp

    def __init__(self, build, transposed=False):
        self.transposed = transposed
        self.kernel, self.arg_types = ("unroll_kernel3", "PPiiiiii") if transposed else ("unroll_kernel2", "PPiiiii")
        super().__init__(build, SHORT_ROW=self.SHORT_ROW)

    @staticmethod
    def row(k, c):
        """Floats in a row of the transposed layout: k*k*c rounded up to 4 (16-byte aligned rows)."""
        return ceil_div(k * k * c, 4) * 4

    def __call__(self, stream, x, u, n, h, w, c, k):
        pixels, row = n * (h - k + 1) * (w - k + 1), self.row(k, c)
        _check_int32(unrolled_elements=row * pixels)
        if self.transposed:  # 8 or 16 lanes a pixel for short rows, else a warp
            per_block = 256 // (8 if row <= 32 else 16 if row <= self.SHORT_ROW else 32)
            self.launch(stream, (min(ceil_div(pixels, per_block), 65535), 1), (256, 1, 1), x, u, n, h, w, c, k, row)
        else:
            self.launch(stream, (min(ceil_div(pixels, 256), 65535), 1), (256, 1, 1), x, u, n, h, w, c, k)


def gemm_choice(name, tile_width, arch):
    """The GEMM (name, version) that --gemm-algo name (auto: the fastest here) and --tile-width
    (None: any) select on architecture arch, or raise ValueError saying why none can."""
    for candidate in (GEMMS if name == "auto" else [name]):
        if gemm_runs_on(candidate, arch) is None and (tile_width is None or tile_width in GEMMS[candidate].tiles):
            return candidate, GEMMS[candidate].version
    if name == "auto":
        raise ValueError(f"no GEMM has tile width {tile_width} on {arch}")
    why = gemm_runs_on(name, arch)
    if why:
        raise ValueError(why)
    raise ValueError(f"the {name} GEMM has tile widths {', '.join(map(str, GEMMS[name].tiles))}, not {tile_width}")


class Gemm(Launcher):
    """c = a . b (+ReLU) in one of the GEMM versions; `tile` None picks, for version 2 and 3, the
    smallest block tile covering `rows` (all of M in one block row where it fits), 16 for version 1.
    Version 4 (sm_90a) takes b as `weights` lays it out, in column blocks of 16, 32 or 64: the
    smallest covering `cols` (N)."""
    arg_types = "PPPiiii"
    BN, THREADS, STAGES = 128, 256, 3
    V4_BNS, V4_STAGES, V4_BK = (16, 32, 64), 4, 16

    def __init__(self, build, version, tile=None, rows=None, cols=None):
        spec = next(spec for spec in GEMMS.values() if spec.version == version)
        tiles = spec.tiles
        if tile is None:
            tile = 16 if version == 1 else next((t for t in tiles if rows is not None and t >= rows), tiles[-1])
        if tile not in tiles:
            raise ValueError(f"GEMM version {version} has tile widths {tiles}, not {tile}")
        self.kernel, self.version, self.tile, self.source = spec.kernel, version, tile, f"gemm{version}"
        if version == 4:
            self.bn = next((bn for bn in self.V4_BNS if cols is not None and cols <= bn), self.V4_BNS[-1])
            self.shared = 4 * self.V4_STAGES * (tile * (self.V4_BK + 4) + 2 * self.V4_BK * self.bn)
            super().__init__(build, "sm_90a", TILE_WIDTH=tile, GEMM_BN=self.bn, SHARED_FLOATS=self.shared // 4)
        elif version == 3:
            self.shared = 4 * self.STAGES * (tile * 20 + 16 * (self.BN + 8))
            super().__init__(build, TILE_WIDTH=tile, SHARED_FLOATS=self.shared // 4)
        else:
            self.shared = 0
            super().__init__(build, TILE_WIDTH=tile)
        if self.shared:
            import pycuda.driver as cuda

            self.function.set_attribute(cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, self.shared)

    def weights(self, b):
        """The (K, N) b operand as this version reads it: as it is, or (version 4) split and laid out."""
        if self.version == 4:
            return operands.wgmma_column_blocks(b, self.bn, self.V4_BK)
        return b

    def __call__(self, stream, a, b, c, m, n, k, relu):
        _check_int32(a_elements=m * k, b_elements=k * n, c_elements=m * n)
        if self.version == 1:
            grid, block = (ceil_div(n, self.tile), ceil_div(m, self.tile)), (self.tile, self.tile, 1)
        elif self.version == 4:
            if k % 4 == 0 and int(a) % 16:
                raise ValueError("gemm_kernel4 copies rows of a 16 bytes at a time: a must be 16-byte aligned")
            grid, block = (ceil_div(m, self.tile), ceil_div(n, self.bn)), (self.THREADS, 1, 1)
        else:
            grid, block = (ceil_div(n, self.BN), ceil_div(m, self.tile)), (self.THREADS, 1, 1)
        if grid[1] > 65535:
            raise ValueError(f"GEMM with {m} rows needs more than 65535 row tiles; use a smaller --chunk")
        self.launch(stream, grid, block, a, b, c, m, n, k, int(relu), shared=self.shared)


class Conv(Launcher):
    """One conv layer -> ReLU -> 2x2 average pool of any geometry, an implicit GEMM on the tensor
    cores in 3xTF32: x (n, h, w, c) -> (n, (h-k+1)//2, (w-k+1)//2, c_out). Version 1 on mma.sync
    (sm_80 and later, conv_kernel1), weights (k, k, c, c_out) as stored; version 2 on Hopper's wgmma (sm_90a, conv_kernel2),
    weights as pipelines.ImplicitWarpgroup lays them out for column blocks of `bn` channels; version
    3 (conv_kernel3) version 2's bits for the layers `whole` takes, persistent blocks (blocks_per_sm);
    version 4 (conv_kernel4) version 2's bits for the layers `staged` takes, A from x staged once a block."""
    arg_types = "PPPi"
    THREADS = 256
    BK = {1: 16, 2: 32, 3: 16}  # k-tiles (conv_kernel3: the k padding of its weights; conv_kernel4's: pipeline)
    ARCH = {2: "sm_90a", 3: "sm_90a", 4: "sm_90a"}
    WHOLE_BYTES = 110 * 1024  # conv_kernel3's most shared memory: two blocks an SM
    STAGED_BYTES = 113 * 1024  # conv_kernel4's: two blocks an SM

    def __init__(self, build, h, w, c, k, c_out, kernel="conv_kernel1"):
        version = version_of(kernel)
        if version == 4 and (why := self.staged(h, w, c, k, c_out)):
            raise ValueError(why)
        defines = self.defines(version, h, w, c, k, c_out)
        self.kernel, self.source, self.version = kernel, f"conv{version}", version
        self.bn, self.bk, self.c_out, self.image = defines["BN"], defines["CONV_BK"], c_out, h * w * c
        self.windows = ((h - k + 1) // 2) * ((w - k + 1) // 2)
        self.block_windows, self.shared = self.layout(version, self.bn, h, w, c, k)
        super().__init__(build, self.ARCH.get(version), **defines)
        self.blocks = defines.get("MIN_BLOCKS", 0) * build.sms  # version 3's grid: every block resident
        import pycuda.driver as cuda

        self.function.set_attribute(cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, self.shared)
        if version > 1:  # all of the SM's memory as shared memory: two blocks of conv_kernel2's 103 KB fit only so
            self.function.set_attribute(cuda.function_attribute.PREFERRED_SHARED_MEMORY_CARVEOUT, 100)

    @classmethod
    def defines(cls, version, h, w, c, k, c_out):
        """The -D options of a layer (input h x w x c, k x k, c_out channels) for conv_kernel<version>."""
        bn = cls.column_block(version, c_out)
        shared = cls.layout(version, bn, h, w, c, k)[1]
        whole = dict(SPAN=cls.span(h, w, c, k), MIN_BLOCKS=cls.blocks_per_sm(bn, shared)) if version == 3 else {}
        staged = dict(SPAN_PIX=cls.span_pixels(h, w, k), CONV_STAGES=cls.pipeline(bn, h, w, c, k)[1]) if version == 4 else {}
        return dict(IN_H=h, IN_W=w, IN_C=c, KS=k, C_OUT=c_out, BN=bn, CONV_BK=cls.tile(version, bn, h, w, c, k),
                    SHARED_FLOATS=shared // 4, **whole, **staged)

    @classmethod
    def tile(cls, version, bn, h, w, c, k):
        """The k-tile: conv_kernel4's is 32 where two blocks of it fit an SM so, else 16."""
        return cls.pipeline(bn, h, w, c, k)[0] if version == 4 else cls.BK[version]

    STAGED_PIPELINES = ((32, 3), (16, 4), (16, 3))  # conv_kernel4's (k-tile, stages), in order of preference

    @classmethod
    def pipeline(cls, bn, h, w, c, k):
        """conv_kernel4's (k-tile, stages) for a layer: the first of STAGED_PIPELINES whose shared memory
        fits two blocks an SM, or None."""
        return next((p for p in cls.STAGED_PIPELINES if cls.staged_bytes(*p, bn, h, w, c, k) <= cls.STAGED_BYTES), None)

    @classmethod
    def staged_bytes(cls, bk, stages, bn, h, w, c, k):
        """conv_kernel4's shared memory: the span (pixels c + 4 floats apart), then the weights' stages."""
        return 4 * (cls.span_pixels(h, w, k) * (c + 4) + stages * 2 * bk * bn)

    @staticmethod
    def column_block(version, c_out):
        """The channels of a column block (BN): the smallest size that holds c_out, else the largest."""
        sizes = (32, 64, 128) if version == 1 else (16, 32, 64)
        return next((bn for bn in sizes if c_out <= bn), sizes[-1])

    @classmethod
    def blocks_per_sm(cls, bn, shared):
        """conv_kernel3's blocks an SM: 4 (64 registers a thread) unless its accumulators are 64 channels
        wide, then 2; fewer where their shared memory does not fit."""
        return max(1, min(2 if bn == 64 else 4, cls.SM_SHARED // (shared + 1024)))

    @classmethod
    def layout(cls, version, bn, h, w, c, k):
        """(pool windows per block, or per group for version 3; dynamic shared bytes). Versions 1, 2:
        the block's row table (one int per GEMM row, 4 rows a window), then its pipeline stages of an
        a tile and a k-tile of weights. Version 3: the column block's weights, two stretches of x
        (span), a k offset per k. Version 4: its stretch of x (span_pixels), then its weights' stages."""
        bk = cls.tile(version, bn, h, w, c, k)
        if version == 1:
            windows = 16 * (8 // (bn // 32))
            rows, stages = 4 * windows, 2 if bn == 32 else 3
            return windows, 4 * (rows + stages * (rows * (bk + 4) + bk * (bn + 8)))
        if version == 3:
            kp = ceil_div(k * k * c, bk) * bk
            return 32, 4 * (kp * 2 * bn + 2 * cls.span(h, w, c, k) + kp)
        if version == 4:
            return 32, cls.staged_bytes(*cls.pipeline(bn, h, w, c, k), bn, h, w, c, k)
        windows, rows, stages = 32, 128, 4 if bk == 16 else 3
        return windows, 4 * (rows + stages * (rows * (bk + 4) + 2 * bk * bn))

    @staticmethod
    @functools.lru_cache(maxsize=None)
    def span(h, w, c, k):
        """conv_kernel3's SPAN: the most floats of x one group of 32 pool windows reads, from its first
        window's top-left value to its last window's last, plus 3 for a 16-byte aligned start, in 4s.
        The most over every group: a group's reach depends on where in an image it starts."""
        ph, pw = (h - k + 1) // 2, (w - k + 1) // 2
        windows = ph * pw

        def base(win):
            img, rem = np.divmod(win, windows)
            return ((img * h + 2 * (rem // pw)) * w + 2 * (rem % pw)) * c

        first = np.unique(np.arange(windows, dtype=np.int64) * 32 % windows)
        reach = int((base(first + 31) - base(first)).max()) + (w + 1) * c + ((k - 1) * w + k - 1) * c + c - 1
        return ceil_div(reach + 4, 4) * 4

    @staticmethod
    @functools.lru_cache(maxsize=None)
    def span_pixels(h, w, k):
        """conv_kernel4's SPAN_PIX: the most pixels of x one block of 32 pool windows reads, from its
        first window's top-left input to its last window's last (over every block: a block's reach
        depends on where in an image it starts)."""
        ph, pw = (h - k + 1) // 2, (w - k + 1) // 2
        windows = ph * pw

        def pixel(win):
            img, rem = np.divmod(win, windows)
            return (img * h + 2 * (rem // pw)) * w + 2 * (rem % pw)

        first = np.unique(np.arange(windows, dtype=np.int64) * 32 % windows)
        return int((pixel(first + 31) - pixel(first)).max()) + k * w + k + 1

    @classmethod
    def staged(cls, h, w, c, k, c_out):
        """None where conv_kernel4 takes the layer, else why not: inputs of a multiple of 32 channels
        (16 measured 3% slower than conv_kernel2) whose span fits two blocks an SM (STAGED_BYTES)."""
        if c % 32:
            return f"conv_kernel4 is for inputs of a multiple of 32 channels (whole k-tiles a tap); this one has {c}"
        bn = cls.column_block(4, c_out)
        if cls.pipeline(bn, h, w, c, k) is None:
            least = cls.staged_bytes(*cls.STAGED_PIPELINES[-1], bn, h, w, c, k)
            return f"conv_kernel4 would need {least} bytes of shared memory, more than {cls.STAGED_BYTES}"
        return None

    @classmethod
    def whole(cls, h, w, c, k, c_out):
        """None where conv_kernel3 takes the layer, else why not: inputs of 1 to 3 channels (wider ones
        are copied 16 bytes at a time, which conv_kernel2 does well), in WHOLE_BYTES of shared memory."""
        if c % 4 == 0:
            return f"conv_kernel3 is for inputs of 1 to 3 channels (in 4s, conv_kernel2 gathers 16 bytes at a time); this one has {c}"
        shared = cls.layout(3, cls.column_block(3, c_out), h, w, c, k)[1]
        if shared > cls.WHOLE_BYTES:
            return f"conv_kernel3 would need {shared} bytes of shared memory, more than {cls.WHOLE_BYTES}"
        return None

    def __call__(self, stream, x, w, out, n):
        _check_int32(conv_inputs=n * self.image, conv_outputs=n * self.windows * self.c_out)
        if self.version == 4 and int(x) % 16:
            raise ValueError(f"conv_kernel4 copies x 16 bytes at a time: x must be 16-byte aligned, not {int(x)} (mod 16: {int(x) % 16})")
        blocks = ceil_div(n * self.windows, self.block_windows)
        grid = (min(blocks, self.blocks) if self.version == 3 else blocks, ceil_div(self.c_out, self.bn))
        self.launch(stream, grid, (self.THREADS, 1, 1), x, w, out, n, shared=self.shared)


class Place(Launcher):
    source, kernel, arg_types = "place", "place_kernel1", "PPii"

    def __call__(self, stream, y, out, c_out, p):
        self.launch(stream, (ceil_div(p, 32), ceil_div(c_out, 32)), (32, 32, 1), y, out, c_out, p)


class Pool(Launcher):
    source, kernel, arg_types = "pool", "pool_kernel1", "PPiiii"

    def __call__(self, stream, x, out, n, h, w, c):
        total = n * (h // 2) * (w // 2) * c
        _check_int32(pool_inputs=n * h * w * c)
        self.launch(stream, (min(ceil_div(total, 256), 65535 * 8), 1), (256, 1, 1), x, out, n, h, w, c)


class Argmax(Launcher):
    source, kernel, arg_types = "argmax", "argmax_kernel1", "PPiiP"

    def __call__(self, stream, scores, labels, n, classes, overflow):
        self.launch(stream, (ceil_div(n, 128), 1), (128, 1, 1), scores, labels, n, classes, overflow)
