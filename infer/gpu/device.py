"""The CUDA device and its context: made by the command that needs it, released by close()."""
import ctypes
import os
from typing import NamedTuple

from ..errors import BackendUnavailable, InputError


_KEPT = set()  # GPUs whose primary context this process keeps retained until it exits

# Hardware queues GPU decoding asks for (the uploads', the network's, MAX_STREAMS decode streams). Each
# costs the process ~10 MB of host memory, which the 400 MB peak RSS aim counts (1M images, H200: 24
# queues 463-475 MB, 32 510-556, against 16's 382-395).
DECODE_QUEUES = 16


def ask_hardware_queues(count):
    """How many hardware queues each context of this process gets (CUDA_DEVICE_MAX_CONNECTIONS,
    8 by default), unless the environment says: streams share them, and work waiting at the head of
    one blocks the streams queued behind it. The driver reads it once, as it starts (cuInit), so
    this must come before anything starts the driver: `--devices all` counted the GPUs first and
    its contexts had 8 (two H200s with --decode gpu streamed gzip 1 at 4.0M images/s, 6.8-7.4M with 32)."""
    if count:
        os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", str(count))


def visible_devices():
    """How many CUDA GPUs this process sees (BackendUnavailable without a driver)."""
    import pycuda.driver as cuda

    try:
        cuda.init()
        return cuda.Device.count()
    except cuda.Error as e:
        raise BackendUnavailable(f"the CUDA driver could not start: {e}") from None


class Description(NamedTuple):
    """A GPU as a run plan sees it: a Device's (description()), or one of KNOWN, to plan for a GPU
    that is not here."""
    name: str
    arch: str  # sm_XY
    memory: int  # bytes of device memory
    free: int  # bytes free for a run
    sms: int
    l2_bytes: int
    driver: str = ""  # the CUDA driver's version, e.g. "13.0"

    def describe(self):
        return f"{self.name} ({self.arch}, {self.memory / 2**30:.0f} GiB" + (f", CUDA driver {self.driver})" if self.driver else ")")


def described(name, memory_gib, arch, sms, l2_mib):
    memory = memory_gib << 30
    return Description(name, arch, memory, memory - (600 << 20), sms, l2_mib << 20)  # about what a context leaves


KNOWN = {  # --gpu of `cnninfer plan`, and the plan's unit tests
    "H200": described("NVIDIA H200", 140, "sm_90", 132, 60),
    "H100": described("NVIDIA H100 80GB HBM3", 80, "sm_90", 132, 50),
    "A100": described("NVIDIA A100-SXM4-80GB", 80, "sm_80", 108, 40),
    "L4": described("NVIDIA L4", 22, "sm_89", 58, 48),
    "T4": described("Tesla T4", 15, "sm_75", 40, 4),
}


class Device:
    def __init__(self, ordinal=0, hardware_queues=None):
        """hardware_queues: see ask_hardware_queues."""
        import pycuda.driver as cuda

        self.cuda = cuda
        ask_hardware_queues(hardware_queues)
        try:
            cuda.init()
            count = cuda.Device.count()
        except cuda.Error as e:
            raise BackendUnavailable(f"the CUDA driver could not start: {e}") from None
        if count == 0:
            raise BackendUnavailable("no CUDA GPU is visible")
        if not 0 <= ordinal < count:
            raise InputError(f"--device {ordinal}: this machine has {count} CUDA GPU(s), numbered from 0")
        self.ordinal = ordinal
        self.dev = cuda.Device(ordinal)
        major, minor = self.dev.compute_capability()
        self.arch = f"sm_{major}{minor}"
        self.context = self.dev.retain_primary_context()
        self.context.push()

    @property
    def name(self):
        return self.dev.name()

    @property
    def l2_bytes(self):
        return self.dev.get_attribute(self.cuda.device_attribute.L2_CACHE_SIZE)

    @property
    def sms(self):
        return self.dev.get_attribute(self.cuda.device_attribute.MULTIPROCESSOR_COUNT)

    @property
    def memory(self):
        return self.dev.total_memory()

    def description(self, free=None):
        """This GPU's Description, with the memory free now (asked of this context: on its thread)."""
        driver = self.cuda.get_driver_version()
        free = self.cuda.mem_get_info()[0] if free is None else free
        return Description(self.name, self.arch, self.memory, free, self.sms, self.l2_bytes,
                           f"{driver // 1000}.{driver % 1000 // 10}")

    def describe(self):
        """In words, without the memory free (any thread: it needs no current context)."""
        return self.description(free=0).describe()

    def close(self):
        """Pop the context. The first Device of a GPU keeps its reference to the primary context
        for the process's life, as PyTorch does: the last release destroys the context (~0.3 s of a
        cold run's 1.05 s, H200) and the next Session would make it again; later Devices release
        theirs. The kept one is never freed by Python (its destructor would run at interpreter
        exit, on a thread without the context): the driver ends it with the process."""
        if self.context is not None:
            self.context.pop()
            if self.ordinal in _KEPT:
                self.context.detach()
            else:
                _KEPT.add(self.ordinal)
                ctypes.pythonapi.Py_IncRef(ctypes.py_object(self.context))
            self.context = None
