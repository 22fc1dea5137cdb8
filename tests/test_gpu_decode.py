"""Deflate chunks decoded on the GPU by inflate_kernel3 (--decode gpu), LZF chunks by lzf_kernel1, Zstd
chunks by zstd_kernel2, Blosc lz4 + bitshuffle chunks by blosc_lz4_kernel2 and Blosc zstd ones by zstd_kernel1: the predictions of the host's decoding for
every level, shuffle, value type and chunk size (blocks starting and ending inside chunks, chunks a
stride apart or back to back, odd byte counts, chunks cutting images assembled by assemble_kernel1),
and a damaged chunk refused in one line naming it. Needs a GPU."""
import os
import re
import shutil

import h5py
import numpy as np
import pytest

from infer import Session
from infer.errors import InputError
from tests.conftest import assert_refused, invoke, small_model

pytestmark = pytest.mark.gpu
SMALL = small_model(np.random.default_rng(13))  # takes 13x13x1 images as well as 12x12x1


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    """Every file streamed, in blocks of a few chunks, decoded in groups of 3 blocks (a shorter
    group at the end), over a ring shallower than its blocks."""
    monkeypatch.setenv("CNNINFER_HOST_BUDGET_MB", "0")
    for codec in ("Deflate", "Zstd", "Lzf", "BloscLz4"):
        monkeypatch.setattr(f"infer.gpu.codecs.{codec}.block_bytes", 150_000)
        monkeypatch.setattr(f"infer.gpu.codecs.{codec}.group", 3)
    monkeypatch.setattr("infer.gpu.chunk_decode.MAX_STREAMS", 2)


def codec(name):
    if name.endswith("_f32"):  # fletcher32 after the codec
        return dict(codec(name[:-4]), fletcher32=True)
    if name.startswith("zstd"):
        return dict(pytest.importorskip("hdf5plugin").Zstd(clevel=3), shuffle=name.endswith("shuffle"))
    if name == "blosc_lz4":
        hdf5plugin = pytest.importorskip("hdf5plugin")
        return dict(hdf5plugin.Blosc(cname="lz4", clevel=5, shuffle=hdf5plugin.Blosc.BITSHUFFLE))
    if name == "blosc_lz4_bytes":  # hdf5plugin's default: lz4, byte shuffle (blocks split a stream a value byte)
        return dict(pytest.importorskip("hdf5plugin").Blosc())
    if name == "bitshuffle":
        return dict(pytest.importorskip("hdf5plugin").Bitshuffle(cname="lz4"))
    if name.startswith("blosc_zstd"):
        hdf5plugin = pytest.importorskip("hdf5plugin")
        return dict(hdf5plugin.Blosc(cname="zstd", clevel=5, shuffle=int(not name.endswith("noshuffle"))))
    if name.startswith("lzf"):
        return dict(compression="lzf", shuffle=name.endswith("shuffle"))
    return dict(compression="gzip", compression_opts=int(name[4]), shuffle=name.endswith("shuffle"))


def write(path, x, y, chunk, name):
    """x in chunks of `chunk` whole images, or of the shape `chunk` (a tuple), filtered as `name` says."""
    chunks = chunk if isinstance(chunk, tuple) else (chunk,) + x.shape[1:]
    wide = dict(maxshape=(None,) * x.ndim) if any(c > n for c, n in zip(chunks, x.shape)) else {}  # h5py asks it
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x, chunks=chunks, **codec(name), **wide)
        f["y"] = y
    return path


@pytest.fixture(scope="module")
def sessions():
    """A Session per (model, --decode), made once for the module: one context, kernels built once."""
    made = {}

    def session(model, decode):
        key = (str(model) if not isinstance(model, dict) else "small", decode)
        if key not in made:
            made[key] = Session(model, "cuda", decode=decode)
        return made[key]
    yield session
    for s in made.values():
        s.close()


def assert_same_as_host(sessions, path, model, what="GPU"):
    gpu, host = sessions(model, "gpu").evaluate(path), sessions(model, "host").evaluate(path)
    assert gpu.streamed and gpu.reader["decode"].startswith(what), gpu.reader
    assert host.reader["decode"].startswith("host")
    np.testing.assert_array_equal(gpu.predictions, host.predictions)
    np.testing.assert_array_equal(gpu.labels, host.labels)
    return gpu


@pytest.mark.parametrize("name", ["gzip1", "gzip6", "gzip1_shuffle", "gzip6_shuffle", "lzf", "lzf_shuffle"])
# 16 float32 images: 50,176 bytes, back to back; 37: a stride apart; 350: 1.1 MB, several deflate blocks
@pytest.mark.parametrize("chunk", [16, 37, 350])
def test_mnist_float32_decoded_on_the_gpu_as_on_the_host(tmp_path, ece408, sessions, name, chunk):
    with h5py.File(ece408 / "testfull.hdf5") as f:
        x, y = f["x"][:1999], f["y"][:1999]
    r = assert_same_as_host(sessions, write(tmp_path / "c.h5", x, y, chunk, name), ece408 / "model.hdf5")
    assert r.correct > 1700


@pytest.mark.parametrize("chunk", [16, 37])
@pytest.mark.parametrize("name", ["zstd", "zstd_shuffle"])
def test_mnist_float32_zstd_decoded_on_the_gpu_as_on_the_host(tmp_path, ece408, sessions, name, chunk):
    with h5py.File(ece408 / "testfull.hdf5") as f:
        x, y = f["x"][:1999], f["y"][:1999]
    r = assert_same_as_host(sessions, write(tmp_path / "z.h5", x, y, chunk, name), ece408 / "model.hdf5",
                            "GPU: zstd_kernel2")
    assert r.correct > 1700


@pytest.mark.parametrize("name", ["gzip1_shuffle", "lzf", "zstd_shuffle", "blosc_lz4"])
def test_chunks_larger_than_a_block_are_decoded_by_each_block_they_hold(tmp_path, ece408, sessions, name):
    """Chunks of 400 float32 images, more than a block holds here (250: 1,999 images over 8
    streams): consecutive blocks share a chunk, so a group ends where the next block starts inside
    its last chunk, and each group decodes that chunk."""
    if name != "gzip1_shuffle":
        pytest.importorskip("hdf5plugin")
    with h5py.File(ece408 / "testfull.hdf5") as f:
        x, y = f["x"][:1999], f["y"][:1999]
    r = assert_same_as_host(sessions, write(tmp_path / "c.h5", x, y, 400, name), ece408 / "model.hdf5")
    assert r.correct > 1700


@pytest.mark.parametrize("name", ["gzip1", "gzip6_shuffle", "zstd_shuffle"])
@pytest.mark.parametrize("dtype", ["u1", "i2"])
def test_odd_sized_images_of_integer_types(tmp_path, rng, sessions, name, dtype):
    """13x13x1 images (169 values: chunks of odd byte counts, adler32 byte by byte), 2-byte values
    unshuffled, converted to float32 on the GPU after decoding."""
    x = (rng.random((613, 13, 13, 1)) * 200).astype(dtype)
    y = np.eye(10)[rng.integers(0, 10, len(x))]
    assert_same_as_host(sessions, write(tmp_path / "o.h5", x, y, 37, name), SMALL)


def stored_boxes(values, chunk, stride, shuffled, rng):
    """values (N, H, W, C) as HDF5 stores them in chunks of shape `chunk` (R, h, w, c), decoded: a
    row of chunks at a time, each chunk's values in row-major order (byte-shuffled where shuffled),
    chunks stride bytes apart; the padding past the data's edges noise."""
    grid = [-(-n // c) for n, c in zip(values.shape, chunk)]
    padded = rng.integers(0, 256, [g * c for g, c in zip(grid, chunk)] + [values.itemsize], np.uint8)
    padded[tuple(slice(0, n) for n in values.shape)] = values.view(np.uint8).reshape(values.shape + (-1,))
    out = rng.integers(0, 256, int(np.prod(grid)) * stride, np.uint8)
    for k, at in enumerate(np.ndindex(*grid)):
        box = padded[tuple(slice(i * c, (i + 1) * c) for i, c in zip(at, chunk))].reshape(-1, values.itemsize)
        out[k * stride:][:box.size] = (box.T if shuffled else box).reshape(-1)
    return out


@pytest.mark.parametrize("dtype", ["u1", "i2", "f4", "u8"])
@pytest.mark.parametrize("shuffled", [False, True])
@pytest.mark.parametrize("chunk", [(7, 5, 13, 2), (4, 3, 4, 1), (16, 32, 32, 4), (3, 13, 13, 3)])
def test_assemble_places_rows_from_chunks_cutting_them(gpu, rng, dtype, shuffled, chunk):
    """assemble_kernel1 against NumPy, value for value: 61 rows of 13 x 13 x 3 values in chunks
    cutting them on every axis (edge chunks padded with noise), wider than them, or whole; blocks of
    rows starting and ending inside a row of chunks."""
    import pycuda.driver as cuda

    from infer.gpu import launch
    from tests.conftest import Dev, build

    values = (rng.random((61, 13, 13, 3)) * 250).astype(dtype)
    box_bytes = int(np.prod(chunk)) * values.itemsize
    stride = -(-box_bytes // 256) * 256
    d = Dev()
    decoded = d.put(stored_boxes(values, chunk, stride, shuffled, rng), np.uint8)
    per = int(np.prod([-(-n // c) for n, c in zip(values.shape[1:], chunk[1:])]))  # chunks a row of chunks
    assemble = launch.Assemble(build(gpu), values.itemsize)
    for lo, hi in [(0, 61), (5, 40), (chunk[0], 2 * chunk[0]), (60, 61), (1, 2), (13, 58)]:
        dst = d.put(np.zeros((hi - lo,) + values.shape[1:], dtype), dtype)
        first_slab = lo // chunk[0]
        assemble(cuda.Stream(), int(decoded) + first_slab * per * stride, dst, values.shape[1:], chunk,
                 lo - first_slab * chunk[0], hi - lo, stride, shuffled)
        np.testing.assert_array_equal(d.get(dst, (hi - lo,) + values.shape[1:], dtype), values[lo:hi])


def test_assemble_checks_its_shapes(gpu):
    from infer.gpu import launch
    from tests.conftest import build

    assemble = launch.Assemble(build(gpu), 4)
    with pytest.raises(ValueError, match="rows of H x W x C values in chunks of R x h x w x c"):
        assemble(None, 0, 0, (28, 28), (10, 7, 28, 1), 0, 10, 256, False)
    with pytest.raises(ValueError, match="first row of chunks' 10, not 10"):
        assemble(None, 0, 0, (28, 28, 1), (10, 7, 28, 1), 10, 10, 256, False)


@pytest.mark.parametrize("dtype", ["u1", "i2", "f4", "u8"])
@pytest.mark.parametrize("layout,block,exact_tail", [(0, 1, False), (1, 37, False), (2, 64, True), (2, 48, False)])
def test_assemble_kernel2_places_rows_from_chunks_stored_each_way(gpu, rng, dtype, layout, block, exact_tail):
    """assemble_kernel2 against NumPy, value for value: 61 rows of 13 x 13 x 3 values in (7, 5, 6, 2)
    chunks (edge chunks padded with noise) stored as they are, byte-shuffled in blocks of 37 values
    (the last shorter), bitshuffled in blocks of 64 (c-blosc's exact tail) or 48 (Bitshuffle's: a
    shorter block, then the values past the last multiple of 8); blocks of rows starting and ending
    inside a row of chunks. (The host build of its arithmetic: tests/test_blosc_cut.py.)"""
    import pycuda.driver as cuda

    from infer.gpu import launch
    from tests.conftest import Dev, build
    from tests.test_blosc_cut import bit_shuffled, boxes, byte_shuffled

    chunk = (7, 5, 6, 2)
    values = rng.integers(0, 256, (61, 13, 13, 3, np.dtype(dtype).itemsize), np.uint8).view(dtype)[..., 0]
    parts = boxes(values, chunk, rng)
    stride = -(-parts[0].nbytes // 256) * 256
    stored = np.zeros(stride * len(parts), np.uint8)
    for k, p in enumerate(parts):
        at = p.view(np.uint8) if layout == 0 else byte_shuffled(p, block) if layout == 1 else \
            bit_shuffled(p, block, exact_tail)
        stored[k * stride:][:len(at)] = at
    d = Dev()
    decoded = d.put(stored, np.uint8)
    per = 3 * 3 * 2  # chunks a row of chunks
    assemble = launch.AssembleBlocks(build(gpu), values.itemsize)
    for lo, hi in [(0, 61), (5, 40), (7, 14), (60, 61), (13, 58)]:
        dst = d.put(np.zeros((hi - lo,) + values.shape[1:], dtype), dtype)
        slab = lo // 7
        assemble(cuda.Stream(), int(decoded) + slab * per * stride, dst, values.shape[1:], chunk, lo - slab * 7,
                 hi - lo, stride, layout, block, exact_tail)
        np.testing.assert_array_equal(d.get(dst, (hi - lo,) + values.shape[1:], dtype), values[lo:hi])
    with pytest.raises(ValueError, match="layout 2 in blocks of 12 values"):
        assemble(None, 0, 0, values.shape[1:], chunk, 0, 1, stride, 2, 12)


CUT = [("gzip1", (37, 7, 28, 1)), ("gzip6_shuffle", (16, 10, 9, 1)), ("lzf_shuffle", (50, 28, 14, 1)),
       ("lzf", (29, 32, 32, 1)), ("zstd_shuffle", (20, 5, 28, 1)), ("gzip1", (64, 1, 28, 1)),
       # assemble_kernel2: bitshuffled (c-blosc's, Bitshuffle's), byte-shuffled a c-blosc block at a time, as they are
       ("blosc_lz4", (40, 7, 28, 1)), ("bitshuffle", (29, 32, 32, 1)), ("blosc_zstd", (16, 10, 9, 1)),
       ("blosc_zstd_noshuffle", (50, 28, 14, 1)), ("blosc_lz4_bytes", (40, 7, 28, 1)),
       ("blosc_lz4_bytes", (500, 14, 28, 1))]  # a block split a stream a value byte, a shorter one


@pytest.mark.parametrize("name,chunk", CUT, ids=[f"{n}-{'x'.join(map(str, c))}" for n, c in CUT])
def test_chunks_cutting_images_are_assembled_on_the_gpu_as_on_the_host(tmp_path, ece408, sessions, name, chunk,
                                                                      monkeypatch):
    """MNIST float32 in chunks cutting images in rows, columns, both (edge chunks padded), or wider
    than them: decoded and assembled on the GPU, the scores equal bit for bit to those of the
    host's assembly in float32 (CNNINFER_CODES=0: the same pipeline, on the same values)."""
    if name.startswith(("zstd", "blosc", "bitshuffle")):
        pytest.importorskip("hdf5plugin")
    monkeypatch.setenv("CNNINFER_CODES", "0")
    with h5py.File(ece408 / "testfull.hdf5") as f:
        x, y = f["x"][:1999], f["y"][:1999]
    path = write(tmp_path / "cut.h5", x, y, chunk, name)
    gpu = sessions(ece408 / "model.hdf5", "gpu").evaluate(path, scores=True)
    host = sessions(ece408 / "model.hdf5", "host").evaluate(path, scores=True)
    assert gpu.streamed and "assemble" in gpu.reader["decode"], gpu.reader
    assert host.reader["decode"].startswith("host")
    np.testing.assert_array_equal(gpu.scores, host.scores)
    np.testing.assert_array_equal(gpu.predictions, host.predictions)
    assert gpu.correct > 1700


@pytest.mark.parametrize("dtype", ["u1", "i2"])
def test_chunks_cutting_odd_images_of_integer_types(tmp_path, rng, sessions, dtype):
    x = (rng.random((613, 13, 13, 1)) * 200).astype(dtype)
    y = np.eye(10)[rng.integers(0, 10, len(x))]
    r = assert_same_as_host(sessions, write(tmp_path / "o.h5", x, y, (37, 5, 6, 1), "gzip6_shuffle"), SMALL)
    assert "assemble" in r.reader["decode"]


@pytest.mark.parametrize("name", ["blosc_lz4", "blosc_zstd", "bitshuffle"])
@pytest.mark.parametrize("dtype", ["u1", "i2"])
def test_blosc_chunks_cutting_odd_images_of_integer_types(tmp_path, rng, sessions, dtype, name):
    """13 x 13 images, mostly zeros (noise would leave chunks stored with the filter skipped: the
    host's), in chunks of 7 of their rows, the edge chunks padded."""
    pytest.importorskip("hdf5plugin")
    x = (rng.random((613, 13, 13, 1)) * 200 * (rng.random((613, 13, 13, 1)) < 0.2)).astype(dtype)
    y = np.eye(10)[rng.integers(0, 10, len(x))]
    r = assert_same_as_host(sessions, write(tmp_path / "o.h5", x, y, (40, 7, 13, 1), name), SMALL)
    assert "assemble" in r.reader["decode"]


@pytest.mark.parametrize("name", ["gzip1_f32", "lzf_shuffle_f32", "zstd_f32", "blosc_lz4_f32", "blosc_zstd_f32",
                                  "bitshuffle_f32"])
def test_chunks_with_fletcher32_are_decoded_on_the_gpu_as_on_the_host(tmp_path, ece408, sessions, name):
    """The reader threads check each chunk's fletcher32 as they read it; the GPU decodes the rest."""
    with h5py.File(ece408 / "testfull.hdf5") as f:
        x, y = f["x"][:1999], f["y"][:1999]
    r = assert_same_as_host(sessions, write(tmp_path / "f.h5", x, y, 37, name), ece408 / "model.hdf5")
    assert r.correct > 1700


@pytest.mark.parametrize("name,chunk,bytes_changed,words", [
    ("gzip1", (50, 7, 28, 1), "last 3", "chunk 7"),  # adler32's bytes
    ("lzf", (50, 7, 28, 1), "last 3", "chunk 7"),  # LZF's last token
    ("gzip1_f32", 50, "a middle bit", "chunk 7 fails its fletcher32 checksum"),  # refused as it is read
    ("gzip1_f32", (50, 7, 28, 1), "a middle bit", "chunk 7 fails its fletcher32 checksum"),
])
def test_a_damaged_deflate_or_lzf_chunk_is_refused_in_one_line(tmp_path, ece408, name, chunk, bytes_changed, words):
    """Chunk 7 (of (50, 7, 28, 1) chunks: images 50-99, rows 21-27): named as the host names it."""
    path = tmp_path / "bad.h5"
    with h5py.File(ece408 / "testfull.hdf5") as f:
        write(path, f["x"][:900], f["y"][:900], chunk, name)
    with h5py.File(path) as f:
        info = f["x"].id.get_chunk_info(7)
    raw = bytearray(path.read_bytes())
    if bytes_changed == "last 3":
        for at in range(info.size - 3, info.size):
            raw[info.byte_offset + at] ^= 0x5A
    else:
        raw[info.byte_offset + info.size // 2] ^= 0x04
    path.write_bytes(bytes(raw))
    out = tmp_path / "p.npy"
    for decode in ("gpu", "host"):
        r = invoke("run", path, ece408 / "model.hdf5", "--decode", decode, "--predictions", out)
        assert_refused(r, "bad.h5", "'x'", words)
        assert not out.exists()


def noisy(rng, dtype, high):
    """613 13x13x1 images in chunks of 37, mostly zeros, every third chunk noise in [0, high) that
    LZF cannot shrink (h5py's filter then stores it as it is, its bit set in the chunk's mask)."""
    x = (rng.integers(1, 5, (613, 13, 13, 1)) * 40 * (rng.random((613, 13, 13, 1)) < 0.4)).astype(dtype)
    for k in range(0, 613, 37 * 3):
        x[k:k + 37] = rng.integers(0, high, (len(x[k:k + 37]), 13, 13, 1))
    return x, np.eye(10)[rng.integers(0, 10, len(x))]


@pytest.mark.parametrize("name,dtype,high", [("lzf", "u1", 120), ("lzf_shuffle", "i2", 32767)])
def test_lzf_chunks_stored_as_they_are_are_copied_into_place(tmp_path, rng, sessions, name, dtype, high):
    path = write(tmp_path / "n.h5", *noisy(rng, dtype, high), 37, name)
    with h5py.File(path) as f:
        masks = [f["x"].id.get_chunk_info(k).filter_mask for k in range(f["x"].id.get_num_chunks())]
    assert masks.count(0) and set(masks) == {0, 2 if name.endswith("shuffle") else 1}
    assert_same_as_host(sessions, path, SMALL, "GPU: lzf_kernel1")


def test_a_chunk_stored_as_it_is_at_another_size_is_refused(tmp_path, rng, sessions):
    path = write(tmp_path / "n.h5", *noisy(rng, "u1", 120), 37, "lzf")
    with h5py.File(path, "r+") as f:
        at = f["x"].id.get_chunk_info(3).chunk_offset
        mask, data = f["x"].id.read_direct_chunk(at)
        assert mask == 1
        f["x"].id.write_direct_chunk(at, data[:-5], mask)
    with pytest.raises(InputError, match=r"n\.h5: dataset 'x': chunk 3 cannot be decompressed \(stored without its "
                                         r"filter, 6248 bytes, not 6253\)$"):
        sessions(SMALL, "gpu").evaluate(path)


# bitshuffled: blocks of 12,544 and 29,008 values (one block a chunk); byte-shuffled (hdf5plugin's default)
# the same, and 250 images: a 524,288-byte block split into 4 streams and a shorter one that is not
BLOSC_LZ4 = [("blosc_lz4", 16), ("blosc_lz4", 37), ("blosc_lz4_bytes", 16), ("blosc_lz4_bytes", 37),
             ("blosc_lz4_bytes", 250)]


@pytest.mark.parametrize("name,chunk", BLOSC_LZ4)
def test_mnist_float32_blosc_lz4_decoded_on_the_gpu_as_on_the_host(tmp_path, ece408, sessions, name, chunk):
    with h5py.File(ece408 / "testfull.hdf5") as f:
        x, y = f["x"][:1999], f["y"][:1999]
    placing = "blosc unshuffle" if name.endswith("bytes") else "bitunshuffle"
    r = assert_same_as_host(sessions, write(tmp_path / "b.h5", x, y, chunk, name), ece408 / "model.hdf5",
                            f"GPU: blosc_lz4_kernel2 + {placing}")
    assert r.correct > 1700


@pytest.mark.parametrize("dtype", ["u1", "i2"])
def test_blosc_lz4_images_of_integer_types(tmp_path, rng, sessions, dtype):
    """13x13x1 images in chunks of 48 (8,112 values: whole groups of 8), mostly zeros as MNIST's (so
    every chunk shrinks and is stored coded), the last chunk partly past the data set's end."""
    x = (rng.integers(1, 5, (613, 13, 13, 1)) * 40 * (rng.random((613, 13, 13, 1)) < 0.4)).astype(dtype)
    y = np.eye(10)[rng.integers(0, 10, len(x))]
    assert_same_as_host(sessions, write(tmp_path / "o.h5", x, y, 48, "blosc_lz4"), SMALL, "GPU: blosc_lz4_kernel2")


def blosc_chunk(path, k, mend):
    """Chunk k of path's 'x' replaced by mend(its bytes, the chunk's rows): the bytes to store."""
    with h5py.File(path, "r+") as f:
        d = f["x"]
        at = d.id.get_chunk_info(k).chunk_offset
        mask, data = d.id.read_direct_chunk(at)
        d.id.write_direct_chunk(at, mend(bytearray(data), d[at[0]:at[0] + d.chunks[0]]), mask)


def blosc_stored_as(tmp_path, **blosc):
    """A mend for blosc_chunk: the chunk's rows as hdf5plugin's Blosc(**blosc) stores them."""
    hdf5plugin = pytest.importorskip("hdf5plugin")

    def stored(data, rows):
        with h5py.File(tmp_path / "other.h5", "w") as f:
            d = f.create_dataset("x", data=rows, chunks=rows.shape, **hdf5plugin.Blosc(**blosc))
            return d.id.read_direct_chunk((0, 0, 0, 0))[1]
    return stored


def test_a_blosc_chunk_stored_otherwise_is_decoded_on_the_host(tmp_path, ece408, sessions):
    """Chunk 5 byte-shuffled (c-blosc's other shuffle), as Blosc's filter reads any of its chunks:
    the GPU leaves it to the reader threads and places their rows."""
    pytest.importorskip("hdf5plugin")
    with h5py.File(ece408 / "testfull.hdf5") as f:
        x, y = f["x"][:900], f["y"][:900]
    path = write(tmp_path / "b.h5", x, y, 50, "blosc_lz4")

    blosc_chunk(path, 5, blosc_stored_as(tmp_path, cname="lz4", shuffle=1))
    with h5py.File(path) as f:
        np.testing.assert_array_equal(f["x"][:], x)
    assert_same_as_host(sessions, path, ece408 / "model.hdf5", "GPU: blosc_lz4_kernel2")




def blosc_blocks(path, k):
    """(block size, [each block's stored size]) of chunk k of path's 'x', a c-blosc chunk."""
    with h5py.File(path) as f:
        d = f["x"]
        data = d.id.read_direct_chunk(d.id.get_chunk_info(k).chunk_offset)[1]
    nbytes, block = int.from_bytes(data[4:8], "little"), int.from_bytes(data[8:12], "little")
    starts = [int.from_bytes(data[16 + 4 * j:20 + 4 * j], "little") for j in range(-(-nbytes // block))]
    return block, [int.from_bytes(data[s:s + 4], "little") for s in starts]


@pytest.mark.parametrize("chunk", [16, 37, 400])  # one c-blosc block a chunk; several, the last shorter
@pytest.mark.parametrize("name", ["blosc_zstd", "blosc_zstd_noshuffle"])
def test_mnist_float32_blosc_zstd_decoded_on_the_gpu_as_on_the_host(tmp_path, ece408, sessions, name, chunk):
    with h5py.File(ece408 / "testfull.hdf5") as f:
        x, y = f["x"][:1999], f["y"][:1999]
    path = write(tmp_path / "b.h5", x, y, chunk, name)
    block, stored = blosc_blocks(path, 0)
    assert (len(stored) > 1 and chunk * 784 * 4 % block > 0) == (chunk == 400)
    r = assert_same_as_host(sessions, path, ece408 / "model.hdf5", "GPU: zstd_kernel1 (Blosc blocks)")
    assert r.correct > 1700


@pytest.mark.parametrize("dtype,chunk,noise", [("i2", 1000, 800), ("u8", 300, 200)])
def test_blosc_zstd_blocks_and_chunks_that_did_not_shrink(tmp_path, rng, sessions, dtype, chunk, noise):
    """13x13x1 images of 2- and 8-byte values in chunks of two c-blosc blocks or so, mostly zeros;
    the first images of every chunk noise, so its first block is stored as it is (copied into
    place); chunk 1 bitshuffled (c-blosc's other shuffle: decoded by the reader threads); the last
    chunk partly past the data set's end. (A chunk that does not shrink at all h5py stores with the
    filter skipped, which leaves the file to the host.)"""
    pytest.importorskip("hdf5plugin")
    n = 3 * chunk - 7
    x = (rng.integers(1, 5, (n, 13, 13, 1)) * 40 * (rng.random((n, 13, 13, 1)) < 0.4)).astype(dtype)
    for k in range(0, n, chunk):
        x[k:k + noise] = rng.integers(0, 256, (noise, 13, 13, np.dtype(dtype).itemsize), dtype=np.uint8).view(dtype)
    y = np.eye(10)[rng.integers(0, 10, len(x))]
    path = write(tmp_path / "n.h5", x, y, chunk, "blosc_zstd")
    block, stored = blosc_blocks(path, 0)
    assert stored[0] == block and stored[-1] < block // 2, (block, stored)  # a block stored as it is

    blosc_chunk(path, 1, blosc_stored_as(tmp_path, cname="zstd", shuffle=2))
    with h5py.File(path) as f:
        np.testing.assert_array_equal(f["x"][:], x)
    assert_same_as_host(sessions, path, SMALL, "GPU: zstd_kernel1 (Blosc blocks)")


def reserved_block(data):
    """A c-blosc chunk whose first block's Zstandard frame starts with a block of the reserved type."""
    frame = int.from_bytes(data[16:20], "little") + 4
    fhd = data[frame + 4]
    single = fhd >> 5 & 1
    dictionary, fcs = [0, 1, 2, 4][fhd & 3], [single, 2, 4, 8][fhd >> 6]
    at = frame + 5 + (1 - single) + dictionary + fcs  # the first block's header: last, type (2 bits), size
    data[at] |= 0b110
    return data


@pytest.mark.parametrize("name,chunk,mend,words", [
    # the first stream's first token: more literals than the stream holds
    ("blosc_lz4", 50, lambda data: data[:int.from_bytes(data[16:20], "little") + 4] + bytes([0xF0]) + bytes([0xFF]) * 40
     + data[int.from_bytes(data[16:20], "little") + 45:], ["chunk 3", "cannot be decompressed", "lz4"]),
    # its first block starting past its end
    ("blosc_lz4", 50, lambda data: data[:16] + (10 ** 9).to_bytes(4, "little") + data[20:],
     ["chunk 3", "cannot be decompressed"]),
    ("blosc_zstd", 400, reserved_block, ["chunk 3", "cannot be decompressed", "zstd"]),
    # chunks cutting images (assembled by assemble_kernel2)
    ("blosc_lz4", (50, 14, 28, 1), lambda data: data[:16] + (10 ** 9).to_bytes(4, "little") + data[20:],
     ["chunk 3", "cannot be decompressed"]),
    # (refused as the plan reads the first images on the host, to tell 8-bit codes: the host names Blosc)
    ("blosc_zstd", (400, 7, 28, 1), reserved_block, ["chunk 3", "cannot be decompressed"]),
    # its second block starting past its end
    ("blosc_zstd", 400, lambda data: data[:20] + (10 ** 9).to_bytes(4, "little") + data[24:],
     ["chunk 3", "past the chunk's end"]),
])
def test_a_damaged_blosc_chunk_is_refused_in_one_line(tmp_path, ece408, name, chunk, mend, words):
    pytest.importorskip("hdf5plugin")
    with h5py.File(ece408 / "testfull.hdf5") as f:
        x, y = f["x"][:2000], f["y"][:2000]
    path = write(tmp_path / "bad.h5", x, y, chunk, name)
    blosc_chunk(path, 3, lambda data, rows: bytes(mend(data)))
    out = tmp_path / "p.npy"
    r = invoke("run", path, ece408 / "model.hdf5", "--decode", "gpu", "--predictions", out)
    assert_refused(r, "bad.h5", "'x'", *words)
    assert not out.exists()


def test_float64_images_are_refused_for_the_gpu_with_the_reason(tmp_path, rng):
    x = rng.random((300, 28, 28, 1))
    path = write(tmp_path / "f.h5", x, np.eye(10)[rng.integers(0, 10, 300)], 37, "gzip1")
    r = invoke("run", path, "--decode", "gpu")
    assert_refused(r, "f.h5", "--decode gpu", "converted on the host")


def test_auto_decodes_on_the_gpu_where_it_can_and_gpu_refuses_what_it_cannot(tmp_path, ece408, sessions):
    with h5py.File(ece408 / "testfull.hdf5") as f:
        x, y = f["x"][:700], f["y"][:700]
    gz = write(tmp_path / "g.h5", x, y, 50, "gzip1")
    with h5py.File(tmp_path / "l.h5", "w") as f:
        f.create_dataset("x", data=x, chunks=(50, 28, 28, 1), compression="lzf", fletcher32=True)
        f["y"] = y
    s = sessions(ece408 / "model.hdf5", "gpu")
    assert s.evaluate(gz).reader["decode"].startswith("GPU: inflate_kernel3")
    assert sessions(ece408 / "model.hdf5", "host").evaluate(gz).reader["decode"] == "host"
    with Session(ece408 / "model.hdf5", "cuda") as default:  # auto: the GPU where it decodes the file
        assert default.evaluate(gz).reader["decode"].startswith("GPU: inflate_kernel3")
        assert default.evaluate(tmp_path / "l.h5").reader["decode"] == "host"
    with pytest.raises(InputError, match="fletcher32"):
        s.evaluate(tmp_path / "l.h5")
    assert s.evaluate(gz).reader["decode"].startswith("GPU: inflate_kernel3")  # and the session goes on
    r = invoke("run", tmp_path / "l.h5", ece408 / "model.hdf5", "--decode", "gpu")
    assert_refused(r, "l.h5", "--decode gpu", "its chunks carry fletcher32 checksums")


@pytest.mark.parametrize("where,words", [
    (lambda size: [size // 3], ["chunk 3", "damaged Zstandard data"]),  # inside a block: its tables or streams
    (lambda size: range(size - 40, size), ["chunk 3", "cannot be decompressed"]),  # the last block's sequences
    (lambda size: [0], ["chunk 3", "not a Zstandard frame", "--decode host"]),
])
def test_a_damaged_zstd_chunk_is_refused_in_one_line(tmp_path, ece408, where, words):
    pytest.importorskip("hdf5plugin")
    path = damaged(tmp_path, ece408, "zstd", where)
    out = tmp_path / "p.npy"
    r = invoke("run", path, ece408 / "model.hdf5", "--decode", "gpu", "--predictions", out)
    assert_refused(r, "bad.h5", "'x'", *words)
    assert not out.exists()


def test_a_damaged_lzf_chunk_is_refused_in_one_line(tmp_path, ece408):
    path = damaged(tmp_path, ece408, "lzf", lambda size: range(size - 3, size))
    out = tmp_path / "p.npy"
    r = invoke("run", path, ece408 / "model.hdf5", "--decode", "gpu", "--predictions", out)
    assert_refused(r, "bad.h5", "'x'", "chunk 3", "cannot be decompressed")
    assert not out.exists()


def test_damaged_lzf_chunks_are_refused_or_read_as_the_host_reads_them(tmp_path, ece408, sessions, rng):
    """LZF has no checksum: a changed literal decodes, to other values, on the host (liblzf) as on the
    GPU. 16 damages of 1 to 8 bytes at random places of chunk 3: the GPU refuses the chunk exactly where
    the host does, and otherwise reads the same images: the same predictions, or the same refusal of
    what they hold (a value too large for float32's scores)."""
    gpu, host = sessions(ece408 / "model.hdf5", "gpu"), sessions(ece408 / "model.hdf5", "host")
    refused = 0
    for _ in range(16):
        count = int(rng.integers(1, 9))
        path = damaged(tmp_path, ece408, "lzf", lambda size: rng.choice(size, count, replace=False))
        try:
            want = host.evaluate(path).predictions
        except InputError as e:
            with pytest.raises(InputError, match="chunk 3" if "chunk 3" in str(e) else re.escape(str(e))):
                gpu.evaluate(path)
            refused += "chunk 3" in str(e)
            continue
        np.testing.assert_array_equal(gpu.evaluate(path).predictions, want)
    assert 0 < refused < 16


def damaged(tmp_path, ece408, name, where, chunk=50):
    """A copy of 900 testfull images in chunks of `chunk`, chunk 3's bytes damaged at `where` (a
    function of the chunk's size: the offsets to flip)."""
    with h5py.File(ece408 / "testfull.hdf5") as f:
        x, y = f["x"][:max(900, 4 * chunk)], f["y"][:max(900, 4 * chunk)]
    path = write(tmp_path / "bad.h5", x, y, chunk, name)
    with h5py.File(path) as f:
        info = f["x"].id.get_chunk_info(3)
    raw = bytearray(path.read_bytes())
    for at in where(info.size):
        raw[info.byte_offset + at] ^= 0x5A
    path.write_bytes(bytes(raw))
    return path


@pytest.mark.parametrize("where,words", [
    (lambda size: range(size // 3, size // 3 + 64), ["chunk 3"]),
    (lambda size: [size - 1], ["chunk 3", "adler32"]),
    (lambda size: [0], ["chunk 3", "not a zlib stream"]),
])
@pytest.mark.parametrize("chunk", [50, 350])  # 350 images: 1.1 MB, several deflate blocks
def test_a_damaged_chunk_is_refused_in_one_line(tmp_path, ece408, where, words, chunk):
    path = damaged(tmp_path, ece408, "gzip1", where, chunk)
    out = tmp_path / "p.npy"
    r = invoke("run", path, ece408 / "model.hdf5", "--decode", "gpu", "--predictions", out)
    assert_refused(r, "bad.h5", "'x'", *words)
    assert not out.exists()


@pytest.mark.parametrize("chunk", [50, 350])
def test_damage_anywhere_in_a_chunk_is_found_and_the_session_goes_on(tmp_path, ece408, sessions, rng, chunk):
    """24 damages of 1 to 64 bytes at random places of chunk 3 (the kernel's own checks or adler32
    find each); after each, the same session decodes the good file right."""
    s = sessions(ece408 / "model.hdf5", "gpu")
    with h5py.File(ece408 / "testfull.hdf5") as f:
        good = write(tmp_path / "good.h5", f["x"][:max(900, 4 * chunk)], f["y"][:max(900, 4 * chunk)], chunk, "gzip1")
    want = s.evaluate(good).predictions
    for k in range(24):
        count = int(rng.integers(1, 65))
        path = damaged(tmp_path, ece408, "gzip1", lambda size: rng.choice(size, count, replace=False), chunk)
        with pytest.raises(InputError, match="chunk 3"):
            s.evaluate(path)
        np.testing.assert_array_equal(s.evaluate(good).predictions, want)


def timed_stream(monkeypatch):
    """[flag]: the flag True while CudaBackend.stream (a run's timed stream) runs."""
    from infer.gpu.backend import CudaBackend

    streaming, stream = [False], CudaBackend.stream

    def streamed(self, *args, **kwargs):
        streaming[0] = True
        try:
            return stream(self, *args, **kwargs)
        finally:
            streaming[0] = False
    monkeypatch.setattr(CudaBackend, "stream", streamed)
    return streaming


@pytest.mark.parametrize("decode", ["host", "gpu"])
def test_the_ring_is_pinned_before_the_timed_run(tmp_path, ece408, monkeypatch, decode):
    """Pinning a 25 MB buffer takes ~17 ms (H100 host): a streamed run's ring is pinned as the
    Session prepares, never inside the timed stream, and pinned once for repeated runs."""
    from infer.gpu.backend import CudaBackend

    streaming, pinned, pin = timed_stream(monkeypatch), [], CudaBackend.new_host_buffer

    def pinning(shape, dtype):
        pinned.append(streaming[0])
        return pin(shape, dtype)
    monkeypatch.setattr(CudaBackend, "new_host_buffer", staticmethod(pinning))
    with h5py.File(ece408 / "testfull.hdf5") as f:
        path = write(tmp_path / "g.h5", f["x"][:700], f["y"][:700], 50, "gzip1_shuffle")
    with Session(ece408 / "model.hdf5", "cuda", decode=decode) as s:
        first = s.evaluate(path)
        count = len(pinned)
        assert first.streamed and s.evaluate(path).correct == first.correct
    assert count > 0 and len(pinned) == count and not any(pinned)


def test_the_decoders_device_memory_is_taken_before_the_timed_run(tmp_path, ece408, monkeypatch):
    """--decode gpu's device buffers (several GB) are allocated as the Session prepares, never inside
    the timed stream, and kept for the next file they fit."""
    import pycuda.driver as cuda

    streaming, taken, alloc = timed_stream(monkeypatch), [], cuda.mem_alloc

    def allocating(nbytes):
        taken.append(streaming[0])
        return alloc(nbytes)
    monkeypatch.setattr(cuda, "mem_alloc", allocating)
    with h5py.File(ece408 / "testfull.hdf5") as f:
        first = write(tmp_path / "a.h5", f["x"][:700], f["y"][:700], 50, "gzip1_shuffle")
    other = shutil.copy(first, tmp_path / "b.h5")
    with Session(ece408 / "model.hdf5", "cuda", decode="gpu") as s:
        a = s.evaluate(first)
        count = len(taken)
        b = s.evaluate(other)  # another file that the same buffers fit
        assert a.streamed and b.streamed and a.reader["decode"].startswith("GPU")
    assert count > 0 and len(taken) == count and not any(taken)
    np.testing.assert_array_equal(b.predictions, a.predictions)


def test_devices_all_asks_for_the_hardware_queues_before_the_driver_starts(monkeypatch):
    """The driver reads CUDA_DEVICE_MAX_CONNECTIONS as it starts: `--devices all` counts the GPUs
    (starting it) only after --decode gpu has asked for its queues (it was after: 8 queues, two
    H200s streamed gzip 1 at 4.0M images/s instead of 6.8-7.4M)."""
    import infer.gpu
    from infer.errors import BackendUnavailable
    from infer.gpu import device

    seen = []

    def counting():
        seen.append(os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"))
        raise BackendUnavailable("counted")
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "")  # restored afterwards, even where it was unset
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS")
    monkeypatch.setattr(device, "visible_devices", counting)
    with pytest.raises(BackendUnavailable):
        infer.gpu.create("all", decode="gpu")
    assert seen == [str(device.DECODE_QUEUES)]


@pytest.mark.parametrize("ring", ["every chunk in flight", "a ring used again"])
def test_deflate_chunks_are_split_in_parts_only_where_all_are_in_flight(tmp_path, ece408, sessions, monkeypatch, ring):
    """Where a run's chunks all fit the device ring (latency bound), inflate_kernel3 splits each in
    parts; where the ring is used again (throughput bound), it decodes them whole. Either way the
    predictions are the host's."""
    from infer.gpu import chunk_decode, launch

    monkeypatch.setattr("infer.gpu.codecs.Deflate.block_bytes", 2_000_000)  # 4 chunks of 160 images a block
    monkeypatch.setattr("infer.gpu.codecs.Deflate.group", 1)
    if ring == "every chunk in flight":
        monkeypatch.setattr(chunk_decode, "MAX_STREAMS", 8)  # 9 slots of a block for its 4 blocks
    else:
        monkeypatch.setattr(chunk_decode, "IN_FLIGHT_BYTES", 2_000_000)  # 2 slots: one group decoding at a time
    splits, call = [], launch.InflateParts.__call__
    def spied(self, *a, **k):  # (a[1]: the streams; the warm-up's single stream aside)
        if a[1] > 1:
            splits.append(a[-1])
        return call(self, *a, **k)
    monkeypatch.setattr(launch.InflateParts, "__call__", spied)
    with h5py.File(ece408 / "testfull.hdf5") as f:
        x, y = f["x"][:2000], f["y"][:2000]
    path = write(tmp_path / "s.h5", x, y, 160, "gzip1 shuffle")
    with Session(ece408 / "model.hdf5", "cuda", decode="gpu") as s:  # its own: a run planned for this ring
        gpu = s.evaluate(path)
    host = sessions(ece408 / "model.hdf5", "host").evaluate(path)
    assert gpu.streamed and gpu.reader["decode"].startswith("GPU: inflate_kernel3")
    np.testing.assert_array_equal(gpu.predictions, host.predictions)
    assert splits and set(splits) == {ring == "every chunk in flight"}
