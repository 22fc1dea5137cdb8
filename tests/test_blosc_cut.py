"""Blosc's and Bitshuffle's chunks cutting images, assembled on the GPU, checked without a GPU:
- assemble_kernel2's arithmetic (cuda/decode.cu's `assembled`, built by nvcc for the host) against
  NumPy, for each way a chunk stores its values (as they are, byte-shuffled a block at a time,
  bitshuffled) and each value size, on chunks cutting images along every axis;
- each codec's prepare, decode and place run as written on a NumPy device whose kernels are the
  reference decoders and that host build: the images placed are h5py's;
- the plan: --decode auto leaves them to the reader threads (not yet run on a GPU), --decode gpu
  takes them, Blosc2's stay the host's."""
import ctypes
from types import SimpleNamespace

import h5py
import numpy as np
import pytest

from infer.data import loader
from infer.data.dataset import DataSet
from infer.gpu import chunk_decode, codecs, launch
from tests.conftest import small_model
from tests.test_blosc_chunks import bit_unshuffle, walked as blosc_walked
from tests.test_blosc_zstd import zstd_decompress
from tests.test_lz4_blocks import Device, bshuf_unshuffled, built_for_host, lz4_walk  # noqa: F401 (a fixture)

hdf5plugin = pytest.importorskip("hdf5plugin")

HARNESS = """
#include "decode.cu"
extern "C" void assemble(const unsigned char* decoded, void* dst, int H, int W, int C, int R, int h, int w, int c,
                         long long first, long long rows, long long stride, int layout, long long block,
                         int exact_tail) {
    for (long long e = 0; e < rows * H * W * C; ++e)
        ((value_t*)dst)[e] = assembled(decoded, e, H, W, C, R, h, w, c, first, stride, layout, block, exact_tail);
}
"""
PLAIN, BYTES, BITS = launch.AssembleBlocks.PLAIN, launch.AssembleBlocks.BYTES, launch.AssembleBlocks.BITS


@pytest.fixture(scope="module")
def assembled(tmp_path_factory):
    """assemble_kernel2's per-value arithmetic built by nvcc for the host, for values of 1, 2, 4 and 8
    bytes: assemble(decoded, dtype, image, chunk, first, rows, stride, layout, block, exact_tail)."""
    where = tmp_path_factory.mktemp("assemble")
    libs = {size: built_for_host(where, HARNESS, f"VALUE_BYTES={size}").assemble for size in (1, 2, 4, 8)}

    def assemble(decoded, dtype, image, chunk, first, rows, stride, layout, block, exact_tail=False):
        out = np.zeros(rows * int(np.prod(image)), dtype)
        at = ctypes.c_void_p(decoded if isinstance(decoded, int) else np.ascontiguousarray(decoded).ctypes.data)
        libs[np.dtype(dtype).itemsize](at, out.ctypes.data_as(ctypes.c_void_p), *map(ctypes.c_int, (*image, *chunk)),
                                       ctypes.c_longlong(first), ctypes.c_longlong(rows), ctypes.c_longlong(stride),
                                       ctypes.c_int(layout), ctypes.c_longlong(block), ctypes.c_int(int(exact_tail)))
        return out
    return assemble


def boxes(x, chunk, rng):
    """x cut into chunks of the shape `chunk` in HDF5's order (row-major over the grid of chunks),
    the parts past x's edges noise, as a writer may leave them."""
    grid = [-(-n // c) for n, c in zip(x.shape, chunk)]
    padded = rng.integers(0, 256, [g * c for g, c in zip(grid, chunk)] + [x.itemsize], np.uint8).view(x.dtype)[..., 0]
    padded[tuple(slice(0, n) for n in x.shape)] = x
    return [padded[tuple(slice(i * c, (i + 1) * c) for i, c in zip(at, chunk))].reshape(-1)
            for at in np.ndindex(*grid)]


def byte_shuffled(values, block):
    """c-blosc's byte shuffle: each block of `block` values (the last shorter) stored byte k of every value together."""
    size = values.itemsize
    return np.concatenate([values[s:s + block].view(np.uint8).reshape(-1, size).T.reshape(-1)
                           for s in range(0, len(values), block)])


def bit_shuffled(values, block, exact_tail):
    """Bitshuffle's layout (exact_tail: c-blosc's): blocks of `block` values bit-transposed, then a
    shorter one of the values left (down to a multiple of 8; exact_tail: only where they are one),
    the values after it as they are."""
    n, size = len(values), values.itemsize
    full, rest = n // block * block, n % block
    shuffled = full + ((0 if rest % 8 else rest) if exact_tail else rest - rest % 8)
    out = []
    for s in range(0, shuffled, block):
        m = min(block, shuffled - s)
        bits = np.unpackbits(values[s:s + m].view(np.uint8), bitorder="little").reshape(m, 8 * size)
        out.append(np.packbits(bits.T.reshape(8 * size, m // 8, 8), axis=-1, bitorder="little").reshape(-1))
    return np.concatenate(out + [values[shuffled:].view(np.uint8)])


@pytest.mark.parametrize("dtype", ["u1", "i2", "f4", "f8"])
def test_the_bitshuffle_written_here_is_the_one_the_references_undo(rng, dtype):
    """bit_shuffled against the references tested on h5py's chunks: c-blosc's (exact tail) and
    Bitshuffle's (its last shorter block, then the values after the last multiple of 8)."""
    values = rng.integers(0, 256, 1003 * np.dtype(dtype).itemsize, np.uint8).view(dtype)
    np.testing.assert_array_equal(bit_unshuffle(bit_shuffled(values, 256, True).tobytes(), values.dtype, 256), values)
    np.testing.assert_array_equal(bshuf_unshuffled(bit_shuffled(values, 256, False).tobytes(), values.dtype, 256),
                                  values)
    even = values[:1000]  # a last block of 232 values, a multiple of 8: shuffled under both rules
    np.testing.assert_array_equal(bit_shuffled(even, 256, True), bit_shuffled(even, 256, False))


# image (H, W, C) in chunks (R, h, w, c): cut along every axis, edge chunks padded; chunks wider
# than the image; rows cut alone
SHAPES = [((13, 13, 3), (7, 5, 6, 2)), ((9, 10, 1), (5, 16, 4, 1)), ((28, 28, 1), (16, 7, 28, 1))]
# (layout, block values, exact tail): as they are; byte-shuffled in blocks (the last shorter) or
# whole (HDF5's shuffle, assemble_kernel1's); bitshuffled in blocks, a shorter last one, a tail
LAYOUTS = [(PLAIN, 1, False), (BYTES, 37, False), (BYTES, None, False), (BITS, 64, True), (BITS, 48, False),
           (BITS, 40, True)]


@pytest.mark.parametrize("dtype", ["u1", "i2", "f4", "f8"])
@pytest.mark.parametrize("image,chunk", SHAPES)
@pytest.mark.parametrize("layout,block,exact_tail", LAYOUTS)
def test_the_kernels_arithmetic_assembles_each_layout(rng, assembled, dtype, image, chunk, layout, block, exact_tail):
    """assemble_kernel2's values (the host build of decode.cu's `assembled`) for rows 3 to 3 + 2R - 1
    of a block starting 3 rows into its first row of chunks: the image rows NumPy cut into chunks
    and stored in the layout, chunks 256 bytes apart."""
    x = rng.integers(0, 256, (3 * chunk[0],) + image + (np.dtype(dtype).itemsize,), np.uint8).view(dtype)[..., 0]
    parts = boxes(x, chunk, rng)
    chunk_values = len(parts[0])
    block = block or chunk_values
    stored = [p.view(np.uint8) if layout == PLAIN else byte_shuffled(p, block) if layout == BYTES else
              bit_shuffled(p, block, exact_tail) for p in parts]
    stride = -(-chunk_values * x.itemsize // 256) * 256
    decoded = np.zeros(stride * len(stored), np.uint8)
    for k, s in enumerate(stored):
        decoded[k * stride:][:len(s)] = s
    got = assembled(decoded, dtype, image, chunk, 3, 2 * chunk[0] - 1, stride, layout, block, exact_tail)
    np.testing.assert_array_equal(got.reshape((-1,) + image), x[3:2 * chunk[0] + 2])


def cut_file(tmp_path, x, chunk, filters):
    path = tmp_path / "cut.h5"
    with h5py.File(path, "w") as f:
        wide = dict(maxshape=(None,) * x.ndim) if any(c > n for c, n in zip(chunk, x.shape)) else {}
        f.create_dataset("x", data=x, chunks=chunk, **filters, **wide)
        f["y"] = np.eye(10)[np.arange(len(x)) % 10]
    return path


def stored_chunks(path):
    """The chunks of path's 'x' as stored, in HDF5's order (the grid of chunks row-major)."""
    with h5py.File(path) as f:
        d = f["x"]
        grid = [-(-n // c) for n, c in zip(d.shape, d.chunks)]
        return [np.frombuffer(d.id.read_direct_chunk(tuple(i * c for i, c in zip(at, d.chunks)))[1], np.uint8)
                for at in np.ndindex(*grid)]


class Kernels(Device):
    """Device, with the kernels Blosc's codecs launch: blosc_lz4_kernel2 by the reference walk,
    zstd_kernel1 by libzstd, decode_check_kernel2, and assemble_kernel2 by its host build."""

    def __init__(self, walk, dtype, assemble):
        super().__init__(walk, dtype)
        self.host_assemble = assemble
        self.PLAIN, self.BYTES, self.BITS = PLAIN, BYTES, BITS

    def blosc_lz4(self, stream, count, starts, sizes, outputs, chunk_bytes, block_bytes, typesize, first, bad):
        for c, (at, size, out) in enumerate(zip(self.u64(starts, count), self.u64(sizes, count), self.u64(outputs, count))):
            if size:
                try:
                    self.mem[out:out + chunk_bytes] = blosc_walked(self.mem[at:at + size], chunk_bytes, typesize,
                                                                   block_bytes)
                except (AssertionError, IndexError, ValueError):  # the reference walk's damage
                    self.flag(bad, first + c)

    def zstd(self, stream, count, frames, sizes, capacities, decoded, outputs, statuses):
        decompress = zstd_decompress()
        rows = zip(self.u64(frames, count), self.u64(sizes, count), self.u64(capacities, count), self.u64(outputs, count))
        for k, (at, size, capacity, out) in enumerate(rows):
            if size:  # (libzstd is handed raw addresses: each range checked to lie in the memory first)
                assert 0 <= at and at + size <= len(self.mem) and 0 <= out and out + capacity <= len(self.mem)
                n = decompress(self.mem.ctypes.data + int(out), int(capacity), self.mem.ctypes.data + int(at), int(size))
                self.mem[decoded + 8 * k:][:8] = np.array([n], np.uint64).view(np.uint8)
                self.mem[statuses + 8 * k:][:8] = 0  # (libzstd's errors: sizes past the capacity, which check flags)

    def check(self, stream, count, sizes, capacities, decoded, statuses, first, bad):
        for k, (size, capacity, n) in enumerate(zip(self.u64(sizes, count), self.u64(capacities, count),
                                                    self.u64(decoded, count))):
            if size and n != capacity:
                self.flag(bad, first + k)

    def __call__(self, stream, decoded, dst, image, chunk, first, rows, stride, layout, block, exact_tail=False):
        values = self.host_assemble(self.mem.ctypes.data + decoded, self.dtype, image, chunk, first, rows, stride,
                                    layout, block, exact_tail)
        self.put(dst, values)


def placed(tmp_path, monkeypatch, model, x, chunk, filters, lo, hi, walk=None, assemble=None, mend=None):
    """Images [lo, hi) of x stored in chunks of the shape `chunk` through `filters` (then mend(path)):
    the codec's prepare, decode and place run on Kernels as a group of one block; (the images placed,
    the codec, rows of the block the reader threads decoded)."""
    path = cut_file(tmp_path, x, chunk, filters)
    if mend:
        mend(path)
    data = DataSet.open([path], model)
    rows = data.parts[0][1]
    gpu = Kernels(walk, x.dtype, assemble)
    gpu.install(monkeypatch, rows)
    for name, kernel in (("BloscLz4", gpu.blosc_lz4), ("Zstd", gpu.zstd), ("StreamCheck", gpu.check),
                         ("Lz4Index", gpu.index), ("Lz4Blocks", gpu.lz4), ("AssembleBlocks", lambda b, size: gpu)):
        monkeypatch.setattr(launch, name, kernel if name == "AssembleBlocks" else lambda build, k=kernel: k)
    try:
        assert chunk_decode.unsupported(data, x.dtype) is None
        codec = codecs.codec_for(rows)(None, rows)
        chunks = stored_chunks(path)
        per, slab = rows.align, rows.per
        c0, c1 = lo // per * slab, -(-hi // per) * slab
        buf = np.concatenate(chunks[c0:c1])
        block = chunk_decode.Block(buf, hi - lo)
        block.lo, block.c0, block.end = lo, c0, len(buf)
        block.positions = np.concatenate([[0], np.cumsum([len(c) for c in chunks[c0:c1 - 1]])]).astype(np.int64)
        group_rows = (c1 - c0) * codec.rows_per_chunk(rows)
        table_at, data_at, decoded_at, scratch_at, dst = 4096, 1 << 16, 8 << 20, 16 << 20, 24 << 20
        dec = SimpleNamespace(sizes=np.array([len(c) for c in chunks]), chunk_bytes=rows.chunk_bytes, per=per,
                              slab=slab, stride=codec.stride(rows.chunk_bytes), row_bytes=rows.row_bytes, flags=0,
                              pool=SimpleNamespace(native=None),
                              columns=lambda t: [t + k * 8 * group_rows for k in range(codec.arrays)])
        table = np.zeros((codec.arrays, group_rows), np.uint64)
        taken, extra = codec.prepare(dec, block, table, 0, data_at, decoded_at)
        assert taken
        gpu.mem[table_at:table_at + table.nbytes] = table.view(np.uint8).reshape(-1)
        gpu.mem[data_at:data_at + len(buf)] = buf
        codec.decode(dec, None, c1 - c0, table_at, decoded_at, c0, scratch_at, [extra])
        codec.place(dec, None, chunk_decode.Piece(lo, c0, c1 - c0, hi - lo, extra), decoded_at, dst)
        assert gpu.bad == []
        host = extra[1] if isinstance(extra, tuple) else extra
        got = gpu.mem[dst:dst + (hi - lo) * rows.row_bytes].view(x.dtype).reshape((hi - lo,) + x.shape[1:])
        return got, codec, [row for row, _ in host]
    finally:
        data.close()


@pytest.fixture(scope="module")
def mnist(ece408):
    return loader.load_model(ece408 / "model.hdf5")


BLOSC = {"blosc_lz4": lambda: hdf5plugin.Blosc(cname="lz4", clevel=5, shuffle=hdf5plugin.Blosc.BITSHUFFLE),
         "blosc_zstd": lambda: hdf5plugin.Blosc(cname="zstd", clevel=5, shuffle=hdf5plugin.Blosc.SHUFFLE),
         "blosc_zstd_noshuffle": lambda: hdf5plugin.Blosc(cname="zstd", clevel=5, shuffle=hdf5plugin.Blosc.NOSHUFFLE),
         "bitshuffle": lambda: hdf5plugin.Bitshuffle(nelems=1024, cname="lz4")}


def images(rng, n, shape, dtype):
    """Mostly zeros, as MNIST; a band of noise that does not shrink (c-blosc stores such blocks as
    they are; one-byte noise below 64, which bitshuffle shrinks: a chunk that grows is stored with
    its filter skipped, the host's)."""
    x = (rng.integers(0, 200, (n,) + shape) * (rng.random((n,) + shape) < 0.1)).astype(dtype)
    noise = rng.integers(0, 64 if x.itemsize == 1 else 256, (9,) + shape + (x.itemsize,), np.uint8)
    x[n // 3:n // 3 + 9] = noise.view(dtype)[..., 0]
    return x


@pytest.mark.parametrize("name", sorted(BLOSC))
@pytest.mark.parametrize("dtype,chunk,lo,hi", [("f4", (16, 7, 28, 1), 0, 90), ("i2", (16, 5, 6, 1), 13, 61),
                                               ("u1", (7, 30, 8, 1), 20, 21)])
def test_a_block_of_cut_chunks_is_decoded_and_assembled_as_the_codec_launches_it(tmp_path, rng, monkeypatch, mnist,
                                                                                 lz4_walk, assembled, name, dtype,
                                                                                 chunk, lo, hi):
    """Images [lo, hi) of 90 images of 28 x 28 (rows cut), 13 x 13 (cut along both axes, edge chunks
    padded) or 28 x 28 in chunks wider than them, each filter's chunks decoded by the reference
    decoders as decode launches them and assembled by assemble_kernel2's host build as place does:
    h5py's images."""
    shape = (13, 13, 1) if chunk[1] == 5 else (28, 28, 1)
    x = images(rng, 90, shape, dtype)
    model = loader.model_from_arrays(small_model(rng)) if shape[0] == 13 else mnist
    got, codec, host = placed(tmp_path, monkeypatch, model, x, chunk, BLOSC[name](), lo, hi, lz4_walk, assembled)
    assert codec.assemble is not None and host == []
    np.testing.assert_array_equal(got, x[lo:hi])


def test_a_blosc_chunk_whose_last_block_is_no_whole_groups_of_8_keeps_it_as_it_is(tmp_path, rng, monkeypatch, mnist,
                                                                                  assembled):
    """c-blosc's blocks of 512 KB: a (669, 7, 28, 1) chunk's last block holds 52 values (of image
    668), not a multiple of 8, so c-blosc stores it unshuffled (the exact tail), and the GPU must
    read it so."""
    x = images(rng, 669, (28, 28, 1), "f4")
    got, codec, _ = placed(tmp_path, monkeypatch, mnist, x, (669, 7, 28, 1), BLOSC["blosc_lz4"](), 600, 669,
                           assemble=assembled)
    assert (codec.block_values, codec.exact_tail) == (131072, True)
    np.testing.assert_array_equal(got, x[600:])


def restored(path, k, **blosc):
    """Chunk k of path's 'x' (a box within the data) stored again as hdf5plugin's Blosc(**blosc) stores it."""
    with h5py.File(path, "r+") as f:
        d = f["x"]
        at = d.id.get_chunk_info(k).chunk_offset
        box = d[tuple(slice(a, a + c) for a, c in zip(at, d.chunks))]
        with h5py.File(path.parent / "other.h5", "w") as g:
            other = g.create_dataset("x", data=box, chunks=box.shape, **hdf5plugin.Blosc(**blosc))
            data = other.id.read_direct_chunk((0,) * box.ndim)[1]
        d.id.write_direct_chunk(at, data, d.id.get_chunk_info(k).filter_mask)


@pytest.mark.parametrize("name,other", [("blosc_lz4", hdf5plugin.Blosc.SHUFFLE),
                                        ("blosc_zstd", hdf5plugin.Blosc.BITSHUFFLE)])
def test_a_cut_chunk_stored_otherwise_takes_its_row_of_chunks_to_the_host(tmp_path, rng, monkeypatch, mnist,
                                                                          assembled, name, other):
    """Chunks 5 and 6 (of row of chunks 1, 4 chunks a row) stored with c-blosc's other shuffle: the
    reader threads decode that row's images, once, placed over what the GPU assembled of the
    chunks' bytes."""
    x = images(rng, 40, (28, 28, 1), "f4")

    def mend(path):
        for k in (5, 6):
            restored(path, k, cname=name[6:], shuffle=other)
    got, _, host = placed(tmp_path, monkeypatch, mnist, x, (10, 7, 28, 1), BLOSC[name](), 4, 40,
                          assemble=assembled, mend=mend)
    assert host == [6]  # images 10-19, 6 rows into the block
    np.testing.assert_array_equal(got, x[4:40])


@pytest.mark.parametrize("name", sorted(BLOSC))
def test_auto_assembles_cut_blosc_chunks_on_the_gpu_but_bitshuffles(tmp_path, ece408, monkeypatch, name):
    """Timed on an H200 (1M images in chunks cutting each image in 4, 2026-12-05), Blosc lz4 and zstd
    chunks cutting images assembled on the GPU ran 1.6-2.1x the reader threads: a streamed run takes
    them on the GPU by default (the chunks travel as stored). Bitshuffle's stay the reader threads'
    (its codec's host_first: its whole-image chunks ran faster there), as 8-bit codes they assemble,
    saying why; --decode gpu takes every one. Blosc2's stay the host's under both, saying why."""
    from tests.test_run_plan import described

    with h5py.File(ece408 / "test100.hdf5") as f:
        x, y = f["x"][()], f["y"][()]
    path = tmp_path / "cut.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x, chunks=(10, 14, 28, 1), **BLOSC[name]())
        f["y"] = y
    monkeypatch.setenv("CNNINFER_HOST_BUDGET_MB", "0")
    auto, gpu = described(path, ece408, "H200"), described(path, ece408, "H200", decode="gpu")
    if name == "bitshuffle":
        reason = codecs.Bitshuffle.host_first
        assert auto.streamed and auto.decode == "host" and auto.reasons["decode"] == f"by the reader threads: {reason}"
        assert auto.wire_name.startswith("8-bit codes"), auto.wire_name
    else:
        assert auto.streamed and auto.decode == "gpu" and auto.wire_name == "float32", (auto.decode, auto.wire_name)
    assert gpu.streamed and gpu.decode == "gpu" and gpu.decoding and gpu.wire_name == "float32", gpu.wire_name


def test_blosc2_chunks_cutting_images_stay_the_hosts(tmp_path, ece408, monkeypatch):
    from infer.errors import InputError
    from tests.test_run_plan import described

    with h5py.File(ece408 / "test100.hdf5") as f:
        x, y = f["x"][()], f["y"][()]
    path = tmp_path / "cut.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x, chunks=(10, 14, 28, 1),
                         **hdf5plugin.Blosc2(cname="lz4", filters=hdf5plugin.Blosc2.BITSHUFFLE))
        f["y"] = y
    monkeypatch.setenv("CNNINFER_HOST_BUDGET_MB", "0")
    auto = described(path, ece408, "H200")
    assert auto.decode == "host" and "not Blosc2's" in auto.reasons["decode"], auto.reasons
    with pytest.raises(InputError, match="--decode gpu: its chunks cut images, which the GPU assembles from"):
        described(path, ece408, "H200", decode="gpu")
