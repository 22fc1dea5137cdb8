"""cuda/*.cu to cubins: nvcc once per (source, architecture, options), cached on disk.

A cache hit reads the cubin and never runs nvcc (PyCUDA's own cache runs `nvcc --version` on every
lookup); PyCUDA loads it with module_from_buffer. Importable without PyCUDA, so CI compiles too.
"""
import functools
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from .. import env
from ..data.atomic import replacing
from ..errors import BackendUnavailable

NVCC_FLAGS = ("-O3", "-std=c++17", "-Werror", "all-warnings")
PREBUILT_MANIFEST = "MANIFEST.json"  # {"nvcc": ..., "cubins": {file name: sha256}} (prebuilt.py writes it)


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


def prebuilt_folder():
    """Where an installed package keeps its prebuilt cubins (kernels/prebuilt beside the sources)."""
    return kernel_dir() / "prebuilt"


def prebuilt_manifest(where=None):
    """{file name: sha256} of the prebuilt cubins, {} where there are none."""
    return _manifest(str(where or prebuilt_folder()))


@functools.lru_cache(maxsize=None)
def _manifest(where):
    try:
        return json.loads((Path(where) / PREBUILT_MANIFEST).read_text())["cubins"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def prebuilt_arches(where=None):
    """The architectures the prebuilt cubins are for, e.g. ['sm_80', ..., 'sm_90a']."""
    return sorted({name.split("-")[1] for name in prebuilt_manifest(where)})


def prebuilt_lookup(filename, where=None):
    """The bytes of prebuilt `filename` (cubin's cache name), or None: not prebuilt, or its
    bytes do not have the sha256 the manifest gives (a damaged or altered file is not loaded)."""
    where = where or prebuilt_folder()
    digest = prebuilt_manifest(where).get(filename)
    if digest is None:
        return None
    try:
        data = (where / filename).read_bytes()
    except OSError:
        return None
    return data if hashlib.sha256(data).hexdigest() == digest else None


def cache_dir():
    return env.cache_root() / "kernels"


def nvcc():
    found = shutil.which("nvcc") or shutil.which(Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc")
    if not found:
        raise BackendUnavailable("nvcc was not found on the PATH (or in $CUDA_HOME/bin): the CUDA backend compiles its kernels with it on first use")
    return found


def command(name, arch, defines, fast_math=False, output="-", extra=(), source=None):
    """The nvcc command line that builds cuda/NAME.cu (or the file `source`, cuda/ on its include
    path: dev/cuda's kernels) into a cubin for `arch` (e.g. sm_90)."""
    cmd = [nvcc(), "-cubin", f"-arch={arch}", *NVCC_FLAGS, *extra, "-o", str(output)]
    if source is not None:
        cmd += ["-I", str(kernel_dir())]
    if fast_math:
        cmd.append("--use_fast_math")
    cmd += [f"-D{k}={v}" for k, v in sorted(defines.items())]
    return cmd + [str(source or kernel_dir() / f"{name}.cu")]


def cache_name(name, arch, defines, fast_math=False):
    """The file name of cuda/NAME.cu's cubin for `arch` and `defines`: it carries a hash of the
    sources (NAME.cu and every .cuh), the architecture, the defines and the flags, so a cubin is
    found only for the sources it was built from. Prebuilt cubins (prebuilt.py) are named so."""
    folder = kernel_dir()
    sources = [(folder / f"{name}.cu").read_bytes()] + [h.read_bytes() for h in sorted(folder.glob("*.cuh"))]
    key = hashlib.sha256(repr((sources, arch, sorted(defines.items()), fast_math, NVCC_FLAGS)).encode()).hexdigest()[:20]
    return f"{name}-{arch}-{key}.cubin"


def nvcc_tag():
    """A short hash of the version of the nvcc found: the disk cache's cubins are kept per nvcc
    release, so a toolkit upgrade builds afresh. `nvcc --version` runs once per nvcc binary (its
    path, size and time), remembered in the cache's nvcc-versions.json: a cache hit runs nothing."""
    path = nvcc()
    st = os.stat(path)
    ident = f"{os.path.realpath(path)}:{st.st_size}:{st.st_mtime_ns}"
    known = cache_dir() / "nvcc-versions.json"
    try:
        versions = json.loads(known.read_text())
    except (OSError, ValueError):
        versions = {}
    if not isinstance(versions, dict) or ident not in versions:
        versions = dict(versions if isinstance(versions, dict) else {}, **{ident: nvcc_version()})
        known.parent.mkdir(parents=True, exist_ok=True)
        with replacing(known) as tmp:
            Path(tmp).write_text(json.dumps(versions, indent=1) + "\n")
    return hashlib.sha256(versions[ident].encode()).hexdigest()[:8]


def nvcc_version():
    r = subprocess.run([nvcc(), "--version"], capture_output=True, text=True)
    return (r.stdout.strip().splitlines() or ["unknown"])[-1]


def build(name, arch, defines, fast_math=False, source=None):
    """nvcc's cubin of cuda/NAME.cu, or of `source` (see command), not cached (KernelCompileError
    naming the file and quoting nvcc)."""
    with tempfile.TemporaryDirectory(prefix="cnninfer-nvcc-") as tmp:
        out = Path(tmp) / f"{name}.cubin"
        r = subprocess.run(command(name, arch, defines, fast_math, out, source=source), capture_output=True, text=True)
        if r.returncode != 0:
            quoted = " | ".join(line.strip() for line in (r.stderr or r.stdout).splitlines() if line.strip())[:600]
            raise KernelCompileError(f"{source or f'cuda/{name}.cu'}: nvcc failed to compile it for {arch}: {quoted}")
        return out.read_bytes()


def cubin(name, arch, defines, fast_math=False):
    """The cubin of cuda/NAME.cu built with -D defines: prebuilt in the package (its sha256 checked),
    else from the disk cache (kept per nvcc), else built by nvcc now and cached."""
    filename = cache_name(name, arch, defines, fast_math)
    shipped = prebuilt_lookup(filename)
    if shipped is not None:
        return shipped
    try:
        tag = nvcc_tag()
    except BackendUnavailable:  # no nvcc now: a cubin some nvcc built from these sources will do
        for found in sorted(cache_dir().glob(filename.replace(".cubin", "-*.cubin")), key=os.path.getmtime)[::-1]:
            return found.read_bytes()
        raise
    cached = cache_dir() / filename.replace(".cubin", f"-{tag}.cubin")
    try:
        return cached.read_bytes()
    except OSError:
        pass
    data = build(name, arch, defines, fast_math)
    cached.parent.mkdir(parents=True, exist_ok=True)
    with replacing(cached) as tmp:
        Path(tmp).write_bytes(data)
    return data
