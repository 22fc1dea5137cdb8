"""HDF5 model and data files: shapes checked before any value is read, values checked as read.

Model: datasets conv1 (K, K, C, C1), conv2 (K2, K2, C1, C2), fc1 (F, hidden), fc2 (hidden, classes).
Data: x (N, H, W, C) images, NHWC; y (N, classes), one row per image, the label its first maximum.
Numbers of any integer or float type are converted to float32 and must be finite there; every
problem is an InputError naming the file and the dataset.
"""
import contextlib
import os
from dataclasses import dataclass

import numpy as np

from . import reader
from ..errors import InputError, where
from .reader import check_finite
from ..network import MAX_CHANNELS, MAX_KERNEL, MAX_WEIGHT_ELEMENTS, geometry

MODEL_DATASETS = ("conv1", "conv2", "fc1", "fc2")


@dataclass(frozen=True)
class Model:
    path: str
    conv1: np.ndarray
    conv2: np.ndarray
    fc1: np.ndarray
    fc2: np.ndarray


@dataclass
class Data:
    """An open data file: shapes known and checked, readers for x and y chosen, nothing read yet."""
    path: str
    file: object
    x: object  # reader.Rows of the images
    y: object  # reader.Rows of the one-hot labels

    @property
    def size(self):
        return self.x.shape[0]

    def close(self):
        self.x.close()
        self.y.close()
        self.file.close()


@contextlib.contextmanager
def _reading(path, name=None):
    """Any failure of the HDF5 library while inside becomes one InputError line."""
    try:
        yield
    except InputError:
        raise
    except Exception as e:  # h5py raises OSError, KeyError, RuntimeError, ValueError... on bad files
        raise InputError(f"{where(path, name)}: cannot read: {' '.join(str(e).split()) or type(e).__name__}") from None


def sha256(path):
    """The hex sha256 of a model file's bytes (serve --model-sha256 pins it)."""
    import hashlib

    if not os.path.isfile(path):
        raise InputError(f"{path}: no such file" if not os.path.exists(path) else f"{path}: is a folder, not an HDF5 file")
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror}") from None
    return digest.hexdigest()


def _open(path):
    import h5py

    if not os.path.exists(path):
        raise InputError(f"{path}: no such file")
    if os.path.isdir(path):
        raise InputError(f"{path}: is a folder, not an HDF5 file")
    if not h5py.is_hdf5(path):
        raise InputError(f"{path}: not an HDF5 file")
    with _reading(path):
        return h5py.File(path, "r")


def _dataset(f, path, name, rank):
    """The dataset `name` of open file `f`, checked for place, type and rank; nothing read."""
    import h5py

    with _reading(path, name):
        link = f.get(name, getlink=True)
        if link is None:
            raise InputError(f"{where(path, name)}: missing")
        if isinstance(link, h5py.ExternalLink):
            raise InputError(f"{where(path, name)}: is an external link to {link.filename}; datasets must live in the file itself")
        obj = f.get(name)
        if obj is None:
            raise InputError(f"{where(path, name)}: is a soft link to {link.path}, which does not exist")
        if not isinstance(obj, h5py.Dataset):
            raise InputError(f"{where(path, name)}: is a {type(obj).__name__.lower()}, not a dataset")
        if obj.is_virtual or obj.external:
            raise InputError(f"{where(path, name)}: its values are stored in other files; datasets must live in the file itself")
        dt = obj.dtype
        if dt.kind not in "iuf" or dt.subdtype is not None:
            raise InputError(f"{where(path, name)}: type {_describe(dt)} is not a number type (integer or float)")
        if obj.shape is None:
            raise InputError(f"{where(path, name)}: has no dataspace (empty dataset)")
        if len(obj.shape) != rank:
            raise InputError(f"{where(path, name)}: rank {len(obj.shape)} {tuple(obj.shape)}, expected rank {rank}")
        if 0 in obj.shape:
            raise InputError(f"{where(path, name)}: shape {tuple(obj.shape)} is empty")
        return obj


def _describe(dt):
    kinds = {"S": "string", "U": "string", "O": "string or reference", "V": "compound",
             "c": "complex", "b": "boolean", "M": "date", "m": "time delta"}
    if dt.subdtype is not None:
        return f"array of {dt.subdtype[0]}"
    return f"{kinds.get(dt.kind, dt.kind)} ({dt})"


def _finite_float32(values, label):
    """`values` as float32, refused if any is not a finite float32 (NaN, Inf or out of range)."""
    with np.errstate(over="ignore", invalid="ignore"):
        out = values.astype(np.float32, copy=False)
    check_finite(out, values, label, 0)
    return out


def _square_kernel(shape, path, name):
    k, k_, cin, cout = shape
    if k != k_:
        raise InputError(f"{where(path, name)}: kernel {k}x{k_} is not square")
    if k > MAX_KERNEL or cin > MAX_CHANNELS or cout > MAX_CHANNELS:
        raise InputError(f"{where(path, name)}: shape {tuple(shape)} is larger than cnninfer supports "
                         f"(kernel <= {MAX_KERNEL}, channels <= {MAX_CHANNELS})")
    return k, cin, cout


def load_model(path):
    """Read and check a model file: shapes first (consistent with each other), then the weights."""
    path = str(path)
    f = _open(path)
    with f:
        ds = {name: _dataset(f, path, name, rank) for name, rank in zip(MODEL_DATASETS, (4, 4, 2, 2))}
        _check_model_shapes({name: d.shape for name, d in ds.items()}, path)
        weights = {}
        for name in MODEL_DATASETS:
            with _reading(path, name):
                values = ds[name][()]
            weights[name] = np.ascontiguousarray(_finite_float32(values, where(path, name)))
    return Model(path=path, **weights)


def model_from_arrays(weights, label="model"):
    """A Model from a mapping of the four weight arrays (any integer or float type), checked like a
    file's datasets; `label` stands for the file's name in messages."""
    missing = [name for name in MODEL_DATASETS if name not in weights]
    if missing:
        raise InputError(f"{label}: no weights named {', '.join(missing)} (a model needs {', '.join(MODEL_DATASETS)})")
    arrays = {}
    for name, rank in zip(MODEL_DATASETS, (4, 4, 2, 2)):
        a = np.asarray(weights[name])
        if a.dtype.kind not in "iuf":
            raise InputError(f"{where(label, name)}: type {_describe(a.dtype)} is not a number type (integer or float)")
        if a.ndim != rank or 0 in a.shape:
            raise InputError(f"{where(label, name)}: shape {a.shape}, expected a non-empty array of rank {rank}")
        arrays[name] = a
    _check_model_shapes({name: a.shape for name, a in arrays.items()}, label)
    return Model(path=label, **{name: np.ascontiguousarray(_finite_float32(a, where(label, name)))
                                for name, a in arrays.items()})


def _check_model_shapes(shapes, path):
    for name in ("fc1", "fc2"):
        if np.prod(shapes[name], dtype=np.int64) > MAX_WEIGHT_ELEMENTS:
            raise InputError(f"{where(path, name)}: shape {shapes[name]} is larger than cnninfer supports")
    _, _, c1 = _square_kernel(shapes["conv1"], path, "conv1")
    _, c1_, _ = _square_kernel(shapes["conv2"], path, "conv2")
    if c1_ != c1:
        raise InputError(f"{where(path, 'conv2')}: takes {c1_} input channels but conv1 makes {c1}")
    if shapes["fc2"][0] != shapes["fc1"][1]:
        raise InputError(f"{where(path, 'fc2')}: takes {shapes['fc2'][0]} inputs but fc1 makes {shapes['fc1'][1]}")


def open_data(path, model):
    """Open a data file and check its shapes against the model; no image is read yet."""
    path = str(path)
    f = _open(path)
    try:
        x = _dataset(f, path, "x", 4)
        y = _dataset(f, path, "y", 2)
        geometry(model, x.shape, path)
        classes = model.fc2.shape[1]
        if y.shape != (x.shape[0], classes):
            raise InputError(f"{where(path, 'y')}: shape {y.shape}, expected ({x.shape[0]}, {classes}): "
                             f"one row per image of x, one column per class of the model's fc2")
        with _reading(path, "x"):
            x_rows = reader.rows(path, x, where(path, "x"))
        try:
            with _reading(path, "y"):
                y_rows = reader.rows(path, y, where(path, "y"))
        except BaseException:
            x_rows.close()
            raise
    except BaseException:
        f.close()
        raise
    return Data(path=path, file=f, x=x_rows, y=y_rows)

