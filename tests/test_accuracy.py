"""The whole forward on the real ECE408 files: the reference counts, exactly."""
import pytest

import infer
from tests.conftest import TEST100_CORRECT, TESTFULL_CORRECT

EXPECTED = {"testfull.hdf5": (10000, TESTFULL_CORRECT), "test100.hdf5": (100, TEST100_CORRECT), "test10.hdf5": (10, 10),
            "test2.hdf5": (2, 2)}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_cpu_backend_matches_the_reference_counts(ece408, name):
    r = infer.run(ece408 / name, ece408 / "model.hdf5", backend="cpu")
    assert (r.n, r.correct) == EXPECTED[name]


def test_chunk_size_does_not_change_predictions(ece408):
    runs = [infer.run(ece408 / "test100.hdf5", ece408 / "model.hdf5", backend="cpu", chunk=c) for c in (1, 7, 100)]
    for r in runs[1:]:
        assert (r.predictions == runs[0].predictions).all()
