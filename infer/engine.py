"""One inference run as a library call: load and check the files, run a backend, score it."""
import os
import time
from dataclasses import dataclass, field

import numpy as np

from . import backends, loader, stream


@dataclass
class Result:
    data_path: str
    model_path: str
    shape: tuple  # (N, H, W, C) of the images used
    predictions: np.ndarray
    labels: np.ndarray
    backend: str
    device: str
    timing: dict = field(default_factory=dict)  # milliseconds: load, prepare, forward
    profile: list = None
    streamed: bool = False  # read from the file block by block, overlapped with compute

    @property
    def n(self):
        return len(self.predictions)

    @property
    def correct(self):
        return int(np.count_nonzero(self.predictions == self.labels))

    @property
    def accuracy(self):
        return self.correct / self.n

    def as_dict(self):
        d = dict(n=self.n, correct=self.correct, accuracy=self.accuracy,
                 elapsed_ms=self.timing["forward"], backend=self.backend, device=self.device,
                 input_shape=list(self.shape), data=self.data_path, model=self.model_path,
                 streamed=self.streamed, timing_ms=dict(self.timing))
        if self.profile is not None:
            d["profile"] = self.profile
        return d


MIN_AGREEMENT = 0.9995  # share of predictions a GPU run must share with the NumPy reference


def _ms(start):
    return (time.perf_counter() - start) * 1e3


def host_budget():
    """Bytes of images read into host memory at once; larger inputs are streamed."""
    return int(os.environ.get("CNNINFER_HOST_BUDGET_MB", 512)) * 2**20


def run(data_path, model_path, n=None, backend="auto", notice=print, progress=False, **options):
    """Classify the first n images of data_path with the model; `options` go to the backend.

    Images that fit the host budget are read whole, then timed from host memory to labels in host
    memory; larger inputs stream from the file through a ring of buffers, and `forward` then
    includes the reading (timing read: the reader's busy time, wait: compute waiting for it)."""
    t = time.perf_counter()
    model = loader.load_model(model_path)
    data = loader.open_data(data_path, model)
    try:
        n = loader.check_count(data, n)
        loader.check_outputs(data, n)
        x_shape = (n,) + data.x.shape[1:]
        streamed = not loader.in_memory(data, n, host_budget())
        load_ms = _ms(t)
        t = time.perf_counter()
        engine = backends.create(backend, notice, **options)
        setup_ms = _ms(t)
        bar = stream.Progress(n) if progress else stream.NoProgress()
        try:
            if not streamed:
                t = time.perf_counter()
                x = loader.read_images(data, 0, n, engine.host_buffer(x_shape))
                labels = loader.read_labels(data, 0, n)
                load_ms += _ms(t)
            t = time.perf_counter()
            engine.prepare(model, x_shape)
            timing = dict(load=load_ms, prepare=setup_ms + _ms(t))
            t = time.perf_counter()
            if streamed:
                predictions, labels, read_s, wait_s = engine.stream(data, n, bar)
                timing.update(read=read_s * 1e3, wait=wait_s * 1e3)
            else:
                predictions = engine.forward(x, bar)
            timing["forward"] = _ms(t)
            return Result(data_path=str(data_path), model_path=str(model_path), shape=x_shape,
                          predictions=predictions, labels=labels, backend=engine.name, device=engine.device,
                          profile=engine.profile, timing=timing, streamed=streamed)
        finally:
            bar.close()
            engine.close()
    finally:
        data.close()
