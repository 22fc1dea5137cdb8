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
    (dict(chunks=(16, 28, 28, 1), shuffle=True), "f4", "f4", 1, "LZF, Zstd and Blosc lz4 and zstd chunks, not shuffle"),
    (dict(chunks=(16, 28, 28, 1)), "f4", "f4", 1, "not raw chunks"),
    ({}, "f4", "f4", 1, "not stored in chunks (pread)"),
    (dict(GZIP, fletcher32=True), "f4", "f4", 1, "fletcher32"),
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


def test_blosc_chunks_cutting_images_are_the_hosts(tmp_path, model, rng):
    hdf5plugin = pytest.importorskip("hdf5plugin")
    if native.library() is None:
        pytest.skip("no native read pool here")
    got = why(tmp_path, model, rng, chunks=(16, 14, 28, 1), compression=hdf5plugin.Blosc(cname="lz4", shuffle=2))
    assert "cut images, which the GPU assembles from deflate, LZF and Zstd chunks, not Blosc's" in got


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
    (dict(cname="lz4", shuffle=1), "bitshuffled"),
    (dict(cname="blosclz", shuffle=2), "the GPU decodes Blosc"),
])
def test_blosc_chunks_the_gpu_decodes_are_lz4_bitshuffled_or_zstd(tmp_path, model, rng, blosc, reason):
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
