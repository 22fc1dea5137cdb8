"""Prebuilt kernels: the cubins a first `cnninfer run` of the bundled model's geometry loads on each
common GPU generation, built when a wheel is built on a machine with nvcc, so that a fresh install
runs without compiling. Other geometries and GPUs compile on first use (compiler.cubin).

A prebuilt cubin carries compiler.cubin's cache key in its name (the sources' hash, the
architecture, the defines, the flags), so it is used only for the sources it was built from, and
MANIFEST.json holds each file's sha256, checked before use. Nothing here needs a GPU or PyCUDA:
the cubins a pipeline loads are listed by making it on stand-in modules (launch.prefetch's way).

    python -m infer.gpu.prebuilt OUT_DIR       # build them (setup.py's build_py does, into the wheel)
"""
import functools
import hashlib
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ARCHES = ("sm_80", "sm_86", "sm_89", "sm_90")  # A100; RTX 30xx / A10; RTX 40xx / L4 / L40; H100 / H200
MANIFEST = "MANIFEST.json"


def folder():
    """Where an installed package keeps its prebuilt cubins (kernels/prebuilt beside the sources)."""
    from .compiler import kernel_dir

    return kernel_dir() / "prebuilt"


def manifest(where=None):
    """{file name: sha256} of the prebuilt cubins, {} where there are none."""
    return _manifest(str(where or folder()))


@functools.lru_cache(maxsize=None)
def _manifest(where):
    try:
        return json.loads((Path(where) / MANIFEST).read_text())["cubins"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def arches(where=None):
    """The architectures the prebuilt cubins are for, e.g. ['sm_80', ..., 'sm_90a']."""
    return sorted({name.split("-")[1] for name in manifest(where)})


def lookup(filename, where=None):
    """The bytes of prebuilt `filename` (compiler.cubin's cache name), or None: not prebuilt, or its
    bytes do not have the sha256 the manifest gives (a damaged or altered file is not loaded)."""
    where = where or folder()
    digest = manifest(where).get(filename)
    if digest is None:
        return None
    try:
        data = (where / filename).read_bytes()
    except OSError:
        return None
    return data if hashlib.sha256(data).hexdigest() == digest else None


def wanted(arch):
    """The cubin keys (source, arch, defines, fast_math) a first run of the bundled model's
    geometry loads on a GPU of `arch`: its default pipeline's kernels, and the kernels that turn
    8-bit codes and uint8 images into floats where that pipeline does not read them itself."""
    import numpy as np

    from .. import codes, defaults, images, loader, network
    from ..options import AUTO
    from . import launch, pipelines
    from .profile import NullProfiler

    model = loader.load_model(defaults.model())
    g = network.geometry(model, (1,) + images.image_shape(model))
    algo, _ = pipelines.choose(AUTO, g, arch, None)
    build = launch.Build(arch, False, None, NullProfiler(), modules=launch._Recording())
    pipeline = algo(build, g)
    for wire in (*codes.WIRES, np.dtype(np.uint8)):
        if pipeline.staging(wire) is None:
            launch.converter(build, wire)
    return list(dict.fromkeys(build.modules.wanted))


def build_all(out, arches=ARCHES):
    """Build every wanted cubin for `arches` into the folder `out`, with its manifest, in parallel;
    the cubins' names as compiler.cubin caches them. Returns the manifest."""
    from . import compiler

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    keys = list(dict.fromkeys(k for arch in arches for k in _listed(arch)))

    def one(key):
        name, arch, defines, fast_math = key
        filename = compiler.cache_name(name, arch, dict(defines), fast_math)
        (out / filename).write_bytes(compiler.build(name, arch, dict(defines), fast_math))
        return filename

    with ThreadPoolExecutor(max(1, min(len(keys), 8)), thread_name_prefix="cnninfer-prebuild") as pool:
        files = sorted(pool.map(one, keys))
    cubins = {f: hashlib.sha256((out / f).read_bytes()).hexdigest() for f in files}
    (out / MANIFEST).write_text(json.dumps({"nvcc": compiler.nvcc_version(), "cubins": cubins}, indent=1) + "\n")
    return cubins


def _listed(arch):
    """wanted(arch), with stand-ins for PyCUDA while it runs where PyCUDA is not installed (a build
    machine has none); sys.modules is left as it was."""
    try:
        import pycuda.driver  # noqa: F401
    except ImportError:
        from .launch import _StandIn

        saved = {name: sys.modules.get(name) for name in ("pycuda", "pycuda.driver")}
        sys.modules.update({name: _StandIn() for name in saved})
        try:
            return wanted(arch)
        finally:
            for name, module in saved.items():
                if module is None:
                    sys.modules.pop(name, None)
                else:
                    sys.modules[name] = module
    return wanted(arch)


if __name__ == "__main__":
    built = build_all(sys.argv[1])
    print(f"{len(built)} prebuilt cubins in {sys.argv[1]}: {', '.join(arches(Path(sys.argv[1])))}")
