"""What the development folder's scripts share: a .cu of this folder built by the package's compiler
(cuda/ on the include path) once a process, and its module put among a launch.Build's under the key
that a launcher whose `source` is 'dev/cuda/STEM' looks up (the package's compiler knows only cuda/'s
files). A script puts the repository and this folder on sys.path, then imports it."""
import functools
from pathlib import Path

from infer.gpu import compiler

HERE = Path(__file__).resolve().parent


@functools.lru_cache(maxsize=None)
def cubin(stem, arch, defines):
    """nvcc's cubin of dev/cuda/STEM.cu for arch with -D defines (a tuple of pairs)."""
    return compiler.build(stem, arch, dict(defines), source=HERE / f"{stem}.cu")


def load(build, stem, defines, arch=None, fast_math=None):
    """Put dev/cuda/STEM.cu's module among build's (for arch and fast_math as given, else build's)."""
    import pycuda.driver as cuda

    arch = arch or build.arch
    key = (f"dev/cuda/{stem}", arch, defines, build.fast_math if fast_math is None else fast_math)
    if key not in build.modules:
        build.modules[key] = cuda.module_from_buffer(cubin(stem, arch, defines))
