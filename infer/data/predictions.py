"""Output files, written whole: --predictions (labels as .npy int64, or .csv with a header, one
label per line) and --scores (class scores as .npy float32)."""
import os
from pathlib import Path

import numpy as np

from .atomic import replacing
from ..errors import InputError

FORMATS = (".npy", ".csv")


def check_path(path, formats=FORMATS):
    """Refuse an output path we could not write, before any work is done."""
    path = Path(path)
    if path.suffix.lower() not in formats:
        raise InputError(f"{path}: written as {' or '.join(formats)}, not '{path.suffix or 'no extension'}'")
    folder = path.parent.resolve()
    if not folder.is_dir():
        raise InputError(f"{path}: folder {folder} does not exist")
    if path.is_dir():
        raise InputError(f"{path}: is a folder")
    if not os.access(folder, os.W_OK):
        raise InputError(f"{path}: folder {folder} is not writable")


def write(path, predictions):
    """Write the labels whole: a temporary file beside `path`, renamed over it when complete."""
    path = Path(path)
    labels = np.asarray(predictions, np.int64)
    if path.suffix.lower() == ".npy":
        return write_array(path, labels)
    try:
        with replacing(path) as tmp:
            with open(tmp, "w") as f:
                f.write("prediction\n")
                f.writelines(f"{v}\n" for v in labels.tolist())
    except OSError as e:
        raise InputError(f"{path}: cannot write: {e.strerror or e}") from None


def write_array(path, array):
    """Write an array whole as .npy: a temporary file beside `path`, renamed over it when complete."""
    path = Path(path)
    try:
        with replacing(path) as tmp:
            with open(tmp, "wb") as f:
                np.save(f, array)
    except OSError as e:
        raise InputError(f"{path}: cannot write: {e.strerror or e}") from None
