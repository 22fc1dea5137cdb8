"""The Python API: a Session keeps a model, a backend (CUDA context, kernels, weights, buffers and
reader threads) between calls.

    import cnninfer
    with cnninfer.Session("model.hdf5") as s:
        labels = s.predict(images)          # (N, H, W, C) array of any integer or float type
        result = s.evaluate("testfull.hdf5")  # what `cnninfer run --json` reports

Every bad input raises InputError (a ValueError) with the one line the command line prints. A
Session may be shared by any number of threads, each call getting the answers it would get alone
(see Session).
"""
import os
import sys
import threading
import time
import weakref

import numpy as np

from . import backend as backends, env, network
from .data import codes, defaults, loader
from .data.dataset import DataSet, expand
from .errors import BadValue, InputError
from .gpu.home import Holder, Home
from .options import Options
from .data.reader import INLINE_BYTES, Inline, wait
from .result import Result
from .progress import NoProgress, Progress


def host_budget():
    """Bytes of images read into host memory at once; larger inputs are streamed."""
    return env.host_budget_mb() * 2**20


def streams(data, wire, stream_from=None):
    """Whether the images of DataSet `data`, in type `wire`, stream rather than being read whole:
    past the host budget, or past `stream_from` bytes where the backend has one (the GPU's: from
    two blocks on, reading, uploads and compute overlap, where a whole read pins and fills one
    buffer before anything computes)."""
    size = data.size * data.image_bytes(wire)
    return size > host_budget() or (stream_from is not None and size > stream_from)


def wire_type(backend, data):
    """The type `data`'s images travel to `backend` in: its wire type for the stored one, or 8-bit
    codes (codes.py) for float32 files of them where the backend takes codes."""
    wire = backend.wire_dtype(data.dtype)
    if wire == np.float32 and backend.takes_codes:
        return data.codes_wire() or wire
    return wire


def _as_given(data, wire):
    """The one in-memory array behind `data` when the backend can read it as it is (the wire type,
    C order), else None."""
    if data.kind != "array" or len(data.parts) != 1:
        return None
    x = data.parts[0][1].array
    return x if x.dtype == wire and x.flags.c_contiguous else None


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


_said = set()


def _notice(line):
    """The default notice: on stderr, each line once a process (every Session of a machine
    without a GPU would say the same)."""
    if line not in _said:
        _said.add(line)
        print(line, file=sys.stderr)


class Session:
    """A model on a backend, ready for repeated calls.

    model: a path to an HDF5 model, a mapping {conv1, conv2, fc1, fc2} of arrays, or None for the
    bundled model. backend: "auto" (CUDA when usable, else the CPU with one notice), "cuda" or
    "cpu". The other options are the command line's (see options.Options): chunk, readers,
    streams, tile_width, conv_algo, gemm_algo, device, devices (a list of GPU numbers or "all"),
    fast_math, profile, decode, precision ("certified": float16 where certified, the rest exact, the
    same answers; "exact"; None: certified for runs of 5,120 images or more uploaded a byte a pixel
    without scores where conv_algo is "auto", see --precision); a name not among them is a TypeError.

    Thread-safe: calls from several threads give each the answers it would get alone. On the GPU
    they take turns (each call keeps the GPU busy; one set of buffers) on one thread of the
    session's own, which holds the CUDA context from its creation to close(), so any thread may
    call or close; the CPU backend's in-memory calls run at once on its shared compute threads
    (see _forward).

    close() (or `with`) releases it at once; a Session dropped, or alive at interpreter exit, is
    released then, quietly (home.py). In a process forked from the one that made it, a GPU
    Session raises ForkedSession (a RuntimeError: make the Session in the child); a CPU Session
    starts a backend of the child's own.
    """

    def __init__(self, model=None, backend="auto", *, notice=_notice, **options):
        t = time.perf_counter()
        self.options = Options.of(**options)
        if backend not in backends.NAMES:
            raise InputError(f"backend must be one of {', '.join(backends.NAMES)}, not {backend!r}")
        env.check()
        self.model = _model(model)
        self.load_ms = _ms(t)  # counted in the first call's timing, as one run of the command line does
        self.setup_ms = 0.0
        self.closed = False
        self.backend_name = backend
        self._notice = notice
        self._own()

    def _own(self):
        """What this process's Session holds: the backend's holder (with, for a GPU, the thread
        the backend lives on: a CUDA context stays current in the thread that made it), its
        release, the locks. The backend (for CUDA: the context, kernels, weights) starts with the
        first call, after that call's input has been checked: a bad file costs no GPU start-up."""
        self._holder = Holder(None if self.backend_name == "cpu" else Home())
        self._release = weakref.finalize(self, self._holder.release)
        self.lock = threading.RLock()  # one call at a time on the backend and its buffers
        self._calls = threading.Condition()  # calls running outside the lock (see _forward)
        self._running = 0

    @property
    def backend(self):
        return self._holder.backend

    def _here(self):
        """Refuse (GPU) or start afresh (CPU: the parent's threads are not in this process) in a
        process forked after the Session was made."""
        if not self._holder.forked:
            return
        self._holder.check()
        self._release()  # leaves the parent's backend untouched
        self._own()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Release the backend: device memory, page-locked buffers, the CUDA context, threads.
        Waits for a call in progress on another thread; later calls raise InputError."""
        if self._holder.forked:  # the parent's locks may be held by threads this process lacks
            self.closed = True
            self._release()
            return
        with self.lock:
            with self._calls:
                self.closed = True
                self._calls.wait_for(lambda: self._running == 0)
            self._release()

    @property
    def classes(self):
        return self.model.fc2.shape[1]

    def _backend(self, data=None):
        """The backend, made by the first call, for its DataSet `data` where given (see _decode)."""
        if self.closed:
            raise InputError("this session is closed")
        if self.backend is None:
            t = time.perf_counter()
            kwargs = dict(self.options.backend_kwargs(), decode=self._decode(data))
            self._holder.backend = self._at_home(backends.create, self.backend_name, self._notice, **kwargs)
            self.setup_ms += _ms(t)
        return self.backend

    def _decode(self, data):
        """--decode for the backend about to be made: with auto, "auto" (on the GPU where it can)
        where the first call's file, past the host budget, has chunks the GPU decodes, else "host". The
        choice is made once: GPU decoding needs more hardware queues, asked for as the driver starts,
        which cost the process ~80 MB of host memory (H100); its start-up (~0.2 s a process) outweighs
        its speed on files within the budget, which stream decoded by the host."""
        if self.options.decode != "auto":
            return self.options.decode
        if self.backend_name == "cpu" or data is None:
            return "host"
        from .gpu import chunk_decode, plan

        wire = plan.wire_dtype(data.dtype)
        return "auto" if streams(data, wire) and chunk_decode.unsupported(data, wire) is None else "host"

    @property
    def executor(self):
        """The backend's own thread (None where calls run on the caller's): a caller that drives
        the session from one thread of its own (the server's batches) can use this one instead."""
        return self._holder.home

    def _at_home(self, fn, *args, **kwargs):
        """fn(*args, **kwargs) on the backend's own thread (where there is one), whoever calls."""
        return self._holder.call(lambda: fn(*args, **kwargs))

    @property
    def device(self):
        """What runs the network (the GPU or the CPU), once the backend has started, else None."""
        return None if self.backend is None else self.backend.device

    def predict(self, x):
        """The predicted class (int64) of each image of x, an (N, H, W, C) array."""
        return self.classify(x)[0]

    def scores(self, x):
        """The class scores (N, classes) float32 of each image of x, an (N, H, W, C) array."""
        return self.classify(x, scores=True)[1]

    def classify(self, x, scores=False):
        """(predicted classes int64 (N,), scores float32 (N, classes) or None) of x's images, both
        from one forward pass."""
        self._here()
        x = np.asarray(x)
        if x.dtype.kind not in "iuf":
            raise InputError(f"x: type {x.dtype} is not a number type (integer or float)")
        if x.ndim != 4:
            raise InputError(f"x: shape {x.shape}, expected (N, H, W, C) images")
        if len(x) == 0:
            network.geometry(self.model, (1,) + x.shape[1:], "x")
            return np.empty(0, np.int64), np.empty((0, self.classes), np.float32)
        data = DataSet.from_array(x)
        predictions, _, kept, _, _ = self._forward(data, scores, NoProgress())
        return predictions, kept if scores else None

    def evaluate(self, data, n=None, *, scores=False, progress=False):
        """Classify the first n images (all by default) of one data file, or of several taken as
        one data set (a list of paths, glob patterns allowed): a Result (see `as_dict`)."""
        self._here()
        t = time.perf_counter()
        paths = expand([data] if isinstance(data, (str, os.PathLike)) else list(data))
        if not paths:
            raise InputError("no data file given")
        dataset = DataSet.open(paths, self.model, n)
        try:
            load_ms = _ms(t)
            bar = Progress(dataset.size) if progress else NoProgress()
            with self.lock:
                try:
                    predictions, labels, kept, timing, recomputed = self._forward(dataset, scores, bar)
                finally:
                    bar.close()
                timing["load"] += load_ms + self.load_ms
                self.load_ms = 0.0
                backend = self._backend()
                return Result(data_paths=paths, model_path=self.model.path, shape=(dataset.size,) + dataset.image_shape,
                              predictions=predictions, labels=labels, scores=kept, classes=self.classes,
                              shards=dataset.shards, backend=backend.name, device=backend.device,
                              profile=backend.profile, timing=timing, streamed="read" in timing, recomputed=recomputed,
                              reader=dict(layout=dataset.kind, filters=dataset.filters, threads=backend.reader_threads,
                                          pool=backend.reader.kind, decode=getattr(backend, "decoding", "host"),
                                          wire=codes.NAMES.get(dataset.wire, str(dataset.wire))))
        finally:
            dataset.close()

    def _forward(self, data, scores, progress):
        """(predictions, labels or None, scores or None, timing in ms, images the certified pipeline
        recomputed exactly or None) for every image of `data`.
        Calls take turns on the backend (the lock), except where it keeps no state between prepare
        and forward (the CPU backend's in-memory path): there each call has its own image buffer
        and runs at once, on the backend's shared compute threads."""
        with self.lock:
            backend = self._backend(data)
        network.geometry(self.model, (data.size,) + tuple(data.image_shape), data.parts[0][0])
        try:
            return self._forward_as(data, scores, progress, wire_type(backend, data))
        except codes.NotCodes:  # a float32 value past the first image was no 8-bit code
            data.no_codes()
            progress.restart()
            return self._forward_as(data, scores, progress, wire_type(backend, data))

    def _forward_as(self, data, scores, progress, wire):
        """_forward with the images travelling in type `wire`."""
        with self.lock:
            backend = self._backend()
        n = data.size
        x_shape = (n,) + tuple(data.image_shape)
        data.wire = wire
        streamed = streams(data, wire, backend.stream_from)
        if backend.concurrent and not streamed:
            with self._calls:
                if self.closed:
                    raise InputError("this session is closed")
                self._running += 1
            try:
                return self._run(backend, data, scores, progress, x_shape, wire, streamed, at_once=True)
            finally:
                with self._calls:
                    self._running -= 1
                    self._calls.notify_all()
        with self.lock:
            backend = self._backend()  # closed meanwhile?
            return self._at_home(self._run, backend, data, scores, progress, x_shape, wire, streamed)

    def _run(self, backend, data, scores, progress, x_shape, wire, streamed, at_once=False):
        n = x_shape[0]
        t = time.perf_counter()
        if at_once:  # only the model, not prepare's per-call settings (keep_scores)
            backend.use(self.model)
        else:
            backend.prepare(self.model, x_shape, scores, wire, streamed, data.align, data if streamed else None)
        counter = None if at_once else getattr(backend, "recomputed", None)
        if counter is not None:
            counter()  # from zero: prepare's warm-up ran the network too
        timing = dict(load=0.0, prepare=_ms(t))
        try:
            if streamed:
                t = time.perf_counter()
                predictions, labels, kept, read_s, wait_s = backend.stream(data, 0, n, progress)
                timing.update(read=read_s * 1e3, wait=wait_s * 1e3, forward=_ms(t))
            else:
                t = time.perf_counter()
                labels = None if data.classes is None else np.empty(n, np.int64)
                given = _as_given(data, wire) if at_once and backend.checks_values else None
                if given is not None:  # the caller's array as it is: no copy (the backend checks the values)
                    x, futures = given, []
                else:
                    x = backend.new_host_buffer(x_shape, wire) if at_once else backend.host_buffers(x_shape, wire)[0]
                    small = data.kind == "array" and x.nbytes <= INLINE_BYTES
                    futures = data.submit_images(Inline if small else backend.reader, 0, n, x,
                                                 check=not backend.checks_values)
                if labels is not None:
                    futures += data.submit_labels(backend.reader, 0, n, labels)
                wait(futures)
                timing["load"] = _ms(t)
                t = time.perf_counter()
                predictions, kept = backend.forward(x, progress)
                timing["forward"] = _ms(t)
        except BadValue as e:
            raise data.bad_value(e.image) from None
        with self._calls:
            timing["prepare"] += self.setup_ms
            self.setup_ms = 0.0
        return predictions, labels, kept if scores else None, timing, None if counter is None else counter()


def run(data_path, model_path, n=None, backend="auto", notice=print, progress=False, scores=False, **options):
    """Classify the first n images of data_path (a path, or a list of shards taken as one data set)
    with the model; `options` go to the backend. Images that fit the host budget are read whole,
    then timed from host memory to labels in host memory; larger inputs stream from the files
    through a ring of buffers, and `forward` then includes the reading (timing read: the reader
    threads' mean busy time, wait: compute waiting for them)."""
    with Session(model_path, backend, notice=notice, **options) as session:
        return session.evaluate(data_path, n, scores=scores, progress=progress)
