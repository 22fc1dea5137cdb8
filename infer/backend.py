"""Backends behind one interface: wire_dtype(stored type) (the type images travel in),
host_buffers(shape, dtype, count), reader (a reader.Reader), checks_values (whether the backend
checks float32 images itself), prepare(model, x_shape, scores), forward(x) -> (labels, scores),
stream(data, start, stop, progress), close().

`auto` takes CUDA when it is usable here, else the CPU with one notice line.
"""
from .errors import BackendUnavailable, InputError
from .options import BACKENDS as NAMES  # noqa: F401


def create_cuda(devices=None, **options):
    """The CUDA backend on one GPU, or on several (devices: a list of numbers, or "all"), or
    BackendUnavailable saying why it cannot run here."""
    if devices != "all" and devices and len(set(devices)) != len(devices):
        # Two contexts on one GPU share its legacy stream: one's graph capture fails the other's calls
        raise InputError(f"devices: GPU numbers must be distinct, got {list(devices)}")
    try:
        from .gpu.backend import CudaBackend
        from .gpu.device import DECODE_QUEUES, ask_hardware_queues, visible_devices
        from .gpu.multi import MultiGpuBackend
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


def once(notice):
    """notice, saying each distinct line only the first time (several GPUs, one message)."""
    said = set()

    def say(line):
        if line not in said:
            said.add(line)
            notice(line)
    return say


def create(name, notice, chunk=None, readers=None, **cuda_options):
    """A ready backend by name; `notice` takes the one-line notices: when `auto` falls back to the
    CPU, when an option has no effect on the algorithm that runs."""
    from .cpu.backend import CpuBackend

    if name == "cpu":
        if cuda_options.get("decode") == "gpu":
            raise InputError("--decode gpu needs the CUDA backend")
        return CpuBackend(chunk=chunk, readers=readers)
    try:
        return create_cuda(chunk=chunk, readers=readers, notice=once(notice), **cuda_options)
    except BackendUnavailable as e:
        if name == "cuda":
            raise
        notice(f"cnninfer: CUDA backend not usable ({e.message}); using the CPU backend")
        return CpuBackend(chunk=chunk, readers=readers)
