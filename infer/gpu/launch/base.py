"""What every launcher shares: the Build a run's kernels are compiled and launched with, the cubins (compiled once a
process, loaded once a context), Launcher (launch geometry, profiling events), and pipelines made on stand-in
modules (recorded, prefetch)."""
import dataclasses
import functools
import sys
from concurrent.futures import ThreadPoolExecutor

from .. import compiler


INT_MAX = 2**31 - 1


def version_of(kernel):
    """The version a kernel's exported name carries (fused_kernel3: 3): the -D ..._VERSION its .cu
    file is built with to define it, or the file (fused3.cu)."""
    return int(kernel.rsplit("_kernel", 1)[1])


def needs_hopper(arch):
    """None on Hopper (sm_90), else why kernels with sm_90a instructions (wgmma) cannot run on arch."""
    return None if arch == "sm_90" else f"needs a Hopper GPU (sm_90), this GPU is {arch}"


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
