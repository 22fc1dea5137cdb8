"""The GPU's Blosc zstd decoding without a GPU: the table BloscZstd.prepare writes for the chunks
hdf5plugin writes (a row a c-blosc block: its Zstandard frame, size, capacity, output), each row
decoded by hdf5plugin's own libzstd, the blocks stored as they are copied, and c-blosc's shuffle
undone a block at a time by blosc_unshuffle_kernel1's index arithmetic (a NumPy reference) give the
values h5py reads; chunks stored otherwise are left to the reader threads; a chunk whose block
starts run past its bytes is refused, named."""
import ctypes
from types import SimpleNamespace

import h5py
import numpy as np
import pytest

from infer.data import native, reader
from infer.errors import InputError
from infer.gpu import codecs, launch
from tests.test_gpu_decode import blosc_stored_as

hdf5plugin = pytest.importorskip("hdf5plugin")
DATA, DECODED = 1 << 40, 1 << 41  # device addresses the table is written for


@pytest.fixture
def no_kernels(monkeypatch):
    for name in ("Zstd", "StreamCheck", "BloscUnshuffle"):
        monkeypatch.setattr(launch, name, lambda *args: None)


def zstd_decompress():
    address = native.block_codecs(reader.FILTER_BLOSC).get("zstd")
    if address is None:
        pytest.skip("hdf5plugin's Blosc plugin exports no ZSTD_decompress here")
    return ctypes.CFUNCTYPE(ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                            ctypes.c_size_t)(address)


def write(path, x, chunk, shuffle, mend=None):
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x, chunks=(chunk,) + x.shape[1:],
                         **hdf5plugin.Blosc(cname="zstd", clevel=5, shuffle=shuffle))
    if mend:
        with h5py.File(path, "r+") as f:
            d = f["x"]
            at = d.id.get_chunk_info(1).chunk_offset
            mask, data = d.id.read_direct_chunk(at)
            d.id.write_direct_chunk(at, mend(bytearray(data), d[at[0]:at[0] + chunk]), mask)
    return path


def decoded(path, lo, hi):
    """Images [lo, hi) of path as the GPU would place them from BloscZstd's table, and as h5py reads
    them, the rows of the chunks it leaves to the host zeros in both: (values, h5py's values, chunks
    left to the host, blocks copied as stored, table rows a chunk)."""
    with h5py.File(path) as f:
        rows = reader.rows(path, f["x"], "x")
    try:
        assert codecs.codec_for(rows) is codecs.BloscZstd and codecs.BloscZstd.unsupported(rows) is None
        codec = codecs.BloscZstd(None, rows)
        codec._host_rows = lambda dec, block, left: list(np.flatnonzero(left))  # the chunks, not their rows
        index = np.array(rows.index, np.int64).reshape(-1, 3)
        per, stride = rows.align, codec.stride(rows.chunk_bytes)
        c0, c1 = lo // per, -(-hi // per)
        with open(path, "rb") as f:
            stored = f.read()
        buf = np.concatenate([np.frombuffer(stored[o:o + s], np.uint8) for o, s, _ in index[c0:c1]])
        block = SimpleNamespace(buf=buf, positions=np.concatenate([[0], np.cumsum(index[c0:c1 - 1, 1])]), c0=c0,
                                end=len(buf), lo=lo)
        dec = SimpleNamespace(sizes=index[:, 1], chunk_bytes=rows.chunk_bytes, stride=stride)
        n, nb = c1 - c0, codec.blocks
        table = np.zeros((6, (n + 2) * nb), np.uint64)
        gpu, (copies, host) = codec.prepare(dec, block, table, 2, DATA, DECODED)  # from the group's third chunk
        out = np.zeros(n * stride, np.uint8)
        zstd = zstd_decompress()
        for r in range(2 * nb, (n + 2) * nb):
            size, capacity, at = int(table[1, r]), int(table[2, r]), int(table[3, r]) - DECODED
            if size:
                frame = buf[int(table[0, r]) - DATA:][:size].tobytes()
                assert zstd(out.ctypes.data + at, capacity, frame, size) == capacity
        for slot, src, nbytes in copies:
            out[slot - DECODED:][:nbytes] = buf[src - DATA:][:nbytes]
        # blosc_unshuffle_kernel1's arithmetic: value v of chunk c, in block k of n values, byte b
        size = rows.dtype.itemsize
        values, chunk_values, block_values = rows.row_bytes // size, per * rows.row_bytes // size, codec.blosc_block // size
        at = (lo - c0 * per) * values + np.arange((hi - lo) * values)
        c, v = at // chunk_values, at % chunk_values
        k = v // block_values
        if codec.shuffled:
            planes = c * stride + k * block_values * size + (v - k * block_values)
            count = np.minimum(block_values, chunk_values - k * block_values)
            raw = np.stack([out[planes + b * count] for b in range(size)], axis=-1)
        else:
            raw = np.stack([out[c * stride + v * size + b] for b in range(size)], axis=-1)
        got = raw.reshape(-1).view(rows.dtype).reshape((hi - lo,) + rows.shape[1:])
        want = np.zeros_like(got)
        with h5py.File(path) as f:  # h5py's values but for the chunks left to the host (zeros)
            for j in range(n):
                if j not in host:
                    a, b = max((c0 + j) * per, lo), min((c0 + j + 1) * per, hi)
                    want[a - lo:b - lo] = f["x"][a:b]
        for j in host:
            got[max((c0 + j) * per, lo) - lo:min((c0 + j + 1) * per, hi) - lo] = 0
        return got, want, [c0 + j for j in host], len(copies), nb
    finally:
        rows.close()


@pytest.mark.parametrize("shuffle", [1, 0], ids=["shuffled", "not shuffled"])
@pytest.mark.parametrize("chunk", [37, 400])  # one c-blosc block a chunk; 5 of 256 KB, the last shorter
def test_mnist_chunks_decoded_from_the_table_give_h5pys_values(tmp_path, ece408, no_kernels, shuffle, chunk):
    with h5py.File(ece408 / "testfull.hdf5") as f:
        x = f["x"][:1999]
    path = write(tmp_path / "z.h5", x, chunk, shuffle)
    for lo, hi in ((0, 1999), (5, 1200), (chunk, 2 * chunk), (1990, 1999)):
        got, want, host, copied, blocks = decoded(path, lo, hi)
        assert blocks == (1 if chunk == 37 else 5) and host == [] and copied == 0
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype,chunk,noise", [("i2", 1000, 800), ("u8", 300, 200)])
def test_blocks_stored_as_they_are_and_chunks_stored_otherwise(tmp_path, rng, no_kernels, dtype, chunk, noise):
    """Mostly zeros; the first images of every chunk noise, so each chunk's first block is stored as
    it is (copied); chunk 1 bitshuffled, c-blosc's other shuffle, left to the reader threads."""
    n = 3 * chunk - 7
    x = (rng.integers(1, 5, (n, 13, 13, 1)) * 40 * (rng.random((n, 13, 13, 1)) < 0.4)).astype(dtype)
    for k in range(0, n, chunk):
        x[k:k + noise] = rng.integers(0, 256, (noise, 13, 13, np.dtype(dtype).itemsize), dtype=np.uint8).view(dtype)
    path = write(tmp_path / "n.h5", x, chunk, 1, blosc_stored_as(tmp_path, cname="zstd", shuffle=2))
    got, want, host, copied, blocks = decoded(path, 0, n)
    assert host == [1] and copied == 2 and blocks == 2
    np.testing.assert_array_equal(got, want)


def test_a_chunk_with_a_frame_that_is_not_plain_is_left_to_the_host(tmp_path, ece408, no_kernels):
    """Chunk 1's first frame flagged as carrying a content checksum (which the GPU's decoder skips
    and libzstd checks) or with its magic number damaged: the reader threads decode it (and check
    it, or name the damage)."""
    with h5py.File(ece408 / "testfull.hdf5") as f:
        x = f["x"][:1200]

    def flagged(byte, mask):
        def mend(data, rows):
            frame = int.from_bytes(data[16:20], "little") + 4
            data[frame + byte] |= mask
            return data
        return mend
    for name, (byte, mask) in (("checksum", (4, 4)), ("magic", (0, 1))):
        path = write(tmp_path / f"{name}.h5", x, 400, 1, flagged(byte, mask))
        got, want, host, copied, blocks = decoded(path, 0, 1200)
        assert host == [1] and blocks == 5
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("start", [10 ** 9, 16], ids=["past its end", "inside its header"])
def test_a_block_starting_outside_its_chunk_is_refused(tmp_path, ece408, no_kernels, start):
    """Chunk 1's second block said to start past the chunk's end, or at its table of block starts."""
    with h5py.File(ece408 / "testfull.hdf5") as f:
        x = f["x"][:1200]
    path = write(tmp_path / "bad.h5", x, 400, 1, lambda data, rows: data[:20] + start.to_bytes(4, "little") + data[24:])
    with pytest.raises(InputError, match=r"^x: chunk 1 cannot be decompressed \(Blosc zstd: a block's start or size "
                                         r"past the chunk's end\)$"):
        decoded(path, 0, 1200)
