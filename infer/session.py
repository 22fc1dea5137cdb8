"""The Python API: a Session keeps a model, a backend (CUDA context, kernels, weights, buffers and
reader threads) between calls.

    import cnninfer
    with cnninfer.Session("model.hdf5") as s:
        labels = s.predict(images)          # (N, H, W, C) array of any integer or float type
        result = s.evaluate("testfull.hdf5")  # what `cnninfer run --json` reports

Every bad input raises InputError (a ValueError) with the one line the command line prints.
"""
import os
import time

import numpy as np

from . import backends, defaults, loader
from .dataset import DataSet, expand
from .errors import BadValue, InputError
from .reader import wait
from .result import Result
from .stream import NoProgress, Progress


def host_budget():
    """Bytes of images read into host memory at once; larger inputs are streamed."""
    return int(os.environ.get("CNNINFER_HOST_BUDGET_MB", 512)) * 2**20


def _ms(start):
    return (time.perf_counter() - start) * 1e3


def _model(model):
    if model is None:
        return loader.load_model(defaults.model())
    if isinstance(model, loader.Model):
        return model
    if isinstance(model, (str, os.PathLike)):
        return loader.load_model(model)
    if hasattr(model, "keys"):
        return loader.model_from_arrays(model)
    raise TypeError(f"model must be a path, a mapping of weight arrays or a loaded Model, not {type(model).__name__}")


def _notice(line):
    import sys

    print(line, file=sys.stderr)


class Session:
    """A model on a backend, ready for repeated calls.

    model: a path to an HDF5 model, a mapping {conv1, conv2, fc1, fc2} of arrays, or None for the
    bundled model. backend: "auto" (CUDA when usable, else the CPU with one notice), "cuda" or
    "cpu". The other options are the command line's: chunk, streams, tile_width, conv_algo,
    device, devices (a list of GPU numbers or "all"), fast_math, profile, readers (reader threads).
    """

    def __init__(self, model=None, backend="auto", *, notice=_notice, chunk=None, readers=None, device=0,
                 devices=None, **cuda_options):
        t = time.perf_counter()
        if backend not in backends.NAMES:
            raise InputError(f"backend must be one of {', '.join(backends.NAMES)}, not {backend!r}")
        self.model = _model(model)
        self.load_ms = _ms(t)  # counted in the first call's timing, as one run of the command line does
        self.setup_ms = 0.0
        self.backend, self.closed = None, False
        # The backend (for CUDA: the context, kernels, weights) starts with the first call, after
        # that call's input has been checked: a bad file costs no GPU start-up.
        self._create = lambda: backends.create(backend, notice, chunk=chunk, readers=readers,
                                               devices=devices or [device], **cuda_options)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Release the backend: device memory, page-locked buffers, the CUDA context, threads."""
        if self.backend is not None:
            self.backend.close()
        self.backend, self.closed = None, True

    @property
    def classes(self):
        return self.model.fc2.shape[1]

    def _backend(self):
        if self.closed:
            raise InputError("this session is closed")
        if self.backend is None:
            t = time.perf_counter()
            self.backend = self._create()
            self.setup_ms += _ms(t)
        return self.backend

    def predict(self, x):
        """The predicted class (int64) of each image of x, an (N, H, W, C) array."""
        return self._array(x, scores=False)[0]

    def scores(self, x):
        """The class scores (N, classes) float32 of each image of x, an (N, H, W, C) array."""
        return self._array(x, scores=True)[1]

    def _array(self, x, scores):
        x = np.asarray(x)
        if x.dtype.kind not in "iuf":
            raise InputError(f"x: type {x.dtype} is not a number type (integer or float)")
        if x.ndim != 4:
            raise InputError(f"x: shape {x.shape}, expected (N, H, W, C) images")
        if len(x) == 0:
            loader.geometry(self.model, (1,) + x.shape[1:], "x")
            return np.empty(0, np.int64), np.empty((0, self.classes), np.float32)
        data = DataSet.from_array(x)
        predictions, _, kept, _ = self._forward(data, scores, NoProgress())
        return predictions, kept

    def evaluate(self, data, n=None, *, scores=False, progress=False):
        """Classify the first n images (all by default) of one data file, or of several taken as
        one data set (a list of paths, glob patterns allowed): a Result (see `as_dict`)."""
        t = time.perf_counter()
        paths = expand([data] if isinstance(data, (str, os.PathLike)) else list(data))
        if not paths:
            raise InputError("no data file given")
        dataset = DataSet.open(paths, self.model, n)
        try:
            load_ms = _ms(t)
            bar = Progress(dataset.size) if progress else NoProgress()
            try:
                predictions, labels, kept, timing = self._forward(dataset, scores, bar)
            finally:
                bar.close()
            timing["load"] += load_ms + self.load_ms
            self.load_ms = 0.0
            backend = self._backend()
            return Result(data_paths=paths, model_path=self.model.path, shape=(dataset.size,) + dataset.image_shape,
                          predictions=predictions, labels=labels, scores=kept, classes=self.classes,
                          shards=dataset.shards, backend=backend.name, device=backend.device,
                          profile=backend.profile, timing=timing, streamed="read" in timing,
                          reader=dict(layout=dataset.kind, threads=backend.reader.threads_used, pool=backend.reader.kind))
        finally:
            dataset.close()

    def _forward(self, data, scores, progress):
        """(predictions, labels or None, scores or None, timing in ms) for every image of `data`."""
        backend = self._backend()
        n = data.size
        x_shape = (n,) + tuple(data.image_shape)
        loader.geometry(self.model, x_shape, data.parts[0][0])
        wire = backend.wire_dtype(data.dtype)
        streamed = n * data.image_bytes(wire) > host_budget()
        t = time.perf_counter()
        backend.prepare(self.model, x_shape, scores, wire, streamed)
        timing = dict(load=0.0, prepare=_ms(t))
        try:
            if streamed:
                t = time.perf_counter()
                predictions, labels, kept, read_s, wait_s = backend.stream(data, 0, n, progress)
                timing.update(read=read_s * 1e3, wait=wait_s * 1e3, forward=_ms(t))
            else:
                t = time.perf_counter()
                x = backend.host_buffers(x_shape, wire)[0]
                labels = None if data.classes is None else np.empty(n, np.int64)
                futures = data.submit_images(backend.reader, 0, n, x, check=not backend.checks_values)
                if labels is not None:
                    futures += data.submit_labels(backend.reader, 0, n, labels)
                wait(futures)
                timing["load"] = _ms(t)
                t = time.perf_counter()
                predictions, kept = backend.forward(x, progress)
                timing["forward"] = _ms(t)
        except BadValue as e:
            raise data.bad_value(e.image) from None
        timing["prepare"] += self.setup_ms
        self.setup_ms = 0.0
        return predictions, labels, kept, timing
