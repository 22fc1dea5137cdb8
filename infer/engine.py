"""One inference run as a library call: load and check the files, run a backend, score it."""
import time
from dataclasses import dataclass, field

import numpy as np

from . import backends, loader


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
                 timing_ms=dict(self.timing))
        if self.profile is not None:
            d["profile"] = self.profile
        return d


def _ms(start):
    return (time.perf_counter() - start) * 1e3


def run(data_path, model_path, n=None, backend="auto", notice=print, **options):
    """Classify the first n images of data_path with the model; `options` go to the backend."""
    t = time.perf_counter()
    model = loader.load_model(model_path)
    data = loader.open_data(data_path, model)
    try:
        n = loader.check_count(data, n)
        loader.check_memory(data, n)
        load_ms = _ms(t)
        t = time.perf_counter()
        engine = backends.create(backend, notice, **options)
        setup_ms = _ms(t)
        try:
            t = time.perf_counter()
            x = loader.read_images(data, n, engine.host_buffer((n,) + data.x.shape[1:]))
            labels = loader.read_labels(data, n)
            load_ms += _ms(t)
            t = time.perf_counter()
            engine.prepare(model, x.shape)
            prepare_ms = setup_ms + _ms(t)
            t = time.perf_counter()
            predictions = engine.forward(x)
            forward_ms = _ms(t)
            return Result(data_path=str(data_path), model_path=str(model_path), shape=x.shape,
                          predictions=predictions, labels=labels, backend=engine.name,
                          device=engine.device, profile=engine.profile,
                          timing=dict(load=load_ms, prepare=prepare_ms, forward=forward_ms))
        finally:
            engine.close()
    finally:
        data.close()
