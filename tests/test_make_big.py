"""tools/make_big.py's deflate path for chunks that do not tile testfull: each chunk's stored bytes are
what HDF5's shuffle and gzip filters store for the same images (the benchmarks' files must be the
layouts they name), the 1M images' last chunk padded with the fill value."""
import sys

import h5py
import numpy as np
import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "tools"))
import make_big  # noqa: E402


@pytest.fixture(scope="module")
def testfull(ece408):
    with h5py.File(ece408 / "testfull.hdf5") as f:
        return f["x"][()]


@pytest.mark.parametrize("lo", [0, 9216, 999_424])  # the first chunk; one wrapping round testfull; the edge
@pytest.mark.parametrize("level,shuffle", [(6, True), (1, False)])
@pytest.mark.parametrize("chunk,origin", [((1024, 28, 28, 1), (0, 0, 0)), ((256, 7, 28, 1), (21, 0, 0)),
                                          ((1024, 10, 9, 1), (20, 27, 0))])  # whole images; a quarter; an edge box
def test_a_deflated_chunk_is_what_hdf5_stores(testfull, tmp_path, monkeypatch, lo, level, shuffle, chunk, origin):
    x = testfull
    monkeypatch.setattr(make_big, "_TILED", x)
    rows = chunk[0]
    lo = lo // rows * rows
    images = x[np.arange(lo, min(lo + rows, 100 * len(x))) % len(x)]
    with h5py.File(tmp_path / "one.h5", "w") as f:  # the images in the second row of chunks: the edge one short
        d = f.create_dataset("x", (rows + len(images),) + x.shape[1:], "f4", chunks=chunk,
                             compression="gzip", compression_opts=level, shuffle=shuffle)
        d[rows:] = images
        mask, stored = d.id.read_direct_chunk((rows,) + origin)
    assert mask == 0
    assert make_big._deflated(((lo,) + origin, chunk, level, shuffle)) == ((lo,) + origin, stored)
