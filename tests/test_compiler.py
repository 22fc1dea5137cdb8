"""The kernel compiler without a GPU: a kernel nvcc rejects is named and nvcc quoted; a missing
nvcc is one clear line; a cache hit never runs nvcc."""
import shutil

import numpy as np
import pytest

from infer.errors import BackendUnavailable
from infer.gpu import compiler
from tests.conftest import invoke

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on the PATH")


@needs_nvcc
def test_a_kernel_nvcc_rejects_is_named_and_quoted(tmp_path, monkeypatch):
    (tmp_path / "common.cuh").write_text("")
    (tmp_path / "gemm1.cu").write_text('extern "C" __global__ void gemm_kernel1() { undeclared_thing = 1; }\n')
    monkeypatch.setattr(compiler, "kernel_dir", lambda: tmp_path)
    monkeypatch.setenv("CNNINFER_CACHE", str(tmp_path / "cache"))
    with pytest.raises(compiler.KernelCompileError) as e:
        compiler.cubin("gemm1", "sm_90", {"TILE_WIDTH": 16})
    assert e.value.exit_code == 2
    assert "cuda/gemm1.cu" in e.value.message and "undeclared_thing" in e.value.message
    assert "\n" not in e.value.message
    assert not list((tmp_path / "cache").rglob("*.cubin"))  # nothing half-written is cached


@needs_nvcc
def test_cache_hit_does_not_run_nvcc(tmp_path, monkeypatch):
    monkeypatch.setenv("CNNINFER_CACHE", str(tmp_path))
    first = compiler.cubin("argmax", "sm_80", {})
    monkeypatch.setattr(compiler.subprocess, "run", lambda *a, **k: pytest.fail("nvcc ran on a cache hit"))
    assert compiler.cubin("argmax", "sm_80", {}) == first
    # No nvcc at all any more: a cubin built from these very sources is still used
    monkeypatch.setenv("PATH", "")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no-cuda"))
    assert compiler.cubin("argmax", "sm_80", {}) == first


def test_missing_nvcc_is_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no-cuda"))
    monkeypatch.setenv("CNNINFER_CACHE", str(tmp_path / "cache"))
    with pytest.raises(BackendUnavailable) as e:
        compiler.cubin("pool", "sm_90", {})
    assert "nvcc was not found" in e.value.message and "\n" not in e.value.message


def test_bad_devices_option():
    r = invoke("run", "--devices", "0,0")
    assert r.exit_code == 2 and "distinct" in r.stderr


def test_the_api_refuses_one_gpu_twice(ece408):
    """As --devices does: two contexts on one GPU would share its legacy stream."""
    from infer import Session
    from infer.errors import InputError

    with pytest.raises(InputError, match=r"distinct, got \[1, 0, 1\]"):
        with Session(ece408 / "model.hdf5", backend="cuda", devices=[1, 0, 1]) as s:
            s.predict(np.zeros((2, 28, 28, 1), np.float32))


class _AnyCuda:
    """pycuda.driver on a machine without it: every name a stand-in (constructors only read its
    constants; prefetch loads no module)."""

    def __getattr__(self, name):
        return _AnyCuda()

    def __call__(self, *args, **kwargs):
        return _AnyCuda()


@needs_nvcc
@pytest.mark.slow
@pytest.mark.parametrize("arch,expected", [
    ("sm_90", ["certify", "fc", "fc6", "fused3", "fused3", "fused6"]),  # H100 / H200: the default, certified
    ("sm_80", ["fc", "fused2"]),  # A100: the fused float32 kernel (fused_kernel2)
])
def test_a_run_builds_only_the_kernels_its_pipeline_loads_and_at_once(tmp_path, monkeypatch, arch, expected):
    """prefetch lists a pipeline's cubins by making it with stand-in modules, then builds just those,
    in parallel: testfull's default pipeline on a Hopper GPU (version 5 of certify.cu alone)."""
    import sys
    import threading

    from infer.gpu import launch, pipelines
    from infer.gpu.profile import NullProfiler
    from infer.network import Geometry

    try:
        import pycuda.driver  # noqa: F401
    except ImportError:  # the constructors' own imports of it, inside them, get the stand-in
        monkeypatch.setitem(sys.modules, "pycuda", _AnyCuda())
        monkeypatch.setitem(sys.modules, "pycuda.driver", _AnyCuda())
    monkeypatch.setenv("CNNINFER_CACHE", str(tmp_path))
    launch._cubin.cache_clear()
    threads, nvcc = set(), compiler.cubin

    def watched(*args, **kwargs):
        threads.add(threading.current_thread().name)
        return nvcc(*args, **kwargs)

    monkeypatch.setattr(compiler, "cubin", watched)
    g = Geometry(h=28, w=28, c=1, k1=5, c1=32, k2=5, c2=64, hidden=128, classes=10)
    algo, _ = pipelines.choose(pipelines.AUTO, g, arch, None)
    build = launch.Build(arch, False, None, NullProfiler())
    launch.prefetch(build, lambda b: algo(b, g))
    built = sorted(p.name.split("-")[0] for p in (tmp_path / "kernels").glob("*.cubin"))
    assert built == expected
    assert len(threads) == len(expected) and all(t.startswith("cnninfer-nvcc") for t in threads)
    assert not build.modules, "prefetch loads nothing"
    launch._cubin.cache_clear()


@needs_nvcc
@pytest.mark.slow
def test_prebuilt_kernels_are_used_when_their_hash_matches_and_rebuilt_when_not(tmp_path, monkeypatch):
    """The prebuilt cubins for sm_90 (what a wheel built here carries): a run's cubins come from
    them without nvcc; one whose bytes no longer have the manifest's sha256 is built again; info
    names the architectures."""
    import hashlib
    import json
    import subprocess

    from infer.gpu import prebuilt

    out = tmp_path / "prebuilt"
    cubins = prebuilt.build_all(out, arches=("sm_90",))
    assert compiler.prebuilt_arches(out) == ["sm_90", "sm_90a"]
    assert sorted(name.split("-")[0] for name in cubins) == ["certify", "fc", "fc6", "fused3", "fused3", "fused6"]
    for name, digest in cubins.items():
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == digest
    monkeypatch.setattr(compiler, "prebuilt_folder", lambda: out)
    monkeypatch.setenv("CNNINFER_CACHE", str(tmp_path / "cache"))
    runs = []
    real_run = subprocess.run
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: ("-cubin" in a[0] and runs.append(a)) or real_run(*a, **k))
    for key in prebuilt.wanted("sm_90"):
        name, arch, defines, fast_math = key
        assert compiler.cubin(name, arch, dict(defines), fast_math) == (out / compiler.cache_name(*key[:2], dict(defines), fast_math)).read_bytes()
    assert runs == [], "no nvcc for prebuilt kernels"
    # A prebuilt file altered after the manifest: not loaded, built again (and the same as built before)
    name, arch, defines, fast_math = next(k for k in prebuilt.wanted("sm_90") if k[0] == "fc6")
    path = out / compiler.cache_name(name, arch, dict(defines), fast_math)
    good = path.read_bytes()
    path.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    assert compiler.cubin(name, arch, dict(defines), fast_math) == good and len(runs) == 1
    assert json.loads((out / compiler.PREBUILT_MANIFEST).read_text())["nvcc"].startswith("Build cuda_")
    r = invoke("info")
    assert "prebuilt kernels: sm_90, sm_90a" in r.stdout


def test_info_says_when_there_are_no_prebuilt_kernels(tmp_path, monkeypatch):
    monkeypatch.setattr(compiler, "prebuilt_folder", lambda: tmp_path)
    r = invoke("info")
    assert "prebuilt kernels: none (an editable install, or a wheel built without nvcc" in r.stdout


@needs_nvcc
def test_the_cache_is_kept_per_nvcc(tmp_path, monkeypatch):
    """Another nvcc (a toolkit upgrade) builds afresh instead of reusing the old one's cubin."""
    monkeypatch.setenv("CNNINFER_CACHE", str(tmp_path))
    compiler.cubin("argmax", "sm_80", {})
    monkeypatch.setattr(compiler, "nvcc_version", lambda: "Build cuda_99.9")
    (tmp_path / "kernels" / "nvcc-versions.json").unlink()
    runs = []
    real = compiler.subprocess.run
    monkeypatch.setattr(compiler.subprocess, "run", lambda *a, **k: ("-cubin" in a[0] and runs.append(a)) or real(*a, **k))
    compiler.cubin("argmax", "sm_80", {})
    assert len(runs) == 1 and len(list((tmp_path / "kernels").glob("argmax-sm_80-*.cubin"))) == 2


def test_listing_the_prebuilt_kernels_leaves_no_stand_in_behind():
    """Listing with stand-ins for PyCUDA (where it is not installed) restores sys.modules after."""
    import sys

    from infer.gpu import prebuilt

    before = {name: sys.modules.get(name) for name in ("pycuda", "pycuda.driver")}
    assert prebuilt.wanted("sm_80")
    assert {name: sys.modules.get(name) for name in before} == before
