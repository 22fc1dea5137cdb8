"""The CNNINFER_* environment variables, each read and checked in one place: a bad value is an
InputError (one line, exit 2 on the command line), never a traceback or a silent default.

    CNNINFER_HOST_BUDGET_MB  whole MiB of images read into host memory at once (0 or more; 512);
                             larger inputs stream (on the GPU, any over two blocks: plan.STREAM_FROM)
    CNNINFER_NATIVE          0 or 1: native code (1: the read pool, the CPU network) or Python
                             reader threads and the NumPy layers (0)
    CNNINFER_GRAPHS          0 or 1: replay each batch's enqueue as a CUDA graph (1) or not (0)
    CNNINFER_CODES           0 or 1: float32 files of 8-bit pixels travel to a GPU as their codes (1)
                             or as float32 (0); see codes.py
    CNNINFER_CACHE           folder of the kernel and native-library caches (~/.cache/cnninfer)

(CNNINFER_SERVE_TOKEN is `serve --token`'s, read by click: any string is a token.)
"""
import os
from pathlib import Path

from .errors import InputError

DEFAULT_HOST_BUDGET_MB = 512


def _get(name):
    value = os.environ.get(name)
    return None if value is None else value.strip()


def host_budget_mb():
    value = _get("CNNINFER_HOST_BUDGET_MB")
    if value is None or value == "":
        return DEFAULT_HOST_BUDGET_MB
    if not value.isdigit():
        raise InputError(f"CNNINFER_HOST_BUDGET_MB: {value!r} is not a whole number of MiB (0 or more)")
    return int(value)


def flag(name, default=True):
    """A 0/1 switch; unset or empty means `default`."""
    value = _get(name)
    if value is None or value == "":
        return default
    if value not in ("0", "1"):
        raise InputError(f"{name}: {value!r} must be 0 or 1")
    return value == "1"


def native():
    return flag("CNNINFER_NATIVE")


def graphs():
    return flag("CNNINFER_GRAPHS")


def codes():
    return flag("CNNINFER_CODES")


def cache_root():
    """The folder under which compiled kernels and the native read pool are cached."""
    value = _get("CNNINFER_CACHE")
    if value:
        path = Path(value).expanduser()
        if path.exists() and not path.is_dir():
            raise InputError(f"CNNINFER_CACHE: {value} exists and is not a folder")
        return path
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cnninfer"


def cores():
    """The CPUs this process may run on (its affinity: taskset, a container's cpuset), else all."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def check():
    """Every variable checked at once (the command line calls this before any work)."""
    host_budget_mb()
    native()
    graphs()
    codes()
    cache_root()
