"""Dask scale-out on a LocalCluster of two worker processes with the CPU backend: the same
predictions as one process on the same shards."""
import h5py
import pytest

import infer

distributed = pytest.importorskip("distributed")
da = pytest.importorskip("dask.array")


@pytest.fixture(scope="module")
def client():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            distributed.Client(cluster) as c:
        yield c


@pytest.fixture(scope="module")
def shards(ece408, tmp_path_factory):
    with h5py.File(ece408 / "testfull.hdf5") as f:
        x, y = f["x"][:2500], f["y"][:2500]
    folder = tmp_path_factory.mktemp("shards")
    paths = []
    for i, (lo, hi) in enumerate([(0, 1000), (1000, 1777), (1777, 2500)]):
        paths.append(folder / f"part{i}.h5")
        with h5py.File(paths[-1], "w") as f:
            f["x"], f["y"] = x[lo:hi], y[lo:hi]
    return paths


def test_shards_on_the_cluster_equal_one_process(client, shards, ece408):
    from infer.cluster import evaluate_shards

    model = ece408 / "model.hdf5"
    one = infer.run(shards, model, backend="cpu")
    many = evaluate_shards(client, shards, model, backend="cpu")
    assert (many.predictions == one.predictions).all() and (many.labels == one.labels).all()
    assert many.per_shard() == one.per_shard() and many.correct == one.correct
    assert many.device.startswith("dask: 2 workers")


def test_a_dask_array_on_the_cluster_equals_one_process(client, shards, ece408):
    from infer import Session
    from infer.cluster import predict_array

    with h5py.File(shards[1]) as f:
        x = f["x"][()]
    with Session(ece408 / "model.hdf5", backend="cpu") as s:
        expected = s.predict(x)
    labels = predict_array(da.from_array(x, chunks=(200, 28, 28, 1)), ece408 / "model.hdf5", backend="cpu")
    assert (labels == expected).all()


def test_a_glob_string_is_the_shards_and_the_result_has_timing(client, shards, ece408):
    """The README's call: one pattern string (was iterated character by character), and a Result
    whose as_dict() works like a local one's (raised KeyError: 'forward')."""
    from infer.cluster import evaluate_shards

    one = infer.run(shards, ece408 / "model.hdf5", backend="cpu")
    many = evaluate_shards(client, str(shards[0].parent / "part*.h5"), str(ece408 / "model.hdf5"), backend="cpu")
    assert many.data_paths == [str(p) for p in shards]
    assert (many.predictions == one.predictions).all()
    d = many.as_dict()
    assert d["correct"] == one.correct and d["elapsed_ms"] > 0
    assert set(d["timing_ms"]) == {"load", "prepare", "forward"} and all(v >= 0 for v in d["timing_ms"].values())


def test_a_misspelt_option_fails_before_the_cluster_runs(client, shards, ece408):
    from infer.cluster import evaluate_shards

    with pytest.raises(TypeError, match="unknown option conv_alg"):
        evaluate_shards(client, shards, ece408 / "model.hdf5", backend="cpu", conv_alg="unroll")
