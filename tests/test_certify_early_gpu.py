"""The certificate's earlier versions (dev/cuda/certify_early.py: certify_kernel1-3) stay correct beside the
product's 4 and 5: each gives the exact path's labels on testfull. Needs a Hopper GPU."""
import numpy as np
import pytest

from infer.bench.gpu import read_all
from infer.data import loader
from tests.conftest import dev_module
from tests.test_certified_gpu import hopper

pytestmark = pytest.mark.gpu


def test_each_version_gives_the_exact_paths_labels(gpu, ece408):
    """Versions 1 (32 images a block, G tiles in shared memory) and 2 (both stages for every image)
    stay correct, and version 3 (the pairs that the cheaper first stage leaves, then version 2's
    second) recomputes no more than either: it certifies where either of its stages does. Versions
    1-3 read fc1's float32-accurate sums from the fc kernel; version 4 sums fc1 itself from float16
    operands, and its looser bound recomputes more than version 3. Version 5 (the default) is version
    4 on float16 features and bounds: the same operands, sums of dp and p bounded from the float16
    values (no smaller), so it certifies no image version 4 does not."""
    early = dev_module("certify_early")
    hopper(gpu)
    model = loader.load_model(ece408 / "model.hdf5")
    x = read_all(ece408 / "testfull.hdf5", model, 3000)
    exact = early.exact_labels(model, x)
    recomputed = {}
    for v in (1, 2, 3, 4, 5):
        labels, recomputed[v], _ = early.run(model, x, v, repeats=0)
        np.testing.assert_array_equal(labels, exact, err_msg=f"version {v}")
    assert 0 < recomputed[3] <= min(recomputed[1], recomputed[2]), recomputed
    assert recomputed[3] < recomputed[4] <= recomputed[5] < 0.15 * len(x), recomputed
