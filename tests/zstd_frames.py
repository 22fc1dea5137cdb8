"""Zstandard frames for the tests: made and decoded by libzstd (hdf5plugin's Zstd plugin exports its
functions), and decoded by cuda/zstd.cuh built for the host (the decoders zstd_kernel1 and 2 run, one
thread instead of a warp's lanes)."""
import ctypes

import numpy as np
import pytest

from tests.stream_kernels import host_decode, host_library

# ZSTD_cParameter values (zstd.h): level, window log, content size and checksum flags
LEVEL, WINDOW_LOG, CONTENT_SIZE, CHECKSUM = 100, 101, 200, 201
OK, BAD, FULL = 0, 1, 2


def libzstd():
    hdf5plugin = pytest.importorskip("hdf5plugin")
    lib = ctypes.CDLL(f"{hdf5plugin.PLUGIN_PATH}/libh5zstd.so")
    size, p = ctypes.c_size_t, ctypes.c_void_p
    lib.ZSTD_compressBound.restype = size
    lib.ZSTD_compressBound.argtypes = [size]
    lib.ZSTD_createCCtx.restype = p
    lib.ZSTD_freeCCtx.argtypes = [p]
    lib.ZSTD_CCtx_setParameter.restype = size
    lib.ZSTD_CCtx_setParameter.argtypes = [p, ctypes.c_int, ctypes.c_int]
    lib.ZSTD_compress2.restype = size
    lib.ZSTD_compress2.argtypes = [p, p, size, p, size]
    lib.ZSTD_decompress.restype = size
    lib.ZSTD_decompress.argtypes = [p, size, p, size]
    lib.ZSTD_isError.restype = ctypes.c_uint
    lib.ZSTD_isError.argtypes = [size]
    return lib


def compress(lib, data, level=3, params=None):
    """data (bytes-like) as one frame; params: zstd.h parameter numbers -> values."""
    src = np.frombuffer(bytes(data), np.uint8)
    out = np.empty(lib.ZSTD_compressBound(src.size), np.uint8)
    cctx = lib.ZSTD_createCCtx()
    try:
        for key, value in {LEVEL: level, **(params or {})}.items():
            assert not lib.ZSTD_isError(lib.ZSTD_CCtx_setParameter(cctx, key, value))
        n = lib.ZSTD_compress2(cctx, out.ctypes.data, out.size, src.ctypes.data, src.size)
    finally:
        lib.ZSTD_freeCCtx(cctx)
    assert not lib.ZSTD_isError(n)
    return out[:n].tobytes()


def lib_decompress(lib, frame, cap):
    """libzstd's bytes, or None where it refuses the frame."""
    src = np.frombuffer(frame, np.uint8)
    out = np.zeros(max(cap, 1), np.uint8)
    n = lib.ZSTD_decompress(out.ctypes.data, cap, src.ctypes.data, src.size)
    return None if lib.ZSTD_isError(n) else out[:n].tobytes()


@pytest.fixture(scope="session")
def host_build(tmp_path_factory):
    """cuda/zstd.cuh compiled by the C compiler (-DZSTD_HOST): its decoders on one host thread."""
    lib = host_library(tmp_path_factory.mktemp("zstd"), "zstd.cuh")
    p, n = ctypes.c_void_p, ctypes.c_longlong
    lib.zstd_host_decode.argtypes = [p, n, p, n, ctypes.POINTER(n)]
    lib.zstd_host_decode2.argtypes = [p, n, p, n, ctypes.POINTER(n), p, n, ctypes.POINTER(ctypes.c_int)]
    return lib


@pytest.fixture(scope="session")
def host_decoder(host_build):
    """decode(frame, cap) -> (status, bytes written): zstd_kernel1's decoder (zstd_frame)."""
    return lambda frame, cap, guard=64: host_decode(host_build.zstd_host_decode, frame, cap, guard)


@pytest.fixture(scope="session")
def host_decoder2(host_build):
    """decode(frame, cap, scratch_bytes) -> (status, bytes written, whether its blocks were decoded
    apart): zstd_kernel2's way, the blocks decoded apart last to first, each with tables of junk."""
    def decode(frame, cap, scratch_bytes=None, guard=64):
        scratch_bytes = 4 * cap + 4096 if scratch_bytes is None else scratch_bytes
        scratch = np.zeros(max(scratch_bytes, 1), np.uint8)
        planned = ctypes.c_int(-1)

        def call(*args):
            return host_build.zstd_host_decode2(*args, scratch.ctypes.data, scratch_bytes, ctypes.byref(planned))
        status, got = host_decode(call, frame, cap, guard)
        return status, got, planned.value == 1
    return decode
