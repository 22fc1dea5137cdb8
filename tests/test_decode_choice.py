"""Which files --decode gpu takes, and why not (no GPU needed): deflate, LZF and Zstd chunks (of whole
images or cutting them), and Blosc's lz4 with its bitshuffle or zstd (of whole images), in the type the GPU
reads, in one file; everything else one line saying why."""
import h5py
import numpy as np
import pytest

from infer import Session
from infer.data import loader, native
from infer.data.dataset import DataSet
from infer.gpu import chunk_decode, codecs
from infer.options import Options
from infer.errors import InputError
from tests.conftest import assert_refused, invoke


@pytest.fixture
def model(ece408):
    return loader.load_model(ece408 / "model.hdf5")


def why(tmp_path, model, rng, wire=np.float32, shards=1, dtype="f4", **options):
    x = rng.random((120, 28, 28, 1)).astype(dtype)
    paths = []
    for i in range(shards):
        paths.append(tmp_path / f"d{i}.h5")
        with h5py.File(paths[-1], "w") as f:
            f.create_dataset("x", data=x, **options)
            f["y"] = np.eye(10)[rng.integers(0, 10, 120)]
    data = DataSet.open(paths, model)
    try:
        return chunk_decode.unsupported(data, np.dtype(wire))
    finally:
        data.close()


GZIP = dict(compression="gzip", chunks=(16, 28, 28, 1))


@pytest.mark.parametrize("options,wire,dtype,shards,reason", [
    (dict(chunks=(16, 28, 28, 1), shuffle=True), "f4", "f4", 1, "Blosc lz4 and zstd and Blosc2 lz4 chunks, not shuffle"),
    (dict(chunks=(16, 28, 28, 1)), "f4", "f4", 1, "not raw chunks"),
    ({}, "f4", "f4", 1, "not stored in chunks (pread)"),
    (GZIP, "f4", "f8", 1, "float64 values are converted on the host"),
    (GZIP, "f4", "f4", 2, "spans several files"),
    (GZIP, "f4", ">f4", 1, "stored in the other byte order"),
])
def test_what_the_gpu_does_not_decode_says_why(tmp_path, model, rng, options, wire, dtype, shards, reason):
    assert reason in why(tmp_path, model, rng, wire, shards, dtype, **options)


def test_lzf_chunks_stored_as_they_are_stay_on_the_gpu_but_no_other_skipped_filter(tmp_path, model, rng):
    """h5py's lzf leaves a chunk it cannot shrink unfiltered (the codec's bit in the chunk's mask):
    the GPU copies it into place. A chunk with its shuffle skipped is the host's."""
    x = (rng.random((120, 28, 28, 1)) * (rng.random((120, 28, 28, 1)) < 0.2)).astype("f4")
    x[16:32] = rng.integers(0, 0x7F000000, (16, 28, 28, 1), np.uint32).view("f4")  # every bit noise: LZF cannot shrink it
    y = np.eye(10)[rng.integers(0, 10, 120)]
    path = tmp_path / "l.h5"
    with h5py.File(path, "w") as f:
        d = f.create_dataset("x", data=x, chunks=(16, 28, 28, 1), compression="lzf", shuffle=True)
        assert [d.id.get_chunk_info(k).filter_mask for k in range(3)] == [0, 2, 0]
        f["y"] = y

    def why_of(p):
        data = DataSet.open([p], model)
        try:
            return chunk_decode.unsupported(data, np.dtype("f4"))
        finally:
            data.close()
    assert why_of(path) is None
    with h5py.File(path) as f:
        chunks = [f["x"].id.read_direct_chunk((16 * k, 0, 0, 0)) for k in range(8)]
    with h5py.File(path, "w") as f:  # chunks written once each (HDF5 keeps a rewritten chunk's mask)
        d = f.create_dataset("x", (120, 28, 28, 1), "f4", chunks=(16, 28, 28, 1), compression="lzf", shuffle=True)
        for k, (mask, data) in enumerate(chunks):
            d.id.write_direct_chunk((16 * k, 0, 0, 0), data, mask | (k == 2))  # chunk 2: its shuffle skipped
        f["y"] = y
    assert "stored with a filter skipped" in why_of(path)


@pytest.mark.parametrize("chunks", [(16, 14, 28, 1), (16, 28, 5, 1), (7, 32, 32, 1), (16, 1, 1, 1)])
@pytest.mark.parametrize("compression", ["gzip", "lzf"])
def test_deflate_and_lzf_chunks_cutting_images_are_assembled_on_the_gpu(tmp_path, model, rng, chunks, compression):
    wide = dict(maxshape=(None,) * 4) if chunks[1] > 28 else {}  # h5py: chunks past the shape need room to grow
    assert why(tmp_path, model, rng, chunks=chunks, compression=compression, **wide) is None
    assert why(tmp_path, model, rng, chunks=chunks, compression=compression, shuffle=True, **wide) is None


def test_blosc2_chunks_cutting_images_are_the_hosts(tmp_path, model, rng):
    hdf5plugin = pytest.importorskip("hdf5plugin")
    if native.library() is None:
        pytest.skip("no native read pool here")
    got = why(tmp_path, model, rng, chunks=(16, 14, 28, 1),
              compression=hdf5plugin.Blosc2(cname="lz4", filters=hdf5plugin.Blosc2.BITSHUFFLE))
    assert "cut images, which the GPU assembles from deflate, LZF, Zstd, LZ4, Bitshuffle and Blosc chunks, not Blosc2's" in got


def test_a_block_of_chunks_cutting_images_holds_whole_rows_of_chunks(tmp_path, model, rng):
    """chunk_decode.layout: a block of 40 rows in (16, 10, 9, 1) chunks (a row of chunks: 3 x 4 of
    them) may touch 4 rows of chunks, 48 chunks, the most bytes any 48 consecutive chunks take."""
    x = (rng.random((120, 28, 28, 1)) * (rng.random((120, 28, 28, 1)) < 0.3)).astype("f4")
    path = tmp_path / "cut.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x, chunks=(16, 10, 9, 1), compression="gzip")
        f["y"] = np.eye(10)[rng.integers(0, 10, 120)]
        sizes = [f["x"].id.get_chunk_info(k).size for k in range(f["x"].id.get_num_chunks())]
    data = DataSet.open([path], model)
    try:
        rows = data.parts[0][1]
        assert (rows.per, len(rows.index)) == (12, 96)
        chunks, capacity = chunk_decode.layout(rows, 40)
        assert chunks == 48 and capacity == max(sum(sizes[k:k + 48]) for k in range(96 - 47))
    finally:
        data.close()


@pytest.mark.parametrize("lo,hi", [(0, 40), (16, 48), (21, 120), (100, 101)])
def test_a_block_of_chunks_cutting_images_reads_its_rows_of_chunks(tmp_path, model, rng, lo, hi):
    """Decoder.read (no GPU: the pool a stand-in, reading at once): images [lo, hi) of (16, 10, 9, 1)
    chunks read as the stored bytes of every chunk of rows of chunks lo // 16 to (hi - 1) // 16, back to
    back, the block's first chunk the first of its first row of chunks."""
    from types import SimpleNamespace

    x = (rng.random((120, 28, 28, 1)) * (rng.random((120, 28, 28, 1)) < 0.3)).astype("f4")
    path = tmp_path / "cut.h5"
    with h5py.File(path, "w") as f:
        d = f.create_dataset("x", data=x, chunks=(16, 10, 9, 1), compression="gzip")
        f["y"] = np.eye(10)[rng.integers(0, 10, 120)]
        stored = [d.id.read_direct_chunk(d.id.get_chunk_info(k).chunk_offset)[1] for k in range(d.id.get_num_chunks())]
    data = DataSet.open([path], model)
    try:
        rows = data.parts[0][1]
        index = np.array(rows.index, np.int64).reshape(-1, 3)
        dec = SimpleNamespace(per=rows.align, slab=rows.per, rows=rows, offsets=index[:, 0], stored=index[:, 1])
        dec._read = lambda *args: chunk_decode.Decoder._read(dec, *args)
        pool = SimpleNamespace(native=None, call=lambda fn, *args: fn(*args))
        block = chunk_decode.Block(np.zeros(int(index[:, 1].sum()), np.uint8), hi - lo)
        chunk_decode.Decoder.read(dec, pool, lo, hi, block)
        first, last = lo // 16 * 12, -(-hi // 16) * 12
        want = b"".join(stored[first:last])
        assert (block.lo, block.c0, len(block.positions), block.end) == (lo, first, last - first, len(want))
        assert block.buf[:block.end].tobytes() == want
    finally:
        data.close()


@pytest.mark.parametrize("shape,chunks,image,chunk", [
    ((120, 28, 28, 1), (16, 10, 9, 1), (28, 28, 1), (16, 10, 9, 1)),
    ((120, 28, 28), (16, 7, 28), (1, 28, 28), (16, 1, 7, 28)),  # 2-D images: a leading 1 on both
])
def test_a_block_of_chunks_cutting_images_is_assembled_from_its_first_row_of_chunks(tmp_path, rng, shape, chunks,
                                                                                      image, chunk):
    """Deflate.place (no GPU: assemble_kernel1's launcher a stand-in) for images 37-99 of chunks of
    16 rows, a block whose chunks start with row of chunks 2: its first row 5 rows into it, the
    images' and chunks' shapes in 3 and 4 dimensions, shuffled as stored."""
    from types import SimpleNamespace

    from infer.data import reader

    path = tmp_path / "cut.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=rng.random(shape).astype("f4"), chunks=chunks, compression="gzip", shuffle=True)
    with h5py.File(path) as f:
        rows = reader.rows(path, f["x"], "cut.h5: dataset 'x'")
    try:
        calls = []
        codec = SimpleNamespace(rows=rows, shuffled=True, assemble=lambda *args: calls.append(args))
        dec = SimpleNamespace(per=rows.align, slab=rows.per, row_bytes=rows.row_bytes, stride=4096)
        piece = chunk_decode.Piece(37, 2 * rows.per, 5 * rows.per, 63, None)
        codecs.Deflate.place(codec, dec, "stream", piece, 1 << 20, 2 << 20)
        assert calls == [("stream", 1 << 20, 2 << 20, image, chunk, 5, 63, 4096, True)]
    finally:
        rows.close()


@pytest.mark.parametrize("stride_pad", [0, 200])  # chunks back to back (one copy), or a stride apart (one a chunk)
@pytest.mark.parametrize("lo,hi", [(0, 21), (5, 40), (14, 21), (93, 100)])
def test_a_block_of_whole_row_chunks_is_copied_into_place(monkeypatch, rng, stride_pad, lo, hi):
    """codecs._copy_rows (no GPU: device memory a NumPy array, pycuda's copy a stand-in on it): rows
    [lo, hi) of 100 rows of 60 bytes in decoded chunks of 7 rows, from the block's first chunk on."""
    import sys
    from types import ModuleType, SimpleNamespace

    memory = np.zeros(1 << 16, np.uint8)
    fake = ModuleType("pycuda.driver")
    fake.memcpy_dtod_async = lambda dst, src, n, stream: memory.__setitem__(slice(dst, dst + n), memory[src:src + n])
    monkeypatch.setitem(sys.modules, "pycuda", ModuleType("pycuda"))
    monkeypatch.setitem(sys.modules, "pycuda.driver", fake)
    values = rng.integers(0, 256, (100, 60), np.uint8)
    per, chunk_bytes = 7, 7 * 60
    stride = chunk_bytes + stride_pad
    c0, c1 = lo // per, -(-hi // per)
    for k in range(c0, c1):
        memory[(k - c0) * stride:][:chunk_bytes] = np.resize(values[k * per:(k + 1) * per], (per, 60)).reshape(-1)
    dst = 32768
    dec = SimpleNamespace(per=per, row_bytes=60, stride=stride, chunk_bytes=chunk_bytes)
    codecs._copy_rows(dec, None, chunk_decode.Piece(lo, c0, c1 - c0, hi - lo, None), lo - c0 * per, 0, dst)
    np.testing.assert_array_equal(memory[dst:dst + (hi - lo) * 60].reshape(-1, 60), values[lo:hi])


def test_deflate_chunks_of_whole_images_need_nothing_more(tmp_path, model, rng):
    assert why(tmp_path, model, rng, **GZIP) is None
    assert why(tmp_path, model, rng, shuffle=True, **GZIP) is None


def test_zstd_chunks_of_whole_images_need_nothing_more(tmp_path, model, rng):
    hdf5plugin = pytest.importorskip("hdf5plugin")
    if native.library() is None:
        pytest.skip("no native read pool here")
    for shuffle in (False, True):
        assert why(tmp_path, model, rng, chunks=(16, 28, 28, 1), shuffle=shuffle, compression=hdf5plugin.Zstd()) is None


def test_zstd_frames_with_checksums_are_the_hosts(tmp_path, model, rng):
    """libzstd on the host checks a frame's content checksum; zstd_kernel2 does not."""
    from tests.zstd_frames import CHECKSUM, compress, libzstd

    hdf5plugin = pytest.importorskip("hdf5plugin")
    if native.library() is None:
        pytest.skip("no native read pool here")
    x = rng.random((32, 28, 28, 1)).astype("f4")
    with h5py.File(tmp_path / "z.h5", "w") as f:
        d = f.create_dataset("x", data=x, chunks=(16, 28, 28, 1), compression=hdf5plugin.Zstd())
        for k in range(2):
            d.id.write_direct_chunk((16 * k, 0, 0, 0), compress(libzstd(), x[16 * k:16 * (k + 1)].tobytes(), 3,
                                                                 {CHECKSUM: 1}))
        f["y"] = np.eye(10)[rng.integers(0, 10, 32)]
    with h5py.File(tmp_path / "z.h5") as f:
        np.testing.assert_array_equal(f["x"][:], x)
    data = DataSet.open([tmp_path / "z.h5"], model)
    try:
        assert "checksum" in chunk_decode.unsupported(data, np.dtype("f4"))
    finally:
        data.close()


def test_zstd_chunks_over_the_kernels_output_limit_are_the_hosts(tmp_path, model, rng, monkeypatch):
    """The GPU's Zstandard decoders keep 32-bit positions (ZOUT_MAX); larger chunks are decoded on the host."""
    hdf5plugin = pytest.importorskip("hdf5plugin")
    if native.library() is None:
        pytest.skip("no native read pool here")
    monkeypatch.setattr(codecs.Zstd, "OUT_MAX", 16 * 28 * 28 * 4 - 1)
    assert "more than the GPU's Zstandard decoder takes (50,175 bytes)" in why(
        tmp_path, model, rng, chunks=(16, 28, 28, 1), compression=hdf5plugin.Zstd())
    monkeypatch.setattr(codecs.Zstd, "OUT_MAX", 16 * 28 * 28 * 4)
    assert why(tmp_path, model, rng, chunks=(16, 28, 28, 1), compression=hdf5plugin.Zstd()) is None


@pytest.mark.parametrize("blosc,reason", [
    (dict(cname="lz4", shuffle=2), None),
    (dict(cname="zstd", shuffle=1), None),
    (dict(cname="zstd", shuffle=0), None),
    (dict(cname="zstd", shuffle=2), "byte-shuffled or not, a stream a block"),
    (dict(cname="lz4", shuffle=1), None),  # hdf5plugin's default
    (dict(cname="blosclz", shuffle=2), "the GPU decodes Blosc"),
])
def test_blosc_chunks_the_gpu_decodes_are_lz4_shuffled_or_zstd(tmp_path, model, rng, blosc, reason):
    hdf5plugin = pytest.importorskip("hdf5plugin")
    if native.library() is None:
        pytest.skip("no native read pool here")
    got = why(tmp_path, model, rng, chunks=(16, 28, 28, 1), compression=hdf5plugin.Blosc(**blosc))
    assert got is None if reason is None else reason in got


def test_the_decode_option_is_checked():
    assert Options().decode == "auto"
    with pytest.raises(InputError, match="decode must be one of auto, host, gpu, not 'cpu'"):
        Options.of(decode="cpu")


class Made(Exception):
    """Raised in place of making a backend: what it would have been made with."""


@pytest.fixture
def made(monkeypatch):
    """The decode mode each Session's backend would be made with (nothing made, no GPU needed)."""
    from infer import session

    def create(name, notice, **options):
        raise Made(options["decode"])
    monkeypatch.setattr(session, "create_backend", create)

    def decode(path, backend="cuda", **options):
        with Session(MODEL, backend, **options) as s:
            with pytest.raises(Made) as e:
                s.evaluate(path)
        return e.value.args[0]
    return decode


@pytest.fixture
def files(tmp_path, rng):
    x = (rng.random((120, 28, 28, 1)) * (rng.random((120, 28, 28, 1)) < 0.2)).astype("f4")  # MNIST-like: LZF shrinks it
    y = np.eye(10)[rng.integers(0, 10, 120)]
    paths = {}
    for name, options in (("gzip", GZIP), ("contiguous", {}), ("lzf", dict(compression="lzf", chunks=(16, 28, 28, 1))),
                          ("raw chunks", dict(chunks=(16, 28, 28, 1)))):
        paths[name] = tmp_path / f"{name}.h5"
        with h5py.File(paths[name], "w") as f:
            f.create_dataset("x", data=x, **options)
            f["y"] = y
    return paths


MODEL = None  # the bundled model takes 28x28x1 images


def test_auto_decodes_on_the_gpu_only_a_streamed_file_it_can_decode(made, files, monkeypatch):
    """The hardware queues GPU decoding needs are asked for as the driver starts, so auto chooses as
    the first call makes the backend: GPU decoding where that call streams a file the GPU decodes."""
    monkeypatch.setenv("CNNINFER_HOST_BUDGET_MB", "0")  # every file streamed
    assert made(files["gzip"]) == "auto"
    assert made(files["contiguous"]) == "host"
    assert made(files["lzf"]) == "auto"
    assert made(files["raw chunks"]) == "host"
    assert made(files["gzip"], decode="host") == "host"
    assert made(files["gzip"], "cpu") == "host"
    assert made(files["contiguous"], decode="gpu") == "gpu"
    monkeypatch.setenv("CNNINFER_HOST_BUDGET_MB", "512")  # read whole: nothing streamed
    assert made(files["gzip"]) == "host"
    # Streamed within the budget (past the GPU's stream_from): decoded by the host, whose start-up costs less
    monkeypatch.setattr("infer.gpu.plan.STREAM_FROM", 1000)
    assert made(files["gzip"]) == "host" and made(files["gzip"], decode="gpu") == "gpu"


def test_decode_gpu_on_the_cpu_backend_is_one_line(ece408):
    r = invoke("run", ece408 / "test100.hdf5", ece408 / "model.hdf5", "--backend", "cpu", "--decode", "gpu")
    assert_refused(r, "--decode gpu needs the CUDA backend")


def test_decode_streams_take_every_group_at_once_where_the_run_fits_the_ring():
    """A run whose blocks all fit the device slots decodes every group at once, a stream each (a
    1M-image deflate file: 125 blocks, 7 groups); a longer one keeps a group of slots spare for the
    blocks waiting for compute; never more than MAX_STREAMS."""
    assert chunk_decode.shape(140, 20, 125) == (7, 20)
    assert chunk_decode.shape(65, 5, 125) == (12, 5)
    assert chunk_decode.shape(65, 5, 400) == (12, 5)
    assert chunk_decode.shape(3, 5, 3) == (1, 3)
    assert chunk_decode.shape(200, 5, 190) == (chunk_decode.MAX_STREAMS, 5)
    plan = chunk_decode.Plan(20, 64 << 20, 6)
    streams = min(chunk_decode.MAX_STREAMS, chunk_decode.IN_FLIGHT_BYTES // (20 * 64 << 20))
    assert chunk_decode.slots(80 << 30, plan) == (streams + 1) * 20
    # a kernel's scratch memory (zstd_kernel2: a byte a decoded byte) shares the eighth of the memory
    assert chunk_decode.slots(80 << 30, plan._replace(scratch=1.0)) == (streams + 1) * 20
    assert chunk_decode.slots(32 << 30, plan) == 4 * 20
    assert chunk_decode.slots(32 << 30, plan._replace(scratch=1.0)) == 2 * 20


def test_a_codecs_blocks_halve_until_the_host_ring_of_compressed_chunks_fits(tmp_path, model, rng, monkeypatch):
    path = tmp_path / "lzf.h5"
    with h5py.File(path, "w") as f:  # noise: LZF keeps nearly every byte
        f.create_dataset("x", data=rng.random((500, 28, 28, 1), np.float32), chunks=(50, 28, 28, 1),
                         compression="lzf")
        f["y"] = np.eye(10)[rng.integers(0, 10, 500)]
    data = DataSet.open([path], model)
    try:
        rows = data.parts[0][1]
        stored = int(np.array(rows.index, np.int64).reshape(-1, 3)[:, 1].max())
        assert stored > 0.9 * 50 * 784 * 4
        codec = codecs.Lzf
        assert chunk_decode.plan(rows) == chunk_decode.Plan(codec.group, codec.block_bytes, codec.ring, codec.scratch)

        def pinned(block_bytes):
            return codec.ring * chunk_decode.layout(rows, block_bytes // rows.row_bytes)[1]
        monkeypatch.setattr(chunk_decode, "RING_PINNED", codec.ring * 7 * stored)  # blocks of 7 chunks at most
        monkeypatch.setattr(chunk_decode, "MIN_BLOCK_BYTES", 1 << 16)
        plan = chunk_decode.plan(rows)
        assert pinned(plan.block_bytes) <= chunk_decode.RING_PINNED < pinned(2 * plan.block_bytes)
        assert plan.group * plan.block_bytes == codec.group * codec.block_bytes  # the same decoded bytes a launch
        monkeypatch.setattr(chunk_decode, "MIN_BLOCK_BYTES", codec.block_bytes // 4)
        assert chunk_decode.plan(rows).block_bytes == codec.block_bytes // 4
    finally:
        data.close()
