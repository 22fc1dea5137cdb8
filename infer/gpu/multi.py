"""Several GPUs: the images split into contiguous ranges, one per GPU, each GPU with its own
context, streams and host thread (a context stays current in the thread that made it). The
per-image computation does not depend on the batch, so predictions equal one GPU's."""
import dataclasses

import numpy as np

from ..backend import Backend
from ..errors import BadValue, ScoresOverflow
from .home import Home, close_boxed
from .backend import CudaBackend


class MultiGpuBackend(Backend):
    name = "cuda"
    profile = None  # per-kernel profiles are per GPU: profile one device at a time
    checks_values = True
    concurrent = False

    def __init__(self, devices, **options):
        self._reader_threads = None
        self.workers = [Home(f"cnninfer-gpu{d}") for d in devices]  # not stopped before atexit (home.py)
        self.gpus = []
        try:
            for d, w in zip(devices, self.workers):
                self.gpus.append(w.submit(CudaBackend, device=d, **options).result())
                self.gpus[-1].records_forward_graph = False  # each reads its slice of this backend's buffer
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

    @property
    def reader(self):
        return self.gpus[0].reader

    @property
    def reader_threads(self):
        """Reader threads the last read used: every GPU's where each streamed its range with its own
        pool, else the first GPU's, which reads images held in memory."""
        return self._reader_threads or self.reader.threads_used

    def host_buffers(self, shape, dtype, count=1):
        """Portable page-locked memory (every context can copy from it), owned by the first GPU."""
        return self.workers[0].submit(self.gpus[0].host_buffers, shape, dtype, count).result()

    def description(self):
        """The first GPU's (on its own thread, where its context is current): the plan sizes a share
        by it."""
        return self.workers[0].submit(self.gpus[0].description).result()

    @property
    def options(self):
        return self.gpus[0].options

    @property
    def devices(self):
        return tuple(g.gpu.ordinal for g in self.gpus)

    def prepare(self, model, plan, source=None):
        """Each GPU prepares its share of the plan's images (plan.shares)."""
        self._reader_threads = None
        self.ranges = plan.shares
        self._each(lambda i, g: g.prepare(model, dataclasses.replace(plan, n=self.ranges[i][1] - self.ranges[i][0]),
                                          source))
        if not plan.streamed:  # each GPU's graph of forward over its slice of the buffer forward reads
            x = self.host_buffers((plan.shares[-1][1],) + tuple(plan.image_shape), plan.wire)[0]
            self._each(lambda i, g: g.executor.record(x[self.ranges[i][0]:self.ranges[i][1]]))

    def recomputed(self):
        counts = [c for c in self._each(lambda i, g: g.recomputed()) if c is not None]
        return sum(counts) if counts else None

    @property
    def decoding(self):
        return self.gpus[0].decoding

    def _gather(self, parts):
        labels, scores = zip(*parts)
        return np.concatenate(labels), None if scores[0] is None else np.concatenate(scores)

    def forward(self, x, progress=None):
        def part(i, g):
            lo, hi = self.ranges[i]
            try:
                return g.forward(x[lo:hi], progress)
            except (ScoresOverflow, BadValue) as e:  # its image index counts from the start of x
                raise e.shifted(lo) from None

        return self._gather(self._each(part))

    def stream(self, data, start, stop, progress):
        """Each GPU streams its own range with its own reader threads and ring into its part of
        one set of outputs: its reader threads write the true labels as they read them, the GPU's
        thread its predictions as it finishes; nothing is gathered after the last GPU is done."""
        out = self.gpus[0].outputs(stop - start)  # every GPU holds the same model and options

        def part(i, g):
            lo, hi = self.ranges[i]
            mine = tuple(None if a is None else a[lo:hi] for a in out)
            return g.stream(data, start + lo, start + hi, progress, mine)[3:]

        read_s, wait_s = zip(*self._each(part))
        self._reader_threads = sum(g.reader.threads_used for g in self.gpus)
        return out + (max(read_s), max(wait_s))

    def close(self):
        """Each GPU's backend closed and dropped on its own thread, then the threads ended."""
        boxes, self.gpus = [[g] for g in self.gpus], []
        for box, w in zip(boxes, self.workers):
            w.submit(close_boxed, box).result()
        for w in self.workers:
            w.shutdown()
        self.workers = []
