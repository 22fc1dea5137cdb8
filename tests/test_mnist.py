"""convert-mnist: bit-identical to the course's testfull, compressed output, every bad IDX file;
the bundled default model and sample."""
import gzip
import json
import struct

import h5py
import numpy as np
import pytest

from infer.data import defaults
from tests.conftest import SHARED_DATA, assert_refused, invoke

MNIST = SHARED_DATA / "mnist"


def idx(path, array, type_code=0x08, gz=False):
    header = struct.pack(">BBBB", 0, 0, type_code, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    data = header + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


@pytest.fixture
def pair(tmp_path, rng):
    images = rng.integers(0, 256, (13, 28, 28))
    labels = rng.integers(0, 10, 13)
    return idx(tmp_path / "img.idx", images, gz=True), idx(tmp_path / "lab.idx", labels), images, labels


def test_t10k_converts_to_testfull_bit_for_bit(tmp_path, ece408):
    if not (MNIST / "t10k-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"MNIST IDX files are not at {MNIST}")
    out = tmp_path / "t10k.hdf5"
    r = invoke("convert-mnist", MNIST / "t10k-images-idx3-ubyte.gz", MNIST / "t10k-labels-idx1-ubyte.gz", out)
    assert r.exit_code == 0, r.stderr
    with h5py.File(out) as a, h5py.File(ece408 / "testfull.hdf5") as b:
        assert a["x"].dtype == b["x"].dtype and a["y"].dtype == b["y"].dtype
        assert np.array_equal(a["x"][()].view(np.uint32), b["x"][()].view(np.uint32))
        assert np.array_equal(a["y"][()], b["y"][()])


def test_limit_and_compress_are_read_back(tmp_path, pair):
    out = tmp_path / "c.hdf5"
    r = invoke("convert-mnist", pair[0], pair[1], out, "--limit", 7, "--compress")
    assert r.exit_code == 0, r.stderr
    with h5py.File(out) as f:
        assert f["x"].compression == "gzip" and f["x"].chunks
        assert f["x"].shape == (7, 28, 28, 1)
        np.testing.assert_array_equal(f["x"][()][..., 0], (pair[2][:7].astype(np.float32) * np.float32(1 / 255)))
        np.testing.assert_array_equal(f["y"][()].argmax(1), pair[3][:7])
    r = invoke("run", out, "--backend", "cpu", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["n"] == 7


@pytest.mark.parametrize("break_it,words", [
    (lambda p: p.write_bytes(b"\x01\x02\x08\x03" + p.read_bytes()[4:]), "bad magic"),
    (lambda p: p.write_bytes(p.read_bytes()[:2] + b"\x0d" + p.read_bytes()[3:]), "type code 0x0d"),
    (lambda p: p.write_bytes(p.read_bytes()[:3] + b"\x02" + p.read_bytes()[4:]), "rank 2"),
    (lambda p: p.write_bytes(p.read_bytes()[:500]), "truncated"),
    (lambda p: p.write_bytes(b"\0\0\x08\x03" + struct.pack(">3I", 2**31, 2**16, 2**16)), "too large"),
])
def test_bad_images_file(tmp_path, pair, break_it, words):
    raw = tmp_path / "raw.idx"
    raw.write_bytes(gzip.decompress(pair[0].read_bytes()))
    break_it(raw)
    out = tmp_path / "o.hdf5"
    assert_refused(invoke("convert-mnist", raw, pair[1], out), "raw.idx", words)
    assert not out.exists()


def test_label_count_and_range(tmp_path, pair, rng):
    assert_refused(invoke("convert-mnist", pair[0], idx(tmp_path / "few.idx", np.zeros(5)), tmp_path / "o.h5"), "13 images", "5 labels")
    assert_refused(invoke("convert-mnist", pair[0], idx(tmp_path / "big.idx", np.full(13, 12)), tmp_path / "o.h5"), "not a digit")
    ten = idx(tmp_path / "ten.idx", np.r_[rng.integers(0, 10, 12), 10])  # one label just past the digits
    assert_refused(invoke("convert-mnist", pair[0], ten, tmp_path / "o.h5"), "label 10 is not a digit")


def test_run_without_paths_uses_the_bundled_model_and_sample():
    r = invoke("run", "--backend", "cpu", "--json")
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["n"] == 1000 and d["accuracy"] >= 0.98
    assert d["model"] == str(defaults.model())


def test_default_model_on_testfull(ece408):
    r = invoke("run", ece408 / "testfull.hdf5", "--backend", "cpu", "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["accuracy"] >= 0.990


def test_data_then_n_without_model():
    r = invoke("run", defaults.sample(), "25", "--backend", "cpu", "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["n"] == 25
