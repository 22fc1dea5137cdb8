"""Shuffled chunks (HDF5's byte shuffle; Bitshuffle's, c-blosc's and Blosc2's bitshuffle; c-blosc's
byte shuffle) decoded by the host and unshuffled on the GPU as each streamed block is placed: the
placer against the values for blocks starting and ending inside chunks, and streamed runs whose
predictions equal the host's unshuffle for every value size. Needs a GPU."""
from types import SimpleNamespace

import h5py
import numpy as np
import pytest

from infer import Session
from infer.data import native
from tests.conftest import Dev, assert_refused, build, damaged_copy, invoke, small_model
from tests.test_reader import bit_shuffle, blosc_shuffle, byte_shuffle, shuffled_rows

pytestmark = pytest.mark.gpu
SMALL = small_model(np.random.default_rng(13))  # takes 13x13x1 images


SHUFFLES = {"bytes": (None, byte_shuffle), "bitshuffle": ((16, False), bit_shuffle(16, False)),
            "blosc": ((24, True), bit_shuffle(24, True)),  # 7 rows of 30 values: blocks, a shorter one, values left
            "blosc bytes": (11, blosc_shuffle(11))}  # c-blosc's byte shuffle, blocks of 11 values


@pytest.mark.parametrize("dtype", ["f4", "i2", "u8", "u1"])
@pytest.mark.parametrize("kind", SHUFFLES)
def test_the_placer_unshuffles_whole_chunks_and_copies_the_rest(gpu, rng, dtype, kind):
    import pycuda.driver as cuda

    from infer.gpu.shuffled import Placer

    layout, shuffle = SHUFFLES[kind]
    bits, blosc = (None, layout) if kind == "blosc bytes" else (layout, None)
    if bits is None and dtype == "u1":
        pytest.skip("a byte shuffle leaves one-byte values as they are")
    values = (rng.random((100, 5, 3, 2)) * 200).astype(dtype)
    rows = SimpleNamespace(align=7, dtype=values.dtype, row_bytes=values[0].nbytes, bitshuffle=bits,
                           blosc_shuffle=blosc)  # what Placer reads
    d = Dev()
    placer = Placer(build(gpu), rows, 40, lambda nbytes: d.empty(nbytes, np.uint8, 0))
    for lo, hi in [(0, 35), (5, 40), (14, 21), (93, 100), (3, 4), (8, 20), (60, 63)]:
        dst = d.put(np.zeros((hi - lo, 5, 3, 2), dtype), dtype)
        stream = cuda.Stream()
        uploaded, ready = placer.enqueue(stream, int(dst), shuffled_rows(values, lo, hi, 7, shuffle), lo)
        ready.synchronize()
        np.testing.assert_array_equal(d.get(dst, (hi - lo, 5, 3, 2), dtype), values[lo:hi])


STREAMED = {  # 800-image chunks of 13 x 13 values: c-blosc's blocks of 64-128 KB, a shorter last one
    "shuffle+gzip": dict(compression="gzip", shuffle=True),
    "bitshuffle lz4": ("Bitshuffle", dict(cname="lz4")),
    "blosc lz4 + bitshuffle": ("Blosc", dict(cname="lz4", shuffle=2)),
    "blosc zstd + bitshuffle": ("Blosc", dict(cname="zstd", clevel=3, shuffle=2)),
    "blosc lz4 + shuffle": ("Blosc", dict(cname="lz4", shuffle=1)),  # hdf5plugin's default: a stream a value byte
    "blosc zstd + shuffle": ("Blosc", dict(cname="zstd", clevel=3, shuffle=1)),
    "blosc2 lz4 + bitshuffle": ("Blosc2", dict(cname="lz4", filters=2)),
    "blosc2 lz4 + bitshuffle, padded": ("Blosc2", dict(cname="lz4", filters=2)),
}
# Blosc2's b2nd blocks (256 rows of 13 x 13 values, 64 of 28 x 28) divide 768-row chunks; 800 rows
# are padded in the frame (to 1,024 and 832), the block across the chunk's end cut short by the host
CHUNK_ROWS = {"blosc2 lz4 + bitshuffle": 768}


def streamed_options(layout, monkeypatch):
    """The h5py dataset options of STREAMED[layout], with every file streamed (skipped without the
    native pool, which alone leaves chunks shuffled, or without hdf5plugin for its filters)."""
    if native.library() is None:
        pytest.skip("no native read pool: the host unshuffles")
    options = STREAMED[layout]
    if isinstance(options, tuple):
        options = dict(getattr(pytest.importorskip("hdf5plugin"), options[0])(**options[1]))
    monkeypatch.setenv("CNNINFER_HOST_BUDGET_MB", "0")
    return options


@pytest.mark.parametrize("dtype", ["f4", "i2", "u1"])
@pytest.mark.parametrize("layout", STREAMED)
def test_streamed_shuffled_chunks_unshuffled_on_the_gpu_predict_as_the_host(tmp_path, rng, monkeypatch, dtype, layout):
    options = streamed_options(layout, monkeypatch)
    monkeypatch.setattr("infer.gpu.backend.CudaBackend.STREAM_BYTES", 60_000)  # blocks of one chunk
    x = (rng.random((2000, 13, 13, 1)) * (200 if dtype != "u1" else 8)).astype(dtype)
    y = np.eye(10)[rng.integers(0, 10, len(x))]
    path = tmp_path / "s.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x, chunks=(CHUNK_ROWS.get(layout, 800), 13, 13, 1), **options)
        f["y"] = y
    with h5py.File(tmp_path / "plain.h5", "w") as f:
        f["x"], f["y"] = x, y
    with Session(SMALL, "cuda", decode="host") as s:
        gpu, plain = s.evaluate(path), s.evaluate(tmp_path / "plain.h5")
    # one-byte values: nothing to unshuffle
    on_gpu = not (layout in ("shuffle+gzip", "blosc lz4 + shuffle", "blosc zstd + shuffle") and dtype == "u1")
    assert gpu.streamed and gpu.reader["decode"] == ("host, unshuffled on the GPU" if on_gpu else "host"), gpu.reader
    assert plain.reader["decode"] == "host"
    np.testing.assert_array_equal(gpu.predictions, plain.predictions)
    np.testing.assert_array_equal(gpu.labels, plain.labels)


def test_the_placers_staging_block_is_taken_before_the_timed_run(tmp_path, rng, monkeypatch):
    """The GPU unshuffle's staging block (a streamed block: ~25 MB at full size) is allocated as the
    Session prepares, never inside the timed stream, and kept for the next file it fits."""
    import shutil

    import pycuda.driver as cuda

    from tests.test_gpu_decode import timed_stream

    options = streamed_options("shuffle+gzip", monkeypatch)
    monkeypatch.setattr("infer.gpu.backend.CudaBackend.STREAM_BYTES", 60_000)  # blocks of one chunk
    x = (rng.random((2000, 13, 13, 1)) * 200).astype("f4")
    first = tmp_path / "a.h5"
    with h5py.File(first, "w") as f:
        f.create_dataset("x", data=x, chunks=(800, 13, 13, 1), **options)
        f["y"] = np.eye(10)[rng.integers(0, 10, len(x))]
    other = shutil.copy(first, tmp_path / "b.h5")
    streaming, taken, alloc = timed_stream(monkeypatch), [], cuda.mem_alloc

    def allocating(nbytes):
        taken.append(streaming[0])
        return alloc(nbytes)
    monkeypatch.setattr(cuda, "mem_alloc", allocating)
    with Session(SMALL, "cuda", decode="host") as s:
        a = s.evaluate(first)
        count = len(taken)
        b = s.evaluate(other)  # another file whose blocks the same staging block fits
    assert a.reader["decode"] == b.reader["decode"] == "host, unshuffled on the GPU", (a.reader, b.reader)
    assert count > 0 and len(taken) == count and not any(taken), taken
    np.testing.assert_array_equal(b.predictions, a.predictions)


def test_bench_stream_reads_as_the_run_reads(tmp_path, ece408):
    """The raw read row of `cnninfer bench --stream` leaves the chunks shuffled, as the host's
    decoding does; a file the GPU decodes gets a row for each."""
    if native.library() is None:
        pytest.skip("no native read pool: the host unshuffles")
    with h5py.File(ece408 / "testfull.hdf5") as f:
        x, y = f["x"][:3000], f["y"][:3000]
    path = tmp_path / "s.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x, chunks=(500, 28, 28, 1), compression="gzip", shuffle=True)
        f["y"] = y
    r = invoke("bench", "--stream", path, ece408 / "model.hdf5")
    assert r.exit_code == 0, r.output
    assert "(chunks, left shuffled," in r.output and "cnninfer run --decode host" in r.output, r.output
    assert "cnninfer run --decode gpu" in r.output, r.output  # the GPU decodes shuffled deflate too


@pytest.mark.parametrize("layout", ["shuffle+gzip", "bitshuffle lz4", "blosc lz4 + bitshuffle", "blosc2 lz4 + bitshuffle",
                                    "blosc2 lz4 + bitshuffle, padded"])
def test_a_damaged_chunk_left_shuffled_is_one_line_and_nothing_written(tmp_path, ece408, monkeypatch, layout):
    """A streamed run whose chunks stay shuffled for the GPU, chunk 2's header damaged: exit 2, one
    line naming the chunk, no predictions file."""
    options = streamed_options(layout, monkeypatch)
    path = damaged_copy(ece408, tmp_path / "d.h5", 4000, 2, chunks=(CHUNK_ROWS.get(layout, 800), 28, 28, 1), **options)
    out = tmp_path / "p.npy"
    r = invoke("run", path, ece408 / "model.hdf5", "--backend", "cuda", "--decode", "host", "--predictions", out)
    assert_refused(r, "d.h5", "'x'", "chunk 2")
    assert not out.exists()


def test_a_plain_file_after_a_shuffled_one_is_not_unshuffled(tmp_path, ece408, monkeypatch):
    """The session keeps its GPU unshuffle for the next shuffled file and hands it only the blocks
    of one: a plain file of the same shape after a shuffled one predicts as it does alone (the
    kept placer was handed the plain file's blocks too, and unshuffled them)."""
    monkeypatch.setenv("CNNINFER_HOST_BUDGET_MB", "0")
    with h5py.File(ece408 / "testfull.hdf5") as f:
        x, y = f["x"][:700], f["y"][:700]
    paths = {}
    for name, shuffle in (("s", True), ("p", False)):
        paths[name] = tmp_path / f"{name}.h5"
        with h5py.File(paths[name], "w") as f:
            f.create_dataset("x", data=x, chunks=(50, 28, 28, 1), compression="gzip", compression_opts=1, shuffle=shuffle)
            f["y"] = y
    with Session(ece408 / "model.hdf5", "cuda", decode="host") as s:
        a, b = s.evaluate(paths["s"]), s.evaluate(paths["p"])
    assert a.reader["decode"] == "host, unshuffled on the GPU" and b.reader["decode"] == "host", (a.reader, b.reader)
    np.testing.assert_array_equal(b.predictions, a.predictions)
    assert b.correct == a.correct > 600
