"""Prebuilt kernels: the cubins a first `cnninfer run` of the bundled model's geometry loads on each
common GPU generation, built when a wheel is built on a machine with nvcc, so that a fresh install
runs without compiling. Other geometries and GPUs compile on first use (compiler.cubin).

A prebuilt cubin carries compiler.cubin's cache key in its name (the sources' hash, the
architecture, the defines, the flags), so it is used only for the sources it was built from, and
MANIFEST.json holds each file's sha256, checked before use (compiler.prebuilt_lookup). Nothing here needs a GPU or PyCUDA:
the cubins a pipeline loads are listed by making it on stand-in modules (launch.prefetch's way).

    python -m infer.gpu.prebuilt OUT_DIR       # build them (setup.py's build_py does, into the wheel)
"""
import hashlib
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ARCHES = ("sm_80", "sm_86", "sm_89", "sm_90")  # A100; RTX 30xx / A10; RTX 40xx / L4 / L40; H100 / H200


def wanted(arch):
    """The cubin keys (source, arch, defines, fast_math) a first run of the bundled model's
    geometry loads on a GPU of `arch`: its default pipeline's kernels, and the kernels that turn
    8-bit codes and uint8 images into floats where that pipeline does not read them itself."""
    import numpy as np

    from ..data import codes, defaults, loader
    from .. import network
    from ..options import AUTO
    from . import launch, pipelines
    from .profile import NullProfiler

    model = loader.load_model(defaults.model())
    g = network.geometry(model, (1,) + network.image_shape(model))
    algo, _ = pipelines.choose(AUTO, g, arch, None)

    def make(build):
        pipeline = algo(build, g)
        for wire in (*codes.WIRES, np.dtype(np.uint8)):
            if pipeline.staging(wire) is None:
                launch.converter(build, wire)

    return launch.recorded(launch.Build(arch, False, None, NullProfiler()), make)[1]


def build_all(out, arches=ARCHES):
    """Build every wanted cubin for `arches` into the folder `out`, with its manifest, in parallel;
    the cubins' names as compiler.cubin caches them. Returns the manifest."""
    from . import compiler

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    keys = list(dict.fromkeys(k for arch in arches for k in wanted(arch)))

    def one(key):
        name, arch, defines, fast_math = key
        filename = compiler.cache_name(name, arch, dict(defines), fast_math)
        (out / filename).write_bytes(compiler.build(name, arch, dict(defines), fast_math))
        return filename

    with ThreadPoolExecutor(max(1, min(len(keys), 8)), thread_name_prefix="cnninfer-prebuild") as pool:
        files = sorted(pool.map(one, keys))
    cubins = {f: hashlib.sha256((out / f).read_bytes()).hexdigest() for f in files}
    (out / compiler.PREBUILT_MANIFEST).write_text(json.dumps({"nvcc": compiler.nvcc_version(), "cubins": cubins}, indent=1) + "\n")
    return cubins


if __name__ == "__main__":
    from .compiler import prebuilt_arches

    built = build_all(sys.argv[1])
    print(f"{len(built)} prebuilt cubins in {sys.argv[1]}: {', '.join(prebuilt_arches(Path(sys.argv[1])))}")
