"""The CPU backend: the network in native code (cpu_net.c) where it builds, else the NumPy
reference layers; either way over chunks of images, a thread per core, memory bounded."""
import contextlib
import ctypes
import functools
import math
import platform
from typing import NamedTuple
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .. import env, reference
from .net import net_library
from . import winograd
from ..errors import BadValue, ScoresOverflow
from ..network import Geometry
from ..options import Options
from ..backend import Backend
from ..data.host import HostSide

NUMPY_CHUNK = 32  # small chunks keep each thread's im2col buffer in cache
NATIVE_CHUNK = 32, 1024  # the native path's chunk bounds: about four chunks per thread between them


def chunk_for(n, threads, native, asked=None):
    """Images per chunk of a batch of n: --chunk where given; else NUMPY_CHUNK for the NumPy layers,
    and for the native network about four chunks per thread, within NATIVE_CHUNK."""
    if asked:
        return asked
    if not native:
        return NUMPY_CHUNK
    low, high = NATIVE_CHUNK
    return min(high, max(low, math.ceil(n / (4 * threads))))


class Description(NamedTuple):
    """The CPU as a run plan sees it."""
    threads: int
    vector_bits: int  # the native network's vector width; 0 where the NumPy layers compute
    status: str  # why (cpu.net.net_status)

    def describe(self):
        how = f"native, {self.vector_bits}-bit vectors" if self.vector_bits else f"NumPy {np.__version__}"
        return f"CPU ({platform.machine()}, {self.threads} threads, {how})"


@functools.lru_cache(maxsize=None)
def _blas():
    """threadpoolctl's view of the loaded BLAS, found once: finding it costs ~0.7 ms a call, which
    was most of a one-image predict (imported here: start-up of GPU runs skips it)."""
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def _padded(a, axis, size):
    """a with zeros appended along axis up to size."""
    pad = [(0, 0)] * a.ndim
    pad[axis] = (0, size - a.shape[axis])
    return np.ascontiguousarray(np.pad(a, pad), dtype=np.float32)


class NativeNet:
    """The model's weights laid out for cpu_net.c (output channels zero-padded to the vector
    width), and the call that runs it on a chunk of images without the interpreter lock."""

    def __init__(self, lib, model, image_shape):
        self.lib, self.model = lib, model
        vw = lib.cn_vector_width()
        up = lambda n: -(-n // vw) * vw  # noqa: E731
        g = Geometry(*image_shape, model.conv1.shape[0], model.conv1.shape[3], model.conv2.shape[0],
                     model.conv2.shape[3], model.fc1.shape[1], model.fc2.shape[1])
        c1p, c2p, hidden_p, classes_p = up(g.c1), up(g.c2), up(g.hidden), up(g.classes)
        h2, w2 = g.pool2_out
        fc1 = model.fc1.reshape(h2, w2, g.c2, g.hidden)
        self.w1 = _padded(model.conv1, 3, c1p)
        self.w2 = _padded(_padded(model.conv2, 2, c1p), 3, c2p)
        # conv2 5x5: by Winograd's F(2x2, 5x5), 36 products per channel pair and pool window, not 100
        self.u2 = winograd.weights(self.w2) if g.k2 == winograd.K else None
        self.f1 = _padded(_padded(fc1, 2, c2p), 3, hidden_p).reshape(h2 * w2 * c2p, hidden_p)
        self.f2 = _padded(_padded(model.fc2, 0, hidden_p), 1, classes_p)
        self.geometry = np.array([g.h, g.w, g.c, g.k1, c1p, g.k2, c2p, h2 * w2 * c2p, hidden_p, g.classes, classes_p],
                                 np.int32)
        self.image_shape, self.classes = tuple(image_shape), g.classes

    def __call__(self, x, labels, scores):
        """Fill labels (int64) and scores (float32, C order) for x (N, H, W, C) float32; -1, or
        BadValue / ScoresOverflow for the first image (numbered in x) holding a value that is not
        finite / whose scores are not all finite."""
        x = np.ascontiguousarray(x, np.float32)
        ptr = lambda a: a.ctypes.data_as(ctypes.c_void_p)  # noqa: E731
        u2 = None if self.u2 is None else ptr(self.u2)
        bad = self.lib.cn_forward(ptr(x), len(x), ptr(self.geometry), ptr(self.w1), ptr(self.w2), u2, ptr(self.f1),
                                  ptr(self.f2), ptr(scores), ptr(labels))
        if bad == -2:
            raise MemoryError("no memory for the CPU network's scratch buffers")
        if bad <= -3:
            raise BadValue(-3 - bad)
        if bad >= 0:
            raise ScoresOverflow(self.model.path, bad)
        return bad


class CpuBackend(HostSide, Backend):
    name = "cpu"
    profile = None  # the CPU backend keeps no per-kernel timings
    concurrent = True  # forward keeps no state: calls from several threads may run at once
    stream_block = 4096  # images per block when streaming from the file
    ring_depth = 3

    def __init__(self, chunk=None, readers=None):
        self.chunk = chunk
        self.options = Options.of(chunk=chunk, readers=readers)  # the options its runs are planned with
        self.threads = env.cores()
        self.readers = readers
        self.model = None
        self.pool = None  # the compute threads, made on the first batch of several chunks
        self.lib = net_library()
        self.net = None  # NativeNet of the last model and image shape seen

    @property
    def checks_values(self):
        """The native network checks the images as it reads them; for NumPy, the reader does."""
        return self.lib is not None

    def description(self):
        from .net import net_status

        return Description(self.threads, self.lib.cn_vector_width() * 32 if self.lib else 0, net_status())

    @property
    def device(self):
        return self.description().describe()

    def _native(self, image_shape):
        """The NativeNet for the current model and these images (made once, kept while they stay)."""
        net = self.net
        if net is None or net.model is not self.model or net.image_shape != tuple(image_shape):
            net = self.net = NativeNet(self.lib, self.model, image_shape)
        return net

    @staticmethod
    def wire_dtype(stored):
        return np.dtype(np.float32)

    @staticmethod
    def new_host_buffer(shape, dtype):
        return np.empty(shape, dtype)

    def prepare(self, model, plan, source=None):
        self.model, self.keep_scores = model, plan.scores

    def use(self, model):
        """What forward needs, for calls that run at once (see Session._forward)."""
        self.model = model

    def forward(self, x, progress=None):
        """(predicted class, scores) of each image of x (N, H, W, C) float32 (both: the scores are
        there anyway, and forward depends on nothing but the model, so threads may share it)."""
        out = np.empty(len(x), np.int64)
        kept = np.empty((len(x), self.model.fc2.shape[1]), np.float32)
        chunk = chunk_for(len(x), self.threads, self.lib is not None, self.chunk)
        starts = range(0, len(x), chunk)
        net = self._native(x.shape[1:]) if self.lib else None

        def one(start):
            stop = min(start + chunk, len(x))
            if net is not None:
                try:
                    net(x[start:stop], out[start:stop], kept[start:stop])
                except (BadValue, ScoresOverflow) as e:
                    raise e.shifted(start) from None
                return stop - start
            with np.errstate(over="ignore", invalid="ignore"):
                scores = reference.scores(x[start:stop], self.model)
            finite = np.isfinite(scores).all(axis=1)
            if not finite.all():
                raise ScoresOverflow(self.model.path, start + int(np.argmin(finite)))
            out[start:stop], kept[start:stop] = reference.argmax(scores), scores
            return stop - start

        # Native calls and NumPy's copies and BLAS calls release the interpreter lock: a thread per
        # core (each with a single-threaded BLAS) keeps every core busy (for NumPy, measured 2.4x
        # faster than one thread driving a multi-threaded BLAS on 2 cores). One chunk runs on the
        # caller's thread.
        with _blas().limit(limits=1, user_api="blas") if net is None else contextlib.nullcontext():
            if len(starts) == 1:
                calls = [functools.partial(one, 0)]
            else:
                if self.pool is None:
                    self.pool = ThreadPoolExecutor(self.threads, thread_name_prefix="cnninfer-cpu")
                calls = [self.pool.submit(one, start).result for start in starts]
            failed = []
            for call in calls:
                try:
                    count = call()
                except (BadValue, ScoresOverflow) as e:
                    failed.append(e)
                    continue
                if progress is not None:
                    progress.update(count)
        if failed:  # as the other paths: the first image with a value that is not finite, else with overflow
            raise min(failed, key=lambda e: (not isinstance(e, BadValue), e.image))
        return out, kept

    def forward_stream(self, ring, progress, out):
        """Labels found (and scores) of images streamed block by block from `ring`, into out (see
        host.outputs)."""
        out, _, kept = out
        for start, x, buf in ring:
            at = start - ring.start
            try:
                labels, scores = self.forward(x)
            except (ScoresOverflow, BadValue) as e:
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
