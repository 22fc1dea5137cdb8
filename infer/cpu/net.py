"""The CPU network in C (cpu_net.c), built for this machine's vector unit by data/native.py's
`build` and loaded with ctypes; where no compiler or build works, `net_library()` is None and the
NumPy layers compute instead (CNNINFER_NATIVE=0 forces it)."""
import ctypes
import functools
from pathlib import Path

from .. import env
from ..data.native import FAILED, FLAGS, _load, build

HERE = Path(__file__).parent
# The network's code is tuned to the vector width it finds; -march=native makes it this machine's,
# so the cache key names the CPU too. Without -march=native (a compiler that lacks it), the baseline.
NET_COMMON = ("-O3", "-ffp-contract=fast", *FLAGS[1:])
NET_FLAGS = (("-march=native", *NET_COMMON), NET_COMMON)


@functools.lru_cache(maxsize=None)
def net_library():
    """The loaded CPU network (cpu_net.c, see backend.NativeNet), or None: no compiler, a failed build,
    or CNNINFER_NATIVE=0."""
    if not env.native():
        return None
    for flags in NET_FLAGS:
        lib = load_net(flags)
        if lib:
            return lib
    return None


def net_status():
    """The CPU backend's kind, in one line: the native network (its vectors, its library) or the
    NumPy fallback and why."""
    if not env.native():
        return "NumPy layers (CNNINFER_NATIVE=0)"
    lib = net_library()
    if lib is None:
        return f"NumPy layers, the fallback: {FAILED.get('cpu_net', 'the native network did not load')}"
    return (f"native C (infer/cpu/cpu_net.c), {lib.cn_vector_width() * 32}-bit vectors, library "
            f"{Path(lib._name).parent}")


def load_net(flags):
    """cpu_net.c built with these flags and loaded, or None."""
    path = build(HERE / "cpu_net.c", flags, machine_specific=True)
    lib = path and _load(path)
    if not lib:
        return None
    p, i64 = ctypes.c_void_p, ctypes.c_longlong
    lib.cn_vector_width.argtypes, lib.cn_vector_width.restype = [], ctypes.c_int
    lib.cn_forward.argtypes, lib.cn_forward.restype = [p, i64, p, p, p, p, p, p, p, p], i64
    return lib
