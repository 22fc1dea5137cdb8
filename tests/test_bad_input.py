"""Every bad input: exit code 2, one line on stderr naming the file and dataset, no traceback."""
import h5py
import numpy as np
import pytest

from tests.conftest import assert_refused, invoke, small_data, small_model, write


@pytest.fixture
def good(tmp_path, rng):
    return small_data(rng), small_model(rng)


def run(tmp_path, data, model, *extra):
    d = write(tmp_path / "data.h5", data) if isinstance(data, dict) else data
    m = write(tmp_path / "model.h5", model) if isinstance(model, dict) else model
    return invoke("run", d, m, *extra, "--backend", "cpu")



def test_good_small_files_run(tmp_path, good):
    r = run(tmp_path, *good)
    assert r.exit_code == 0, r.stderr


def test_missing_file(tmp_path, good):
    assert_refused(run(tmp_path, tmp_path / "nope.h5", good[1]), "nope.h5", "no such file")


def test_not_hdf5(tmp_path, good):
    junk = tmp_path / "junk.h5"
    junk.write_bytes(b"not an hdf5 file at all" * 100)
    assert_refused(run(tmp_path, good[0], junk), "junk.h5", "not an HDF5 file")


@pytest.mark.parametrize("options", [None, dict(chunks=(64, 5, 12, 1), compression="gzip"), dict(plugin="Blosc"),
                                     dict(plugin="LZ4")],
                         ids=["contiguous", "gzip, chunks cutting images", "blosc zstd", "lz4"])
def test_truncated_file(tmp_path, rng, good, options):
    x = np.zeros((2000, 12, 12, 1), np.float32)
    x[:, 3:9, 3:9] = rng.integers(0, 256, (2000, 6, 6, 1)) / np.float32(255)  # 8-bit codes, compressible
    if options and "plugin" in options:
        hdf5plugin = pytest.importorskip("hdf5plugin")
        plugin = options["plugin"]
        options = dict(chunks=(256, 12, 12, 1),
                       **(hdf5plugin.Blosc(cname="zstd", shuffle=1) if plugin == "Blosc" else hdf5plugin.LZ4()))
    whole = write(tmp_path / "whole.h5", {**good[0], "x": x if options is None else
                                          lambda f, n: f.create_dataset(n, data=x, **options),
                                          "y": np.eye(10)[np.zeros(2000, int)]})
    cut = tmp_path / "cut.h5"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    out = tmp_path / "p.npy"
    assert_refused(run(tmp_path, cut, good[1], "--predictions", out), "cut.h5")
    assert not out.exists()


@pytest.mark.parametrize("name", ["conv1", "conv2", "fc1", "fc2"])
def test_model_dataset_missing(tmp_path, good, name):
    assert_refused(run(tmp_path, good[0], {**good[1], name: None}), "model.h5", f"'{name}'", "missing")


@pytest.mark.parametrize("name", ["x", "y"])
def test_data_dataset_missing(tmp_path, good, name):
    assert_refused(run(tmp_path, {**good[0], name: None}, good[1]), "data.h5", f"'{name}'", "missing")


def test_group_where_a_dataset_belongs(tmp_path, good):
    assert_refused(run(tmp_path, good[0], {**good[1], "fc1": lambda f, n: f.create_group(n)}), "'fc1'", "is a group")


def test_external_link_refused(tmp_path, good):
    other = write(tmp_path / "other.h5", good[1])
    link = {**good[1], "conv2": lambda f, n: f.__setitem__(n, h5py.ExternalLink(str(other), "conv2"))}
    assert_refused(run(tmp_path, good[0], link), "'conv2'", "external link")


def test_dangling_soft_link_refused(tmp_path, good):
    assert_refused(run(tmp_path, {**good[0], "x": lambda f, n: f.__setitem__(n, h5py.SoftLink("/nowhere"))}, good[1]),
                   "'x'", "soft link")


def test_soft_link_inside_the_file_is_followed(tmp_path, good):
    def linked(f, n):
        f["real_x"] = good[0]["x"]
        f[n] = h5py.SoftLink("/real_x")
    assert run(tmp_path, {**good[0], "x": linked}, good[1]).exit_code == 0


def test_virtual_dataset_refused(tmp_path, good):
    src = write(tmp_path / "src.h5", good[0])

    def virtual(f, n):
        layout = h5py.VirtualLayout(shape=good[0]["x"].shape, dtype="f4")
        layout[:] = h5py.VirtualSource(str(src), "x", shape=good[0]["x"].shape)
        f.create_virtual_dataset(n, layout)
    assert_refused(run(tmp_path, {**good[0], "x": virtual}, good[1]), "'x'", "other files")


@pytest.mark.parametrize("kind,value", [
    ("string", np.array([b"abc"] * 4)),
    ("compound", np.zeros(3, dtype=[("a", "f4"), ("b", "i4")])),
    ("complex", np.ones((3, 3, 1, 4), np.complex64)),
    ("boolean", np.ones((3, 3, 1, 4), bool)),
])
def test_non_number_types_refused(tmp_path, good, kind, value):
    assert_refused(run(tmp_path, good[0], {**good[1], "conv1": value}), "'conv1'", "not a number type")


def test_integer_and_float64_inputs_are_converted(tmp_path, good):
    data, model = good
    r = run(tmp_path, {**data, "x": (data["x"] * 255).astype(np.uint8)}, {**model, "fc2": model["fc2"].astype(np.float64)})
    assert r.exit_code == 0, r.stderr


@pytest.mark.parametrize("name,shape,words", [
    ("conv1", (3, 3, 1), "rank 3"),
    ("conv1", (3, 2, 1, 4), "not square"),
    ("conv2", (2, 2, 5, 6), "takes 5 input channels but conv1 makes 4"),
    ("fc2", (9, 10), "takes 9 inputs but fc1 makes 8"),
    ("fc1", (25, 8), "fc1 takes 25"),
    ("conv1", (3, 3, 2, 4), "conv1 takes 2"),
    ("conv1", (9, 9, 1, 4), "too small"),
    ("fc1", (0, 8), "is empty"),
])
def test_inconsistent_model_shapes(tmp_path, good, name, shape, words):
    assert_refused(run(tmp_path, good[0], {**good[1], name: np.ones(shape, np.float32)}), words)


@pytest.mark.parametrize("shape,words", [((5, 9), "shape (5, 9), expected (5, 10)"), ((4, 10), "shape (4, 10)")])
def test_labels_shape(tmp_path, good, shape, words):
    assert_refused(run(tmp_path, {**good[0], "y": np.ones(shape)}, good[1]), "data.h5", "'y'", words)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, 1e300])
def test_non_finite_image_values(tmp_path, good, bad):
    x = good[0]["x"].astype(np.float64)
    x[3, 4, 5, 0] = bad
    assert_refused(run(tmp_path, {**good[0], "x": x}, good[1]), "data.h5", "'x'", "(3, 4, 5, 0)", "not a finite float32")


def test_non_finite_weight(tmp_path, good):
    w = good[1]["fc1"].copy()
    w[2, 1] = np.nan
    assert_refused(run(tmp_path, good[0], {**good[1], "fc1": w}), "model.h5", "'fc1'", "(2, 1)", "nan")


def test_non_finite_label(tmp_path, good):
    y = good[0]["y"].copy()
    y[1, 1] = np.inf
    assert_refused(run(tmp_path, {**good[0], "y": y}, good[1]), "'y'", "not a finite")


def test_empty_dataset(tmp_path, good):
    assert_refused(run(tmp_path, {"x": np.zeros((0, 12, 12, 1), np.float32), "y": np.zeros((0, 10))}, good[1]),
                   "'x'", "empty")


def test_null_dataspace(tmp_path, good):
    assert_refused(run(tmp_path, {**good[0], "y": lambda f, n: f.create_dataset(n, data=h5py.Empty("f8"))}, good[1]),
                   "'y'", "no dataspace")


def test_huge_declared_images_refused_without_allocating(tmp_path, good):
    def huge(f, n):
        f.create_dataset(n, shape=(2**40, 12, 12, 1), dtype="f4", chunks=(1, 12, 12, 1))
    y = lambda f, n: f.create_dataset(n, shape=(2**40, 10), dtype="f8", chunks=(1, 10))  # noqa: E731
    assert_refused(run(tmp_path, {"x": huge, "y": y}, good[1]), "'x'", "GiB")


def test_huge_declared_weights_refused(tmp_path, good):
    huge = lambda f, n: f.create_dataset(n, shape=(2**20, 2**20), dtype="f4", chunks=(1, 1024))  # noqa: E731
    assert_refused(run(tmp_path, good[0], {**good[1], "fc1": huge}), "'fc1'", "larger than cnninfer supports")


@pytest.mark.parametrize("n,words", [("0", "must be positive"), ("-3", "must be positive"), ("6", "holds 5 images")])
def test_bad_n(tmp_path, good, n, words):
    d, m = write(tmp_path / "data.h5", good[0]), write(tmp_path / "model.h5", good[1])
    assert_refused(invoke("run", "--backend", "cpu", "--", d, m, n), words)


@pytest.mark.parametrize("name,words", [("p.txt", "not '.txt'"), ("missing/p.npy", "does not exist")])
def test_bad_predictions_path(tmp_path, good, name, words):
    assert_refused(run(tmp_path, *good, "--predictions", tmp_path / name), words)


def test_overflowing_weights_are_refused(tmp_path, good):
    big = np.float32(1e20)  # every weight finite; their product through three layers is not
    model = {**good[1], **{k: good[1][k] * big for k in ("conv1", "fc1", "fc2")}}
    assert_refused(run(tmp_path, good[0], model), "model.h5", "image 0", "not finite")


def test_overflowing_image_is_named(tmp_path, good, monkeypatch):
    x = good[0]["x"].copy()
    x[3] = 3e38
    for budget in ("512", "0"):  # in memory, and streamed block by block
        monkeypatch.setenv("CNNINFER_HOST_BUDGET_MB", budget)
        assert_refused(run(tmp_path, {**good[0], "x": x}, good[1]), "model.h5", "image 3", "float32 overflow")


@pytest.mark.parametrize("options", [dict(compression="gzip", shuffle=True), dict(compression="lzf"),
                                     dict(compression="lzf", fletcher32=True), dict(plugin="Blosc"), dict(plugin="Zstd")],
                         ids=["shuffle+gzip", "lzf", "lzf+fletcher32", "blosc", "zstd"])
def test_a_damaged_chunk_stops_the_run_and_nothing_is_written(tmp_path, rng, good, options):
    from infer.data import reader

    if "plugin" in options:
        options = dict(compression=getattr(pytest.importorskip("hdf5plugin"), options["plugin"])())
    x = np.zeros((300, 12, 12, 1), np.float32)
    x[:, 3:9, 3:9] = rng.random((300, 6, 6, 1), dtype=np.float32).round(1)
    data = tmp_path / "data.h5"
    write(data, dict(x=lambda f, n: f.create_dataset(n, data=x, chunks=(50, 12, 12, 1), **options),
                     y=np.eye(10)[rng.integers(0, 10, 300)]))
    with h5py.File(data) as f:
        offset, size, _ = reader.rows(data, f["x"], "x").index[2]
    with open(data, "r+b") as f:
        f.seek(offset + size // 3)
        f.write(b"\x00\xff" * 8)
    out = tmp_path / "labels.npy"
    assert_refused(run(tmp_path, data, good[1], "--predictions", out), "data.h5", "'x'", "chunk 2")
    assert not out.exists()
