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
    monkeypatch.setenv("PATH", "")
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
