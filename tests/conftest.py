import functools
import os
import zlib
from pathlib import Path

import h5py
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


@pytest.fixture(params=["native", "python"])
def pool(request):
    """A reader.Reader on the native pool's threads, then on Python's (skipped without a C compiler)."""
    from infer.data import reader

    p = reader.Reader(3, use_native=request.param == "native")
    if request.param == "native" and p.native is None:
        p.close()
        pytest.skip("no C compiler here: the native read pool cannot be built")
    yield p
    p.close()


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
    # test_kernels_compile's ptxas lines, from the reports (so they come back from xdist's workers too)
    lines = {value for report in terminalreporter.stats.get("passed", []) + terminalreporter.stats.get("failed", [])
             for key, value in getattr(report, "user_properties", ()) if key == "ptxas"}
    if lines:
        terminalreporter.write_sep("-", "ptxas: registers and spills per kernel")
        for line in sorted(lines):
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


def small_model(rng):
    """A model for 12x12x1 images: 3x3 -> 10 -> pool 5 -> 2x2 -> 4 -> pool 2 -> 2*2*6 = 24."""
    return dict(conv1=rng.standard_normal((3, 3, 1, 4)).astype(np.float32),
                conv2=rng.standard_normal((2, 2, 4, 6)).astype(np.float32),
                fc1=rng.standard_normal((24, 8)).astype(np.float32),
                fc2=rng.standard_normal((8, 10)).astype(np.float32))


def small_data(rng, n=5):
    y = np.eye(10)[rng.integers(0, 10, n)]
    return dict(x=rng.random((n, 12, 12, 1)).astype(np.float32), y=y)


def write(path, datasets):
    """Write datasets; a callable value is called with (file, name) to make something unusual."""
    with h5py.File(path, "w") as f:
        for name, value in datasets.items():
            if callable(value):
                value(f, name)
            elif value is not None:
                f[name] = value
    return path


def damaged_copy(ece408, path, n, chunk, **create):
    """testfull's first n images written to `path` with h5py's create_dataset options `create`,
    then 16 bytes at the start of chunk `chunk` overwritten (1..16): a chunk a reader must refuse."""
    with h5py.File(ece408 / "testfull.hdf5") as f:
        x, y = f["x"][:n], f["y"][:n]
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x, **create)
        f["y"] = y
        offset = f["x"].id.get_chunk_info(chunk).byte_offset
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(bytes(range(1, 17)))
    return path


def assert_refused(r, *words):
    assert r.exit_code == 2, (r.exit_code, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    for w in words:
        assert w in lines[0], lines[0]


@pytest.fixture(scope="module")
def gpu():
    from infer.gpu.device import Device

    d = Device(0)
    yield d
    import pycuda.driver as cuda

    cuda.Context.synchronize()
    d.close()


def build(gpu, tile_width=None, gemm="auto"):
    from infer.gpu.backend import Build
    from infer.gpu.profile import NullProfiler

    return Build(gpu.arch, False, tile_width, NullProfiler(), gemm, gpu.l2_bytes, gpu.sms)


class Dev:
    """Device copies of host arrays, and results back; float32 unless given otherwise."""

    def __init__(self):
        import pycuda.driver as cuda

        self.cuda, self.bufs = cuda, []

    def put(self, a, dtype=np.float32):
        a = np.ascontiguousarray(a, dtype)
        buf = self.cuda.mem_alloc(max(a.nbytes, 4))
        self.cuda.memcpy_htod(buf, a)
        self.bufs.append(buf)
        return buf

    def empty(self, shape, dtype=np.float32, poison=np.nan):
        return self.put(np.full(shape, poison, dtype), dtype)  # poisoned: unwritten outputs show

    def get(self, buf, shape, dtype=np.float32):
        out = np.empty(shape, dtype)
        self.cuda.Context.synchronize()
        self.cuda.memcpy_dtoh(out, buf)
        return out


@functools.lru_cache(maxsize=None)
def dev_module(name):
    """dev/cuda/NAME.py, imported once (the development folder is not a package: it is not in the
    wheel; once, so the cubins it builds and remembers are built once a test session)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"dev_cuda_{name}", REPO / "dev" / "cuda" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
