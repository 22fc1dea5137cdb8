"""Each NumPy reference layer against a plain loop, on seeded random inputs of odd sizes."""
import numpy as np
import pytest

from infer import reference
from tests import loops


def rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("n,h,w,c,k,m", [(3, 11, 9, 3, 3, 5), (2, 7, 8, 1, 5, 4), (1, 6, 6, 2, 1, 3)])
def test_conv2d(rng, n, h, w, c, k, m):
    x, wt = rand(rng, n, h, w, c), rand(rng, k, k, c, m)
    out = reference.conv2d(x, wt)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, loops.conv2d(x, wt), rtol=1e-5, atol=1e-5)


def test_unroll_rows_are_windows(rng):
    x = rand(rng, 2, 7, 6, 3)
    cols = reference.unroll(x, 3)
    assert cols.shape == (2 * 5 * 4, 27)
    np.testing.assert_array_equal(cols[1 * 20 + 2 * 4 + 3], x[1, 2:5, 3:6, :].ravel())


@pytest.mark.parametrize("shape", [(3, 9, 7, 5), (2, 4, 6, 1)])
def test_relu(rng, shape):
    x = rand(rng, *shape)
    np.testing.assert_array_equal(reference.relu(x), loops.relu(x))


@pytest.mark.parametrize("shape", [(3, 9, 7, 5), (2, 4, 6, 3), (1, 2, 3, 1)])
def test_avgpool2_floors_odd_sizes(rng, shape):
    x = rand(rng, *shape)
    out = reference.avgpool2(x)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, loops.avgpool2(x), rtol=1e-6, atol=1e-6)


def test_flatten_is_hwc_order(rng):
    x = rand(rng, 3, 5, 3, 7)
    np.testing.assert_array_equal(reference.flatten(x), loops.flatten(x))


def test_fc(rng):
    x, w = rand(rng, 5, 37), rand(rng, 37, 11)
    np.testing.assert_allclose(reference.fc(x, w), loops.fc(x, w), rtol=1e-5, atol=1e-5)


def test_argmax_takes_the_first_maximum(rng):
    s = rng.integers(0, 3, (50, 7)).astype(np.float32)  # many ties
    np.testing.assert_array_equal(reference.argmax(s), loops.argmax(s))
