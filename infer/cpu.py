"""The CPU backend: the NumPy reference layers, run over chunks of images so memory stays bounded."""
import os
import platform
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from . import reference
from .errors import ScoresOverflow
from .stream import through

DEFAULT_CHUNK = 32  # small chunks keep each thread's im2col buffer in cache


class CpuBackend:
    name = "cpu"
    profile = None  # the CPU backend keeps no per-kernel timings

    def __init__(self, chunk=None):
        self.chunk = chunk or DEFAULT_CHUNK
        self.threads = os.cpu_count() or 1
        self.model = None

    @property
    def device(self):
        return f"CPU ({platform.machine()}, {self.threads} threads, NumPy {np.__version__})"

    def host_buffer(self, shape):
        return np.empty(shape, np.float32)

    def prepare(self, model, x_shape):
        self.model = model

    def forward(self, x, progress=None):
        """Predicted class of each image of x (N, H, W, C) float32."""
        out = np.empty(len(x), np.int64)
        starts = range(0, len(x), self.chunk)

        def one(start):
            with np.errstate(over="ignore", invalid="ignore"):
                scores = reference.scores(x[start:start + self.chunk], self.model)
            finite = np.isfinite(scores).all(axis=1)
            if not finite.all():
                raise ScoresOverflow(self.model.path, start + int(np.argmin(finite)))
            out[start:start + self.chunk] = reference.argmax(scores)
            return len(scores)

        # NumPy releases the GIL in its copies and BLAS calls: a thread per core, each with a
        # single-threaded BLAS, keeps every core busy, also through the im2col copies (measured
        # 2.4x faster than one thread driving a multi-threaded BLAS on 2 cores).
        from threadpoolctl import threadpool_limits  # imported here: start-up of GPU runs skips it

        with threadpool_limits(limits=1, user_api="blas"), ThreadPoolExecutor(self.threads) as pool:
            for done in pool.map(one, starts):
                if progress is not None:
                    progress.update(done)
        return out

    stream_block = 4096  # images per block when streaming from the file
    ring_depth = 3

    def forward_stream(self, ring, progress):
        """Labels of images streamed block by block from `ring`."""
        out = np.empty(ring.stop - ring.start, np.int64)
        for start, x, buf in ring:
            try:
                out[start - ring.start:start - ring.start + len(x)] = self.forward(x)
            except ScoresOverflow as e:
                raise e.shifted(start) from None
            ring.release(buf)
            progress.update(len(x))
        return out

    def stream(self, data, n, progress):
        """Images [0, n) of an open data file, streamed: see stream.through."""
        return through(self, data, 0, n, progress)

    def close(self):
        pass
