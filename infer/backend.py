"""The backend contract: what Session (and serve, bench) may call on a backend, one base class for
CpuBackend (cpu/backend.py), CudaBackend (gpu/backend.py) and MultiGpuBackend (gpu/multi.py).

A backend is made with its options (the CPU's: chunk and readers; a GPU's: every Options field),
describes its device to the run plan (infer/plan.py), then runs plans: prepare(model, plan)
makes ready what the plan says (kernels, weights, buffers), forward or stream computes. It chooses
nothing a plan decides. Made by session.create_backend (`auto`: CUDA where usable, else the CPU).
"""
from .options import BACKENDS as NAMES  # noqa: F401 (the names --backend takes)


class Backend:
    name = None  # cuda or cpu
    options = None  # the Options its runs are planned with
    checks_values = False  # whether it checks float32 images itself (else the readers do)
    concurrent = False  # in-memory runs keep no state between prepare and forward: may run at once (use, forward)
    profile = None  # per-kernel timings of the last run, where kept
    decoding = "host"  # where the last streamed run's chunks were decoded, for --json
    devices = ()  # the GPU numbers it runs on
    fallback = None  # why --backend auto did not take CUDA, where it did not (a CpuBackend)

    def description(self):
        """The device as a plan sees it: gpu.device.Description, or cpu.backend.Description."""
        raise NotImplementedError

    @property
    def device(self):
        """The device in words."""
        return self.description().describe()

    def prepare(self, model, plan, source=None):
        """Make ready the run `plan` describes (source: the DataSet a streamed plan reads)."""
        raise NotImplementedError

    def prepared_for(self, model, plan):
        """Whether prepare(model, plan) would find all of it ready (the last prepare was of this
        plan and model, and nothing has changed since): forward may then run without it."""
        return False

    def use(self, model):
        """What forward needs for in-memory runs that skip prepare (concurrent backends only)."""
        raise NotImplementedError

    def forward(self, x, progress=None):
        """(labels int64, scores float32 or None) of images x in a host buffer of the plan's wire type."""
        raise NotImplementedError

    def stream(self, data, start, stop, progress):
        """Images [start, stop) of DataSet data streamed: (labels found, true labels, scores or None,
        reader busy seconds, seconds compute waited)."""
        raise NotImplementedError

    def host_buffers(self, shape, dtype, count=1):
        """Host buffers the backend reads (page-locked for CUDA), kept for repeated runs."""
        raise NotImplementedError

    def new_host_buffer(self, shape, dtype):
        """A host buffer of the caller's own (calls that run at once each have theirs)."""
        raise NotImplementedError

    def pin(self, array):
        """Make `array`'s memory (the caller keeps it mapped until unpin) one forward may read in
        place (reads_in_place): whether it could. Only a CUDA backend can."""
        return False

    def unpin(self, array):
        """Undo pin(array) (nothing where it was not pinned)."""

    def reads_in_place(self, x):
        """Whether forward(x, in_place=True) may read images x where they lie, the run prepared
        for them (x lies in pinned memory and the run's images stay on the device)."""
        return False

    @property
    def reader(self):
        """The reader threads (data/reader.Reader)."""
        raise NotImplementedError

    @property
    def reader_threads(self):
        raise NotImplementedError

    def recomputed(self):
        """Images the certified pass recomputed exactly since the last call, or None where every
        image is computed exactly."""
        return None

    def close(self):
        raise NotImplementedError
