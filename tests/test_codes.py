"""float32 images of 8-bit pixels read as their codes (infer/data/codes.py), in every scaling: which
values are codes, the native pool's packing paths against NumPy's, a value that is not failing the
read, and which data sets are taken to hold codes of which scaling."""
import h5py
import numpy as np
import pytest

from infer.data import codes, dataset, native, reader
from infer.data.loader import load_model
from infer.errors import InputError

WIRES = pytest.mark.parametrize("wire", codes.WIRES, ids=["mul", "div", "one"])
K = np.arange(256, dtype=np.uint8)


def values(wire):
    return codes.unpack(K, wire)


def not_codes(wire):
    """Values that are no code of the scaling: -0.0, NaN, infinities, past 255, below 0, a code's
    neighbours, a half, another scaling's values where they differ."""
    v = values(wire)
    other = codes.unpack(K, codes.DIV if wire == codes.MUL else codes.MUL)
    return [np.float32(-0.0), np.float32(np.nan), np.float32(np.inf), np.float32(-np.inf),
            np.nextafter(v[255], np.float32(1e9)), -v[1], np.float32(1e30),
            np.nextafter(v[7], np.float32(1)), np.nextafter(v[200], np.float32(0)), (v[3] + v[4]) / 2,
            other[np.flatnonzero(other != v)[0]]]


def test_the_scalings_are_numpys_and_mul_and_div_differ_on_126_codes():
    assert int((codes.unpack(K, codes.MUL) != codes.unpack(K, codes.DIV)).sum()) == 126
    assert np.array_equal((K / 255.0).astype(np.float32), codes.unpack(K, codes.DIV))
    assert np.array_equal(K * np.float32(1 / 255), codes.unpack(K, codes.MUL))
    assert np.array_equal(K.astype(np.float32), codes.unpack(K, codes.ONE))


def test_which_wires_the_fused_kernels_stage_themselves():
    """codes and uint8 images reach fused_kernel3-5 as uploaded, each in its scaling (uint8: its astype,
    ONE); any other wire is converted first, and the pipelines without that staging convert every one."""
    from infer.gpu.pipelines import ALGORITHMS

    assert [codes.staged_scaling(w) for w in codes.WIRES] == [0, 1, 2] == [codes.SCALINGS[w] for w in codes.WIRES]
    assert codes.staged_scaling(np.uint8) == codes.SCALINGS[codes.ONE]
    for wire in (np.float32, np.int8, np.uint16, np.float16):
        assert codes.staged_scaling(wire) is None
    staging = {name for name, algo in ALGORITHMS.items() if algo.STAGES_CODES}
    assert staging == {"fused-wgmma", "fused-certified"}


@WIRES
def test_every_code_packs_and_unpacks_to_the_same_bits(wire):
    k = codes.pack(values(wire), wire)
    np.testing.assert_array_equal(k, K)
    assert codes.wire_of(values(wire)) == wire
    assert codes.wire_of(values(wire)[:1]) == codes.MUL  # 0.0: both scalings' code 0; MUL first


@WIRES
def test_one_value_that_is_no_code_refuses_the_whole_array(wire):
    for bad in not_codes(wire):
        x = np.tile(values(wire), 3)
        x[517] = bad
        assert codes.pack(x, wire) is None, bad
    assert codes.pack(values(wire).astype(np.float64), wire) is None  # only float32 values are codes


@WIRES
@pytest.mark.parametrize("path", [0, 1, 2])  # one at a time, SSE2, AVX2
def test_every_native_packing_path_equals_numpys(rng, wire, path):
    lib = native.library()
    if lib is None:
        pytest.skip("no native read pool here")
    for n in (0, 1, 15, 16, 31, 32, 33, 4095, 4096):
        x = codes.unpack(rng.integers(0, 256, n, dtype=np.uint8), wire)
        cases = [x] + [np.concatenate([x[:at], [bad], x[at + 1:]]).astype(np.float32)
                       for bad in not_codes(wire) for at in {0, n // 2, n - 1} if n]
        for v in cases:
            out = np.zeros(n, np.uint8)
            got = lib.rp_pack_codes(v.ctypes.data, out.ctypes.data, n, path, codes.SCALINGS[wire])
            if got == -1:
                pytest.skip(f"path {path} is not on this CPU")
            expected = codes.pack(v, wire)
            assert got == (expected is not None), (n, v[:3])
            if expected is not None:
                np.testing.assert_array_equal(out, expected)


def images(rng, n, wire, h=9, w=7):
    """n images of random codes, odd sizes (the native packer's vector steps and tails)."""
    return codes.unpack(rng.integers(0, 256, (n, h, w, 1), dtype=np.uint8), wire)


def read_codes(path, pool, lo, hi, wire):
    with h5py.File(path) as f:
        rows = reader.rows(path, f["x"], "x")
    try:
        out = np.zeros((hi - lo,) + rows.shape[1:], wire)
        reader.wait(pool.submit(rows, lo, hi, out, check=False))
        return out
    finally:
        rows.close()


@WIRES
def test_the_pool_reads_float32_images_as_their_codes(tmp_path, rng, pool, wire):
    x = images(rng, 1301, wire)
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f["x"] = x
    for lo, hi in ((0, 1301), (3, 1000), (1300, 1301)):
        out = read_codes(tmp_path / "d.h5", pool, lo, hi, wire)
        np.testing.assert_array_equal(out.view(np.uint8), codes.pack(x[lo:hi], wire))
        assert np.array_equal(codes.unpack(out, wire).view(np.uint32), x[lo:hi].view(np.uint32))


@WIRES
@pytest.mark.parametrize("fletcher32", [False, True])
def test_chunks_stored_without_a_codec_are_read_as_their_codes(tmp_path, rng, pool, wire, fletcher32):
    """Chunks of 100 images of 29 x 31 (a chunk of two 262,080-byte steps and a bit, the step the
    checksum is summed in), fletcher32 or not: any range, whole chunks and parts of them, gives the
    codes NumPy packs; a value that is no code fails the read (NotCodes); a damaged chunk fails as
    damaged, named, not as NotCodes."""
    if native.library() is None:
        pytest.skip("chunked files are read as codes on the native pool only")
    x = images(rng, 350, wire, 29, 31)
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f.create_dataset("x", data=x, chunks=(100, 29, 31, 1), fletcher32=fletcher32)
    for lo, hi in ((0, 350), (100, 200), (37, 301), (299, 300)):
        out = read_codes(tmp_path / "d.h5", pool, lo, hi, wire)
        np.testing.assert_array_equal(out.view(np.uint8), codes.pack(x[lo:hi], wire))
    bad = x.copy()
    bad[250, 28, 30, 0] = not_codes(wire)[-1]
    with h5py.File(tmp_path / "bad.h5", "w") as f:
        f.create_dataset("x", data=bad, chunks=(100, 29, 31, 1), fletcher32=fletcher32)
    with pytest.raises(codes.NotCodes):
        read_codes(tmp_path / "bad.h5", pool, 200, 300, wire)
    np.testing.assert_array_equal(read_codes(tmp_path / "bad.h5", pool, 0, 250, wire).view(np.uint8),
                                  codes.pack(x[:250], wire))  # the rows read are codes: the rest of the chunk not read as such
    if fletcher32:
        with h5py.File(tmp_path / "d.h5") as f:
            offset, size, _ = reader.rows(tmp_path / "d.h5", f["x"], "x").index[1]
        with open(tmp_path / "d.h5", "r+b") as f:
            f.seek(offset + size - 5)
            byte = f.read(1)[0]
            f.seek(-1, 1)
            f.write(bytes([byte ^ 1]))
        with pytest.raises(InputError, match="chunk 1 fails its fletcher32 checksum"):
            read_codes(tmp_path / "d.h5", pool, 150, 160, wire)


def plugin(name, **kwargs):
    return lambda: dict(getattr(pytest.importorskip("hdf5plugin"), name)(**kwargs))


def blosc(cname, shuffle):
    return lambda: dict(pytest.importorskip("hdf5plugin").Blosc(cname=cname, clevel=5, shuffle=shuffle))


# What the host decodes (a codec, shuffle, fletcher32, chunks cutting images) for rows read as codes
DECODED = {
    "gzip": lambda: dict(compression="gzip"),
    "shuffle + gzip + fletcher32": lambda: dict(compression="gzip", shuffle=True, fletcher32=True),
    "lzf": lambda: dict(compression="lzf"),
    "shuffle only": lambda: dict(shuffle=True),
    "LZ4": plugin("LZ4"),
    "Zstd": plugin("Zstd"),
    "Bitshuffle lz4": plugin("Bitshuffle", cname="lz4"),
    "Blosc zstd + shuffle": blosc("zstd", 1),
    "Blosc lz4 + bitshuffle": blosc("lz4", 2),
    "Blosc2 lz4 + bitshuffle": plugin("Blosc2", cname="lz4", filters=2),
}


@WIRES
@pytest.mark.parametrize("layout", DECODED)
def test_chunks_cutting_images_are_assembled_as_their_codes(tmp_path, rng, pool, wire, layout):
    """Chunks cutting images, with edges (29 x 31 in 10 x 16 boxes), of every filter the reader
    threads decode: any range gives the codes NumPy packs (each decoded chunk's runs packed as they
    are scattered), a value that is no code fails the read (NotCodes), a chunk that does not decode
    fails named, not as NotCodes. The same filters in chunks of whole images are decoded straight
    into place as float32, not taken as codes."""
    if native.library() is None:
        pytest.skip("chunked files are read as codes on the native pool only")
    options = DECODED[layout]()
    x = images(rng, 350, wire, 29, 31)
    bad = x.copy()
    bad[250, 28, 30, 0] = not_codes(wire)[-1]
    for name, values, chunks in (("d.h5", x, (64, 10, 16, 1)), ("bad.h5", bad, (64, 10, 16, 1)),
                                 ("whole.h5", x, (64, 29, 31, 1))):
        with h5py.File(tmp_path / name, "w") as f:
            f.create_dataset("x", data=values, chunks=chunks, **options)
    indexes = {}
    for name, taken in (("d.h5", True), ("whole.h5", False)):
        with h5py.File(tmp_path / name) as f:
            rows = reader.rows(tmp_path / name, f["x"], "x")
            assert rows.takes_codes == taken and rows.cut == taken
            indexes[name] = rows.index
            rows.close()
    index = indexes["d.h5"]
    for lo, hi in ((0, 350), (100, 200), (37, 301), (299, 300)):
        out = read_codes(tmp_path / "d.h5", pool, lo, hi, wire)
        np.testing.assert_array_equal(out.view(np.uint8), codes.pack(x[lo:hi], wire))
    with pytest.raises(codes.NotCodes):
        read_codes(tmp_path / "bad.h5", pool, 200, 300, wire)
    np.testing.assert_array_equal(read_codes(tmp_path / "bad.h5", pool, 0, 192, wire).view(np.uint8),
                                  codes.pack(x[:192], wire))
    offset, size, _ = index[-1]  # the last chunk's first bytes damaged (its codec's header)
    with open(tmp_path / "d.h5", "r+b") as f:
        f.seek(offset)
        head = f.read(12)
        f.seek(offset)
        f.write(bytes(b ^ 0x5A for b in head))
    if layout != "shuffle only":
        with pytest.raises(InputError, match=f"chunk {len(index) - 1} "):
            read_codes(tmp_path / "d.h5", pool, 0, 350, wire)


@WIRES
@pytest.mark.parametrize("at", [0, 4, 15, 16, 62, 4070, 4094])
def test_a_value_that_is_no_code_fails_the_read(tmp_path, rng, pool, wire, at):
    """Anywhere in a vector step or in the tail past the last one (4,095 values: 127 steps of 32)."""
    for i, bad in enumerate(not_codes(wire)):
        x = images(rng, 65, wire, 7, 9)
        x.reshape(-1)[at] = bad
        with h5py.File(tmp_path / f"d{i}.h5", "w") as f:
            f["x"] = x
        with pytest.raises(codes.NotCodes):
            read_codes(tmp_path / f"d{i}.h5", pool, 0, 65, wire)


def open_data(path, tmp_path):
    model = tmp_path / "model.h5"
    with h5py.File(model, "w") as f:  # any model that takes (12, 11, 1) images
        f["conv1"] = np.zeros((3, 3, 1, 2), np.float32)
        f["conv2"] = np.zeros((2, 2, 2, 2), np.float32)
        f["fc1"] = np.zeros((4, 3), np.float32)
        f["fc2"] = np.zeros((3, 10), np.float32)
    return dataset.DataSet.open([str(path)], load_model(str(model)))


def test_data_sets_of_codes_in_float32_files_read_straight_are_taken_as_codes(tmp_path, rng):
    mul, div = images(rng, 80, codes.MUL, 12, 11), images(rng, 80, codes.DIV, 12, 11)
    one, off = images(rng, 80, codes.ONE, 12, 11), np.float32(1e-3)
    cases = {"mul.h5": (mul, {}, codes.MUL), "div.h5": (div, {}, codes.DIV), "one.h5": (one, {}, codes.ONE),
             "an early image not codes.h5": (np.concatenate([mul[:5], mul[5:6] + off, mul[6:]]), {}, None),
             # past the sample: taken as codes, and the read fails (the run then reads float32)
             "a late image not codes.h5": (np.concatenate([mul[:79], mul[79:] + off]), {}, codes.MUL),
             "chunked.h5": (mul, dict(chunks=(8, 12, 11, 1)), codes.MUL if native.library() else None),
             "chunked, fletcher32.h5": (div, dict(chunks=(8, 12, 11, 1), fletcher32=True),
                                        codes.DIV if native.library() else None),
             "chunked, gzip.h5": (mul, dict(chunks=(8, 12, 11, 1), compression="gzip"), None),
             "chunked, shuffle.h5": (mul, dict(chunks=(8, 12, 11, 1), shuffle=True), None),
             # assembled by the reader threads from decoded chunks, as codes
             "chunks cutting images.h5": (mul, dict(chunks=(8, 6, 11, 1)), codes.MUL if native.library() else None),
             "gzip chunks cutting images.h5": (mul, dict(chunks=(8, 6, 11, 1), compression="gzip"),
                                               codes.MUL if native.library() else None),
             "big-endian.h5": (mul.astype(">f4"), {}, None),
             "uint8.h5": (np.rint(mul * 255).astype(np.uint8), {}, None)}
    assert dataset.CODES_SAMPLE < 79
    for name, (x, options, expected) in cases.items():
        with h5py.File(tmp_path / name, "w") as f:
            f.create_dataset("x", data=x, **options)
            f["y"] = np.eye(10, dtype=np.float32)[np.arange(len(x)) % 10]
        d = open_data(tmp_path / name, tmp_path)
        try:
            assert d.codes_wire() == expected, name
            d.no_codes()
            assert d.codes_wire() is None
        finally:
            d.close()


def test_cnninfer_codes_0_sends_float32(tmp_path, rng, monkeypatch):
    x = images(rng, 8, codes.MUL, 12, 11)
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f["x"], f["y"] = x, np.eye(10, dtype=np.float32)[np.arange(8)]
    for value, expected in (("0", None), ("1", codes.MUL), ("", codes.MUL)):
        monkeypatch.setenv("CNNINFER_CODES", value)
        d = open_data(tmp_path / "d.h5", tmp_path)
        try:
            assert d.codes_wire() == expected, value
        finally:
            d.close()
