"""The GPU's Blosc lz4 decoding without a GPU: the chunks hdf5plugin writes, walked as
blosc_lz4_kernel1 walks them (a reference: each block's start, its streams split per value byte
unless flagged, LZ4 blocks or stored bytes), decoded and bit-unshuffled, give the values h5py reads;
the host's header check (codecs.blosc_chunks) takes them, and leaves chunks stored otherwise
to the reader threads."""
import ctypes

import h5py
import numpy as np
import pytest

from infer.gpu.codecs import blosc_chunks

hdf5plugin = pytest.importorskip("hdf5plugin")


def lz4_block(src, size, raw=True):
    """The LZ4 block format decoded (a sequence: a token, its literals, a 2-byte offset, a match);
    raw: a stream as long as its output is stored as it is (c-blosc's rule)."""
    src = bytes(src)
    if raw and len(src) == size:
        return src
    out, pos = bytearray(), 0

    def length(n):
        nonlocal pos
        if n == 15:
            while True:
                byte = src[pos]
                pos += 1
                n += byte
                if byte != 255:
                    break
        return n
    while pos < len(src):
        token = src[pos]
        pos += 1
        lit = length(token >> 4)
        out += src[pos:pos + lit]
        pos += lit
        if pos == len(src):
            break
        dist = src[pos] | src[pos + 1] << 8
        pos += 2
        for _ in range(length(token & 15) + 4):
            out.append(out[-dist])
    assert len(out) == size
    return bytes(out)


def bit_unshuffle(stored, dtype, block):
    """The values of a c-blosc bitshuffled chunk (bit_shuffle(block, True)'s inverse)."""
    n = len(stored) // dtype.itemsize
    bits = np.unpackbits(np.frombuffer(stored, np.uint8), bitorder="little")
    values = np.zeros(n * dtype.itemsize * 8, np.uint8)
    full = n // block * block
    rest = n - full
    tail = full + (0 if rest % 8 else rest)
    for s in range(0, tail, block):
        m = min(block, tail - s)
        rows = bits[s * dtype.itemsize * 8:(s + m) * dtype.itemsize * 8].reshape(dtype.itemsize * 8, m)
        values[s * dtype.itemsize * 8:(s + m) * dtype.itemsize * 8] = rows.T.reshape(-1)
    values[tail * dtype.itemsize * 8:] = bits[tail * dtype.itemsize * 8:]
    return np.packbits(values, bitorder="little").view(dtype)


def chunks_of(path):
    with h5py.File(path) as f:
        d = f["x"]
        got = [d.id.read_direct_chunk(d.id.get_chunk_info(i).chunk_offset) for i in range(d.id.get_num_chunks())]
    return [np.frombuffer(data, np.uint8) for _, data in got]


def walked(chunk, chunk_bytes, itemsize, block_bytes):
    """A c-blosc chunk decoded (still shuffled) as blosc_lz4_kernel1 finds and decodes its streams."""
    blocks, out = -(-chunk_bytes // block_bytes), bytearray()
    for b in range(blocks):
        bsize = min(block_bytes, chunk_bytes - b * block_bytes)
        split = not chunk[2] & 0x10 and itemsize <= 16 and bsize // itemsize >= 128 and bsize == block_bytes
        pos = int.from_bytes(chunk[16 + 4 * b:20 + 4 * b].tobytes(), "little")
        for _ in range(itemsize if split else 1):
            stored = int.from_bytes(chunk[pos:pos + 4].tobytes(), "little")
            out += lz4_block(chunk[pos + 4:pos + 4 + stored], bsize // (itemsize if split else 1))
            pos += 4 + stored
    return np.frombuffer(bytes(out), np.uint8)


@pytest.mark.parametrize("dtype,per,shape", [("f4", 201, (30, 30, 1)), ("f4", 16, (28, 28, 1)), ("i2", 48, (13, 13, 1)),
                                             ("u1", 160, (30, 30, 1))])
def test_the_streams_found_decode_to_the_values(tmp_path, rng, dtype, per, shape):
    dtype = np.dtype(dtype)
    values = (rng.random((3 * per + 5,) + shape) * 200 * (rng.random((3 * per + 5,) + shape) < 0.3)).astype(dtype)
    values[per:2 * per] = 0  # a chunk of long matches; the others mostly zeros, as MNIST: stored compressed
    with h5py.File(tmp_path / "b.h5", "w") as f:
        f.create_dataset("x", data=values, chunks=(per,) + shape,
                         **hdf5plugin.Blosc(cname="lz4", clevel=5, shuffle=hdf5plugin.Blosc.BITSHUFFLE))
    chunks = chunks_of(tmp_path / "b.h5")
    block = int.from_bytes(chunks[0][8:12].tobytes(), "little") // dtype.itemsize
    data = np.concatenate([np.zeros(3, np.uint8)] + chunks)  # chunks back to back, not at 0
    sizes = np.array([len(c) for c in chunks], np.int64)
    at = 3 + np.concatenate([[0], np.cumsum(sizes[:-1])])
    chunk_bytes = per * values[0].nbytes
    assert blosc_chunks(data, at, sizes, chunk_bytes, dtype.itemsize, block * dtype.itemsize).all()
    got = np.concatenate([bit_unshuffle(walked(c, chunk_bytes, dtype.itemsize, block * dtype.itemsize).tobytes(),
                                        dtype, block) for c in chunks])[:values.size]
    np.testing.assert_array_equal(got, values.reshape(-1))


def test_chunks_stored_otherwise_are_left_to_the_host(tmp_path, rng):
    values = (rng.random((4 * 64, 30, 30, 1)) * 200 * (rng.random((4 * 64, 30, 30, 1)) < 0.3)).astype("f4")
    with h5py.File(tmp_path / "b.h5", "w") as f:
        f.create_dataset("x", data=values, chunks=(64, 30, 30, 1),
                         **hdf5plugin.Blosc(cname="lz4", clevel=5, shuffle=hdf5plugin.Blosc.BITSHUFFLE))
    chunks = [c.copy() for c in chunks_of(tmp_path / "b.h5") * 2]
    block = int.from_bytes(chunks[0][8:12].tobytes(), "little")
    chunks[1][2] |= 0x02  # stored as it is (c-blosc's memcpyed)
    chunks[2][2] = 0x21  # byte-shuffled
    chunks[3][2] = 0x04 | (4 << 5)  # zstd
    chunks[4][8:12] = np.frombuffer((block // 2).to_bytes(4, "little"), np.uint8)
    chunks[5] = chunks[5][:-1]  # shorter than its header says
    chunks[6][0] = 3  # another format version
    data = np.concatenate(chunks)
    sizes = np.array([len(c) for c in chunks], np.int64)
    at = np.concatenate([[0], np.cumsum(sizes[:-1])])
    taken = blosc_chunks(data, at, sizes, 64 * 3600, 4, block)
    assert list(np.flatnonzero(~taken)) == [1, 2, 3, 4, 5, 6]


FIND_STREAM = """
#include "lz4.cu"
extern "C" int find(const u64* ptrs, const u64* sizes, const u64* outs, int count, long long chunk_bytes,
                    long long block_bytes, int typesize, long long w, long long* got) {
    const Stream st = find_stream(ptrs, sizes, outs, count, chunk_bytes, block_bytes, typesize, w);
    got[0] = st.c, got[1] = st.work, got[2] = st.ok;
    got[3] = st.ok ? (long long)(st.src - (const unsigned char*)ptrs[st.c]) : -1, got[4] = st.ok ? (long long)st.size : -1;
    got[5] = st.ok ? (long long)(st.dst - (unsigned char*)outs[st.c]) : -1, got[6] = st.ok ? (long long)st.cap : -1;
    return 0;
}
"""


@pytest.fixture(scope="module")
def find_stream(tmp_path_factory):
    """blosc_lz4_kernel2's find_stream (cuda/lz4.cu) built by nvcc for the host: warp w's
    (chunk, work, ok, stream start and size in its chunk, output offset and size)."""
    from tests.test_lz4_blocks import built_for_host

    lib = built_for_host(tmp_path_factory.mktemp("find"), FIND_STREAM)

    def find(chunks, chunk_bytes, block_bytes, typesize, w):
        ptrs = np.array([c.ctypes.data for c in chunks], np.uint64)
        sizes = np.array([len(c) for c in chunks], np.uint64)
        outs = np.zeros(len(chunks), np.uint64)
        got = np.zeros(7, np.int64)
        lib.find(*(a.ctypes.data_as(ctypes.c_void_p) for a in (ptrs, sizes, outs)), len(chunks),
                 ctypes.c_longlong(chunk_bytes), ctypes.c_longlong(block_bytes), typesize, ctypes.c_longlong(w),
                 got.ctypes.data_as(ctypes.c_void_p))
        return tuple(int(v) for v in got)
    return find


@pytest.mark.parametrize("shuffle,per", [(hdf5plugin.Blosc.SHUFFLE, 250), (hdf5plugin.Blosc.SHUFFLE, 37),
                                         (hdf5plugin.Blosc.BITSHUFFLE, 250)],
                         ids=["byte shuffle, a split block and a shorter one", "byte shuffle, one block",
                              "bitshuffle, a split block and a shorter one"])
def test_the_kernels_own_stream_finding_decodes_real_chunks(tmp_path, ece408, find_stream, shuffle, per):
    """The streams blosc_lz4_kernel2's warps find (find_stream, the kernel's code built for the host)
    in hdf5plugin's chunks of MNIST images, each decoded by the reference LZ4 decoder into the output
    the warp names, give the chunk as c-blosc stored it (the walk's): a whole block of 128 values or
    more in 4 streams (c-blosc splits it a value byte, whatever the shuffle), a shorter last block in
    one, every other warp idle; a block start past the chunk's end makes its warps' streams not ok."""
    with h5py.File(ece408 / "testfull.hdf5") as f:
        x = f["x"][:3 * per]
    with h5py.File(tmp_path / "b.h5", "w") as f:
        f.create_dataset("x", data=x, chunks=(per, 28, 28, 1), **hdf5plugin.Blosc(cname="lz4", shuffle=shuffle))
    chunks = [np.ascontiguousarray(c) for c in chunks_of(tmp_path / "b.h5")]
    chunk_bytes, block_bytes = per * 28 * 28 * 4, int.from_bytes(chunks[0][8:12].tobytes(), "little")
    blocks = -(-chunk_bytes // block_bytes)
    whole = [b for b in range(blocks) if (b + 1) * block_bytes <= chunk_bytes]
    for c, chunk in enumerate(chunks):
        out, streams = np.zeros(chunk_bytes, np.uint8), [0] * blocks
        for w in range(c * blocks * 4, (c + 1) * blocks * 4):
            got_c, work, ok, at, size, dst, cap = find_stream(chunks, chunk_bytes, block_bytes, 4, w)
            assert got_c == c
            if work:
                assert ok
                out[dst:dst + cap] = np.frombuffer(lz4_block(chunk[at:at + size], cap), np.uint8)
                streams[dst // block_bytes] += 1
        np.testing.assert_array_equal(out, walked(chunk, chunk_bytes, 4, block_bytes))
        assert streams == [4 if b in whole else 1 for b in range(blocks)]
    assert len(whole) == 1 and blocks == (2 if per == 250 else 1)
    damaged = chunks[0].copy()
    damaged[16:20] = np.frombuffer((len(damaged) + 5).to_bytes(4, "little"), np.uint8)  # block 0 starts past the end
    assert find_stream([damaged], chunk_bytes, block_bytes, 4, 0)[1:3] == (1, 0)
