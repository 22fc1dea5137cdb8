"""Stream decoders (launch.FrameDecoder's kernels) on the GPU against their host builds: the cuda/
headers compiled by the C compiler with -DZSTD_HOST (a warp's lanes become one thread), every
stream of a test in one launch."""
import ctypes
import subprocess

import numpy as np
import pytest

from infer.data import native
from tests.conftest import REPO

OK = 0  # a stream's status where it decoded (launch.FrameDecoder.OK)


def host_library(folder, header):
    """cuda/<header> compiled for the host into folder: the loaded library."""
    cc = native.compiler()
    if cc is None:
        pytest.skip("no C compiler")
    path = folder / (header.replace(".", "_") + ".so")
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", "-x", "c", "-DZSTD_HOST",
                    str(REPO / "cuda" / header), "-o", str(path)], check=True, capture_output=True)
    return ctypes.CDLL(str(path))


def host_decode(call, stream, cap, guard):
    """call(src, size, out, cap, &decoded) on stream into an output of cap bytes and `guard` more
    that must stay untouched: (status, bytes written)."""
    src = np.frombuffer(stream, np.uint8).copy()
    out = np.full(cap + guard, 0xA5, np.uint8)
    got = ctypes.c_longlong(-1)
    status = call(src.ctypes.data, src.size, out.ctypes.data, cap, ctypes.byref(got))
    assert (out[cap:] == 0xA5).all(), "written past the output"
    return status, out[:got.value].tobytes()


def on_gpu(cases, kernel, guard=64, *scratch):
    """Every (stream, cap) in one launch of kernel (a launch.FrameDecoder: Zstd, ZstdApart, Lzf), each
    stream at another misalignment, its output `guard` bytes short of the next: (statuses, decoded
    sizes, outputs, where each output starts)."""
    import pycuda.driver as cuda

    n = len(cases)
    src, at = bytearray(), []
    for k, (frame, _) in enumerate(cases):
        src += bytes(-len(src) % 16 + k % 16)
        at.append(len(src))
        src += frame
    src += bytes(16)
    size = [-(-(cap + guard) // 256) * 256 for _, cap in cases]
    outs = np.concatenate([[0], np.cumsum(size)])
    d_src = cuda.to_device(np.frombuffer(bytes(src), np.uint8))
    d_out = cuda.to_device(np.full(int(outs[-1]), 0xA5, np.uint8))
    table = np.array([[int(d_src) + a for a in at], [len(f) for f, _ in cases], [c for _, c in cases], [0] * n,
                      [int(d_out) + int(o) for o in outs[:-1]]], np.uint64)
    d_table, d_status = cuda.to_device(table), cuda.to_device(np.full(n, -1, np.int32))
    row = [int(d_table) + 8 * n * k for k in range(5)]
    kernel(cuda.Stream(), n, row[0], row[1], row[2], row[3], row[4], d_status, *scratch)
    cuda.Context.synchronize()
    return (cuda.from_device_like(d_status, np.zeros(n, np.int32)), cuda.from_device_like(d_table, table)[3].astype(
        np.int64), cuda.from_device_like(d_out, np.zeros(int(outs[-1]), np.uint8)), outs)


def assert_as_on_the_host(cases, got, decode, guard=64, same_status=True):
    """on_gpu's result `got` against decode(stream, cap) -> (status, bytes) on the host: the same
    status (or only OK or not), the same bytes where OK, nothing written past any output."""
    status, sizes, out, outs = got
    for k, (frame, cap) in enumerate(cases):
        want_status, want = decode(frame, cap)[:2]
        assert status[k] == want_status if same_status else (status[k] == OK) == (want_status == OK), k
        assert (out[outs[k] + cap:outs[k] + cap + guard] == 0xA5).all(), k
        if want_status == OK:
            assert sizes[k] == len(want) and out[outs[k]:outs[k] + len(want)].tobytes() == want, k
