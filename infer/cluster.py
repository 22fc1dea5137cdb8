"""Scale-out on Dask (`pip install 'cnninfer[dask]'`): shards of a data set (files, or blocks of a
dask array) mapped over a cluster's workers, one Session per worker process (a dask-cuda worker
sees one GPU, so that is one session per GPU), predictions gathered in order.

    from dask.distributed import Client
    from infer.cluster import evaluate_shards
    client = Client("tcp://scheduler:8786")          # or LocalCluster(), or dask_cuda.LocalCUDACluster()
    result = evaluate_shards(client, "shards/*.h5", "model.hdf5")   # or a list of paths

The result equals one process's `Session(model).evaluate(shards)`: the per-image computation
does not depend on which process or batch an image is in.
"""
import os
import threading
import time

import numpy as np

from .options import Options
from .result import Result

_SESSIONS = {}  # per worker process: (model, backend, options) -> (Session, lock)
_GUARD = threading.Lock()


def _session(model, backend, options):
    """This worker's session for the model and options (made on first use, then kept warm); a
    lock per session, since a worker may run several tasks at once on threads."""
    from .session import Session

    key = (str(model), backend, tuple(sorted(options.items())))
    with _GUARD:
        if key not in _SESSIONS:
            _SESSIONS[key] = (Session(model, backend, **options), threading.Lock())
        return _SESSIONS[key]


def _evaluate_shard(path, model, backend, options):
    session, lock = _session(model, backend, options)
    with lock:
        r = session.evaluate(path)
    return r.predictions, r.labels, r.device, r.backend, r.timing


def _predict_block(block, model, backend, options):
    session, lock = _session(model, backend, options)
    with lock:
        return session.predict(block)


def evaluate_shards(client, paths, model, backend="auto", **options):
    """Each data file evaluated on some worker; one Result over all of them, in the given order.
    paths: one path or glob pattern, or a list of them (patterns expanded as on the command line).
    `model` is a path every worker can read. The Result's timing (ms): load and prepare summed
    over the shards, forward the wall-clock time from submitting the shards to the last gathered."""
    from .data.dataset import expand

    Options.of(**options)  # a misspelt or bad option fails here, not on every worker
    paths = expand([paths] if isinstance(paths, (str, os.PathLike)) else list(paths))
    if not paths:
        raise ValueError("no data file given")
    t = time.perf_counter()
    futures = client.map(_evaluate_shard, paths, model=str(model), backend=backend, options=options, pure=False)
    parts = client.gather(futures)
    timing = dict(load=sum(p[4]["load"] for p in parts), prepare=sum(p[4]["prepare"] for p in parts),
                  forward=(time.perf_counter() - t) * 1e3)
    bounds, lo = [], 0
    for path, (predictions, *_) in zip(paths, parts):
        bounds.append((path, lo, lo + len(predictions)))
        lo += len(predictions)
    predictions = np.concatenate([p[0] for p in parts])
    labels = np.concatenate([p[1] for p in parts])
    import h5py

    with h5py.File(str(model)) as f:
        classes = f["fc2"].shape[1]
    return Result(data_paths=paths, model_path=str(model), shape=(len(predictions),) + _image_shape(paths[0]),
                  predictions=predictions, labels=labels, classes=classes, shards=bounds, backend=parts[0][3],
                  timing=timing,
                  device=f"dask: {len(client.scheduler_info()['workers'])} workers; " + "; ".join(sorted({p[2] for p in parts})))


def _image_shape(path):
    import h5py

    with h5py.File(path) as f:
        return tuple(f["x"].shape[1:])


def predict_array(x, model, backend="auto", **options):
    """Predictions (int64, computed) for a dask array x (N, H, W, C) chunked along N only, each
    block on a worker's session; uses the current Dask client (or scheduler)."""
    Options.of(**options)
    if any(len(c) > 1 for c in x.chunks[1:]):
        raise ValueError("x must be chunked along its first axis only (x.rechunk({1: -1, 2: -1, 3: -1}))")
    labels = x.map_blocks(_predict_block, model=str(model), backend=backend, options=options,
                          drop_axis=[1, 2, 3], dtype=np.int64)
    return labels.compute()
