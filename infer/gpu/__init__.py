"""The CUDA backend: kernels in cuda/*.cu compiled by nvcc to cubins (cached on disk), loaded and
launched through PyCUDA. Nothing here touches the GPU at import time."""
from ..errors import BackendUnavailable, InputError


def create(devices=None, **options):
    """The CUDA backend on one GPU, or on several (devices: a list of numbers, or "all"), or
    BackendUnavailable saying why it cannot run here."""
    if devices != "all" and devices and len(set(devices)) != len(devices):
        # Two contexts on one GPU share its legacy stream: one's graph capture fails the other's calls
        raise InputError(f"devices: GPU numbers must be distinct, got {list(devices)}")
    try:
        from .backend import CudaBackend
        from .device import DECODE_QUEUES, ask_hardware_queues, visible_devices
        from .multi import MultiGpuBackend
    except ImportError as e:
        raise BackendUnavailable(f"the CUDA backend needs PyCUDA ({e}); install it with: pip install 'cnninfer[cuda]'") from None
    if options.get("decode") in ("gpu", "auto"):
        ask_hardware_queues(DECODE_QUEUES)  # before the driver starts
    if devices == "all":
        devices = list(range(visible_devices()))
    if devices and len(devices) > 1:
        return MultiGpuBackend(devices, **options)
    if devices:
        options["device"] = devices[0]
    return CudaBackend(**options)
