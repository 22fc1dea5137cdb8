"""The GPU's decoding of hdf5plugin's LZ4, Bitshuffle (lz4) and Blosc2 (lz4 + bitshuffle) chunks,
without a GPU:
- the chunks hdf5plugin writes, walked as the kernels walk them (LZ4's and Bitshuffle's chained block
  sizes, then Bitshuffle's tail), decoded and unshuffled, give h5py's values;
- lz4_index_kernel1's own walk (lz4_walk, built for the host by nvcc) finds each block, flags damage;
- each codec's prepare, decode and place, run on a NumPy device memory (Device), place h5py's
  images, leaving chunks stored otherwise to the reader threads;
- what the GPU does not take says why, and --decode auto leaves these filters to the reader threads
  (which ran them faster on an H200) while --decode gpu takes them."""
import ctypes
import subprocess

import h5py
import numpy as np
import pytest

from infer.data import loader
from infer.data.dataset import DataSet
from infer.errors import BackendUnavailable, InputError
from infer.gpu import chunk_decode, codecs, compiler
from tests.conftest import small_model
from tests.test_blosc_chunks import chunks_of, lz4_block

hdf5plugin = pytest.importorskip("hdf5plugin")


def walked(chunk, codec, rows):
    """A chunk decoded as the two kernels do: lz4_index_kernel1's walk (each block's start and size,
    the sizes adding up to the chunk's with `tail` bytes left), lz4_blocks_kernel1's blocks block_bytes
    apart (LZ4's filter: a block of its decoded size stored as it is). (Its bytes, blocks stored as
    they are.)"""
    block, blocks, last, tail = codec.framing(rows, int.from_bytes(chunk[8:12].tobytes(), "big"))
    assert int.from_bytes(chunk[:8].tobytes(), "big") == rows.chunk_bytes
    out, at, raw = bytearray(), 12, 0
    for k in range(blocks):
        stored = int.from_bytes(chunk[at:at + 4].tobytes(), "big")
        at += 4
        cap = last if k == blocks - 1 else block
        data = chunk[at:at + stored].tobytes()
        raw += codec.raw and stored == cap
        out += data if codec.raw and stored == cap else lz4_block(data, cap, raw=False)
        at += stored
    assert len(chunk) - at == tail
    return bytes(out + chunk[at:].tobytes()), raw


def bshuf_unshuffled(stored, dtype, block):
    """The values of a Bitshuffle chunk: blocks of `block` values bit-transposed, the last shorter
    one (a multiple of 8 values) too, the values after it as they are."""
    n, size = len(stored) // dtype.itemsize, dtype.itemsize
    bits = np.unpackbits(np.frombuffer(stored, np.uint8), bitorder="little")
    values = bits.copy()
    done = 0
    while n - done >= 8:
        m = min(block, (n - done) // 8 * 8)
        lo, hi = done * size * 8, (done + m) * size * 8
        values[lo:hi] = bits[lo:hi].reshape(size * 8, m).T.reshape(-1)
        done += m
    return np.packbits(values, bitorder="little").view(dtype)


def stored(tmp_path, x, chunk, filters, shuffle=False):
    path = tmp_path / "c.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x, chunks=(chunk,) + x.shape[1:], shuffle=shuffle, **filters)
        f["y"] = np.eye(10)[np.arange(len(x)) % 10]
    return path


def opened(path, model):
    data = DataSet.open([path], model)
    return data, data.parts[0][1]


@pytest.fixture
def model(ece408):
    return loader.load_model(ece408 / "model.hdf5")


@pytest.mark.parametrize("chunk", [16, 37, 250])  # 12,544 values: 6 blocks and 256 values; 29,008: 14 and 336
def test_bitshuffle_chunks_walked_and_unshuffled_give_h5pys_values(tmp_path, ece408, model, chunk):
    with h5py.File(ece408 / "testfull.hdf5") as f:
        x = f["x"][:611]
    path = stored(tmp_path, x, chunk, hdf5plugin.Bitshuffle(cname="lz4"))
    data, rows = opened(path, model)
    try:
        assert chunk_decode.unsupported(data, np.dtype("f4")) is None
        assert codecs.codec_for(rows) is codecs.Bitshuffle
        chunks = chunks_of(path)
        buf = np.concatenate(chunks)
        at = np.concatenate([[0], np.cumsum([len(c) for c in chunks])[:-1]])
        sizes = np.array([len(c) for c in chunks])
        coder = object.__new__(codecs.Bitshuffle)
        coder.block_bytes = codecs.Bitshuffle._block_of(rows)
        assert coder.taken(buf, at, sizes, rows.chunk_bytes).all()
        got = np.concatenate([bshuf_unshuffled(walked(c, codecs.Bitshuffle, rows)[0], np.dtype("f4"),
                                               rows.bitshuffle[0]) for c in chunks])
        np.testing.assert_array_equal(got[:x.size].reshape(x.shape), x)
        # another block size in one chunk's header, or another decoded size: the host's
        other = buf.copy()
        other[at[1] + 11] ^= 0x40
        other[at[2] + 7] ^= 0x01
        assert coder.taken(other, at, sizes, rows.chunk_bytes).tolist() == [True, False, False] + [True] * (len(at) - 3)
    finally:
        data.close()


@pytest.mark.parametrize("nbytes,shuffle", [(0, False), (0, True), (1000, False), (65536, True)])
@pytest.mark.parametrize("dtype", ["f4", "u1", "i2"])
def test_lz4_chunks_walked_give_h5pys_values(tmp_path, model, rng, nbytes, shuffle, dtype):
    """LZ4's filter in one block a chunk (its default) or in blocks of 1,000 bytes (not a whole number
    of values) or 64 KB; noise rows make blocks that do not shrink, stored as they are."""
    x = (rng.integers(0, 200, (300, 28, 28, 1)) * (rng.random((300, 28, 28, 1)) < 0.3)).astype(dtype)
    x[40:60] = rng.integers(0, 256, (20, 28, 28, x.itemsize), np.uint8).view(dtype)
    path = stored(tmp_path, x, 64, hdf5plugin.LZ4(nbytes=nbytes), shuffle)
    data, rows = opened(path, model)
    try:
        assert chunk_decode.unsupported(data, np.dtype(dtype)) is None
        raw_blocks = 0
        for k, c in enumerate(chunks_of(path)):
            plain, raw = walked(c, codecs.Lz4, rows)
            plain = np.frombuffer(plain, np.uint8)
            if shuffle and x.itemsize > 1:
                plain = plain.reshape(x.itemsize, -1).T.reshape(-1)
            got = plain.view(dtype).reshape((64,) + x.shape[1:])[:len(x) - 64 * k]
            np.testing.assert_array_equal(got, x[64 * k:64 * (k + 1)])
            raw_blocks += raw
        assert raw_blocks or nbytes != 1000  # a block stored as it is walked too
    finally:
        data.close()


@pytest.mark.parametrize("filters,dtype,chunk,reason", [
    (lambda: hdf5plugin.Bitshuffle(cname="zstd"), "f4", 16, "lz4 blocks, not its zstd"),
    (lambda: hdf5plugin.Bitshuffle(cname="none"), "f4", 16, "lz4 blocks, not its zstd or uncompressed"),
    (lambda: hdf5plugin.LZ4(nbytes=256), "f4", 16, "LZ4 blocks, more than the GPU's index takes"),
    (lambda: dict(hdf5plugin.LZ4(), shuffle=True), ">f4", 16, "stored in the other byte order"),
    (lambda: hdf5plugin.Blosc2(cname="zstd", filters=2), "f4", 64, "Blosc2's lz4, not its other codecs"),
    (lambda: hdf5plugin.Blosc2(cname="lz4", filters=2), "f4", 100, "decode past the HDF5 chunk (b2nd blocks"),
    (lambda: hdf5plugin.Blosc2(cname="lz4", filters=1), "f4", 64, "Blosc2 chunks bitshuffled alone"),
])
def test_what_the_gpu_does_not_decode_says_why(tmp_path, model, rng, filters, dtype, chunk, reason):
    x = rng.random((120, 28, 28, 1)).astype(dtype)
    path = tmp_path / "w.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x, chunks=(chunk, 28, 28, 1), **filters())
        f["y"] = np.eye(10)[rng.integers(0, 10, 120)]
    data = DataSet.open([path], model)
    try:
        assert reason in chunk_decode.unsupported(data, np.dtype("f4"))
    finally:
        data.close()


def test_bitshuffle_framing_counts_blocks_of_whole_groups_of_8(tmp_path, rng):
    """A chunk of 13x13 uint16 images, 5 of them (845 values) in blocks of 256: 3 whole blocks, a last
    of 72 values (9 groups of 8), 5 values (10 bytes) after it."""
    path = stored(tmp_path, rng.integers(0, 9, (20, 13, 13, 1)).astype("u2"), 5,
                  hdf5plugin.Bitshuffle(nelems=256, cname="lz4"))
    data, rows = opened(path, loader.model_from_arrays(small_model(rng)))
    try:
        assert codecs.Bitshuffle.framing(rows, 512) == (512, 4, 144, 10)
        assert codecs.Lz4.framing(rows, 512) == (512, 4, 1690 - 3 * 512, 0)
    finally:
        data.close()


@pytest.mark.parametrize("filters,chunks", [(lambda: hdf5plugin.Bitshuffle(cname="lz4"), (10, 28, 28, 1)),
                                            (lambda: hdf5plugin.LZ4(nbytes=65536), (10, 28, 28, 1)),
                                            (lambda: hdf5plugin.LZ4(nbytes=65536), (10, 14, 28, 1))])
def test_auto_leaves_lz4_blocks_to_the_reader_threads_and_gpu_takes_them(tmp_path, ece408, monkeypatch, filters,
                                                                        chunks):
    """The reader threads' LZ4 outran the GPU's on an H200: a streamed run decodes
    them on the host by default, saying why (chunks cutting MNIST images then travel as the 8-bit
    codes the threads assemble), and on the GPU with --decode gpu."""
    from tests.test_run_plan import described

    with h5py.File(ece408 / "test100.hdf5") as f:
        x, y = f["x"][()], f["y"][()]
    path = tmp_path / "b.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x, chunks=chunks, **filters())
        f["y"] = y
    monkeypatch.setenv("CNNINFER_HOST_BUDGET_MB", "0")
    auto, gpu = described(path, ece408, "H200"), described(path, ece408, "H200", decode="gpu")
    assert auto.streamed and auto.decode == "host"
    assert auto.reasons["decode"] == f"by the reader threads: {codecs.Bitshuffle.host_first}"
    assert gpu.streamed and gpu.decode == "gpu" and gpu.decoding
    # each gate alone: the backend's mode as made, and a plan under a backend made "auto" for another file
    from infer import network, plan as planning
    from infer.gpu.device import KNOWN
    from infer.options import Options

    model = loader.load_model(ece408 / "model.hdf5")
    data = DataSet.open([path], model)
    try:
        d = planning.Data.of(data)
        assert planning.decode_mode(d, Options(), 0) == "host"
        under_auto = planning.make(d, network.geometry(model, (d.size,) + d.image_shape, str(path)), KNOWN["H200"],
                                   Options(), budget=0, decoding_mode="auto")
        assert under_auto.decode == "host" and codecs.Bitshuffle.host_first in under_auto.reasons["decode"]
        assert under_auto.wire_name.startswith("8-bit codes") == (chunks[1] == 14), under_auto.wire_name
    finally:
        data.close()


HARNESS = """
#include "lz4.cu"
extern "C" int walk(const unsigned char* in, unsigned long long size, int blocks, int tail, unsigned* at_k) {
    return lz4_walk(in, size, blocks, tail, at_k);
}
"""


def built_for_host(where, source, *defines):
    """A library nvcc builds for the host from `source` (which includes cuda/'s files; defines: -D
    options), in the folder `where`; the test skips where there is no nvcc."""
    try:
        nvcc = compiler.nvcc()
    except BackendUnavailable as e:
        pytest.skip(str(e))
    name = "-".join(["h"] + [d.replace("=", "") for d in defines])
    (where / f"{name}.cu").write_text(source)
    subprocess.run([nvcc, "-shared", "-Xcompiler", "-fPIC", "-arch=sm_80", *(f"-D{d}" for d in defines), "-I",
                    str(compiler.kernel_dir()), "-o", str(where / f"{name}.so"), str(where / f"{name}.cu")],
                   check=True, capture_output=True)
    return ctypes.CDLL(str(where / f"{name}.so"))


@pytest.fixture(scope="module")
def lz4_walk(tmp_path_factory):
    """lz4_index_kernel1's walk (cuda/lz4.cu's lz4_walk) built by nvcc for the host: (ok, index)."""
    lib = built_for_host(tmp_path_factory.mktemp("walk"), HARNESS)

    def walk(chunk, blocks, tail):
        index = np.full(2 * blocks, 7, np.uint32)
        chunk = np.ascontiguousarray(chunk, np.uint8)
        ok = lib.walk(chunk.ctypes.data_as(ctypes.c_void_p), ctypes.c_ulonglong(len(chunk)), blocks, tail,
                      index.ctypes.data_as(ctypes.c_void_p))
        return bool(ok), index.reshape(-1, 2)
    return walk


@pytest.mark.parametrize("filters", [lambda: hdf5plugin.Bitshuffle(nelems=256, cname="lz4"),
                                     lambda: hdf5plugin.LZ4(nbytes=1000)])
def test_the_kernels_walk_finds_each_block_and_flags_damage(tmp_path, rng, lz4_walk, filters):
    """The walk the GPU runs, on real chunks of 5 13x13 uint16 images (Bitshuffle: 10 bytes after its
    last block): every block's start and size as the reference walk reads them; a chunk a byte short,
    a byte long, or with a block's size past its end, refused, its blocks from the damage on unreadable."""
    x = (rng.integers(0, 9, (23, 13, 13, 1)) * (rng.random((23, 13, 13, 1)) < 0.5)).astype("u2")
    path = stored(tmp_path, x, 5, filters())
    data, rows = opened(path, loader.model_from_arrays(small_model(rng)))
    codec = codecs.codec_for(rows)
    try:
        for chunk in chunks_of(path):
            _, blocks, _, tail = codec.framing(rows, int.from_bytes(chunk[8:12].tobytes(), "big"))
            assert (blocks, tail) == ((4, 10) if codec is codecs.Bitshuffle else (2, 0))
            ok, index = lz4_walk(chunk, blocks, tail)
            assert ok
            at = 12
            for k in range(blocks):
                size = int.from_bytes(chunk[at:at + 4].tobytes(), "big")
                assert index[k].tolist() == [at + 4, size]
                at += 4 + size
            assert lz4_walk(chunk[:-1], blocks, tail)[0] is False
            assert lz4_walk(np.append(chunk, 0), blocks, tail)[0] is False
            bad = chunk.copy()
            second = 16 + int.from_bytes(chunk[12:16].tobytes(), "big")
            bad[second:second + 4] = [0x7F, 0xFF, 0xFF, 0xFF]
            ok, index = lz4_walk(bad, blocks, tail)
            assert not ok and index[0, 1] != 0xFFFFFFFF and (index[1:, 1] == 0xFFFFFFFF).all()
            assert lz4_walk(chunk[:13], blocks, tail)[0] is False  # not even a whole size
    finally:
        data.close()


class Device:
    """Device memory as a NumPy array (addresses are offsets into it) and the kernels the codecs
    launch, run on it as the GPU runs them: lz4_index_kernel1 by the host-built lz4_walk, the LZ4
    blocks by the reference decoder, the unshuffles by NumPy."""

    def __init__(self, walk, dtype):
        self.mem, self.walk, self.dtype = np.zeros(32 << 20, np.uint8), walk, np.dtype(dtype)
        self.bad = []

    def u64(self, at, n):
        return self.mem[at:at + 8 * n].view(np.uint64).astype(np.int64)

    def index(self, stream, count, starts, sizes, outputs, chunk_bytes, blocks, tail, index, first, bad):
        for c, (at, size, out) in enumerate(zip(self.u64(starts, count), self.u64(sizes, count), self.u64(outputs, count))):
            if size:
                ok, found = self.walk(self.mem[at:at + size], blocks, tail)
                self.mem[index + 8 * blocks * c:][:8 * blocks] = found.reshape(-1).view(np.uint8)
                self.mem[out + chunk_bytes - tail:][:tail] = self.mem[at + size - tail:][:tail]
                if not ok:
                    self.flag(bad, first + c)

    def lz4(self, stream, count, starts, sizes, outputs, block_bytes, blocks, last_bytes, raw, index, first, bad):
        found = self.mem[index:index + 8 * blocks * count].view(np.uint32).reshape(count, blocks, 2)
        for c, (at, size, out) in enumerate(zip(self.u64(starts, count), self.u64(sizes, count), self.u64(outputs, count))):
            for k in range(blocks if size else 0):
                cap = last_bytes if k == blocks - 1 else block_bytes
                if found[c, k, 1] == 0xFFFFFFFF:  # UNREADABLE: past the damage the walk found
                    continue
                src = self.mem[at + int(found[c, k, 0]):][:int(found[c, k, 1])].tobytes()
                try:
                    self.mem[out + k * block_bytes:][:cap] = np.frombuffer(lz4_block(src, cap, raw=bool(raw)), np.uint8)
                except (AssertionError, IndexError, ValueError):  # the reference decoder's damage
                    self.flag(bad, first + c)

    def flag(self, bad, j):
        """What the kernels' atomicMin(bad, j) does, and the failures noted."""
        self.bad.append(j)
        flags = self.mem[bad:bad + 4].view(np.int32)
        flags[0] = min(flags[0], j)

    def bit_unshuffle(self, stream, src, dst, chunks, chunk_values, block, exact_tail, first_value, values):
        assert not exact_tail  # Bitshuffle's layout
        size = self.dtype.itemsize * chunk_values
        plain = np.concatenate([bshuf_unshuffled(self.mem[src + i * size:][:size].tobytes(), self.dtype, block)
                                for i in range(chunks)])
        self.put(dst, plain[first_value:first_value + values])

    def unshuffle(self, stream, decoded, dst, first_value, values, chunk_values, stride):
        chunks, size = -(-(first_value + values) // chunk_values), self.dtype.itemsize
        plain = np.concatenate([self.mem[decoded + i * stride:][:chunk_values * size].reshape(size, -1).T.reshape(-1)
                                for i in range(chunks)]).view(self.dtype)
        self.put(dst, plain[first_value:first_value + values])

    def put(self, at, values):
        raw = np.ascontiguousarray(values).reshape(-1).view(np.uint8)
        self.mem[at:at + len(raw)] = raw

    def copy(self, dst, src, n, stream):
        self.mem[dst:dst + n] = self.mem[src:src + n]

    def install(self, monkeypatch, rows):
        """This device as pycuda.driver's copies (fake_driver), the chunks of `rows` the GPU leaves
        to the reader threads read at once on this thread."""
        from types import SimpleNamespace

        monkeypatch.setattr(rows, "submit", lambda pool, lo, hi, out: SimpleNamespace(result=lambda: rows.read(lo, hi, out)))
        fake = fake_driver(monkeypatch)
        fake.memcpy_dtod_async = self.copy
        fake.memcpy_htod_async = lambda dst, src, stream: self.put(dst, src)


def fake_driver(monkeypatch):
    """A pycuda.driver in PyCUDA's place: page-locked memory NumPy's, anything else a stand-in that
    does nothing; the executor's events always done. (The module, to add to.)"""
    import sys
    from types import ModuleType, SimpleNamespace

    from infer.gpu.launch.base import _StandIn

    fake = ModuleType("pycuda.driver")
    fake.__getattr__ = lambda name: _StandIn()
    def pagelocked_empty(shape, dtype):  # as PyCUDA's: a shape of Python ints (a NumPy integer fails there)
        assert type(shape) is int or type(shape) is tuple and all(type(n) is int for n in shape), repr(shape)
        return np.empty(shape, dtype)
    fake.pagelocked_empty = pagelocked_empty
    executor = ModuleType("infer.gpu.executor")
    executor.event = lambda stream: SimpleNamespace(query=lambda: True, synchronize=lambda: None)
    monkeypatch.setitem(sys.modules, "pycuda", ModuleType("pycuda"))
    monkeypatch.setitem(sys.modules, "pycuda.driver", fake)
    monkeypatch.setitem(sys.modules, "infer.gpu.executor", executor)
    return fake


def placed(tmp_path, model, monkeypatch, walk, x, chunk, filters, shuffle, lo, hi, host=0, mend=None):
    """Images [lo, hi) of x stored in chunks of `chunk` through `filters` (then mend(path)): the
    codec's prepare, decode and place run on a Device as a group of one block (`host` of its chunks
    left to the reader threads); the images placed."""
    import sys
    from types import SimpleNamespace

    from infer.gpu import launch

    path = stored(tmp_path, x, chunk, filters, shuffle)
    if mend:
        mend(path)
    data, rows = opened(path, model)
    gpu = Device(walk, x.dtype)
    gpu.install(monkeypatch, rows)
    monkeypatch.setattr(launch, "Lz4Index", lambda build: gpu.index)
    monkeypatch.setattr(launch, "Lz4Blocks", lambda build: gpu.lz4)
    monkeypatch.setattr(launch, "BitUnshuffleRange", lambda build, size: gpu.bit_unshuffle)
    monkeypatch.setattr(launch, "Unshuffle", lambda build, size: gpu.unshuffle)
    try:
        codec = codecs.codec_for(rows)(None, rows)
        chunks = chunks_of(path)
        c0, c1 = lo // chunk, -(-hi // chunk)
        buf = np.concatenate(chunks[c0:c1])
        block = chunk_decode.Block(buf, hi - lo)
        block.lo, block.c0, block.end = lo, c0, len(buf)
        block.positions = np.concatenate([[0], np.cumsum([len(c) for c in chunks[c0:c1 - 1]])]).astype(np.int64)
        group_rows = 8 * codec.rows_per_chunk(rows)
        table_at, data_at, decoded_at, scratch_at, dst = 4096, 1 << 16, 8 << 20, 16 << 20, 24 << 20
        dec = SimpleNamespace(sizes=np.array([len(c) for c in chunks]), chunk_bytes=rows.chunk_bytes, per=chunk, slab=1,
                              stride=codec.stride(rows.chunk_bytes), row_bytes=rows.row_bytes, flags=0,
                              pool=SimpleNamespace(native=None),
                              columns=lambda t: [t + k * 8 * group_rows for k in range(codec.arrays)])
        table = np.zeros((codec.arrays, group_rows), np.uint64)
        taken, extra = codec.prepare(dec, block, table, 0, data_at, decoded_at)
        assert taken and len(extra) == host
        gpu.mem[table_at:table_at + table.nbytes] = table.view(np.uint8).reshape(-1)
        gpu.mem[data_at:data_at + len(buf)] = buf
        codec.decode(dec, None, c1 - c0, table_at, decoded_at, c0, scratch_at, [extra])
        codec.place(dec, None, chunk_decode.Piece(lo, c0, c1 - c0, hi - lo, extra), decoded_at, dst)
        assert gpu.bad == []
        return gpu.mem[dst:dst + (hi - lo) * rows.row_bytes].view(x.dtype).reshape((hi - lo,) + x.shape[1:])
    finally:
        data.close()


@pytest.mark.parametrize("filters,shuffle", [(lambda: hdf5plugin.Bitshuffle(nelems=256, cname="lz4"), False),
                                             (lambda: hdf5plugin.LZ4(nbytes=1000), False),
                                             (lambda: hdf5plugin.LZ4(nbytes=1000), True)])
@pytest.mark.parametrize("lo,hi", [(0, 23), (7, 21), (20, 23)])
def test_a_block_decoded_and_placed_as_the_codec_launches_it(tmp_path, rng, monkeypatch, lz4_walk, filters, shuffle,
                                                             lo, hi):
    """codecs.Bitshuffle and codecs.Lz4, host side (no GPU: the kernels run on a NumPy device memory,
    see Device): images [lo, hi) of 23 13x13 uint16 images in chunks of 5, a block's table written by
    prepare, decoded by the two kernels as decode launches them, placed (unshuffled, or copied) as
    place launches it, are h5py's images."""
    x = (rng.integers(0, 9, (23, 13, 13, 1)) * (rng.random((23, 13, 13, 1)) < 0.5)).astype("u2")
    x[9:12] = rng.integers(0, 1 << 16, (3, 13, 13, 1))  # blocks that do not shrink (LZ4: stored as they are)
    got = placed(tmp_path, loader.model_from_arrays(small_model(rng)), monkeypatch, lz4_walk, x, 5, filters(), shuffle,
                 lo, hi)
    np.testing.assert_array_equal(got, x[lo:hi])


@pytest.mark.parametrize("dtype,chunk", [("f4", 256), ("u1", 512)])  # 4 b2nd blocks of 64 rows a chunk; 8
@pytest.mark.parametrize("lo,hi", [(0, 600), (300, 500)])
def test_a_blosc2_block_decoded_and_placed_as_the_codec_launches_it(tmp_path, rng, monkeypatch, model, dtype, chunk, lo,
                                                                   hi):
    """codecs.Blosc2 on a Device: each chunk's block starts and sizes read by the host into the
    index column, the blocks decoded (a noise band's stored as they are), the bits unshuffled; the
    last chunk, past the data set's end, has blocks of zeros stored as runs: the reader threads'."""
    x = (rng.integers(0, 200, (600, 28, 28, 1)) * (rng.random((600, 28, 28, 1)) < 0.3)).astype(dtype)
    x[130:200] = rng.integers(0, 256, (70, 28, 28, x.itemsize), np.uint8).view(dtype)
    filters = hdf5plugin.Blosc2(cname="lz4", clevel=5, filters=hdf5plugin.Blosc2.BITSHUFFLE)
    got = placed(tmp_path, model, monkeypatch, None, x, chunk, filters, False, lo, hi, host=int(hi > 600 // chunk * chunk))
    np.testing.assert_array_equal(got, x[lo:hi])


def test_a_blosc2_chunk_stored_otherwise_is_the_hosts_and_a_damaged_one_refused(tmp_path, rng, monkeypatch, model):
    """Chunk 1 stored with zstd: decoded by the reader threads, placed over the GPU's; chunk 0 with its
    second block starting past its end: refused by prepare, naming it."""
    from tests.test_gpu_decode import blosc_chunk
    from tests.test_gpu_lz4_blocks import restored

    x = (rng.integers(0, 200, (512, 28, 28, 1)) * (rng.random((512, 28, 28, 1)) < 0.3)).astype("f4")
    lz4 = hdf5plugin.Blosc2(cname="lz4", clevel=5, filters=hdf5plugin.Blosc2.BITSHUFFLE)
    other = hdf5plugin.Blosc2(cname="zstd", clevel=5, filters=hdf5plugin.Blosc2.BITSHUFFLE)
    got = placed(tmp_path, model, monkeypatch, None, x, 256, lz4, False, 100, 512, host=1,
                 mend=lambda path: blosc_chunk(path, 1, restored(tmp_path, other)))
    np.testing.assert_array_equal(got, x[100:512])

    def damaged(path):
        def mend(data, rows):
            at = 203 + 32 + 4  # the frame's header, the chunk's, the first block's start: the second's
            return bytes(data[:at] + (10 ** 8).to_bytes(4, "little") + data[at + 4:])
        blosc_chunk(path, 0, mend)
    (tmp_path / "d").mkdir()
    with pytest.raises(InputError, match=r"c\.h5: dataset 'x': chunk 0 cannot be decompressed \(Blosc2: a block's start"):
        placed(tmp_path / "d", model, monkeypatch, None, x, 256, lz4, False, 0, 512, mend=damaged)


def test_blocks_the_gpu_decoder_cannot_take_say_why():
    """No whole block, blocks under the index's 512 bytes (Bitshuffle and LZ4, whose index is the
    lane's scratch memory; Blosc2's is the table), a block of 2 GB or more (32-bit offsets)."""
    from types import SimpleNamespace

    rows = SimpleNamespace(dtype=np.dtype("u1"), chunk_bytes=5 << 30)
    assert codecs.Lz4._blocks_unsupported(rows, 1 << 30) is None
    assert "past the GPU decoder's 2 GB" in codecs.Lz4._blocks_unsupported(rows, 2 << 30)
    assert "more than the GPU's index takes" in codecs.Bitshuffle._blocks_unsupported(rows, 256)
    assert codecs.Blosc2._blocks_unsupported(rows, 256) is None
    assert "no whole LZ4 block" in codecs.Bitshuffle._blocks_unsupported(SimpleNamespace(dtype=np.dtype("f4"),
                                                                                         chunk_bytes=20), 4096)
