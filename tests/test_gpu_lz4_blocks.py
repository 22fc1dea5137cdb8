"""hdf5plugin's LZ4 and Bitshuffle (lz4) chunks decoded on the GPU (--decode gpu: lz4_index_kernel1,
lz4_blocks_kernel1), and Blosc2's lz4 + bitshuffle ones (lz4_blocks_kernel1 alone): the predictions of the host's decoding for each block size, shuffle, value type
and chunk size (blocks stored as they are, Bitshuffle's values after its last block, chunks cutting
images assembled), a chunk of another block size left to the reader threads, and a damaged chunk
refused in one line naming it. Needs a GPU."""
import h5py
import numpy as np
import pytest

from infer.errors import InputError
from tests.conftest import assert_refused, invoke
from tests.test_gpu_decode import SMALL, assert_same_as_host, blosc_chunk, sessions  # noqa: F401 (a fixture)

pytestmark = pytest.mark.gpu
hdf5plugin = pytest.importorskip("hdf5plugin")
FILTERS = {
    "bshuf": lambda: hdf5plugin.Bitshuffle(cname="lz4"),  # blocks of 8 KB
    "bshuf_512": lambda: hdf5plugin.Bitshuffle(nelems=512, cname="lz4"),  # u1: the index's least, 512 bytes
    "lz4": lambda: hdf5plugin.LZ4(),  # a block a chunk
    "lz4_1000": lambda: hdf5plugin.LZ4(nbytes=1000),  # blocks not of whole values
    "lz4_64k": lambda: hdf5plugin.LZ4(nbytes=65536),
    "blosc2": lambda: hdf5plugin.Blosc2(cname="lz4", clevel=5, filters=hdf5plugin.Blosc2.BITSHUFFLE),
}
KERNELS = "GPU: lz4_index_kernel1 + lz4_blocks_kernel1"


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    """Every file streamed, in blocks of a few chunks, decoded in groups of 3 blocks."""
    monkeypatch.setenv("CNNINFER_HOST_BUDGET_MB", "0")
    for codec in ("Bitshuffle", "Lz4"):
        monkeypatch.setattr(f"infer.gpu.codecs.{codec}.block_bytes", 150_000)
        monkeypatch.setattr(f"infer.gpu.codecs.{codec}.group", 3)
    monkeypatch.setattr("infer.gpu.chunk_decode.MAX_STREAMS", 2)


def write(path, x, y, chunk, name, shuffle=False):
    chunks = chunk if isinstance(chunk, tuple) else (chunk,) + x.shape[1:]
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x, chunks=chunks, shuffle=shuffle, **FILTERS[name]())
        f["y"] = y
    return path


def mnist(ece408, n=1999):
    with h5py.File(ece408 / "testfull.hdf5") as f:
        return f["x"][:n], f["y"][:n]


@pytest.mark.parametrize("name", [name for name in FILTERS if name != "blosc2"])
# 16 images: 50,176 bytes (Bitshuffle: 6 blocks, then 256 values); 37: 29,008 values; 350: 1.1 MB
@pytest.mark.parametrize("chunk", [16, 37, 350])
def test_mnist_float32_decoded_on_the_gpu_as_on_the_host(tmp_path, ece408, sessions, name, chunk):
    x, y = mnist(ece408)
    r = assert_same_as_host(sessions, write(tmp_path / "m.h5", x, y, chunk, name), ece408 / "model.hdf5", KERNELS)
    assert r.correct > 1700


@pytest.mark.parametrize("chunk", [64, 256, 512])  # b2nd blocks of 64 rows: 1, 4, 8 a chunk (not padded past it)
def test_mnist_float32_blosc2_decoded_on_the_gpu_as_on_the_host(tmp_path, ece408, sessions, chunk):
    x, y = mnist(ece408)
    r = assert_same_as_host(sessions, write(tmp_path / "m.h5", x, y, chunk, "blosc2"), ece408 / "model.hdf5",
                            "GPU: lz4_blocks_kernel1 (Blosc2 blocks)")
    assert r.correct > 1700


@pytest.mark.parametrize("name,shuffle", [("bshuf", False), ("bshuf_512", False), ("lz4", True), ("lz4_1000", False),
                                          ("lz4_1000", True)])
@pytest.mark.parametrize("dtype", ["u1", "i2"])
def test_odd_images_of_integer_types(tmp_path, rng, sessions, name, shuffle, dtype):
    """13x13x1 images, mostly zeros, with a band of noise whose LZ4 blocks do not shrink (stored as
    they are), in chunks of 47 (7,943 values: Bitshuffle stores the last 7 after its last block),
    the last partly past the data set's end."""
    x = (rng.integers(1, 5, (613, 13, 13, 1)) * 40 * (rng.random((613, 13, 13, 1)) < 0.4)).astype(dtype)
    x[100:160] = rng.integers(0, 256, (60, 13, 13, np.dtype(dtype).itemsize), np.uint8).view(dtype)
    y = np.eye(10)[rng.integers(0, 10, len(x))]
    path = write(tmp_path / "o.h5", x, y, 47, name, shuffle)
    if name == "bshuf_512" and dtype == "u1":  # 15 blocks of 512 bytes and a shorter one: past the index's share
        with pytest.raises(InputError, match="7,943-byte chunks hold 16 LZ4 blocks, more than the GPU's index takes"):
            sessions(SMALL, "gpu").evaluate(path)
        return
    r = assert_same_as_host(sessions, path, SMALL, KERNELS)
    assert ("unshuffle" in r.reader["decode"]) == (shuffle and dtype != "u1" or name.startswith("bshuf"))


@pytest.mark.parametrize("chunk,shuffle", [((250, 14, 28, 1), False), ((128, 7, 28, 1), True), ((64, 28, 10, 1), True)])
def test_lz4_chunks_cutting_images_are_assembled_on_the_gpu(tmp_path, ece408, sessions, chunk, shuffle):
    x, y = mnist(ece408, 1500)
    r = assert_same_as_host(sessions, write(tmp_path / "c.h5", x, y, chunk, "lz4_64k", shuffle), ece408 / "model.hdf5",
                            KERNELS)
    assert "assemble" in r.reader["decode"]


def restored(tmp_path, filters):
    """A mend for blosc_chunk: the chunk's rows as `filters` store them."""
    def stored(data, rows):
        with h5py.File(tmp_path / "other.h5", "w") as f:
            d = f.create_dataset("x", data=rows, chunks=rows.shape, **filters)
            return d.id.read_direct_chunk((0,) * rows.ndim)[1]
    return stored


@pytest.mark.parametrize("name,chunk,other,kernels", [
    ("bshuf", 50, hdf5plugin.Bitshuffle(nelems=512, cname="lz4"), KERNELS),
    ("lz4_64k", 50, hdf5plugin.LZ4(nbytes=4096), KERNELS),
    ("blosc2", 128, hdf5plugin.Blosc2(cname="zstd", filters=hdf5plugin.Blosc2.BITSHUFFLE), "GPU: lz4_blocks_kernel1"),
])
def test_a_chunk_stored_otherwise_is_decoded_on_the_host(tmp_path, ece408, sessions, name, chunk, other, kernels):
    x, y = mnist(ece408, 900)
    path = write(tmp_path / "b.h5", x, y, chunk, name)
    blosc_chunk(path, 5 if chunk == 50 else 2, restored(tmp_path, other))
    with h5py.File(path) as f:
        np.testing.assert_array_equal(f["x"][:], x)
    assert_same_as_host(sessions, path, ece408 / "model.hdf5", kernels)


def first_block_size(data, size):
    return data[:12] + size.to_bytes(4, "big") + data[16:]


@pytest.mark.parametrize("name,mend,words", [
    ("bshuf", lambda data: first_block_size(data, 10 ** 9), ["chunk 3", "cannot be decompressed", "Bitshuffle lz4"]),
    ("lz4_64k", lambda data: first_block_size(data, 10 ** 9), ["chunk 3", "cannot be decompressed", "LZ4"]),
    ("bshuf", lambda data: data[:-1], ["chunk 3", "cannot be decompressed"]),  # its last byte gone
    # the first block's token: more literals than it holds
    ("bshuf", lambda data: data[:16] + bytes([0xF0]) + bytes([0xFF]) * 40 + data[57:], ["chunk 3", "cannot be decompressed"]),
    ("lz4", lambda data: data[:16] + bytes([0xF0]) + bytes([0xFF]) * 200 + data[217:], ["chunk 3", "cannot be decompressed"]),
    # Blosc2: its first block's stream (after the frame's 203 bytes, the chunk's 32, 4 block starts, its
    # size): more literals than the block's 200,704 bytes
    ("blosc2", lambda data: data[:203 + 52] + bytes([0xF0]) + bytes([0xFF]) * 1000 + data[203 + 1053:],
     ["chunk 3", "cannot be decompressed", "Blosc2 lz4"]),
])
def test_a_damaged_chunk_is_refused_in_one_line(tmp_path, ece408, name, mend, words):
    x, y = mnist(ece408, 2000)
    path = write(tmp_path / "bad.h5", x, y, 256 if name == "blosc2" else 50, name)
    blosc_chunk(path, 3, lambda data, rows: bytes(mend(data)))
    out = tmp_path / "p.npy"
    r = invoke("run", path, ece408 / "model.hdf5", "--decode", "gpu", "--predictions", out)
    assert_refused(r, "bad.h5", "'x'", *words)
    assert not out.exists()


@pytest.mark.parametrize("name,chunk", [("bshuf", 50), ("lz4_64k", 50), ("blosc2", 256)])
def test_a_truncated_file_is_refused_in_one_line(tmp_path, ece408, name, chunk):
    x, y = mnist(ece408, 2000)
    whole = write(tmp_path / "whole.h5", x, y, chunk, name)
    cut = tmp_path / "cut.h5"
    cut.write_bytes(whole.read_bytes()[:whole.stat().st_size // 2])
    out = tmp_path / "p.npy"
    r = invoke("run", cut, ece408 / "model.hdf5", "--decode", "gpu", "--predictions", out)
    assert_refused(r, "cut.h5")
    assert not out.exists()
