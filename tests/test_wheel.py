"""`pip wheel .` gives a wheel that carries the kernels, the default model and the sample; in a
fresh virtual environment, run from another folder, `cnninfer run` works on the CPU backend."""
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO


@pytest.mark.slow
def test_wheel_installs_and_runs_anywhere(tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", wheels, REPO], check=True)
    (wheel,) = wheels.glob("cnninfer-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for name in ("infer/kernels/fused3.cu", "infer/kernels/gemm1.cu", "infer/kernels/common.cuh", "infer/models/cnninfer-mnist.hdf5",
                 "infer/models/mnist-sample.hdf5", "infer/gpu/backend.py", "infer/data/read_pool/pool.c", "infer/data/read_pool/read_pool.h", "infer/cpu/cpu_net.c"):
        assert name in names
    # the wheel ships what runs: kernel versions kept for development stay in dev/
    assert not [n for n in names if n.startswith("dev/") or "certify_early" in n]
    assert b"certify_kernel3" not in zipfile.ZipFile(wheel).read("infer/kernels/certify.cu")
    # Built where nvcc is: the bundled geometry's kernels for sm_80, sm_86, sm_89 and sm_90, prebuilt
    prebuilt = sorted(n.split("/")[-1].split("-")[1] for n in names if n.startswith("infer/kernels/prebuilt/") and n.endswith(".cubin"))
    if shutil.which("nvcc"):
        assert "infer/kernels/prebuilt/MANIFEST.json" in names
        assert sorted(set(prebuilt)) == ["sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"]
    else:
        assert prebuilt == []
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    subprocess.run([python, "-m", "pip", "install", "-q", wheel], check=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    r = subprocess.run([env_dir / "bin" / "cnninfer", "run", "--backend", "cpu"], cwd=elsewhere, env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "input dimensions = 1000 x 28 x 28 x 1"
    assert float(r.stdout.split("Correctness: ")[1]) >= 0.98
    assert not Path(elsewhere).joinpath("infer").exists()
    info = subprocess.run([env_dir / "bin" / "cnninfer", "info"], cwd=elsewhere, env=env, capture_output=True, text=True)
    assert ("prebuilt kernels: sm_80, sm_86, sm_89, sm_90, sm_90a" if shutil.which("nvcc") else
            "prebuilt kernels: none") in info.stdout
