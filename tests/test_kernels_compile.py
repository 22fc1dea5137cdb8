"""CI has nvcc but no GPU: every kernel file compiles for sm_80 and sm_90 (the Hopper-only wgmma kernel
for sm_90a), each version and tile width of the GEMM, conv layers of several geometries, with
warnings as errors; ptxas's register and spill report is collected, and a spill fails."""
import re
import shutil
import subprocess
from types import SimpleNamespace

import pytest

from infer.gpu import compiler
from infer.gpu.launch import (GEMMS, BloscLz4, Certify, Conv, FullyConnected, FullyConnectedWarpgroup, Fused, Gemm, ZstdApart)
from infer.network import Geometry

MNIST = Geometry(h=28, w=28, c=1, k1=5, c1=32, k2=5, c2=64, hidden=128, classes=10)
SMALL_FC = Geometry(28, 28, 1, 3, 16, 3, 13, 36, 10)  # 325 features (scalar loads), 36 hidden units
WIDE_FC = Geometry(28, 28, 1, 5, 64, 5, 128, 256, 10)  # 256 hidden units: fc1 tiles of 16, 8 warps in fc_kernel5
# conv layers (H, W, C, K, C_OUT): ECE408's two, odd channel counts (scalar copies), 7x7, the largest;
# column blocks (BN) of 32, 64 and 128 (version 1), 16 and 64 (version 2)
CONVS = [(28, 28, 1, 5, 32), (12, 12, 32, 5, 64), (29, 31, 3, 7, 12), (11, 12, 12, 3, 20), (13, 13, 7, 7, 50),
         (62, 62, 256, 7, 256), (20, 20, 5, 3, 100)]
HOPPER_CONVS = [(28, 28, 1, 5, 32), (12, 12, 32, 5, 64), (29, 31, 3, 7, 12), (62, 62, 256, 7, 256)]


# conv_kernel3's layers: conv1 of the other geometries, and K past one chunk of sums
WHOLE_CONVS = [(32, 32, 3, 5, 32), (64, 64, 1, 5, 32), (29, 31, 3, 7, 12), (30, 30, 5, 9, 16), (14, 14, 3, 5, 64),
               (128, 128, 3, 7, 32)]


# conv_kernel4's layers: k-tiles of 32 in 3 stages, of 16 in 3 and 4, 64 channels, a partial column
# block (40 of 64)
STAGED_CONVS = [(30, 30, 32, 5, 64), (46, 46, 32, 5, 64), (15, 15, 64, 3, 128), (19, 17, 32, 7, 40)]


def conv(sizes, version=1):
    return f"conv{version}", Conv.defines(version, *sizes)


def gemm(version, tile, **extra):
    """gemm<version>.cu's defines as launch.Gemm gives them."""
    shared = {3: 4 * Gemm.STAGES * (tile * 20 + 16 * (Gemm.BN + 8)),
              4: 4 * Gemm.V4_STAGES * (tile * (Gemm.V4_BK + 4) + 2 * Gemm.V4_BK * extra.get("GEMM_BN", 0))}.get(version)
    return f"gemm{version}", dict(TILE_WIDTH=tile, **extra, **({"SHARED_FLOATS": shared // 4} if shared else {}))


VARIANTS = ([gemm(s.version, tw) for s in GEMMS.values() if not s.hopper_only for tw in s.tiles]
            + [conv(c) for c in CONVS]
            + [(f"fused{version}", Fused.defines(MNIST, version)) for version in (1, 2)] + [("fc", FullyConnected.defines(g)) for g in (MNIST, SMALL_FC, WIDE_FC)]
            + [(name, {}) for name in ("unroll", "place", "pool", "argmax")] + [("inflate", {"WINDOW": w}) for w in (4096, 8192, 32768)] + [("zstd", ZstdApart.defines()), ("lzf", {})]
            + [("stage", {"SRC_T": t}) for t in ("unsigned char", "short", "long long")]
            + [("decode", {"VALUE_BYTES": b}) for b in (1, 2, 4, 8)] + [("lz4", BloscLz4.defines())])
HOPPER = ([("fused3", Fused.defines(g, 3)) for g in (MNIST, Geometry(27, 29, 3, 3, 32, 5, 64, 100, 7),  # conv1 tails 1, 0
                                                     Geometry(28, 28, 2, 5, 32, 5, 64, 100, 7), Geometry(24, 24, 2, 1, 32, 5, 64, 100, 7))]  # 2, 0
          + [("fused3", Fused.defines(MNIST, 3, imgs=2)), ("fused4", Fused.defines(MNIST, 4)), ("fused6", Fused.defines(MNIST, 6)), ("fused6", Fused.defines(MNIST, 6, feat_halves=True)), ("fused6", Fused.defines(Geometry(24, 24, 1, 5, 32, 3, 64, 128, 10), 6)),
             # conv1 from codes in 4 k16 steps (K1*K1*IN_C = 50): its rounds rolled, or fused_kernel4 and 5 spill
             ("fused4", Fused.defines(Geometry(28, 28, 2, 5, 32, 5, 64, 100, 7), 4)), ("fused6", Fused.defines(Geometry(28, 28, 2, 5, 32, 5, 64, 100, 7), 6)),
             ("fc6", FullyConnectedWarpgroup.defines(MNIST)), ("fc6", FullyConnectedWarpgroup.defines(Geometry(28, 28, 1, 3, 16, 3, 20, 64, 7))),
             ("fc6", FullyConnectedWarpgroup.defines(WIDE_FC)),
             *[("certify", Certify.defines(MNIST, v)) for v in Certify.KERNELS],
             ("certify", Certify.defines(SimpleNamespace(flat=320, hidden=128, classes=10), 5))]
          + [conv(c, version=2) for c in HOPPER_CONVS] + [conv(c, version=3) for c in WHOLE_CONVS]
          + [conv(c, version=4) for c in STAGED_CONVS]
          + [gemm(4, 128, GEMM_BN=bn) for bn in (16, 32, 64)])


def test_every_kernel_file_is_covered():
    assert sorted({name for name, _ in VARIANTS + HOPPER}) == compiler.kernel_names()


def test_grep_finds_each_kernels_launcher():
    """Every kernel exported by cuda/*.cu is named, whole, in the Python that launches it, and every
    kernel name there is exported by some .cu file: grep for a symbol finds both sides."""
    import re

    from tests.conftest import REPO

    exported = {m for f in (REPO / "cuda").glob("*.cu")
                for m in re.findall(r'extern "C" __global__ void(?: __launch_bounds__\([^)]*\))?\s+(\w+_kernel\d+)\(',
                                    f.read_text())}
    named = {m for f in (REPO / "infer").rglob("*.py") for m in re.findall(r'"(\w+_kernel\d+)"', f.read_text())}
    assert len(exported) >= 20 and exported == named, (exported - named, named - exported)


def test_each_launchers_argument_types_are_its_kernels_parameters():
    """A launcher prepares its kernel with PyCUDA's argument codes (P a pointer, i int, I unsigned,
    q long long, Q unsigned long long, f float): each is the kernel's parameter list as cuda/ declares
    it, so no launch passes an argument of the wrong width (which no CPU test would run)."""
    import inspect
    import re

    from infer.gpu import launch
    from tests.conftest import REPO

    widths = {"int": "i", "unsigned": "I", "unsigned int": "I", "long long": "q", "unsigned long long": "Q",
              "u64": "Q", "float": "f"}

    def code(parameter):
        declared = re.sub(r"\s+", " ", parameter.replace("const ", "")).strip()
        return "P" if "*" in declared else widths.get(declared.rsplit(" ", 1)[0], "?")

    checked = 0
    for name, cls in inspect.getmembers(launch, inspect.isclass):
        if not (issubclass(cls, launch.Launcher) and cls.kernel and cls.arg_types and cls.source):
            continue
        text = (REPO / "cuda" / f"{cls.source}.cu").read_text()
        found = re.search(r'extern "C" __global__ void(?: __launch_bounds__\([^)]*\))?\s+' + cls.kernel + r"\(([^)]*)\)",
                          text)
        assert found, f"{name}: no {cls.kernel} in cuda/{cls.source}.cu"
        assert "".join(code(p) for p in found.group(1).split(",")) == cls.arg_types, (name, found.group(1))
        checked += 1
    assert checked >= 20


def ids(variants):
    return [f"{n}-{'-'.join(map(str, d.values())).replace(' ', '_') or 'plain'}" for n, d in variants]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on the PATH")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("name,defines", VARIANTS, ids=ids(VARIANTS))
@pytest.mark.slow
def test_kernel_compiles_without_spills(request, tmp_path, name, defines, arch):
    compile_without_spills(request, tmp_path, name, defines, arch)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on the PATH")
@pytest.mark.parametrize("name,defines", HOPPER, ids=ids(HOPPER))
@pytest.mark.slow
def test_hopper_kernel_compiles_without_spills(request, tmp_path, name, defines):
    compile_without_spills(request, tmp_path, name, defines, "sm_90a")


def compile_without_spills(request, tmp_path, name, defines, arch):
    """ptxas's registers and spills for each kernel go into the test's report (conftest prints them)."""
    cmd = compiler.command(name, arch, defines, output=tmp_path / "k.cubin", extra=("-Xptxas", "-v"))
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    kernels = re.findall(r"Compiling entry function '(\w+)'", r.stderr)
    usage = re.findall(r"Used (\d+) registers", r.stderr)
    # every function's spills: the kernels' and those of device functions kept out of line (inflate.cu's long_code)
    spilled = {f: int(a) + int(b) for f, a, b in re.findall(
        r"Function properties for (\w+)\n\s+\d+ bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", r.stderr)}
    assert kernels and len(usage) == len(kernels) and set(kernels) <= set(spilled), r.stderr
    for kernel, regs in zip(kernels, usage):
        request.node.user_properties.append(("ptxas", f"{kernel:16} {arch}  {str(defines.get('TILE_WIDTH', '')):>3}  {regs:>4} registers  {spilled[kernel]} bytes spilled"))
    assert not any(spilled.values()), f"{name} spills registers on {arch}: {r.stderr}"
    # ptxas serializes the wgmma (one in flight) where registers run short (C7512) or for other
    # reasons (C75xx "Potential Performance Loss"); a kernel that did so was dropped (docs/performance.md).
    assert "Potential Performance Loss" not in r.stderr, f"{name} on {arch}: {r.stderr}"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on the PATH")
def test_certify_builds_the_one_version_asked_for(tmp_path, monkeypatch):
    """CERTIFY_VERSION: a run's cubin holds its certify_kernel version (and pair kernel) alone."""
    monkeypatch.setenv("CNNINFER_CACHE", str(tmp_path))
    for version, pair in ((4, b"pair_kernel1"), (5, b"pair_kernel2")):
        cubin = compiler.cubin("certify", "sm_90a", Certify.defines(MNIST, version))
        names = {v: f"certify_kernel{v}".encode() in cubin for v in Certify.KERNELS}
        assert names == {v: v == version for v in Certify.KERNELS}
        assert pair in cubin and b"compact_kernel1" in cubin and b"scatter_kernel1" in cubin


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on the PATH")
def test_the_development_certificates_build():
    """dev/cuda/certify_early.cu (certify_kernel1-3, on certify.cu's helpers) builds for sm_90a: the
    development folder keeps compiling as the product's kernels change."""
    from tests.conftest import dev_module

    early = dev_module("certify_early")
    defines = tuple(sorted(early.EarlyCertify.defines(MNIST).items()))
    cubin = dev_module("devbuild").cubin("certify_early", "sm_90a", defines)
    for name in (*early.EarlyCertify.KERNELS.values(), "pair_kernel1", "certify_kernel4"):
        assert name.encode() in cubin, name


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on the PATH")
def test_the_development_inflate_builds():
    """dev/cuda/inflate_early.cu (inflate_kernel1, on inflate.cu's tables and bit reader) builds: the
    development folder keeps compiling as the product's decoder changes."""
    from tests.conftest import dev_module

    for window in (1024, 8192):
        cubin = dev_module("devbuild").cubin("inflate_early", "sm_80", (("WINDOW", window),))
        assert b"inflate_kernel1" in cubin and b"inflate_kernel2" in cubin


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on the PATH")
def test_the_development_lz4_builds():
    """dev/cuda/lz4_early.cu (blosc_lz4_kernel1, on lz4.cu's framing) builds beside the product's kernel."""
    from tests.conftest import dev_module

    cubin = dev_module("devbuild").cubin("lz4_early", "sm_80", tuple(sorted(BloscLz4.defines().items())))
    assert b"blosc_lz4_kernel1" in cubin and b"blosc_lz4_kernel2" in cubin


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on the PATH")
@pytest.mark.parametrize("defines, why", [({"WINDOW": 512}, "WINDOW"), ({"WINDOW": 3000}, "WINDOW"),
                                          ({"RING": 64}, "RING"), ({"RING": 200}, "RING")])
def test_inflate_refuses_sizes_its_writer_cannot_keep_to(defines, why):
    """inflate_kernel2's writer reads a far match from output that the batch before stored only where
    a batch and a match fit in the window, and its ring holds a batch beside a publication: other
    sizes stop the build, naming the size, rather than decode wrong bytes."""
    with pytest.raises(compiler.KernelCompileError, match=f"static assertion failed.*{why}"):
        compiler.build("inflate", "sm_80", defines)
