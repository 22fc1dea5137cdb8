"""Memory a caller already holds, page-locked where it lies (cuMemHostRegister), so a pass uploads
images from it with one DMA instead of first copying them into the backend's own page-locked
buffer: the server engine's view of its front ends' shared memory, where that copy was 30% of the
engine's time under 4096-image requests. Every call runs on the thread the context is current on."""
import ctypes

PORTABLE, READ_ONLY = 0x01, 0x08  # CU_MEMHOSTREGISTER_*: any context may copy; the pages are read only

_driver = None


def _lib():
    global _driver
    if _driver is None:
        lib = ctypes.CDLL("libcuda.so.1")
        lib.cuMemHostRegister_v2.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
        lib.cuMemHostUnregister.argtypes = [ctypes.c_void_p]
        lib.cuMemHostRegister_v2.restype = lib.cuMemHostUnregister.restype = ctypes.c_int
        _driver = lib
    return _driver


class Registered:
    """The arrays registered, by address: the arrays themselves are kept (their memory stays
    mapped until unregistered)."""

    def __init__(self):
        self.arrays = {}  # address -> array

    def add(self, array):
        """Register array's memory (C-contiguous, one byte or more): whether the driver took it (a
        read-only mapping needs a driver and system that register read-only pages)."""
        start = array.ctypes.data
        if start in self.arrays:
            return True
        if not array.flags.c_contiguous or not array.nbytes:
            return False
        flags = PORTABLE | (0 if array.flags.writeable else READ_ONLY)
        if _lib().cuMemHostRegister_v2(start, array.nbytes, flags):
            return False
        self.arrays[start] = array
        return True

    def remove(self, array):
        if self.arrays.pop(array.ctypes.data, None) is not None:
            _lib().cuMemHostUnregister(array.ctypes.data)

    def holds(self, x):
        """Whether all of x's memory lies in one registered array (x C-contiguous)."""
        if not self.arrays or not x.flags.c_contiguous:
            return False
        start = x.ctypes.data
        return any(at <= start and start + x.nbytes <= at + a.nbytes for at, a in self.arrays.items())

    def clear(self):
        for array in list(self.arrays.values()):
            self.remove(array)
