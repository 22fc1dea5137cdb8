"""cuda/*.cu to cubins: nvcc once per (source, architecture, options), cached on disk.

A cache hit reads the cubin and never runs nvcc (PyCUDA's own cache runs `nvcc --version` on every
lookup); PyCUDA loads it with module_from_buffer. Importable without PyCUDA, so CI compiles too.
"""
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from .. import env
from ..atomic import replacing
from ..errors import BackendUnavailable

NVCC_FLAGS = ("-O3", "-std=c++17", "-Werror", "all-warnings")


class KernelCompileError(BackendUnavailable):
    """nvcc refused a kernel: the message names the file and quotes nvcc."""


def kernel_dir():
    """The kernel sources: inside the installed package, or cuda/ of a checkout."""
    here = Path(__file__).resolve().parent.parent
    for folder in (here / "kernels", here.parent / "cuda"):
        if (folder / "common.cuh").is_file():
            return folder
    raise BackendUnavailable(f"the kernel sources (cuda/*.cu) are not installed beside {here}")


def kernel_names():
    return sorted(p.stem for p in kernel_dir().glob("*.cu"))


def cache_dir():
    return env.cache_root() / "kernels"


def nvcc():
    found = shutil.which("nvcc") or shutil.which(Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc")
    if not found:
        raise BackendUnavailable("nvcc was not found on the PATH (or in $CUDA_HOME/bin): the CUDA backend compiles its kernels with it on first use")
    return found


def command(name, arch, defines, fast_math=False, output="-", extra=()):
    """The nvcc command line that builds cuda/NAME.cu into a cubin for `arch` (e.g. sm_90)."""
    cmd = [nvcc(), "-cubin", f"-arch={arch}", *NVCC_FLAGS, *extra, "-o", str(output)]
    if fast_math:
        cmd.append("--use_fast_math")
    cmd += [f"-D{k}={v}" for k, v in sorted(defines.items())]
    return cmd + [str(kernel_dir() / f"{name}.cu")]


def cubin(name, arch, defines, fast_math=False):
    """The cubin of cuda/NAME.cu built with -D defines, from the disk cache or from nvcc."""
    folder = kernel_dir()
    sources = [(folder / f"{name}.cu").read_bytes()] + [h.read_bytes() for h in sorted(folder.glob("*.cuh"))]
    key = hashlib.sha256(repr((sources, arch, sorted(defines.items()), fast_math, NVCC_FLAGS)).encode()).hexdigest()[:20]
    cached = cache_dir() / f"{name}-{arch}-{key}.cubin"
    try:
        return cached.read_bytes()
    except OSError:
        pass
    cached.parent.mkdir(parents=True, exist_ok=True)
    with replacing(cached) as tmp:
        r = subprocess.run(command(name, arch, defines, fast_math, tmp), capture_output=True, text=True)
        if r.returncode != 0:
            quoted = " | ".join(line.strip() for line in (r.stderr or r.stdout).splitlines() if line.strip())[:600]
            raise KernelCompileError(f"cuda/{name}.cu: nvcc failed to compile it for {arch}: {quoted}")
    return cached.read_bytes()
