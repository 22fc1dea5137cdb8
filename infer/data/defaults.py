"""The project's own files shipped in the package: the default model (trained by tools/train.py,
99.5% on the MNIST test set) and a sample of the first 1,000 MNIST test images."""
from pathlib import Path

MODEL = "cnninfer-mnist.hdf5"
SAMPLE = "mnist-sample.hdf5"


def folder():
    """models/ inside the installed package, or models/ of a checkout."""
    here = Path(__file__).resolve().parent.parent  # the package
    for candidate in (here / "models", here.parent / "models"):
        if (candidate / MODEL).is_file():
            return candidate
    raise FileNotFoundError(f"the default model {MODEL} is not installed beside {here}")


def model():
    return folder() / MODEL


def sample():
    return folder() / SAMPLE
