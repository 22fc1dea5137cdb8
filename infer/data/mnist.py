"""MNIST IDX files (gzip or raw) and their conversion to cnninfer's HDF5 data format.

IDX: two zero bytes, a type code (0x08 = uint8), the rank, then one big-endian uint32 per
dimension, then the values. Images are (N, rows, cols) uint8, labels (N,) uint8 in 0..9.
The data format: x = pixels as uint8 * float32(1/255), multiplied in float32, NHWC (N, H, W, 1);
y = one-hot float64 (N, 10).
"""
import gzip
import math
import os
import struct

import numpy as np

from .atomic import replacing
from ..errors import InputError

CLASSES = 10
UINT8 = 0x08
# The largest element count we accept before reading: more than any real IDX file, and small
# enough that a header declaring absurd dimensions is refused without allocating anything.
MAX_ELEMENTS = 1 << 33


def _open(path):
    try:
        with open(path, "rb") as f:
            gzipped = f.read(2) == b"\x1f\x8b"
        return gzip.open(path, "rb") if gzipped else open(path, "rb")
    except OSError as e:
        raise InputError(f"{path}: cannot open: {e.strerror or e}") from None


def read_idx(path, rank, limit=None):
    """Read an IDX file of uint8 values and the given rank; at most `limit` items."""
    with _open(path) as f:
        try:
            header = f.read(4)
            if len(header) < 4 or header[:2] != b"\0\0":
                raise InputError(f"{path}: not an IDX file (bad magic number)")
            if header[2] != UINT8:
                raise InputError(f"{path}: IDX type code 0x{header[2]:02x}, expected 0x08 (uint8)")
            if header[3] != rank:
                raise InputError(f"{path}: IDX rank {header[3]}, expected {rank}")
            raw = f.read(4 * rank)
            if len(raw) < 4 * rank:
                raise InputError(f"{path}: truncated IDX header")
            dims = struct.unpack(f">{rank}I", raw)
            if 0 in dims:
                raise InputError(f"{path}: IDX dimensions {dims} are empty")
            count = dims[0] if limit is None else min(limit, dims[0])
            shape = (count,) + dims[1:]
            size = math.prod(shape)  # Python ints: a forged header cannot overflow
            if size > MAX_ELEMENTS:
                raise InputError(f"{path}: IDX dimensions {dims} are too large")
            data = f.read(size)
        except (OSError, EOFError, gzip.BadGzipFile) as e:
            raise InputError(f"{path}: cannot read: {e}") from None
    if len(data) < size:
        raise InputError(f"{path}: truncated: {len(data)} of {size} data bytes for dimensions {dims}")
    return np.frombuffer(data, np.uint8).reshape(shape)


def to_dataset(images, labels, images_path="images", labels_path="labels"):
    """Pixels and digit labels to the data format's (x, y)."""
    if len(images) != len(labels):
        raise InputError(f"{images_path}: {len(images)} images but {labels_path} has {len(labels)} labels")
    if labels.max(initial=0) >= CLASSES:
        raise InputError(f"{labels_path}: label {int(labels.max())} is not a digit 0..9")
    x = (images.astype(np.float32) * np.float32(1 / 255))[..., np.newaxis]
    y = np.zeros((len(labels), CLASSES), np.float64)
    y[np.arange(len(labels)), labels] = 1.0
    return x, y


def load(images_path, labels_path, limit=None):
    """MNIST IDX images and labels as the data format's (x, y)."""
    images = read_idx(images_path, 3, limit)
    labels = read_idx(labels_path, 1, limit)
    return to_dataset(images, labels, images_path, labels_path)


def write_hdf5(path, x, y, compress=False):
    """Write (x, y) to `path` whole (temporary file, then rename)."""
    import h5py

    options = dict(compression="gzip", compression_opts=4, shuffle=True, chunks=True) if compress else {}
    try:
        with replacing(path) as tmp, h5py.File(tmp, "w") as f:
            f.create_dataset("x", data=x, **options)
            f.create_dataset("y", data=y, **options)
    except OSError as e:
        raise InputError(f"{path}: cannot write: {e.strerror or e}") from None


def convert(images_path, labels_path, out_path, limit=None, compress=False):
    """Convert MNIST IDX files to the HDF5 data format; returns the number of images written."""
    if limit is not None and limit <= 0:
        raise InputError(f"--limit must be positive, got {limit}")
    x, y = load(images_path, labels_path, limit)
    if not os.path.isdir(os.path.dirname(os.path.abspath(out_path))):
        raise InputError(f"{out_path}: folder does not exist")
    write_hdf5(out_path, x, y, compress)
    return len(x)
