"""The parallel reader: every layout read on several threads equals h5py's own read, whatever the
range (pieces and chunk edges), in the stored type or converted; damage is one InputError."""
import contextlib
import ctypes
import os
import re

import h5py
import numpy as np
import pytest

from infer.data import dataset, native, reader
from infer.errors import InputError

NATIVE = "chunks" if native.library() else "h5py"  # lzf, fletcher32 and plugins need the native library
LAYOUTS = {  # dataset options -> the read path they must take
    "contiguous": ({}, "pread"),
    "chunked": (dict(chunks=(7, 5, 3, 2)), "chunks"),
    "gzip": (dict(chunks=(7, 5, 3, 2), compression="gzip"), "chunks"),
    "shuffle+gzip": (dict(chunks=(7, 5, 3, 2), compression="gzip", shuffle=True), "chunks"),
    "chunks cutting channels": (dict(chunks=(7, 5, 3, 1)), "chunks"),
    "chunks cutting H, edge chunks": (dict(chunks=(7, 2, 3, 2)), "chunks"),
    "chunks cutting W and C, gzip": (dict(chunks=(6, 5, 2, 1), compression="gzip"), "chunks"),
    "chunks cutting H and W, shuffle+gzip": (dict(chunks=(64, 3, 2, 2), compression="gzip", shuffle=True), "chunks"),
    "chunks cutting H, lzf+fletcher32": (dict(chunks=(9, 4, 3, 2), compression="lzf", fletcher32=True),
                                         "chunks" if native.library() else "h5py"),
    "lzf": (dict(chunks=(7, 5, 3, 2), compression="lzf"), "chunks" if native.library() else "h5py"),
    "shuffle+lzf": (dict(chunks=(7, 5, 3, 2), compression="lzf", shuffle=True), "chunks" if native.library() else "h5py"),
    "fletcher32": (dict(chunks=(7, 5, 3, 2), fletcher32=True), "chunks" if native.library() else "h5py"),
    "shuffle+gzip+fletcher32": (dict(chunks=(7, 5, 3, 2), compression="gzip", shuffle=True, fletcher32=True),
                                "chunks" if native.library() else "h5py"),
    "lzf+fletcher32": (dict(chunks=(7, 5, 3, 2), compression="lzf", fletcher32=True),
                       "chunks" if native.library() else "h5py"),
    "shuffle only": (dict(chunks=(7, 5, 3, 2), shuffle=True), "chunks"),
    # values in the other byte order, swapped as they are read
    "big-endian": (dict(big_endian=True), "pread"),
    "big-endian, shuffle+gzip": (dict(big_endian=True, chunks=(7, 5, 3, 2), compression="gzip", shuffle=True), "chunks"),
    "big-endian, chunks cutting H": (dict(big_endian=True, chunks=(9, 2, 3, 2)), "chunks"),
    "big-endian, lzf+fletcher32": (dict(big_endian=True, chunks=(7, 5, 3, 2), compression="lzf", fletcher32=True),
                                   "chunks" if native.library() else "h5py"),
    # hdf5plugin's filters (the plugins extra): their decoders called on the native pool's threads
    "blosc lz4 + bitshuffle": (dict(chunks=(7, 5, 3, 2), plugin=("Blosc", dict(cname="lz4", shuffle=2))), NATIVE),
    "blosc zstd + shuffle, chunks cutting H": (dict(chunks=(9, 2, 3, 2), plugin=("Blosc", dict(cname="zstd"))), NATIVE),
    "blosc2 lz4 + bitshuffle": (dict(chunks=(7, 5, 3, 2), plugin=("Blosc2", dict(cname="lz4", filters=2))), NATIVE),
    "zstd": (dict(chunks=(7, 5, 3, 2), plugin=("Zstd", {})), NATIVE),
    "shuffle+zstd+fletcher32": (dict(chunks=(7, 5, 3, 2), shuffle=True, fletcher32=True, plugin=("Zstd", {})), NATIVE),
    "lz4, chunks cutting W": (dict(chunks=(11, 5, 2, 2), plugin=("LZ4", {})), NATIVE),
    "lz4 in 64-byte blocks, some stored raw": (dict(chunks=(7, 5, 3, 2), plugin=("LZ4", dict(nbytes=64))), NATIVE),
    "bitshuffle lz4": (dict(chunks=(7, 5, 3, 2), plugin=("Bitshuffle", dict(cname="lz4"))), NATIVE),
    "bitshuffle zstd": (dict(chunks=(7, 5, 3, 2), plugin=("Bitshuffle", dict(cname="zstd"))), NATIVE),
    "bzip2": (dict(chunks=(7, 5, 3, 2), plugin=("BZip2", {})), NATIVE),
    "big-endian, shuffle+zstd": (dict(big_endian=True, chunks=(7, 5, 3, 2), shuffle=True, plugin=("Zstd", {})), NATIVE),
    "big-endian, blosc lz4 + bitshuffle": (dict(big_endian=True, chunks=(7, 5, 3, 2),
                                                plugin=("Blosc", dict(cname="lz4", shuffle=2))), NATIVE),
}


def test_the_native_pool_builds_wherever_there_is_a_compiler():
    """Where a C compiler exists a failed build would silently fall back to Python threads."""
    if native.compiler() is None:
        pytest.skip("no C compiler here")
    assert native.library() is not None


def test_the_pools_cached_library_is_keyed_by_every_source_file(tmp_path, monkeypatch):
    """read_pool/'s files build together into one library; an edit to any of them (a .c or the header)
    builds anew, and a file that does not compile fails the build, named, rather than reusing the last."""
    import shutil

    if native.compiler() is None:
        pytest.skip("no C compiler here")
    monkeypatch.setenv("CNNINFER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(native, "FAILED", {})
    folder = tmp_path / "read_pool"
    shutil.copytree(native.HERE / "read_pool", folder)
    first = native.build(folder)
    assert first is not None and native.build(folder) == first
    seen = {first}
    for name in ("read_pool.h", "labels.c", "filters.c"):
        with open(folder / name, "a") as f:
            f.write("/* edited */\n")
        path = native.build(folder)
        assert path is not None and path not in seen, name
        seen.add(path)
        assert ctypes.CDLL(str(path)).rp_create
    (folder / "codes.c").write_text((folder / "codes.c").read_text().replace("int read_codes(", "int read_codes(oops"))
    assert native.build(folder) is None
    assert native.FAILED["read_pool"].startswith("read_pool did not build with"), native.FAILED["read_pool"]


def test_the_native_pool_reads_many_small_pieces_and_tickets(tmp_path, rng):
    """More pieces than the queue's first capacity, several tickets in flight, waited out of order."""
    lib = native.library()
    if lib is None:
        pytest.skip("no native read pool here")
    data = rng.integers(0, 256, 1 << 20, dtype=np.uint8)
    (tmp_path / "f").write_bytes(data.tobytes())
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    pool = native.ReadPool(lib, 4)
    try:
        out = np.zeros_like(data)
        spans = [(0, 300_001), (300_001, 700_000), (700_000, 1 << 20)]
        tickets = [pool.submit(fd, out[a:].ctypes.data, b - a, a, 999) for a, b in spans]
        assert [pool.wait(t) for t in reversed(tickets)] == [0, 0, 0]
        np.testing.assert_array_equal(out, data)
        assert pool.wait(pool.submit(fd, out.ctypes.data, 100, (1 << 20) - 50, 7)) == native.EOF
        assert pool.busy_s > 0
    finally:
        pool.close()
        os.close(fd)


def write(path, values, plugin=None, **options):
    """values as dataset x; plugin: (hdf5plugin's filter class name, its arguments), skipped
    without hdf5plugin."""
    if plugin is not None:
        hdf5plugin = pytest.importorskip("hdf5plugin")
        options["compression"] = getattr(hdf5plugin, plugin[0])(**plugin[1])
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=values, **options)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", ["f4", "u1", "i2", "f8"])
def test_every_layout_reads_what_h5py_reads(tmp_path, rng, pool, layout, dtype):
    options, kind = dict(LAYOUTS[layout][0]), LAYOUTS[layout][1]
    values = (rng.random((1003, 5, 3, 2)) * 200).astype(dtype)
    if options.pop("big_endian", False):
        values = values.astype(values.dtype.newbyteorder(">"))
    write(tmp_path / "d.h5", values, **options)
    with h5py.File(tmp_path / "d.h5") as f:
        rows = reader.rows(tmp_path / "d.h5", f["x"], "x")
        try:
            assert rows.kind == kind
            assert rows.swapped == (kind != "h5py" and values.dtype.byteorder == ">")  # one byte has no order
            for lo, hi in [(0, 1003), (5, 900), (14, 21), (1000, 1003), (3, 4)]:
                for check in (True, False):  # unchecked in the stored type: what the GPU reads
                    stored = np.empty((hi - lo, 5, 3, 2), rows.dtype)
                    pool.read(rows, lo, hi, stored, check=check)
                    np.testing.assert_array_equal(stored, values[lo:hi])
                converted = np.empty((hi - lo, 5, 3, 2), np.float32)
                pool.read(rows, lo, hi, converted, check=True)
                np.testing.assert_array_equal(converted, values[lo:hi].astype(np.float32))
            assert pool.used_native == (pool.native is not None and kind in ("pread", "chunks"))
        finally:
            rows.close()


def test_the_reader_names_the_filters_in_pipeline_order(tmp_path, rng):
    values = rng.random((40, 5, 3, 2)).astype(np.float32)
    for options, names in ((dict(compression="gzip", shuffle=True, fletcher32=True), "shuffle+deflate+fletcher32"),
                           (dict(compression="lzf"), "lzf"), (dict(chunks=(7, 5, 3, 2)), ""), ({}, ""),
                           (dict(plugin=("Zstd", {}), fletcher32=True), "zstd+fletcher32")):
        write(tmp_path / "d.h5", values, **options)
        with h5py.File(tmp_path / "d.h5") as f:
            rows = reader.rows(tmp_path / "d.h5", f["x"], "x")
            assert rows.filters == names
            rows.close()


def test_pieces_cover_the_range_on_chunk_edges():
    cuts = reader.pieces(5, 1003, 120, 7, 4)
    assert cuts[0][0] == 5 and cuts[-1][1] == 1003
    assert all(a == b for (_, a), (b, _) in zip(cuts, cuts[1:]))
    assert all(a % 7 == 0 for a, _ in cuts[1:])


def test_the_first_bad_value_in_row_order_is_named(tmp_path, pool):
    values = np.ones((5000, 4, 4, 1), np.float32)
    values[4321, 1, 2, 0], values[4999, 0, 0, 0] = np.inf, np.nan
    write(tmp_path / "d.h5", values)
    with h5py.File(tmp_path / "d.h5") as f:
        rows = reader.rows(tmp_path / "d.h5", f["x"], "d.h5: dataset 'x'")
        with pytest.raises(InputError, match=r"index \(4321, 1, 2, 0\) is inf"):
            pool.read(rows, 0, 5000, np.empty((5000, 4, 4, 1), np.float32), check=True)
        rows.close()


def labels_of(path, pool, ranges, label="y"):
    """Each range's labels as the data set reads them from dataset y of path (x: a stand-in)."""
    with h5py.File(path) as f:
        y = reader.rows(path, f["y"], label)
        try:
            data = dataset.DataSet([(str(path), reader.ArrayRows(np.zeros((y.shape[0], 1)), "x"), y, y.shape[0])])
            outs, native_jobs = [], set()
            for lo, hi in ranges:
                outs.append(np.full(hi - lo, -1, np.int64))
                futures = data.submit_labels(pool, lo, hi, outs[-1])
                native_jobs |= {isinstance(f, reader.Ticket) for f in futures}
                reader.wait(futures)
            return y.kind, native_jobs, outs
        finally:
            y.close()


@pytest.mark.parametrize("dtype", ["f4", "f8", ">f8", "i1", "u2", ">i4", "u8", "f2", "?"])
@pytest.mark.parametrize("options", [{}, dict(chunks=(999, 10), compression="gzip")])
def test_labels_are_each_rows_first_maximum(tmp_path, rng, pool, dtype, options):
    """Labels with ties everywhere (so which maximum counts shows) read contiguous (the native pool's
    own jobs where it runs) or chunked (Python's threads, native code for the argmax) equal
    np.argmax's first maximum, in ranges across the native jobs' pieces."""
    y = rng.integers(0, 3, size=(20011, 10)).astype(dtype)
    with h5py.File(tmp_path / "y.h5", "w") as f:
        f.create_dataset("y", data=y, **options)
    ranges = [(0, 20011), (13, 9000), (8191, 8193), (19999, 20011)]
    kind, native_jobs, outs = labels_of(tmp_path / "y.h5", pool, ranges)
    assert kind == ("chunks" if options else "pread")
    assert native_jobs == {pool.native is not None and not options and dtype not in ("f2", "?")}
    for (lo, hi), out in zip(ranges, outs):
        np.testing.assert_array_equal(out, np.argmax(y[lo:hi], axis=1))


@pytest.mark.parametrize("options", [{}, dict(chunks=(999, 10), compression="gzip")])
@pytest.mark.parametrize("bad", [np.nan, -np.inf])
def test_the_first_label_not_finite_is_named(tmp_path, pool, options, bad):
    """A label row not finite is refused in check_finite's words, naming the first such value (row,
    class) in the whole range, whichever piece or thread came to it first."""
    y = np.eye(10)[np.arange(30000) % 10]
    y[17777, 3], y[29000, 0] = bad, np.nan
    with h5py.File(tmp_path / "y.h5", "w") as f:
        f.create_dataset("y", data=y, **options)
    with pytest.raises(InputError, match=rf"^y: value at index \(17777, 3\) is {bad!r}, not a finite float64 number$"):
        labels_of(tmp_path / "y.h5", pool, [(5, 30000)])
    labels_of(tmp_path / "y.h5", pool, [(0, 17777)])  # the rows before it are fine


def test_labels_of_a_truncated_file_are_refused(tmp_path, pool):
    with h5py.File(tmp_path / "y.h5", "w") as f:
        f["y"] = np.eye(10)[np.arange(30000) % 10]
    size = (tmp_path / "y.h5").stat().st_size
    with h5py.File(tmp_path / "y.h5") as f:
        y = reader.rows(tmp_path / "y.h5", f["y"], "y")
        os.truncate(tmp_path / "y.h5", size - 8 * 10 * 1000)
        data = dataset.DataSet([("y.h5", reader.ArrayRows(np.zeros((30000, 1)), "x"), y, 30000)])
        with pytest.raises(InputError, match=r"^y: the file is truncated"):
            reader.wait(data.submit_labels(pool, 0, 30000, np.empty(30000, np.int64)))
        y.close()


def test_a_file_truncated_under_us_is_refused(tmp_path, pool):
    """h5py refuses a file truncated before it opens; this one shrinks after."""
    write(tmp_path / "d.h5", np.ones((1000, 8, 8, 1), np.float32))
    size = (tmp_path / "d.h5").stat().st_size
    with h5py.File(tmp_path / "d.h5") as f:
        rows = reader.rows(tmp_path / "d.h5", f["x"], "x")
        os.truncate(tmp_path / "d.h5", size // 2)
        for check in (True, False):
            with pytest.raises(InputError, match=r"^x: the file is truncated: its values need bytes up to \d+, "
                                                 rf"but the file has {size // 2}$"):
                pool.read(rows, 0, 1000, np.empty((1000, 8, 8, 1), np.float32), check=check)
        with pytest.raises(InputError, match="truncated"):
            reader.rows(tmp_path / "d.h5", f["x"], "x")
        rows.close()


@pytest.mark.parametrize("options,words", [
    (dict(compression="gzip"), "chunk 3 cannot be decompressed"),
    (dict(compression="lzf"), "chunk 3 cannot be decompressed"),
    (dict(fletcher32=True), "chunk 3 fails its fletcher32 checksum"),
    (dict(compression="lzf", shuffle=True, fletcher32=True), "chunk 3 fails its fletcher32 checksum"),
    (dict(compression="gzip", shuffle=True, chunks=(100, 2, 4, 1)),
     "chunk 3 (cannot be decompressed|does not decode to its 3200 bytes)"),  # an inflater may stop early
], ids=["gzip", "lzf", "fletcher32", "shuffle+lzf+fletcher32", "shuffle+gzip, chunks cutting H"])
def test_a_corrupted_chunk_is_refused(tmp_path, pool, options, words):
    if ("lzf" in options.values() or "fletcher32" in options) and native.library() is None:
        pytest.skip("lzf and fletcher32 chunks take the h5py path without the native library")
    write(tmp_path / "d.h5", np.arange(700 * 16, dtype=np.float32).reshape(700, 4, 4, 1),
          **{"chunks": (100, 4, 4, 1), **options})
    with h5py.File(tmp_path / "d.h5") as f:
        offset, size, _ = reader.rows(tmp_path / "d.h5", f["x"], "x").index[3]
    with open(tmp_path / "d.h5", "r+b") as f:
        f.seek(offset + size // 2)
        f.write(b"\xff" * 16)
    with h5py.File(tmp_path / "d.h5") as f:
        rows = reader.rows(tmp_path / "d.h5", f["x"], "x")
        for check in (True, False):  # unchecked: the native pool's decoders
            with pytest.raises(InputError, match=words):
                pool.read(rows, 0, 700, np.empty((700, 4, 4, 1), np.float32), check=check)
        rows.close()


@pytest.mark.parametrize("where", ["values", "checksum"])
@pytest.mark.parametrize("lo,hi", [(0, 700), (300, 400), (350, 380)], ids=["all", "the chunk whole", "part of the chunk"])
@pytest.mark.parametrize("image", [(4, 4, 1), (29, 27, 1)], ids=["small chunks", "chunks of two steps and a bit"])
def test_fletcher32_alone_is_checked_where_the_values_land(tmp_path, pool, where, lo, hi, image):
    """fletcher32 without a codec: the values go straight into the read's memory, summed a step of
    262,080 bytes at a time, and the checksum is checked there (or in the thread's buffer for part of
    a chunk); a damaged value (in a chunk's last step) or a damaged stored checksum fails the read,
    naming the chunk, and undamaged chunks read as h5py reads them."""
    if native.library() is None:
        pytest.skip("fletcher32 chunks take the h5py path without the native library")
    values = np.random.default_rng(5).random((700,) + image, np.float32)
    write(tmp_path / "d.h5", values, chunks=(100,) + image, fletcher32=True)
    with h5py.File(tmp_path / "d.h5") as f:
        rows = reader.rows(tmp_path / "d.h5", f["x"], "x")
        offset, size, _ = rows.index[3]
        out = np.empty((100,) + image, np.float32)
        pool.read(rows, 200, 300, out, check=False)
        np.testing.assert_array_equal(out, values[200:300])
        rows.close()
    with open(tmp_path / "d.h5", "r+b") as f:
        f.seek(offset + (size - 4 if where == "checksum" else size - 9))
        byte = f.read(1)[0]
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte ^ 0xFF]))
    with h5py.File(tmp_path / "d.h5") as f:
        rows = reader.rows(tmp_path / "d.h5", f["x"], "x")
        for check in (True, False):
            with pytest.raises(InputError, match="chunk 3 fails its fletcher32 checksum"):
                pool.read(rows, lo, hi, np.empty((hi - lo,) + image, np.float32), check=check)
        rows.close()


@pytest.mark.parametrize("plugin,name", [(("Blosc", dict(cname="lz4", shuffle=2)), "blosc"),
                                         (("Blosc2", dict(cname="zstd")), "blosc2"), (("Zstd", {}), "zstd"),
                                         (("LZ4", {}), "lz4"), (("Bitshuffle", dict(cname="lz4")), "bshuf")],
                         ids=["blosc", "blosc2", "zstd", "lz4", "bitshuffle"])
def test_a_corrupted_plugin_chunk_is_refused(tmp_path, pool, plugin, name):
    """A damaged chunk header, decoded by the plugin on the pool's threads: one InputError naming
    the chunk and the plugin, whichever way the plugin notices."""
    if native.library() is None:
        pytest.skip("plugin chunks take the h5py path without the native library")
    values = np.arange(700 * 16, dtype=np.float32).reshape(700, 4, 4, 1)
    write(tmp_path / "d.h5", values, plugin=plugin, chunks=(100, 4, 4, 1))
    with h5py.File(tmp_path / "d.h5") as f:
        offset, size, _ = reader.rows(tmp_path / "d.h5", f["x"], "x").index[3]
    with open(tmp_path / "d.h5", "r+b") as f:
        f.seek(offset)
        f.write(bytes(range(1, 17)))
    with h5py.File(tmp_path / "d.h5") as f:
        rows = reader.rows(tmp_path / "d.h5", f["x"], "x")
        assert rows.kind == "chunks" and rows.native
        for check in (True, False):
            with pytest.raises(InputError, match=rf"^x: chunk 3 (cannot be decompressed \({name}: damaged data\)|"
                                                 r"does not decode to its 6400 bytes)$"):
                pool.read(rows, 0, 700, np.empty((700, 4, 4, 1), np.float32), check=check)
        rows.close()


def test_a_filter_plugin_decodes_on_several_threads_at_once(tmp_path, rng):
    """The plugins' decoders share no state between calls (c-blosc's global lock is off): many
    chunks decoded on 4 threads at once, over and over, equal h5py's read."""
    if native.library() is None:
        pytest.skip("no native library")
    values = (rng.random((4000, 6, 6, 1)) * (rng.random((4000, 6, 6, 1)) > 0.4)).astype(np.float32)
    for plugin in (("Blosc", dict(cname="lz4", shuffle=2)), ("Blosc2", dict(cname="lz4")), ("Zstd", {})):
        write(tmp_path / "d.h5", values, plugin=plugin, chunks=(13, 6, 6, 1))
        with h5py.File(tmp_path / "d.h5") as f:
            rows = reader.rows(tmp_path / "d.h5", f["x"], "x")
            pool = reader.Reader(4)
            try:
                for _ in range(5):
                    out = np.empty_like(values)
                    pool.read(rows, 0, len(values), out, check=False)
                    assert pool.used_native
                    np.testing.assert_array_equal(out, values)
            finally:
                pool.close()
                rows.close()


def test_the_pool_threads_start_with_the_reader():
    """Not inside the first timed read (that cost two GPUs' first streamed run ~10 ms)."""
    import threading

    before = {t.name for t in threading.enumerate()}
    p = reader.Reader(5, use_native=False)
    try:
        started = {t.name for t in threading.enumerate()} - before
        assert len([t for t in started if t.startswith("cnninfer-reader")]) == 5
    finally:
        p.close()


def test_work_aside_runs_on_a_pool_thread_and_is_not_reading():
    """The outputs faulted in during a streamed run must not count as the readers' busy time."""
    import threading
    import time

    p = reader.Reader(2, use_native=False)
    try:
        ran = p.aside(lambda: (time.sleep(0.05), threading.current_thread().name)[1]).result()
        assert ran.startswith("cnninfer-reader")
        assert p.busy_s == 0.0
        p.call(time.sleep, 0.05).result()
        assert p.busy_s >= 0.04
    finally:
        p.close()


@pytest.mark.parametrize("shuffle", [False, True])
def test_lzf_chunks_that_shrank_are_decoded_natively(tmp_path, rng, pool, shuffle):
    """Digits on a blank page: lzf shrinks most chunks (random values would be stored as they are)."""
    if native.library() is None:
        pytest.skip("lzf chunks take the h5py path without the native library")
    values = np.zeros((999, 28, 28, 1), np.float32)
    values[:, 6:22, 8:20] = np.round(rng.random((999, 16, 12, 1)) * 4) / 4
    write(tmp_path / "d.h5", values, chunks=(64, 28, 28, 1), compression="lzf", shuffle=shuffle)
    with h5py.File(tmp_path / "d.h5") as f:
        rows = reader.rows(tmp_path / "d.h5", f["x"], "x")
        try:
            assert rows.kind == "chunks" and all(not mask for _, _, mask in rows.index)
            assert sum(size for _, size, _ in rows.index) < values.nbytes / 2
            out = np.empty_like(values)
            pool.read(rows, 0, 999, out, check=True)
            np.testing.assert_array_equal(out, values)
        finally:
            rows.close()


@pytest.fixture
def zlib_only(monkeypatch):
    """Inflate with zlib, in Python threads and in the native pool: where `deflate` is missing."""
    monkeypatch.setattr(reader, "_libdeflate", lambda: None)
    lib = native.library()
    if lib is not None:
        assert native.use_inflater(lib, "zlib") == "zlib"
    yield
    if lib is not None:
        native.use_inflater(lib, "libdeflate")


def test_without_libdeflate_zlib_inflates_the_same(tmp_path, rng, pool, zlib_only):
    values = (rng.random((500, 6, 6, 1)) * 4).round().astype(np.float32)
    write(tmp_path / "d.h5", values, chunks=(64, 6, 6, 1), compression="gzip", shuffle=True)
    with h5py.File(tmp_path / "d.h5") as f:
        rows = reader.rows(tmp_path / "d.h5", f["x"], "x")
        for check in (True, False):
            out = np.empty_like(values)
            pool.read(rows, 3, 500, out[3:], check=check)
            np.testing.assert_array_equal(out[3:], values[3:])
        with open(tmp_path / "d.h5", "r+b") as f:
            f.seek(rows.index[2][0] + rows.index[2][1] // 2)
            f.write(b"\xff" * 16)
        with pytest.raises(InputError, match=r"chunk 2 cannot be decompressed \(zlib"):
            pool.read(rows, 0, 500, out, check=False)
        rows.close()


def test_the_native_pool_decodes_chunks_in_parallel_with_libdeflate():
    """The `deflate` package (a dependency) hands its libdeflate to the native pool."""
    if native.library() is None:
        pytest.skip("no native read pool here")
    pytest.importorskip("deflate")
    assert native.INFLATER == "libdeflate"


def test_chunks_decoded_natively_report_the_lowest_bad_chunk(tmp_path, rng):
    """Several chunks damaged, decoded on several threads in any order: the error names the first."""
    if native.library() is None:
        pytest.skip("no native read pool here")
    values = (rng.random((900, 5, 5, 1)) * 8).round().astype(np.float32)
    write(tmp_path / "d.h5", values, chunks=(30, 5, 5, 1), compression="gzip")
    with h5py.File(tmp_path / "d.h5") as f:
        index = reader.rows(tmp_path / "d.h5", f["x"], "x").index
    with open(tmp_path / "d.h5", "r+b") as f:
        for j in (29, 17, 9):
            f.seek(index[j][0] + 2)
            f.write(b"\x07" * (index[j][1] - 2))
    p = reader.Reader(4)
    with h5py.File(tmp_path / "d.h5") as f:
        rows = reader.rows(tmp_path / "d.h5", f["x"], "x")
        try:
            for _ in range(5):
                with pytest.raises(InputError, match=r"^x: chunk 9 "):
                    p.read(rows, 31, 900, np.empty((869, 5, 5, 1), np.float32), check=False)
            out = np.empty((100, 5, 5, 1), np.float32)
            p.read(rows, 170, 270, out, check=False)  # chunks 5-8, untouched, still read
            np.testing.assert_array_equal(out, values[170:270])
            assert p.used_native
        finally:
            rows.close()
            p.close()


def test_hdf5plugin_filters_are_registered_when_installed(tmp_path, rng):
    hdf5plugin = pytest.importorskip("hdf5plugin")
    values = np.zeros((300, 12, 12, 1), np.float32)
    values[:, 3:9, 2:10] = rng.random((300, 6, 8, 1), dtype=np.float32)
    for name, options in (("blosc-lz4-bitshuffle", hdf5plugin.Blosc(cname="lz4", shuffle=hdf5plugin.Blosc.BITSHUFFLE)),
                          ("zstd", hdf5plugin.Zstd())):
        write(tmp_path / f"{name}.h5", values, chunks=(64, 12, 12, 1), **options)
    import subprocess
    import sys

    # A fresh process, where nothing has imported hdf5plugin yet: the reader must register it
    code = ("import sys, h5py, numpy as np; from infer.data import reader\n"
            "for path in sys.argv[1:]:\n"
            "    with h5py.File(path) as f:\n"
            "        rows = reader.rows(path, f['x'], 'x'); out = np.empty((300, 12, 12, 1), np.float32)\n"
            "        reader.Reader(2).read(rows, 0, 300, out, check=True); print(float(out.sum()))")
    r = subprocess.run([sys.executable, "-c", code, *map(str, sorted(tmp_path.glob("*.h5")))], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    assert [float(v) for v in r.stdout.split()] == [pytest.approx(float(values.sum()), rel=1e-6)] * 2


def test_a_filter_nothing_here_decodes_is_one_line(tmp_path, monkeypatch):
    import sys

    write(tmp_path / "d.h5", np.ones((20, 4, 4, 1), np.float32), chunks=(5, 4, 4, 1), compression="gzip")
    monkeypatch.setattr(h5py.h5z, "filter_avail", lambda f: f != h5py.h5z.FILTER_DEFLATE)
    monkeypatch.setitem(sys.modules, "hdf5plugin", None)  # import fails
    with h5py.File(tmp_path / "d.h5") as f:
        with pytest.raises(InputError, match=r"^d.h5: 'x': compressed with HDF5 filter 1, which this HDF5 cannot "
                                             r"decode: pip install 'cnninfer\[plugins\]'"):
            reader.rows(tmp_path / "d.h5", f["x"], "d.h5: 'x'")


def test_lzf_repeating_runs_of_every_short_period(tmp_path, rng, pool):
    """Back references shorter than what they copy (a run repeating its last `period` bytes)."""
    if native.library() is None:
        pytest.skip("lzf chunks take the h5py path without the native library")
    rows_of = []
    for period in range(1, 9):
        pattern = rng.integers(0, 256, period, dtype=np.uint8)
        rows_of.append(np.resize(pattern, (40, 10, 10, 3)))
    values = np.concatenate(rows_of)
    values[::7, 0, 0, 0] = 255  # and breaks in the runs
    write(tmp_path / "d.h5", values, chunks=(16, 10, 10, 3), compression="lzf")
    with h5py.File(tmp_path / "d.h5") as f:
        rows = reader.rows(tmp_path / "d.h5", f["x"], "x")
        assert all(size < 16 * 300 // 4 for _, size, _ in rows.index)  # every chunk shrank: decoded
        out = np.empty_like(values)
        pool.read(rows, 0, len(values), out, check=False)
        rows.close()
    np.testing.assert_array_equal(out, values)


@pytest.mark.parametrize("options,dtype", [(dict(chunks=(7, 5, 3, 2), compression="gzip", shuffle=True), "f4"),
                                           (dict(chunks=(9, 2, 3, 1), compression="gzip"), "f4"),
                                           (dict(chunks=(7, 5, 2, 2)), "f4"),
                                           (dict(chunks=(7, 5, 3, 2), compression="gzip", shuffle=True), ">f4")],
                         ids=["shuffle+gzip", "gzip, chunks cutting H and C", "raw, chunks cutting W",
                              "big-endian, shuffle+gzip"])
def test_without_the_native_library_python_decodes_raw_and_deflate_chunks(tmp_path, rng, monkeypatch, options, dtype):
    monkeypatch.setattr(native, "library", lambda: None)
    values = (rng.random((300, 5, 3, 2)) * 100).astype(dtype)
    write(tmp_path / "d.h5", values, **options)
    p = reader.Reader(3, use_native=False)
    with h5py.File(tmp_path / "d.h5") as f:
        rows = reader.rows(tmp_path / "d.h5", f["x"], "x")
        try:
            assert rows.kind == "chunks" and rows.spec is None
            for lo, hi in [(0, 300), (5, 291), (14, 17)]:
                out = np.empty((hi - lo, 5, 3, 2), np.float32)
                p.read(rows, lo, hi, out, check=True)
                np.testing.assert_array_equal(out, values[lo:hi])
        finally:
            rows.close()
            p.close()


@pytest.fixture
def h5py_processes(monkeypatch):
    """Every h5py-only dataset read by worker processes, however small."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one core: the h5py fallback reads in this process")
    monkeypatch.setattr(reader.H5pyRows, "PROCESS_BYTES", 1)


def unwritten(f, values):
    """Chunks of 7 rows, only every third one written: the rest are fill values only h5py knows."""
    d = f.create_dataset("x", values.shape, values.dtype, chunks=(7,) + values.shape[1:], fillvalue=-3)
    for lo in range(0, len(values), 21):
        d[lo:lo + 7] = values[lo:lo + 7]


@pytest.mark.parametrize("layout", ["scale-offset", "chunks never written"])
def test_the_h5py_fallback_reads_in_parallel_processes(tmp_path, rng, h5py_processes, layout):
    values = rng.integers(-1000, 1000, (301, 6, 5, 2)).astype(np.int32)
    with h5py.File(tmp_path / "d.h5", "w") as f:
        if layout == "scale-offset":
            scale_offset(f, values)
        else:
            unwritten(f, values)
    with h5py.File(tmp_path / "d.h5") as f:
        want = f["x"][()]
        rows = reader.rows(tmp_path / "d.h5", f["x"], "d.h5: dataset 'x'")
        pool = reader.Reader(4, use_native=False)
        try:
            assert rows.kind == "h5py processes"
            got = pool.read(rows, 3, 299, np.empty((296, 6, 5, 2), np.int32), check=False)
            np.testing.assert_array_equal(got, want[3:299])
            assert rows.pids and os.getpid() not in rows.pids
        finally:
            pool.close()
            rows.close()


def scale_offset(f, values):
    """values as dataset x with HDF5's scale-offset filter (lossless on integers): only h5py reads it."""
    f.create_dataset("x", data=values, chunks=(16,) + values.shape[1:], scaleoffset=0)


def test_an_h5py_worker_failing_is_one_line(tmp_path, rng, h5py_processes):
    with h5py.File(tmp_path / "d.h5", "w") as f:
        scale_offset(f, rng.integers(0, 1000, (50, 4, 4, 1)).astype(np.int32))
    with h5py.File(tmp_path / "d.h5") as f:
        rows = reader.rows(tmp_path / "d.h5", f["x"], "d.h5: dataset 'x'")
        os.truncate(tmp_path / "d.h5", 900)  # the worker opens the file afresh
        try:
            with pytest.raises(InputError, match=r"^d.h5: dataset 'x': cannot read: .*truncated"):
                rows.read(0, 50, np.empty((50, 4, 4, 1), np.float32))
        finally:
            rows.close()


def test_an_h5py_worker_killed_is_one_line_and_replaced(tmp_path, rng, h5py_processes):
    values = rng.integers(0, 1000, (80, 4, 4, 1)).astype(np.int32)
    with h5py.File(tmp_path / "d.h5", "w") as f:
        scale_offset(f, values)
    with h5py.File(tmp_path / "d.h5") as f:
        rows = reader.rows(tmp_path / "d.h5", f["x"], "d.h5: dataset 'x'")
        out = np.empty((80, 4, 4, 1), np.float32)
        try:
            rows.read(0, 80, out)
            for p in rows.workers.all:
                p.kill()
                p.wait()
            with pytest.raises(InputError, match=r"^d.h5: dataset 'x': cannot read: a reader process died"):
                rows.read(0, 80, out)
            rows.read(0, 80, out)  # a fresh worker
            np.testing.assert_array_equal(out, values)
        finally:
            rows.close()


@pytest.mark.parametrize("filter_id,codec", [(32015, native.ZSTD), (32004, native.LZ4), (32001, native.BLOSC),
                                             (32026, native.BLOSC2)])
def test_zstd_lz4_blosc_and_blosc2_are_decoded_by_their_codec_not_the_plugin(filter_id, codec):
    """Straight into place, without the plugin's own buffer (the LAYOUTS above check the values)."""
    pytest.importorskip("hdf5plugin")
    if native.library() is None:
        pytest.skip("no C compiler here: the native read pool cannot be built")
    direct = native.direct_codec(filter_id)
    assert direct is not None and direct[0] == codec and direct[1]


@pytest.mark.parametrize("shape,chunks,placed", [
    ((40, 28, 28, 1), (13, 28, 28, 1), True),  # B2ND blocks of whole rows: C order, the last padded
    ((41, 28, 28, 1), (41, 14, 28, 1), True),  # chunks cutting H, blocks of whole chunk rows
    ((3, 128, 128, 4), (2, 128, 128, 4), False),  # 256 KB rows: blocks cut them
])
def test_blosc2_frames_are_decoded_in_place_where_their_blocks_hold_whole_rows(tmp_path, rng, shape, chunks, placed):
    """The codec alone (no plugin to fall back to) reads the frames whose blocks hold rows in C
    order, equal to h5py, and refuses the others, which the plugin then takes."""
    hdf5plugin = pytest.importorskip("hdf5plugin")
    lib = native.library()
    if lib is None:
        pytest.skip("no C compiler here: the native read pool cannot be built")
    values = (rng.random(shape) * 100).astype(np.float32)
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f.create_dataset("x", data=values, chunks=chunks, compression=hdf5plugin.Blosc2(cname="lz4", filters=2))
    with h5py.File(tmp_path / "d.h5") as f:
        rows = reader.rows(tmp_path / "d.h5", f["x"], "x")
        dims = np.array([shape, chunks], np.int64)
        alone = lib.rp_chunks(rows.fd, 4, 0, 0, native.PLUGIN, rows.codec_bit, 0, 4, dims[0].ctypes.data, dims[1].ctypes.data)
        try:
            assert lib.rp_chunks_direct(alone, *native.direct_codec(32026)) == 0
            out, where = np.zeros_like(values), ctypes.c_longlong(-1)
            status = lib.rp_read_chunks(alone, 0, shape[0], rows.offsets.ctypes.data, rows.sizes.ctypes.data,
                                        rows.masks.ctypes.data, out.ctypes.data, ctypes.byref(where))
            if placed:
                assert status == 0
                np.testing.assert_array_equal(out, values)
            else:
                assert (status, where.value) == (native.DAMAGED, 0)
            both = np.empty_like(values)  # the reader's spec: the plugin behind the codec
            rows.read(0, shape[0], both)
            np.testing.assert_array_equal(both, values)
        finally:
            lib.rp_chunks_free(alone)
            rows.close()


def byte_shuffle(chunk):
    """HDF5's shuffle of a chunk's values (1-D): byte k of every value together."""
    return chunk.view(np.uint8).reshape(-1, chunk.dtype.itemsize).T.reshape(-1)


def bit_shuffle(block, exact_tail):
    """The Bitshuffle filter's (exact_tail False) or c-blosc's (True) bitshuffle of a chunk's values
    (1-D) in blocks of `block`: per block, bit b of every value in a row, value i at bit i % 8 of
    byte i / 8; the last, shorter block down to a multiple of 8 values (exact_tail: only where it is
    one); the values after it as they are."""
    def shuffle(chunk):
        raw, n = chunk.view(np.uint8).reshape(len(chunk), -1), len(chunk)
        rest = n % block
        shuffled = n - rest + ((0 if rest % 8 else rest) if exact_tail else rest - rest % 8)
        parts = [np.packbits(np.unpackbits(raw[s:min(s + block, shuffled)], axis=1, bitorder="little").T,
                             axis=1, bitorder="little").reshape(-1) for s in range(0, shuffled, block)]
        return np.concatenate(parts + [raw[shuffled:].reshape(-1)])
    return shuffle


def blosc_shuffle(block):
    """c-blosc's byte shuffle of a chunk's values (1-D): byte_shuffle a block of `block` values at a
    time, the last block shorter."""
    return lambda chunk: np.concatenate([byte_shuffle(chunk[s:s + block]) for s in range(0, len(chunk), block)])


def shuffled_rows(values, lo, hi, per, shuffle=byte_shuffle):
    """What a read of rows [lo, hi) with keep_shuffled holds: each chunk of `per` rows lying wholly
    in the read as `shuffle` stores it, the rest as values."""
    out = values[lo:hi].copy()
    raw = out.reshape(hi - lo, -1).view(np.uint8)
    for first in range(-(-lo // per) * per, hi - per + 1, per):
        raw[first - lo:first - lo + per] = shuffle(values[first:first + per].reshape(-1)).reshape(per, -1)
    return out


def test_the_bitshuffle_reference_is_the_filters_layout(tmp_path, rng):
    """Bitshuffle without a codec stores the shuffled bytes as they are: the reference must match
    them, a shorter last block and values left over included (7 x 13 x 13 = 1183 values)."""
    hdf5plugin = pytest.importorskip("hdf5plugin")
    values = rng.random((21, 13, 13, 1)).astype("f4")
    with h5py.File(tmp_path / "b.h5", "w") as f:
        d = f.create_dataset("x", data=values, chunks=(7, 13, 13, 1), **hdf5plugin.Bitshuffle(cname="none"))
        for k in range(3):
            stored = np.frombuffer(d.id.read_direct_chunk((7 * k, 0, 0, 0))[1], np.uint8)
            np.testing.assert_array_equal(stored, bit_shuffle(2048, False)(values[7 * k:7 * k + 7].reshape(-1)))


KEPT_SHUFFLED = {  # layouts whose whole chunks a read can leave shuffled: options, chunk rows, the shuffle
    "shuffle+gzip": (dict(compression="gzip", shuffle=True), 7, byte_shuffle),
    "shuffle+lzf+fletcher32": (dict(compression="lzf", fletcher32=True, shuffle=True), 7, byte_shuffle),
    "shuffle": (dict(shuffle=True), 7, byte_shuffle),
    "shuffle+zstd": (dict(plugin=("Zstd", {}), shuffle=True), 7, byte_shuffle),
    # 30 x 30 values a row: 2048-value blocks (8 KB of 4-byte values), a shorter one, values left over
    "bitshuffle lz4": (dict(plugin=("Bitshuffle", dict(cname="lz4"))), 7, None),
    "bitshuffle zstd + fletcher32": (dict(plugin=("Bitshuffle", dict(cname="zstd")), fletcher32=True), 5, None),
    # c-blosc: blocks of 32, 64 or 128 KB, the last shorter, its values a multiple of 8 or not
    "blosc lz4 + bitshuffle": (dict(plugin=("Blosc", dict(cname="lz4", shuffle=2))), 201, None),
    "blosc zstd + bitshuffle": (dict(plugin=("Blosc", dict(cname="zstd", clevel=3, shuffle=2))), 201, None),
    "blosc zstd + bitshuffle, 8-value tail": (dict(plugin=("Blosc", dict(cname="zstd", clevel=3, shuffle=2))), 160, None),
    # Blosc2: its b2nd blocks of 64 rows (4-byte values), whole in chunks of 64 or 128 rows; chunks
    # of 100 and 101 rows are padded in the frame (to 128) and keep their own rows' layout: a shorter
    # last block of 36 rows' values, or of 37 rows' (values left over)
    "blosc2 lz4 + bitshuffle": (dict(plugin=("Blosc2", dict(cname="lz4", filters=2))), 128, None),
    "blosc2 zstd + bitshuffle": (dict(plugin=("Blosc2", dict(cname="zstd", clevel=3, filters=2))), 64, None),
    "blosc2 lz4 + bitshuffle, padded": (dict(plugin=("Blosc2", dict(cname="lz4", filters=2))), 100, None),
    "blosc2 zstd + bitshuffle, padded, values left": (dict(plugin=("Blosc2", dict(cname="zstd", clevel=3, filters=2))), 101, None),
    # c-blosc's byte shuffle, a block at a time (hdf5plugin's Blosc default): blocks split into a
    # stream a value byte, the last shorter block not; zstd's blocks one stream each
    "blosc lz4 + shuffle": (dict(plugin=("Blosc", dict(cname="lz4", shuffle=1))), 201, "blosc"),
    "blosc zstd + shuffle + fletcher32": (dict(plugin=("Blosc", dict(cname="zstd", clevel=3, shuffle=1)),
                                              fletcher32=True), 160, "blosc"),
    "blosc2 lz4 + bitshuffle + fletcher32": (dict(plugin=("Blosc2", dict(cname="lz4", filters=2)), fletcher32=True), 128,
                                             None),
}


@pytest.mark.parametrize("layout", KEPT_SHUFFLED)
@pytest.mark.parametrize("dtype", ["f4", "i2", "u8", "u1"])
def test_chunks_wholly_in_a_read_can_be_left_shuffled_for_the_gpu(tmp_path, rng, layout, dtype):
    lib = native.library()
    if lib is None:
        pytest.skip("no native read pool here")
    options, per, shuffle = KEPT_SHUFFLED[layout]
    values = (rng.random((1003, 30, 30, 1)) * (200 if dtype != "u1" else 8)).astype(dtype)
    values[400:620] = rng.integers(0, 256, values[400:620].nbytes, np.uint8).view(dtype).reshape(220, 30, 30, 1)
    # noise: those chunks do not shrink, so HDF5 stores them without the codec; the pool shuffles them
    write(tmp_path / "d.h5", values, chunks=(per, 30, 30, 1), **options)
    pool = native.ReadPool(lib, 3)
    with h5py.File(tmp_path / "d.h5") as f:
        rows = reader.rows(tmp_path / "d.h5", f["x"], "x")
        try:
            if shuffle is None:
                assert rows.bitshuffle is not None
                shuffle = bit_shuffle(*rows.bitshuffle)
            elif shuffle == "blosc":
                assert (rows.blosc_shuffle is not None) == (values.itemsize > 1)
                shuffle = blosc_shuffle(rows.blosc_shuffle) if values.itemsize > 1 else np.ravel
            elif values.itemsize == 1:
                shuffle = np.ravel  # one byte: HDF5's shuffle changes nothing
            for lo, hi in [(0, 1003), (5, 900), (14, 21), (1000, 1003), (3, 4), (8, 20), (200, 603)]:
                out = np.empty((hi - lo, 30, 30, 1), values.dtype)
                rows.submit(pool, lo, hi, out, keep_shuffled=True).result()
                np.testing.assert_array_equal(out.view(np.uint8), shuffled_rows(values, lo, hi, per, shuffle).view(np.uint8))
        finally:
            rows.close()
            pool.close()


@contextlib.contextmanager
def plugin_rows(tmp_path, rng, per, plugin):
    """(the native library, values, their rows): 4 chunks of `per` rows of 30 x 30 float32 values written
    through hdf5plugin's `plugin` (its name, arguments), the rows closed after (skipped without
    hdf5plugin or the native library)."""
    pytest.importorskip("hdf5plugin")
    lib = native.library()
    if lib is None:
        pytest.skip("no C compiler here: the native read pool cannot be built")
    values = (rng.random((4 * per, 30, 30, 1)) * 200).astype(np.float32)
    write(tmp_path / "d.h5", values, chunks=(per, 30, 30, 1), plugin=plugin)
    with h5py.File(tmp_path / "d.h5") as f:
        rows = reader.rows(tmp_path / "d.h5", f["x"], "x")
        try:
            yield lib, values, rows
        finally:
            rows.close()


def decoded_by_the_pool(lib, rows, values, per, direct, stand_in, bits, block, filter_id, shuffle):
    """values (4 chunks of `per` rows, stored in rows' file) read with keep_shuffled on a spec of their
    own whose whole-chunk codec is `stand_in` (codec `direct`, which counts its calls and fails),
    the blocks left shuffled as `bits` says: the whole chunks come as `shuffle` lays them out, the
    stand-in never called; a read cutting chunk 0 calls it for that chunk alone and fails."""
    pool = native.ReadPool(lib, 2)
    dims = np.array([values.shape, (per,) + values.shape[1:]], np.int64)
    alone = lib.rp_chunks(rows.fd, values.itemsize, 0, 0, native.PLUGIN, rows.codec_bit, 0, values.ndim,
                          dims[0].ctypes.data, dims[1].ctypes.data)
    try:
        codecs = native.block_codecs(filter_id)
        assert lib.rp_chunks_direct(alone, direct, ctypes.cast(stand_in, ctypes.c_void_p)) == 0
        assert lib.rp_chunks_bits(alone, bits, block, codecs["lz4"], codecs["zstd"]) == 0
        out = np.zeros_like(values)
        status = pool.finish(pool.submit_chunks(alone, 0, 4 * per, rows.offsets, rows.sizes, rows.masks,
                                                out.ctypes.data, keep_shuffled=True))
        assert status == (0, 0) and stand_in.calls == []
        np.testing.assert_array_equal(out.view(np.uint8), shuffled_rows(values, 0, 4 * per, per, shuffle).view(np.uint8))
        cut = pool.finish(pool.submit_chunks(alone, 5, 4 * per, rows.offsets, rows.sizes, rows.masks,
                                             out.ctypes.data, keep_shuffled=True))
        assert cut == (native.DAMAGED, 0) and len(stand_in.calls) == 1  # the cut chunk 0 alone
    finally:
        lib.rp_chunks_free(alone)
        pool.close()


@pytest.mark.parametrize("per", [128, 100])
def test_blosc2_chunks_left_bitshuffled_are_decoded_by_the_pool_not_blosc2(tmp_path, rng, per):
    """Chunks of whole b2nd blocks (128 rows, blocks of 64), or of a frame padded past the HDF5 chunk
    (100 rows in 128), left bitshuffled for the GPU are decoded by the pool's own loop over their
    blocks (LZ4 from the plugin's library), never by blosc2_getitem."""
    @ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int)
    def getitem(src, size, start, items, dst, capacity):
        getitem.calls.append(size)
        return -1
    getitem.calls = []

    with plugin_rows(tmp_path, rng, per, ("Blosc2", dict(cname="lz4", filters=2))) as (lib, values, rows):
        assert rows.bitshuffle == (64 * 900, False)
        padded = ctypes.c_size_t(0)
        first = os.pread(rows.fd, int(rows.sizes[0]), int(rows.offsets[0]))
        assert lib.rp_blosc2_chunk(rows.spec, first, len(first), ctypes.byref(padded)) > 0
        assert padded.value == 128 * 900 * 4  # the frame's rows: the chunk's, or padded to 128
        decoded_by_the_pool(lib, rows, values, per, native.BLOSC2, getitem, native.BITS_BLOSC2, 64 * 900,
                            reader.FILTER_BLOSC2, bit_shuffle(64 * 900, False))


@pytest.mark.parametrize("cname", ["lz4", "zstd"])
def test_blosc_byte_shuffled_chunks_left_shuffled_are_decoded_by_the_pool_not_blosc(tmp_path, rng, cname):
    """hdf5plugin's Blosc default (byte shuffle): whole chunks left shuffled for the GPU are decoded by
    the pool's own loop over their blocks' streams (lz4: a stream a value byte; the codec from the
    plugin's library), never by blosc_decompress_ctx."""
    @ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    def decompress(src, dst, size, threads):
        decompress.calls.append(size)
        return -1
    decompress.calls = []

    with plugin_rows(tmp_path, rng, 201, ("Blosc", dict(cname=cname, shuffle=1))) as (lib, values, rows):
        block = rows.blosc_shuffle
        assert block is not None and rows.bitshuffle is None
        decoded_by_the_pool(lib, rows, values, 201, native.BLOSC, decompress, native.BYTES_BLOSC, block,
                            reader.FILTER_BLOSC, blosc_shuffle(block))


@pytest.mark.parametrize("options,kept", [(dict(cname="lz4", filters=2), True), (dict(cname="zstd", filters=2), True),
                                           (dict(cname="lz4", filters=1), False), (dict(cname="zstd", filters=0), False),
                                           (dict(cname="zlib", filters=2), False)])
def test_blosc2_chunks_are_left_bitshuffled_only_where_bitshuffle_and_lz4_or_zstd(tmp_path, rng, options, kept):
    """A Blosc2 file byte-shuffled (its streams split, too), unshuffled (one stream a block, as with
    bitshuffle) or coded by zlib has no bitshuffled layout to keep."""
    pytest.importorskip("hdf5plugin")
    if native.library() is None:
        pytest.skip("no C compiler here: the native read pool cannot be built")
    write(tmp_path / "d.h5", (rng.random((256, 30, 30, 1)) * 200).astype(np.float32), chunks=(128, 30, 30, 1),
          plugin=("Blosc2", options))
    with h5py.File(tmp_path / "d.h5") as f:
        rows = reader.rows(tmp_path / "d.h5", f["x"], "x")
        try:
            assert rows.bitshuffle == ((64 * 900, False) if kept else None)
        finally:
            rows.close()


@pytest.mark.parametrize("layout", [k for k, v in KEPT_SHUFFLED.items() if v[2] is None])
def test_damaged_bitshuffled_chunks_left_shuffled_are_refused_or_decoded_never_overrun(tmp_path, rng, layout):
    """The pool's own Bitshuffle and c-blosc framing, on damaged chunks: a damaged header is one
    InputError naming the chunk; 40 random damages of 1-64 bytes anywhere in a chunk each end in
    that error or in bytes decoded within the chunk (lz4 carries no checksum), never past it: the
    rows around the chunk keep their values, and nothing crashes."""
    lib = native.library()
    if lib is None:
        pytest.skip("no native read pool here")
    options, per, _ = KEPT_SHUFFLED[layout]
    values = (rng.random((3 * per, 30, 30, 1)) * 200).astype("f4")
    write(tmp_path / "d.h5", values, chunks=(per, 30, 30, 1), **options)
    with h5py.File(tmp_path / "d.h5") as f:
        rows = reader.rows(tmp_path / "d.h5", f["x"], "x")
        offset, size, _ = rows.index[1]
        shuffle = bit_shuffle(*rows.bitshuffle)
        rows.close()
    pristine = (tmp_path / "d.h5").read_bytes()
    pool = native.ReadPool(lib, 2)
    damages = [(0, bytes(range(1, 17)))] + [(int(rng.integers(0, size)), rng.integers(0, 256, int(rng.integers(1, 65)),
                                                                                          np.uint8).tobytes())
                                            for _ in range(40)]
    refused = 0
    try:
        for at, junk in damages:
            damaged, junk = bytearray(pristine), junk[:size - at]
            damaged[offset + at:offset + at + len(junk)] = junk
            (tmp_path / "d.h5").write_bytes(bytes(damaged))
            with h5py.File(tmp_path / "d.h5") as f:
                rows = reader.rows(tmp_path / "d.h5", f["x"], "x")
                out = np.full((3 * per, 30, 30, 1), -1, np.float32)
                try:
                    rows.submit(pool, 0, 3 * per, out, keep_shuffled=True).result()
                except InputError as e:
                    assert re.fullmatch(r"x: chunk 1 (cannot be decompressed \(.+: damaged data\)|"
                                        r"does not decode to its \d+ bytes|fails its fletcher32 checksum: the file is damaged)",
                                        str(e)), str(e)
                    refused += 1
                else:
                    expect = shuffled_rows(values, 0, 3 * per, per, shuffle)
                    np.testing.assert_array_equal(out[:per], expect[:per])
                    np.testing.assert_array_equal(out[2 * per:], expect[2 * per:])
                finally:
                    rows.close()
    finally:
        pool.close()
    assert refused >= 1  # the damaged header at least


@pytest.mark.parametrize("where", ["first step", "last step", "checksum"])
def test_chunks_read_as_stored_have_their_fletcher32_checked_as_they_land(tmp_path, pool, where):
    """rp_submit_summed (the GPU decoder's reads of chunks with fletcher32): each chunk's stored bytes
    land as they are, its checksum summed a 262,080-byte step at a time; chunks of 2-3 steps and odd
    sizes read whole, and a bit changed in a chunk's first or last step or in its stored checksum
    fails the read naming that chunk, the lowest where several fail."""
    if pool.native is None:
        pytest.skip("the native reader threads check the checksums")
    values = np.random.default_rng(9).random((700, 29, 27, 1), np.float32)  # gzip barely shrinks it
    write(tmp_path / "d.h5", values, chunks=(100, 29, 27, 1), compression="gzip", compression_opts=1, fletcher32=True)
    with h5py.File(tmp_path / "d.h5") as f:
        rows = reader.rows(tmp_path / "d.h5", f["x"], "x")
        positions = np.concatenate([[0], np.cumsum(rows.sizes[:-1])])
        assert rows.sizes.min() > 262080 and (rows.sizes % 2).any()
        buf = np.zeros(int(rows.sizes.sum()), np.uint8)
        reader.wait([rows.submit_summed(pool.native, buf.ctypes.data, 0, 7, positions)])
        stored = b"".join(os.pread(rows.fd, int(s), int(o)) for o, s in zip(rows.offsets, rows.sizes))
        assert buf.tobytes() == stored
        offsets, sizes = rows.offsets.copy(), rows.sizes.copy()
        rows.close()
    at = {"first step": 1000, "last step": int(sizes[3]) - 7, "checksum": int(sizes[3]) - 2}[where]
    with open(tmp_path / "d.h5", "r+b") as f:
        for chunk in (5, 3):
            f.seek(int(offsets[chunk]) + at)
            byte = f.read(1)[0]
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte ^ 0x08]))
    with h5py.File(tmp_path / "d.h5") as f:
        rows = reader.rows(tmp_path / "d.h5", f["x"], "x")
        with pytest.raises(InputError, match=r"^x: chunk 3 fails its fletcher32 checksum: the file is damaged$"):
            reader.wait([rows.submit_summed(pool.native, buf.ctypes.data, 0, 7, positions)])
        reader.wait([rows.submit_summed(pool.native, buf.ctypes.data, 0, 3, positions[:3])])  # chunks 0-2 are whole
        rows.close()
