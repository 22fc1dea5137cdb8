"""float32 images of 8-bit pixels read as their codes (infer/codes.py): which values are codes, the
native pool's packing against NumPy's, a value that is not failing the read, and which data sets
are taken to hold codes."""
import h5py
import numpy as np
import pytest

from infer import codes, dataset, native, reader

ALL = np.arange(256, dtype=np.uint8) * codes.SCALE  # every code's float32 value


def not_codes(values):
    """Values that are no code: -0.0, NaN, infinities, past 255, below 0, and a code's neighbours."""
    return [np.float32(-0.0), np.float32(np.nan), np.float32(np.inf), np.float32(-np.inf),
            np.float32(256) * codes.SCALE, np.float32(-1) * codes.SCALE, np.float32(1e30),
            np.nextafter(ALL[7], np.float32(1)), np.nextafter(ALL[200], np.float32(0)), np.float32(0.5)]


def test_every_code_packs_and_unpacks_to_the_same_bits():
    k = codes.pack(ALL)
    np.testing.assert_array_equal(k, np.arange(256))
    assert np.array_equal(codes.unpack(k).view(np.uint32), ALL.view(np.uint32))


@pytest.mark.parametrize("bad", not_codes(ALL), ids=repr)
def test_one_value_that_is_no_code_refuses_the_whole_array(bad):
    x = np.tile(ALL, 3)
    x[517] = bad
    assert codes.pack(x) is None
    assert codes.pack(x.astype(np.float64)) is None  # only float32 values are codes


@pytest.mark.parametrize("path", [0, 1, 2])  # one at a time, SSE2, AVX2
def test_every_native_packing_path_equals_numpys(rng, path):
    lib = native.library()
    if lib is None:
        pytest.skip("no native read pool here")
    for n in (0, 1, 15, 16, 31, 32, 33, 4095, 4096):
        x = rng.integers(0, 256, n, dtype=np.uint8) * codes.SCALE
        cases = [x] + [np.concatenate([x[:at], [bad], x[at + 1:]]).astype(np.float32)
                       for bad in not_codes(ALL) for at in {0, n // 2, n - 1} if n]
        for values in cases:
            out = np.zeros(n, np.uint8)
            got = lib.rp_pack_codes(values.ctypes.data, out.ctypes.data, n, path)
            if got == -1:
                pytest.skip(f"path {path} is not on this CPU")
            expected = codes.pack(values)
            assert got == (expected is not None), (n, values[:3])
            if expected is not None:
                np.testing.assert_array_equal(out, expected)


def images(rng, n, h=9, w=7):
    """n images of random codes, odd sizes (the native packer's vector steps and tails)."""
    return rng.integers(0, 256, (n, h, w, 1), dtype=np.uint8) * codes.SCALE


def read_codes(path, pool, lo, hi):
    with h5py.File(path) as f:
        rows = reader.rows(path, f["x"], "x")
    try:
        out = np.zeros((hi - lo,) + rows.shape[1:], codes.CODES)
        reader.wait(pool.submit(rows, lo, hi, out, check=False))
        return out
    finally:
        rows.close()


def test_the_pool_reads_float32_images_as_their_codes(tmp_path, rng, pool):
    x = images(rng, 1301)
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f["x"] = x
    for lo, hi in ((0, 1301), (3, 1000), (1300, 1301)):
        out = read_codes(tmp_path / "d.h5", pool, lo, hi)
        np.testing.assert_array_equal(out.view(np.uint8), codes.pack(x[lo:hi]))
        assert np.array_equal(codes.unpack(out).view(np.uint32), x[lo:hi].view(np.uint32))


@pytest.mark.parametrize("at", [0, 4, 15, 16, 62, 4070, 4094])
@pytest.mark.parametrize("bad", not_codes(ALL), ids=repr)
def test_a_value_that_is_no_code_fails_the_read(tmp_path, rng, pool, at, bad):
    """Anywhere in a vector step or in the tail past the last one (4,095 values: 127 steps of 32)."""
    x = images(rng, 65, 7, 9)
    x.reshape(-1)[at] = bad
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f["x"] = x
    with pytest.raises(codes.NotCodes):
        read_codes(tmp_path / "d.h5", pool, 0, 65)


def open_data(path, tmp_path):
    model = tmp_path / "model.h5"
    with h5py.File(model, "w") as f:  # any model that takes (12, 11, 1) images
        f["conv1"] = np.zeros((3, 3, 1, 2), np.float32)
        f["conv2"] = np.zeros((2, 2, 2, 2), np.float32)
        f["fc1"] = np.zeros((4, 3), np.float32)
        f["fc2"] = np.zeros((3, 10), np.float32)
    from infer.loader import load_model
    return dataset.DataSet.open([str(path)], load_model(str(model)))


def test_data_sets_of_codes_in_contiguous_float32_files_are_taken_as_codes(tmp_path, rng):
    x = images(rng, 40, 12, 11)
    cases = {"codes.h5": (x, {}, True),
             "first image not codes.h5": (np.concatenate([x[:1] + np.float32(1e-3), x[1:]]), {}, False),
             "a later image not codes.h5": (np.concatenate([x[:39], x[39:] + np.float32(1e-3)]), {}, True),
             "chunked.h5": (x, dict(chunks=(8, 9, 7, 1)), False),
             "big-endian.h5": (x.astype(">f4"), {}, False),
             "uint8.h5": (np.rint(x * 255).astype(np.uint8), {}, False)}
    for name, (values, options, expected) in cases.items():
        with h5py.File(tmp_path / name, "w") as f:
            f.create_dataset("x", data=values, **options)
            f["y"] = np.eye(10, dtype=np.float32)[np.arange(len(values)) % 10]
        d = open_data(tmp_path / name, tmp_path)
        try:
            assert d.fits_codes() is expected, name  # the first image decides; a later one fails the read
            d.no_codes()
            assert d.fits_codes() is False
        finally:
            d.close()
