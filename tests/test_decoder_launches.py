"""Every GPU decoder's launches, checked without a GPU: a streamed file of each filter and layout goes
through chunk_decode's Decoder (its lanes, tables, groups, flushes) and the codec's real launchers
on a PyCUDA stand-in whose kernels check what they are handed as PyCUDA would pack it: each argument
of the width the launcher prepared (struct.pack of its codes), a grid and block the GPU takes. The
codecs' warm-up launches too. (Their values: the GPU suites, and tests/test_lz4_blocks.py and
tests/test_blosc_cut.py on NumPy devices.)"""
import struct
from types import SimpleNamespace

import h5py
import numpy as np
import pytest

from infer.data.dataset import DataSet
from infer.gpu import chunk_decode
from infer.gpu.launch import Build
from infer.gpu.launch.base import _StandIn
from tests.conftest import small_model
from tests.test_lz4_blocks import fake_driver

hdf5plugin = pytest.importorskip("hdf5plugin")


class Function:
    """A kernel: prepare() notes its argument codes; each launch packs its arguments with them."""

    def __init__(self, name, launched):
        self.name, self.launched, self.arg_types = name, launched, None

    def prepare(self, arg_types):
        self.arg_types = arg_types

    def set_attribute(self, *args):
        pass

    def prepared_async_call(self, grid, block, stream, *args, shared_size=0):
        assert self.arg_types is not None, f"{self.name} launched unprepared"
        struct.pack(self.arg_types, *args)  # the count, and each argument's width and sign
        assert len(grid) == 2 and 0 < grid[0] < 2 ** 31 and 0 < grid[1] < 2 ** 16, (self.name, grid)
        assert len(block) == 3 and 0 < block[0] * block[1] * block[2] <= 1024, (self.name, block)
        assert 0 <= shared_size <= 227 << 10, (self.name, shared_size)
        self.launched.append(self.name)


class Modules(dict):
    """A Build's modules: every one loaded, its functions Functions."""

    def __init__(self):
        super().__init__()
        self.launched = []

    def __contains__(self, key):
        return True

    def __getitem__(self, key):
        return SimpleNamespace(get_function=lambda name: Function(name, self.launched))


@pytest.fixture
def driver(monkeypatch):
    """pycuda.driver as a stand-in (device addresses: growing integers; page-locked memory: NumPy's),
    and the executor's events always done. (The Build, the kernels launched.)"""
    fake = fake_driver(monkeypatch)
    at = [1 << 20]

    class Allocation(int):
        def free(self):
            pass

    def mem_alloc(nbytes):
        at[0] += -(-nbytes // 256) * 256
        return Allocation(at[0] - -(-nbytes // 256) * 256)
    fake.mem_alloc = mem_alloc
    modules = Modules()
    build = Build("sm_90", False, None, SimpleNamespace(start=lambda *a: None, stop=lambda *a: None), modules=modules)
    return build, modules.launched, mem_alloc


FILTERS = {
    "gzip": dict(compression="gzip"),
    "gzip shuffle": dict(compression="gzip", shuffle=True),
    "lzf shuffle": dict(compression="lzf", shuffle=True),
    "zstd shuffle": dict(hdf5plugin.Zstd(), shuffle=True),
    "blosc lz4": dict(hdf5plugin.Blosc(cname="lz4", shuffle=hdf5plugin.Blosc.BITSHUFFLE)),
    "blosc lz4 byte-shuffled": dict(hdf5plugin.Blosc()),  # hdf5plugin's default
    "blosc zstd": dict(hdf5plugin.Blosc(cname="zstd", shuffle=hdf5plugin.Blosc.SHUFFLE)),
    "blosc zstd unshuffled": dict(hdf5plugin.Blosc(cname="zstd", shuffle=hdf5plugin.Blosc.NOSHUFFLE)),
    "lz4 shuffle": dict(hdf5plugin.LZ4(nbytes=4096), shuffle=True),
    "bitshuffle": dict(hdf5plugin.Bitshuffle(nelems=1024, cname="lz4")),
    "blosc2": dict(hdf5plugin.Blosc2(cname="lz4", filters=hdf5plugin.Blosc2.BITSHUFFLE)),
}
# chunks: of whole images, or cutting them (not Blosc2's: the host's)
CASES = [(name, (64, 13, 13, 1)) for name in FILTERS] + [
    (name, (40, 7, 13, 1)) for name in FILTERS if name != "blosc2"]


@pytest.mark.parametrize("dtype", ["f4", "i2"])
@pytest.mark.parametrize("name,chunk", CASES, ids=[f"{n}-{c[1]}" for n, c in CASES])
def test_each_decoder_launches_what_its_kernels_take(tmp_path, rng, driver, name, chunk, dtype):
    """500 images of 13 x 13, mostly zeros, streamed in blocks of 2 rows of chunks, 3 blocks a group
    (a shorter last group), after the codec's warm-up: every launch as PyCUDA takes it; Blosc's and
    Bitshuffle's warm-up loads every kernel the run then launches (the deflate family's leaves its
    check and placing kernels to the run's first launch)."""
    build, launched, alloc = driver
    x = (rng.integers(0, 200, (500, 13, 13, 1)) * (rng.random((500, 13, 13, 1)) < 0.2)).astype(dtype)
    path = tmp_path / "s.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x, chunks=chunk, **FILTERS[name])
        f["y"] = np.eye(10)[np.arange(500) % 10]
    from infer.data import loader

    data = DataSet.open([path], loader.model_from_arrays(small_model(rng)))
    try:
        rows = data.parts[0][1]
        assert chunk_decode.unsupported(data, x.dtype) is None
        chunk_decode.warm_up(build, rows)
        block = 2 * rows.align
        decoder = chunk_decode.Decoder(build, rows, block, 2, alloc, [], 3, _StandIn())
        decoder.start()
        pool = SimpleNamespace(native=None, call=lambda fn, *args: fn(*args))
        monkey_submit = SimpleNamespace(result=lambda: None)
        rows.submit = lambda native, lo, hi, out: monkey_submit  # (a chunk stored otherwise: none here)
        buf = np.empty(chunk_decode.layout(rows, block)[1], np.uint8)
        warm = len(launched)
        for lo in range(0, len(x), block):
            piece = chunk_decode.Block(buf, min(block, len(x) - lo))
            decoder.read(pool, lo, lo + len(piece), piece)
            decoder.enqueue(alloc(len(piece) * rows.row_bytes), piece)
        decoder.flush()
        assert warm > 0 and len(launched) > warm
        if name.startswith(("blosc", "bitshuffle")):  # their warm-up launches each kernel a run does
            assert set(launched[warm:]) <= set(launched[:warm]), (launched[:warm], launched[warm:])
        assert any("assemble" in k for k in launched[warm:]) == rows.cut, launched[warm:]
    finally:
        data.close()
