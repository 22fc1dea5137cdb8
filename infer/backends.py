"""Backends behind one interface: host_buffer(shape), prepare(model), forward(x) -> labels, close().

`auto` takes CUDA when it is usable here, else the CPU with one notice line.
"""
from .cpu import CpuBackend
from .errors import BackendUnavailable

NAMES = ("auto", "cuda", "cpu")


def create_cuda(devices=None, **options):
    """The CUDA backend on one GPU, or on several (devices: a list of numbers, or "all"), or
    BackendUnavailable saying why it cannot run here."""
    try:
        from .gpu.backend import CudaBackend
        from .gpu.device import visible_devices
        from .gpu.multi import MultiGpuBackend
    except ImportError as e:
        raise BackendUnavailable(f"the CUDA backend needs PyCUDA ({e}); install it with: pip install 'cnninfer[cuda]'") from None
    if devices == "all":
        devices = list(range(visible_devices()))
    if devices and len(devices) > 1:
        return MultiGpuBackend(devices, **options)
    if devices:
        options["device"] = devices[0]
    return CudaBackend(**options)


def create(name, notice, chunk=None, **cuda_options):
    """A ready backend by name; `notice` takes the one line said when `auto` falls back to the CPU."""
    if name == "cpu":
        return CpuBackend(chunk=chunk)
    try:
        return create_cuda(chunk=chunk, **cuda_options)
    except BackendUnavailable as e:
        if name == "cuda":
            raise
        notice(f"cnninfer: CUDA backend not usable ({e.message}); using the CPU backend")
        return CpuBackend(chunk=chunk)
