"""The CPU backend: the NumPy reference layers, run over chunks of images so memory stays bounded."""
import functools
import os
import platform
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from . import reference
from .errors import ScoresOverflow
from .stream import HostSide

DEFAULT_CHUNK = 32  # small chunks keep each thread's im2col buffer in cache


@functools.lru_cache(maxsize=None)
def _blas():
    """threadpoolctl's view of the loaded BLAS, found once: finding it costs ~0.7 ms a call, which
    was most of a one-image predict (imported here: start-up of GPU runs skips it)."""
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


class CpuBackend(HostSide):
    name = "cpu"
    profile = None  # the CPU backend keeps no per-kernel timings
    checks_values = False  # the reader checks the images on its threads
    concurrent = True  # forward keeps no state: calls from several threads may run at once
    stream_block = 4096  # images per block when streaming from the file
    ring_depth = 3

    def __init__(self, chunk=None, readers=None):
        self.chunk = chunk or DEFAULT_CHUNK
        self.threads = os.cpu_count() or 1
        self.readers = readers
        self.model = None
        self.pool = None  # the compute threads, made on the first batch of several chunks

    @property
    def device(self):
        return f"CPU ({platform.machine()}, {self.threads} threads, NumPy {np.__version__})"

    @staticmethod
    def wire_dtype(stored):
        return np.dtype(np.float32)

    @staticmethod
    def new_host_buffer(shape, dtype):
        return np.empty(shape, dtype)

    def prepare(self, model, x_shape, scores=False, wire=np.float32, streamed=False):
        self.model, self.keep_scores = model, scores

    def use(self, model):
        """What forward needs, for calls that run at once (see Session._forward)."""
        self.model = model

    def forward(self, x, progress=None):
        """(predicted class, scores) of each image of x (N, H, W, C) float32 (both: the scores are
        there anyway, and forward depends on nothing but the model, so threads may share it)."""
        out = np.empty(len(x), np.int64)
        kept = np.empty((len(x), self.model.fc2.shape[1]), np.float32)
        starts = range(0, len(x), self.chunk)

        def one(start):
            with np.errstate(over="ignore", invalid="ignore"):
                scores = reference.scores(x[start:start + self.chunk], self.model)
            finite = np.isfinite(scores).all(axis=1)
            if not finite.all():
                raise ScoresOverflow(self.model.path, start + int(np.argmin(finite)))
            out[start:start + self.chunk] = reference.argmax(scores)
            kept[start:start + self.chunk] = scores
            return len(scores)

        # NumPy releases the GIL in its copies and BLAS calls: a thread per core, each with a
        # single-threaded BLAS, keeps every core busy, also through the im2col copies (measured
        # 2.4x faster than one thread driving a multi-threaded BLAS on 2 cores). One chunk runs
        # on the caller's thread.
        with _blas().limit(limits=1, user_api="blas"):
            if len(starts) == 1:
                done = map(one, starts)
            else:
                if self.pool is None:
                    self.pool = ThreadPoolExecutor(self.threads, thread_name_prefix="cnninfer-cpu")
                done = self.pool.map(one, starts)
            for count in done:
                if progress is not None:
                    progress.update(count)
        return out, kept

    def forward_stream(self, ring, progress, out):
        """Labels found (and scores) of images streamed block by block from `ring`, into out (see
        stream.outputs)."""
        out, _, kept = out
        for start, x, buf in ring:
            at = start - ring.start
            try:
                labels, scores = self.forward(x)
            except ScoresOverflow as e:
                raise e.shifted(start) from None
            out[at:at + len(x)] = labels
            if kept is not None:
                kept[at:at + len(x)] = scores
            ring.release(buf)
            progress.update(len(x))

    def close(self):
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None
        self.close_host()
