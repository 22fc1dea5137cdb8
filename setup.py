"""setuptools' build_py, then the prebuilt kernels (infer/gpu/prebuilt.py) into the built package
where nvcc is on the PATH: a wheel built so runs the bundled model's geometry on sm_80, sm_86,
sm_89 and sm_90 without compiling. An editable install has none (kernels compile on first use)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithKernels(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False) or os.environ.get("CNNINFER_PREBUILD") == "0":
            return
        if shutil.which("nvcc") is None:
            print("cnninfer: nvcc is not on the PATH: the wheel carries no prebuilt kernels", file=sys.stderr)
            return
        out = Path(self.build_lib) / "infer" / "kernels" / "prebuilt"
        here = Path(__file__).resolve().parent
        env = dict(os.environ, PYTHONPATH=str(here) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        subprocess.run([sys.executable, "-m", "infer.gpu.prebuilt", str(out)], check=True, cwd=here, env=env)


setup(cmdclass={"build_py": BuildPyWithKernels})
