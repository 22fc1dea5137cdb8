"""nvCOMP's batched deflate decompressor through ctypes, from the `nvidia-libnvcomp-cu12` package
(the `gpu-decode` extra) or the library named by CNNINFER_NVCOMP. nvCOMP runs on the CUDA runtime,
which uses the device's primary context: the one CudaBackend makes current."""
import ctypes
import functools
import os

MAJOR = 6  # the C API these calls are written for (the decompress options arrived in 5)
CODECS = ("Deflate",)


class Opts(ctypes.Structure):
    """A codec's decompression options: 64 bytes, all zero being its defaults (the backend nvCOMP
    chooses, no sorting)."""
    _fields_ = [("raw", ctypes.c_char * 64)]


class Alignments(ctypes.Structure):
    _fields_ = [("input", ctypes.c_size_t), ("output", ctypes.c_size_t), ("temp", ctypes.c_size_t)]


def _path():
    given = os.environ.get("CNNINFER_NVCOMP")
    if given:
        return given
    try:
        import importlib.util

        spec = importlib.util.find_spec("nvidia.libnvcomp")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "lib64", f"libnvcomp.so.{MAJOR}")
    return path if os.path.exists(path) else None


@functools.lru_cache(maxsize=None)
def library():
    """(the loaded library, its version string), or (None, why not)."""
    path = _path()
    if path is None:
        return None, "nvCOMP is not installed (pip install 'cnninfer[gpu-decode]')"
    try:
        lib = ctypes.CDLL(path, ctypes.RTLD_LOCAL)
    except OSError as e:
        return None, f"nvCOMP ({path}) does not load: {e}"
    props = (ctypes.c_uint32 * 2)()
    if lib.nvcompGetProperties(ctypes.byref(props)) != 0:
        return None, f"nvCOMP ({path}) does not report its version"
    major, minor = props[0] // 1000, props[0] // 100 % 10
    if major != MAJOR:
        return None, f"nvCOMP {major}.{minor} ({path}): cnninfer is written for nvCOMP {MAJOR}"
    for codec in CODECS:
        base = f"nvcompBatched{codec}Decompress"
        getattr(lib, base + "GetRequiredAlignments").argtypes = [Opts, ctypes.POINTER(Alignments)]
        getattr(lib, base + "GetTempSize").argtypes = [ctypes.c_size_t, ctypes.c_size_t, Opts,
                                                       ctypes.POINTER(ctypes.c_size_t), ctypes.c_size_t, ctypes.c_void_p]
        getattr(lib, base + "Async").argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                                                                         ctypes.c_void_p, Opts, ctypes.c_void_p,
                                                                         ctypes.c_void_p]
    return lib, f"nvCOMP {major}.{minor}"


def alignments(codec):
    """The alignments (in bytes) a codec's decompression wants of its compressed and decoded
    streams and of its temporary memory."""
    lib, version = library()
    if lib is None:
        raise OSError(version)
    align = Alignments()
    Decompressor._call(getattr(lib, f"nvcompBatched{codec}DecompressGetRequiredAlignments"), Opts(), ctypes.byref(align))
    return align


class Decompressor:
    """One codec's batched decompression of up to `count` chunks of at most `chunk_bytes` each, with
    its temporary device memory (alloc(nbytes) gives device memory)."""

    def __init__(self, codec, count, chunk_bytes, alloc):
        lib, self.version = library()
        if lib is None:
            raise OSError(self.version)
        self.codec, self.lib, self.opts = codec, lib, Opts()
        base = f"nvcompBatched{codec}Decompress"
        self._async = getattr(lib, base + "Async")
        align = alignments(codec)
        self.input_align, self.output_align = align.input, align.output
        temp = ctypes.c_size_t(0)
        self._call(getattr(lib, base + "GetTempSize"), count, chunk_bytes, self.opts, ctypes.byref(temp),
                   count * chunk_bytes, None)
        self.temp_bytes = max(temp.value, 1)
        self.temp = alloc(self.temp_bytes)

    @staticmethod
    def _call(fn, *args):
        status = fn(*args)
        if status != 0:
            raise OSError(f"nvCOMP {fn.__name__} failed with status {status}")

    def __call__(self, stream, count, src_ptrs, src_bytes, dst_bytes, actual_bytes, dst_ptrs, statuses):
        """Queue the decompression of `count` chunks on stream (every argument a device address of
        an array of `count`: source pointers, source sizes, output capacities, decoded sizes (out),
        output pointers, statuses (out, int32))."""
        self._call(self._async, src_ptrs, src_bytes, dst_bytes, actual_bytes, count, int(self.temp), self.temp_bytes,
                   dst_ptrs, self.opts, statuses, stream.handle)
