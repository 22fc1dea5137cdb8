"""One launcher per kernel: it owns its launch geometry and checks its preconditions.

Every launch goes through Launcher.launch, which records CUDA events around it when profiling.
"""
import dataclasses
import functools
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np

from . import certify
from ..data import codes
from . import compiler, operands

INT_MAX = 2**31 - 1


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


def version_of(kernel):
    """The version a kernel's exported name carries (fused_kernel3: 3): the -D ..._VERSION its .cu
    file is built with to define it, or the file (fused3.cu)."""
    return int(kernel.rsplit("_kernel", 1)[1])


def needs_hopper(arch):
    """None on Hopper (sm_90), else why kernels with sm_90a instructions (wgmma) cannot run on arch."""
    return None if arch == "sm_90" else f"needs a Hopper GPU (sm_90), this GPU is {arch}"


def gemm_runs_on(name, arch):
    """None when --gemm-algo name runs on GPU architecture arch (sm_XY), else why not."""
    spec, why = GEMMS[name], needs_hopper(arch)
    if spec.hopper_only and why:
        return f"the {name} GEMM {why}"
    if int(arch[3:]) < spec.min_arch:
        return f"the {name} GEMM needs sm_{spec.min_arch} or later, this GPU is {arch}"
    return None


def ceil_div(a, b):
    return -(-a // b)


@dataclasses.dataclass
class Build:
    """What every kernel of one run is compiled and launched with."""
    arch: str
    fast_math: bool
    tile_width: object  # --tile-width, or None for each GEMM's own choice
    profiler: object
    gemm: str = "auto"  # --gemm-algo
    l2_bytes: int = 32 << 20
    sms: int = 108
    modules: dict = dataclasses.field(default_factory=dict)  # loaded modules of this context, by (source, defines)


@functools.lru_cache(maxsize=None)
def _cubin(name, arch, defines, fast_math):
    return compiler.cubin(name, arch, dict(defines), fast_math)


class _Recording(dict):
    """A Build's modules while prefetch makes a pipeline: every module a stand-in, its key noted."""

    def __init__(self):
        super().__init__()
        self.wanted = []

    def __contains__(self, key):
        self.wanted.append(key)
        return True

    def __getitem__(self, key):
        return _StandIn()


class _StandIn:
    """A module, function or global that takes every call and attribute and does nothing."""

    def __getattr__(self, name):
        return _StandIn()

    def __call__(self, *args, **kwargs):
        return _StandIn()

    def __getitem__(self, index):
        return _StandIn()

    def __iter__(self):  # iterated (as by tools walking sys.modules), it holds nothing
        return iter(())


def recorded(build, make):
    """(make(b), the cubins' keys it asked for) where b is a copy of build whose modules are
    stand-ins: nothing compiled, loaded or launched. Where PyCUDA is not installed (a planning or
    build machine), stand-ins take its place while make runs; sys.modules is left as it was."""
    recording = dataclasses.replace(build, modules=_Recording())
    try:
        import pycuda.driver  # noqa: F401
    except ImportError:
        saved = {name: sys.modules.get(name) for name in ("pycuda", "pycuda.driver")}
        sys.modules.update({name: _StandIn() for name in saved})
        try:
            return make(recording), list(dict.fromkeys(recording.modules.wanted))
        finally:
            for name, module in saved.items():
                if module is None:
                    sys.modules.pop(name, None)
                else:
                    sys.modules[name] = module
    return make(recording), list(dict.fromkeys(recording.modules.wanted))


def prefetch(build, make):
    """Build at once, in parallel, the cubins that make(build) loads (a pipeline's constructor),
    listed by recorded(); nvcc runs for each one missing from the cache, a thread each. Built one
    after another, testfull's default pipeline took 10.6 s on an empty cache (H200)."""
    try:
        _, wanted = recorded(build, make)
    except Exception:  # the real construction, next, says what is wrong
        return
    keys = [k for k in wanted if k not in build.modules]
    if len(keys) > 1:
        with ThreadPoolExecutor(len(keys), thread_name_prefix="cnninfer-nvcc") as pool:
            list(pool.map(lambda k: _cubin(*k), keys))


class Launcher:
    """A kernel of cuda/<source>.cu: compiled once per process, loaded once per context (a module
    dies with its context), prepared once."""
    source = kernel = arg_types = None
    DIRECTED_ROUNDING = False  # its bounds round up: never built with --use_fast_math (flushes subnormals)
    SM_SHARED = 228 * 1024  # an H100's shared memory an SM (1 KB of it per block for the driver)

    def __init__(self, build, arch=None, **defines):
        """arch: the compile target where it is not the GPU's own (sm_90a for Hopper-only instructions)."""
        self.build = build
        arch = arch or build.arch
        fast_math = build.fast_math and not self.DIRECTED_ROUNDING
        key = (self.source, arch, tuple(sorted(defines.items())), fast_math)
        if key not in build.modules:
            import pycuda.driver as cuda

            build.modules[key] = cuda.module_from_buffer(_cubin(self.source, arch, key[2], fast_math))
        self.module = build.modules[key]
        self.function = self.module.get_function(self.kernel)
        self.function.prepare(self.arg_types)

    def launch(self, stream, grid, block, *args, shared=0, function=None, name=None):
        """Launch the kernel (or another `function` of the module, named `name`) on stream."""
        name = name or self.kernel
        self.build.profiler.start(name, stream)
        (function or self.function).prepared_async_call(grid, block, stream, *args, shared_size=shared)
        self.build.profiler.stop(name, stream)


def _check_int32(**counts):
    for name, value in counts.items():
        if value > INT_MAX:
            raise ValueError(f"{name} = {value} overflows the kernels' 32-bit indexing; use a smaller --chunk")


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


class Convert(Launcher):
    """Integer images (as uploaded) to float32 on the GPU, exactly as NumPy's astype."""
    source, kernel, arg_types = "stage", "convert_kernel1", "PPq"
    TYPES = {"u1": "unsigned char", "i1": "signed char", "u2": "unsigned short", "i2": "short",
             "u4": "unsigned int", "i4": "int", "u8": "unsigned long long", "i8": "long long"}

    def __init__(self, build, dtype):
        super().__init__(build, SRC_T=self.TYPES[dtype.kind + str(dtype.itemsize)])

    def __call__(self, stream, src, dst, n):
        self.launch(stream, (min(ceil_div(n, 256), 4096), 1), (256, 1, 1), src, dst, n)


class ConvertCodes(Launcher):
    """8-bit codes of float32 images (infer/data/codes.py) to the float32 values they stand for, in the
    scaling of the codes wire `wire`."""
    source, kernel, arg_types = "stage", "convert_kernel2", "PPqfi"

    def __init__(self, build, wire):
        super().__init__(build)
        self.scaling = codes.SCALINGS[wire]

    def __call__(self, stream, src, dst, n):
        self.launch(stream, (min(ceil_div(n, 256), 4096), 1), (256, 1, 1), src, dst, n, codes.SCALE, self.scaling)


def converter(build, wire):
    """The launcher turning images uploaded in type `wire` into float32."""
    return ConvertCodes(build, wire) if wire in codes.WIRES else Convert(build, wire)


class Check(Launcher):
    """*bad = min(*bad, first image holding a value that is not finite) over float32 images (for the
    pipelines whose kernels do not check the images as they read them)."""
    source, kernel, arg_types = "stage", "check_kernel2", "PiiP"

    def __call__(self, stream, x, n, per_image, bad):
        self.launch(stream, (min(ceil_div(n * per_image, 4 * 256), 4096), 1), (256, 1, 1), x, n, per_image, bad)


class DecodeCheck(Launcher):
    """bad[0] = min(bad[0], first + c) for every chunk c not decoded to chunk_bytes; with
    adler (zlib streams) bad[1] likewise where the decoded bytes fail the stream's adler32."""
    source, kernel, arg_types = "decode", "decode_check_kernel1", "PPPPPqqiiP"

    def __call__(self, stream, chunks, src_ptrs, src_bytes, decoded_bytes, statuses, decoded, chunk_bytes, stride, adler,
                 first, bad):
        self.launch(stream, (chunks, 1), (1024, 1, 1), src_ptrs, src_bytes, decoded_bytes, statuses, decoded,
                    chunk_bytes, stride, int(adler), first, bad)


class FrameDecoder(Launcher):
    """Compressed streams decoded a warp each, every stream into its own output; statuses OK, BAD
    (damaged, or reading past its size) or FULL (decoding to more than its output holds)."""
    OK, BAD, FULL = 0, 1, 2

    def check_count(self, count):
        if not 0 < count <= INT_MAX:
            raise ValueError(f"{self.kernel} decodes 1 to {INT_MAX} streams a launch, not {count}")

    def __init__(self, build, **defines):
        import pycuda.driver as cuda

        super().__init__(build, **defines)
        # a block's shared memory (10-17 KB): as many an SM as fit
        self.function.set_attribute(cuda.function_attribute.PREFERRED_SHARED_MEMORY_CARVEOUT, 100)

    def __call__(self, stream, count, src_ptrs, src_bytes, dst_bytes, actual_bytes, dst_ptrs, statuses):
        """Every argument but count a device address of an array of count: source pointers, source
        sizes, output capacities, decoded sizes (out, uint64), output pointers, statuses (out, int32)."""
        self.check_count(count)
        self.launch(stream, (count, 1), (32, 1, 1), src_ptrs, src_bytes, dst_bytes, actual_bytes, dst_ptrs, statuses)


class Inflate(FrameDecoder):
    """Deflate streams (zlib's without header and trailer) decoded by inflate_kernel1, outputs 4-byte aligned."""
    source, kernel, arg_types = "inflate", "inflate_kernel1", "PPPPPP"
    WINDOW = 8192  # recent output bytes a block keeps in shared memory (matches from further back read the output)

    def __init__(self, build, window=None):
        window = window or self.WINDOW
        if window < 1024 or window & (window - 1):
            raise ValueError(f"the window is a power of two of at least 1024 bytes, not {window}")
        super().__init__(build, WINDOW=window)


class Zstd(FrameDecoder):
    """Zstandard frames (no dictionary; a content checksum skipped) decoded by zstd_kernel1."""
    source, kernel, arg_types = "zstd", "zstd_kernel1", "PPPPPP"


class Lzf(FrameDecoder):
    """LZF streams (h5py's lzf filter: liblzf's format, no header) decoded by lzf_kernel1."""
    source, kernel, arg_types = "lzf", "lzf_kernel1", "PPPPPP"


class ZstdApart(FrameDecoder):
    """Zstandard frames decoded by zstd_kernel2: a frame's blocks decoded apart by WARPS - 1 warps
    into scratch memory, their sequences carried out in order by another; a frame of more than 128
    blocks, or finding the scratch pool taken, decoded whole by one warp (zstd_kernel1's way)."""
    source, kernel, arg_types = "zstd", "zstd_kernel2", "PPPPPPPQP"
    WARPS = 3
    SCRATCH = 1.0  # scratch bytes a frame's decoded byte (MNIST: Zstd 3 takes 0.35, shuffled 0.61)
    TABLE_BYTES = 15368  # a decoding warp's tables (zstd.cuh's ZTables; the build asserts the size)

    def __init__(self, build):
        import pycuda.driver as cuda

        super().__init__(build, **self.defines())
        self.shared = (self.WARPS - 1) * self.TABLE_BYTES
        self.function.set_attribute(cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, self.shared)

    @classmethod
    def defines(cls):
        return dict(ZWARPS=cls.WARPS, ZTABLES_BYTES=cls.TABLE_BYTES)

    def __call__(self, stream, count, src_ptrs, src_bytes, dst_bytes, actual_bytes, dst_ptrs, statuses, scratch,
                 scratch_bytes):
        """As FrameDecoder's, and `scratch`: a device buffer of 256 + scratch_bytes bytes, its first
        8 counting what the frames take (zeroed here, on the stream)."""
        import pycuda.driver as cuda

        self.check_count(count)
        scratch = int(scratch)
        cuda.memset_d32_async(scratch, 0, 2, stream)
        self.launch(stream, (count, 1), (32 * self.WARPS, 1, 1), src_ptrs, src_bytes, dst_bytes, actual_bytes, dst_ptrs,
                    statuses, scratch + 256, scratch_bytes, scratch, shared=self.shared)


class BloscLz4(Launcher):
    """c-blosc chunks of lz4 streams decoded by blosc_lz4_kernel1, a warp per (chunk, block, value
    byte), each chunk into its own output; bad[0] = min(bad[0], first + every chunk that fails)."""
    source, kernel, arg_types = "lz4", "blosc_lz4_kernel1", "PPPiqqiiP"
    WARPS = 4

    def __init__(self, build):
        super().__init__(build, WARPS=self.WARPS)

    def __call__(self, stream, count, chunk_ptrs, chunk_sizes, out_ptrs, chunk_bytes, block_bytes, typesize, first, bad):
        """chunk_ptrs, chunk_sizes, out_ptrs: device addresses of arrays of count uint64."""
        warps = count * ceil_div(chunk_bytes, block_bytes) * typesize
        if not 0 < count or warps > INT_MAX * self.WARPS:
            raise ValueError(f"blosc_lz4_kernel1 takes 1 to {INT_MAX * self.WARPS} warps a launch, not {warps}")
        self.launch(stream, (ceil_div(warps, self.WARPS), 1), (32 * self.WARPS, 1, 1), chunk_ptrs, chunk_sizes, out_ptrs,
                    count, chunk_bytes, block_bytes, typesize, first, bad)


class _PerValueSize(Launcher):
    """A decode.cu kernel built for values of value_bytes bytes (1, 2, 4 or 8)."""
    source = "decode"

    def __init__(self, build, value_bytes):
        if value_bytes not in (1, 2, 4, 8):
            raise ValueError(f"no {self.kernel} for {value_bytes}-byte values")
        super().__init__(build, VALUE_BYTES=value_bytes)


class Unshuffle(_PerValueSize):
    """values values of value_bytes bytes from value first_value of decoded chunks stored
    byte-shuffled (HDF5's shuffle), chunk_values values each, stride bytes apart, into consecutive
    values of dst."""
    kernel, arg_types = "unshuffle_kernel1", "PPqqqq"

    def __call__(self, stream, decoded, dst, first_value, values, chunk_values, stride):
        self.launch(stream, (min(ceil_div(values, 256), 8192), 1), (256, 1, 1), decoded, dst, first_value, values,
                    chunk_values, stride)


class BitUnshuffle(_PerValueSize):
    """chunks of chunk_values values of value_bytes bytes stored back to back, each bitshuffled in
    blocks of `block` values (see decode.cu), into consecutive values of dst."""
    kernel, arg_types = "bitunshuffle_kernel1", "PPqqqi"

    def __call__(self, stream, src, dst, chunks, chunk_values, block, exact_tail):
        if block <= 0 or block % 8:
            raise ValueError(f"bitshuffled blocks hold a positive multiple of 8 values, not {block}")
        groups = chunks * ceil_div(chunk_values, 8)
        self.launch(stream, (min(ceil_div(groups, 256), 8192), 1), (256, 1, 1), src, dst, chunks, chunk_values, block,
                    int(exact_tail))


class BitUnshuffleRange(_PerValueSize):
    """BitUnshuffle keeping `values` values from value first_value of the chunks on (numbered across
    them), written from dst on."""
    kernel, arg_types = "bitunshuffle_kernel2", "PPqqqiqq"

    def __call__(self, stream, src, dst, chunks, chunk_values, block, exact_tail, first_value, values):
        if block <= 0 or block % 8:
            raise ValueError(f"bitshuffled blocks hold a positive multiple of 8 values, not {block}")
        if not 0 <= first_value and first_value + values <= chunks * chunk_values:
            raise ValueError(f"values {first_value} to {first_value + values} lie outside {chunks} chunks")
        groups = ceil_div(values, 8) + 2  # those holding the values, a partial one at each end
        self.launch(stream, (min(ceil_div(groups, 256), 8192), 1), (256, 1, 1), src, dst, chunks, chunk_values, block,
                    int(exact_tail), first_value, values)


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


class Certify(Launcher):
    """The certificate of the low-precision pass and the recomputation around it (cuda/certify.cu):
    certify_kernel3 (32 images a block) and pair_kernel1 on the (image, class) pairs its first stage
    left (certify_kernel2: 16 images a block, both stages in one; certify_kernel1: 32 images a block,
    one block an SM), sm_90a; compact_kernel1 (one block) and scatter_kernel1 (the recomputation,
    fused_kernel3, reads the listed images where they lie). certify_kernel4 computes fc1 itself from
    float16 operands, certify_kernel5 likewise from fused_kernel6's float16 features and bounds (with
    pair_kernel2). The shapes it takes: 10 classes, 128 hidden units, features in 64s."""
    source = "certify"
    KERNELS = {1: "certify_kernel1", 2: "certify_kernel2", 3: "certify_kernel3", 4: "certify_kernel4", 5: "certify_kernel5"}
    ARG_TYPES = {1: "PPPPPPPPPi", 2: "PPPPPPPPPi", 3: "PPPPPPPPPPPi", 4: "PPPPPPPPPPPi", 5: "PPPPPPPPPPPi"}
    HALVES = (5,)  # versions that read fused_kernel6's float16 features and bounds (FEAT_HALVES), with pair_kernel2
    DIRECTED_ROUNDING = True
    IMGS = {1: 32, 2: 16, 3: 32, 4: 32, 5: 32}
    PAIRS = 32  # pair_kernel1's pairs a round
    THREADS, MAX_IMAGES = 256, 1 << 20

    @staticmethod
    def shared(g, version=3):
        """certify_kernel<version>'s dynamic shared bytes (its regions and the per-image terms)."""
        small = lambda imgs: imgs * (3 * g.classes + 2)  # noqa: E731
        if version == 1:
            a, b, g_row, ncol = 64 * 72, 64 * g.hidden // 2, 16 * g.classes + 8, 16 * g.classes
            r1 = max(2 * 64 * g_row, 2 * (a + b))
            return 4 * (r1 + g.hidden * ncol + 2 * (64 * g.hidden // 2 + 32 * 64) + small(32))
        if version == 3:
            stages, q_and_slopes = 4 * (64 * 40 + 32 * g.hidden // 2), 64 * (g.hidden + 4) + 32 * g.hidden
            return 4 * (max(stages, q_and_slopes) + 32 * g.hidden + 2 * 32)
        if version in (4, 5):  # A rows of 32 features: float32 padded to 40, or float16 (words) to 20
            row = 40 if version == 4 else 20
            stages, q_z_and_slopes = 4 * (64 * row + 2 * 32 * g.hidden // 2), 96 * (g.hidden + 4) + 32 * g.hidden
            return 4 * (max(stages, q_z_and_slopes) + 2 * 32)
        stage, ncol = 64 * g.hidden // 2 + 16 * 68, 8 * g.classes
        r1 = max(2 * stage, 2 * (32 * 72 + 64 * g.hidden // 2), 32 * (g.hidden + 4))
        return 4 * (r1 + g.hidden * ncol + small(16) + 8 * ncol)

    @classmethod
    def pair_shared(cls, g, halves=False):
        """pair_kernel1's (or with halves 2's) dynamic shared bytes: two stages of two fc1 slabs and
        their dp (64 values a pair and 16 bytes), the columns."""
        half = 64 * g.hidden // 2 + cls.PAIRS * (36 if halves else 68)
        return 4 * (2 * 2 * half + g.hidden * cls.PAIRS // 2 + 9 * cls.PAIRS)

    @staticmethod
    def pair_floats(g, n):
        """Scratch for the pairs of n images (certify_kernel3 lists at most classes - 1 an image):
        [(name, floats)] for pairs (image, margin, rest, 0), columns (float16, hidden a pair), npairs."""
        most = (g.classes - 1) * n
        return [("pairs", 4 * most), ("columns", most * g.hidden // 2), ("npairs", 1)]

    @classmethod
    def defines(cls, g, version):
        """-D options: the shapes, the version built (with its pair kernel, compact and scatter), and
        each version's shared floats (the kernels check theirs fit)."""
        return dict(FEAT=g.flat, HIDDEN=g.hidden, CLASSES=g.classes, SHARED_PAIRS=cls.pair_shared(g) // 4,
                    CERTIFY_VERSION=version, **{f"SHARED_V{v}": cls.shared(g, v) // 4 for v in cls.KERNELS})

    @staticmethod
    def fits(g):
        """None where the certificate's kernels take geometry g, else why not."""
        if g.classes != 10 or g.hidden != 128 or g.flat % 64 or g.flat >= FullyConnected.SPLIT_FEATURES:
            return (f"the certificate needs 10 classes, 128 hidden units and 64 to {FullyConnected.SPLIT_FEATURES - 64} "
                    f"features in 64s; the model has {g.classes}, {g.hidden} and {g.flat}")
        return None

    def __init__(self, build, g, version=3):
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

    def __call__(self, stream, feat, dp, z, scores, labels, w1abs, w1h, w2, ok, n, pairs=None, w1near=None):
        """ok[i] = 1 where image i is certified; versions 3-5 need pairs: the pointers pair_floats
        names. Versions 1-3 read z, scores and labels (fc_kernel6 or 5 on the features); versions 4
        and 5 compute fc1 themselves from float16 operands (w1near: fc1 rounded to nearest, laid out as
        w1abs) and write the scores and labels; version 5's feat and dp are float16 (fused_kernel6's
        FEAT_HALVES)."""
        if self.version >= 4 and w1near is None:
            raise ValueError(f"{self.kernel} needs w1near, fc1 rounded to nearest float16")
        grid = (ceil_div(n, self.IMGS[self.version]), 1)
        if self.version < 3:
            self.launch(stream, grid, (self.THREADS, 1, 1), feat, dp, z, scores, labels, w1abs, w1h, w2, ok, n, shared=self.bytes)
            return
        import pycuda.driver as cuda

        listed, columns, npairs = pairs
        cuda.memset_d32_async(npairs, 0, 1, stream)
        if self.version == 3:
            self.launch(stream, grid, (self.THREADS, 1, 1), feat, dp, z, scores, labels, w1abs, w2, ok, listed, columns, npairs,
                        n, shared=self.bytes)
        else:
            self.launch(stream, grid, (self.THREADS, 1, 1), feat, dp, scores, labels, w1abs, w1near, w2, ok, listed, columns,
                        npairs, n, shared=self.bytes)
        # A round of pairs for each 32 images: the first stage lists about one pair in four images
        # (testfull: 2,306 of 10,000); more take more rounds.
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
