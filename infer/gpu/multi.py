"""Several GPUs: the images split into contiguous ranges, one per GPU, each GPU with its own
context, streams and host thread (a context stays current in the thread that made it). The
per-image computation does not depend on the batch, so predictions equal one GPU's."""
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..errors import ScoresOverflow
from ..stream import through
from .backend import CudaBackend


def split(n, parts):
    """Contiguous [lo, hi) ranges of n items, as equal as possible."""
    edges = [n * i // parts for i in range(parts + 1)]
    return list(zip(edges[:-1], edges[1:]))


class MultiGpuBackend:
    name = "cuda"
    profile = None  # per-kernel profiles are per GPU: profile one device at a time

    def __init__(self, devices, **options):
        self.workers = [ThreadPoolExecutor(1, thread_name_prefix=f"cnninfer-gpu{d}") for d in devices]
        self.gpus = []
        try:
            for d, w in zip(devices, self.workers):
                self.gpus.append(w.submit(CudaBackend, device=d, **options).result())
        except BaseException:
            self.close()
            raise

    def _each(self, fn):
        """fn(i, gpu) on every GPU's own thread, concurrently; the results in GPU order."""
        futures = [w.submit(fn, i, g) for i, (w, g) in enumerate(zip(self.workers, self.gpus))]
        return [f.result() for f in futures]

    @property
    def device(self):
        return f"{len(self.gpus)} GPUs: " + "; ".join(f"{g.gpu.ordinal}: {g.device}" for g in self.gpus)

    def host_buffer(self, shape):
        """Portable page-locked memory (every context can copy from it), owned by the first GPU."""
        return self.workers[0].submit(self.gpus[0].host_buffer, shape).result()

    def prepare(self, model, x_shape):
        self.ranges = split(x_shape[0], len(self.gpus))
        self._each(lambda i, g: g.prepare(model, (self.ranges[i][1] - self.ranges[i][0],) + tuple(x_shape[1:])))

    def forward(self, x, progress=None):
        def part(i, g):
            lo, hi = self.ranges[i]
            try:
                return g.forward(x[lo:hi])
            except ScoresOverflow as e:  # its image index counts from the start of x
                raise e.shifted(lo) from None

        return np.concatenate(self._each(part))

    def stream(self, data, n, progress):
        parts = self._each(lambda i, g: through(g, data, *self.ranges[i], progress))
        predictions, labels, read_s, wait_s = zip(*parts)
        return np.concatenate(predictions), np.concatenate(labels), sum(read_s), max(wait_s)

    def close(self):
        for g, w in zip(self.gpus, self.workers):
            w.submit(g.close).result()
        for w in self.workers:
            w.shutdown()
        self.gpus, self.workers = [], []
