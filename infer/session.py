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

from . import env, network, plan as planning
from .backend import NAMES as BACKENDS
from .data import codes, defaults, loader
from .data.dataset import DataSet, expand
from .errors import BackendUnavailable, BadValue, InputError
from .gpu.home import Holder, Home
from .options import Options
from .data.reader import INLINE_BYTES, Inline, wait
from .result import Result
from .progress import NoProgress, Progress


def host_budget():
    """Bytes of images read into host memory at once; larger inputs are streamed."""
    return env.host_budget_mb() * 2**20


def _as_given(data, wire):
    """The one in-memory array behind `data` when the backend can read it as it is (the wire type,
    C order), else None."""
    if data.kind != "array" or len(data.parts) != 1:
        return None
    x = data.parts[0][1].array
    return x if x.dtype == wire and x.flags.c_contiguous else None


def _paths(data):
    """The data file paths of one path or several (glob patterns expanded); none is an InputError."""
    paths = expand([data] if isinstance(data, (str, os.PathLike)) else list(data))
    if not paths:
        raise InputError("no data file given")
    return paths


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


def create_backend(name, notice, chunk=None, readers=None, **cuda_options):
    """A ready backend by name ("auto", "cuda", "cpu"); `notice` takes the line saying that `auto`
    fell back to the CPU (the CpuBackend's `fallback` says why, for its plans)."""
    from . import gpu
    from .cpu.backend import CpuBackend

    if name == "cpu":
        if cuda_options.get("decode") == "gpu":
            raise InputError("--decode gpu needs the CUDA backend")
        return CpuBackend(chunk=chunk, readers=readers)
    try:
        return gpu.create(chunk=chunk, readers=readers, **cuda_options)
    except BackendUnavailable as e:
        if name == "cuda":
            raise
        notice(f"cnninfer: CUDA backend not usable ({e.message}); using the CPU backend")
        backend = CpuBackend(chunk=chunk, readers=readers)
        backend.fallback = e.message
        return backend


class Session:
    """A model on a backend, ready for repeated calls.

    model: a path to an HDF5 model, a mapping {conv1, conv2, fc1, fc2} of arrays, or None for the
    bundled model. backend: "auto" (CUDA when usable, else the CPU with one notice), "cuda" or
    "cpu". The other options are the command line's (see options.Options): chunk, readers,
    streams, tile_width, conv_algo, gemm_algo, device, devices (a list of GPU numbers or "all"),
    fast_math, profile, decode, precision ("certified": float16 where certified, the rest exact, the
    same answers; "exact"; None: certified for runs of 5,120 images or more uploaded a byte a pixel
    or less (8-bit codes, uint8, chunks the GPU decodes) without scores where conv_algo is "auto",
    see --precision); a name not among them is a TypeError.

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
        if backend not in BACKENDS:
            raise InputError(f"backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
        env.check()
        self.model = _model(model)
        self.load_ms = _ms(t)  # counted in the first call's timing, as one run of the command line does
        self.setup_ms = 0.0
        self.closed = False
        self.backend_name = backend
        self._notice = notice
        self._said = set()  # the plans' notices said so far (each once a session)
        self._plans = {}  # plans of in-memory arrays, by their description and scores (a server's batches)
        self._again = {}  # (shape, dtype, scores) -> the plan of small arrays passed again as they are (_repeat)
        self.last_plan = None  # the plan of the last run
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
        """The backend, made by the first call, for its DataSet `data` where given: where a GPU
        backend decodes chunks is settled then (plan.decode_mode)."""
        if self.closed:
            raise InputError("this session is closed")
        if self.backend is None:
            t = time.perf_counter()
            described = None if data is None or self.backend_name == "cpu" else planning.Data.of(data)
            kwargs = dict(self.options.backend_kwargs(),
                          decode=planning.decode_mode(described, self.options, host_budget()))
            self._holder.backend = self._at_home(create_backend, self.backend_name, self._notice, **kwargs)
            self.setup_ms += _ms(t)
        return self.backend

    def _plan(self, data, scores):
        """The plan of a run of DataSet `data` on this session's backend (infer/plan.py): made
        here, once a run, its notices said once a session; the backend then chooses nothing."""
        backend = self.backend
        described = planning.Data.of(data)
        key = (described, bool(scores)) if data.kind == "array" else None
        run = self._plans.get(key) if key is not None else None
        if run is None:
            if backend.name == "cpu":
                reason = (f"auto: CUDA is not usable here ({backend.fallback})" if backend.fallback else "--backend cpu")
            else:
                reason = "auto: a CUDA GPU is usable here" if self.backend_name == "auto" else "--backend cuda"
            run = planning.make(described, network.geometry(self.model, (data.size,) + tuple(data.image_shape), data.parts[0][0]),
                                self._at_home(backend.description), self.options, scores, budget=host_budget(),
                                backend_reason=reason, decoding_mode=backend.options.decode, devices=backend.devices,
                                model_path=self.model.path)
            if key is not None:
                if len(self._plans) >= 64:
                    self._plans.clear()
                self._plans[key] = run
        for line in run.notices:
            if line not in self._said:
                self._said.add(line)
                self._notice(line)
        self.last_plan = run
        return run

    def plan(self, data, n=None, scores=False):
        """The plan a call of evaluate(data, n, scores=scores) would run (a Plan; .as_dict() is what
        `run --json` reports under "plan"), made without a forward pass: the backend starts (for a
        GPU, its context; no kernel is compiled) and the files' first images are read."""
        self._here()
        paths = _paths(data)
        dataset = DataSet.open(paths, self.model, n)
        try:
            with self.lock:
                self._backend(dataset)
                return self._plan(dataset, scores)
        finally:
            dataset.close()

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

    def pin(self, array):
        """Let calls read images that lie in `array`'s memory (C-contiguous, read-only or not)
        where they lie: a GPU backend registers it page-locked (cuMemHostRegister), so a call on
        a view of it uploads with one copy to the device, none on the host. Whether it could (a
        started CUDA backend, a driver that takes the pages). The memory stays mapped, and must
        hold the images a call reads until it returns, until unpin(array)."""
        self._here()
        with self.lock:
            backend = self._backend()
            return self._at_home(backend.pin, array)

    def unpin(self, array):
        """Undo pin(array); calls after it copy images out of that memory as any others."""
        self._here()
        with self.lock:
            if self.backend is not None:
                self._at_home(self.backend.unpin, array)

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
        key = (x.shape, x.dtype.str, bool(scores))
        again = self._again.get(key)
        if again is not None and x.flags.c_contiguous:
            out = self._repeat(x, again)
            if out is not None:
                return out
        data = DataSet.from_array(x)
        predictions, _, kept, _, _ = self._forward(data, scores, NoProgress())
        run = self.last_plan  # this call's, unless another thread's call ended meanwhile: checked
        if (self.backend.checks_values and not self.backend.concurrent and not run.streamed
                and x.nbytes <= INLINE_BYTES and np.dtype(run.wire) == x.dtype and run.n == len(x)
                and tuple(run.image_shape) == x.shape[1:] and run.scores == bool(scores)):
            if len(self._again) >= 64:
                self._again.clear()
            self._again[key] = run
        return predictions, kept if scores else None

    def _repeat(self, x, run):
        """classify's pass over a small array of the shape, type and scores of an earlier call,
        its plan `run` still the one the backend holds prepared: that call's checks and plan stand,
        so what is left is the copy into page-locked memory and the forward pass (a server's lone
        requests: the checks, the DataSet and the plan were ~55 us of a 125 us pass). None where
        the backend was prepared for another run since (the caller then takes the full path)."""
        def here():
            backend = self.backend
            if backend is None or not backend.prepared_for(self.model, run):
                return None
            in_place = backend.reads_in_place(x)
            if not in_place:
                buf = backend.host_buffers(x.shape, x.dtype)[0]
                np.copyto(buf, x, casting="no")
            try:
                predictions, kept = backend.forward(x, in_place=True) if in_place else backend.forward(buf)
            except BadValue as e:
                raise DataSet.from_array(x).bad_value(e.image) from None
            self.last_plan = run
            return predictions, kept if run.scores else None

        with self.lock:
            if self.closed:
                raise InputError("this session is closed")
            return self._at_home(here)

    def evaluate(self, data, n=None, *, scores=False, progress=False):
        """Classify the first n images (all by default) of one data file, or of several taken as
        one data set (a list of paths, glob patterns allowed): a Result (see `as_dict`)."""
        self._here()
        t = time.perf_counter()
        paths = _paths(data)
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
                                          pool=backend.reader.kind, decode=backend.decoding,
                                          wire=codes.NAMES.get(dataset.wire, str(dataset.wire))),
                              plan=self.last_plan.as_dict())
        finally:
            dataset.close()

    def _forward(self, data, scores, progress):
        """(predictions, labels or None, scores or None, timing in ms, images the certified pipeline
        recomputed exactly or None) for every image of `data`.
        Calls take turns on the backend (the lock), except where it keeps no state between prepare
        and forward (the CPU backend's in-memory path): there each call has its own image buffer
        and runs at once, on the backend's shared compute threads."""
        with self.lock:
            self._backend(data)
        network.geometry(self.model, (data.size,) + tuple(data.image_shape), data.parts[0][0])
        try:
            return self._forward_planned(data, scores, progress)
        except codes.NotCodes:  # a float32 value past the first images was no 8-bit code
            data.no_codes()
            progress.restart()
            return self._forward_planned(data, scores, progress)

    def _forward_planned(self, data, scores, progress):
        """_forward as the run's plan says."""
        with self.lock:
            backend = self._backend()
            run = self._plan(data, scores)
        data.wire = run.wire
        if backend.concurrent and not run.streamed:
            with self._calls:
                if self.closed:
                    raise InputError("this session is closed")
                self._running += 1
            try:
                return self._run(backend, data, run, progress, at_once=True)
            finally:
                with self._calls:
                    self._running -= 1
                    self._calls.notify_all()
        with self.lock:
            backend = self._backend()  # closed meanwhile?
            return self._at_home(self._run, backend, data, run, progress)

    def _run(self, backend, data, run, progress, at_once=False):
        n, wire, streamed, scores = data.size, run.wire, run.streamed, run.scores
        x_shape = (n,) + tuple(data.image_shape)
        t = time.perf_counter()
        if at_once:  # only the model, not prepare's per-call settings (keep_scores)
            backend.use(self.model)
        else:
            backend.prepare(self.model, run, data if streamed else None)
        counter = None if at_once else backend.recomputed
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
                given = _as_given(data, wire) if backend.checks_values else None
                in_place = not at_once and given is not None and backend.reads_in_place(given)
                if given is not None and (at_once or in_place):  # the caller's array as it is: no copy
                    x, futures = given, []  # (the backend checks the values)
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
                predictions, kept = backend.forward(x, progress, in_place=True) if in_place else backend.forward(x, progress)
                timing["forward"] = _ms(t)
        except BadValue as e:
            raise data.bad_value(e.image) from None
        with self._calls:
            timing["prepare"] += self.setup_ms
            self.setup_ms = 0.0
        return predictions, labels, kept if scores else None, timing, None if counter is None else counter()


def plan_for(gpu, data, model=None, n=None, scores=False, **options):
    """The plan of a run of the first n images of data (paths) with the model on a described GPU
    (gpu.device.Description, e.g. KNOWN["H100"]) that need not be here: `cnninfer plan --gpu`."""
    options = Options.of(**options)
    model = _model(model)
    paths = _paths(data)
    dataset = DataSet.open(paths, model, n)
    try:
        d = planning.Data.of(dataset)
        devices = options.devices if options.devices not in (None, "all") else [options.device]
        return planning.make(d, network.geometry(model, (d.size,) + d.image_shape, paths[0]), gpu, options, scores,
                             budget=host_budget(), backend_reason=f"{gpu.name}, described (not this machine's)",
                             decoding_mode=planning.decode_mode(d, options, host_budget()), devices=devices,
                             model_path=model.path)
    finally:
        dataset.close()


def run(data_path, model_path, n=None, backend="auto", notice=print, progress=False, scores=False, **options):
    """Classify the first n images of data_path (a path, or a list of shards taken as one data set)
    with the model; `options` go to the backend. Images that fit the host budget are read whole,
    then timed from host memory to labels in host memory; larger inputs stream from the files
    through a ring of buffers, and `forward` then includes the reading (timing read: the reader
    threads' mean busy time, wait: compute waiting for them)."""
    with Session(model_path, backend, notice=notice, **options) as session:
        return session.evaluate(data_path, n, scores=scores, progress=progress)
