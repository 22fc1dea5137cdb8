import os
import zlib
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from infer.cli import cli

REPO = Path(__file__).resolve().parent.parent
# The reference results (../shared/README.md): testfull's correct answers, test100's, and how many
# of testfull's 10,000 predictions must equal the CPU's (the --check rule: 99.95%)
TESTFULL_CORRECT, TEST100_CORRECT = 8722, 95
TESTFULL_AGREE = 9995
SHARED_DATA = REPO.parent / "shared" / "data"


def data_dir():
    """The ECE408 files: $CNNINFER_DATA, else ../shared/data/ece408 beside the checkout."""
    return Path(os.environ.get("CNNINFER_DATA") or SHARED_DATA / "ece408")


@pytest.fixture(scope="session")
def ece408():
    d = data_dir()
    if not (d / "model.hdf5").is_file():
        pytest.skip(f"the ECE408 data set is not at {d} (set CNNINFER_DATA to its folder)")
    return d


@pytest.fixture
def rng(request):
    """A generator seeded by the test's name: reproducible, different for every test."""
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


def invoke(*args):
    """Run the CLI in-process; stdout and stderr kept apart."""
    try:
        runner = CliRunner(mix_stderr=False)  # click < 8.2
    except TypeError:
        runner = CliRunner()
    return runner.invoke(cli, [str(a) for a in args])


def pytest_terminal_summary(terminalreporter):
    from tests.test_kernels_compile import REPORT

    if REPORT:
        terminalreporter.write_sep("-", "ptxas: registers and spills per kernel")
        for line in sorted(set(REPORT)):
            terminalreporter.write_line(line)


_gpu = None


def gpu_unusable():
    """Why the gpu tests cannot run here, or None (checked once per session)."""
    global _gpu
    if _gpu is None:
        try:
            import pycuda.driver as cuda

            cuda.init()
            _gpu = "" if cuda.Device.count() else "no CUDA GPU is visible"
        except Exception as e:  # no pycuda, no driver, no device: all mean skip
            _gpu = f"no usable CUDA GPU ({type(e).__name__}: {e})"
    return _gpu or None


def pytest_collection_modifyitems(config, items):
    gpu_items = [i for i in items if "gpu" in i.keywords]
    if gpu_items and gpu_unusable():
        skip = pytest.mark.skip(reason=gpu_unusable())
        for item in gpu_items:
            item.add_marker(skip)
