"""The native read pool (read_pool.c): built once with the C compiler ($CC, cc or gcc), cached on
disk beside the kernels, loaded with ctypes. Where no compiler or build works, `library()` is None
and Python threads read instead; CNNINFER_NATIVE=0 forces that."""
import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from .atomic import replacing
from . import env

SOURCE = Path(__file__).with_name("read_pool.c")
FLAGS = ("-O2", "-shared", "-fPIC", "-pthread", "-Wall", "-Wextra", "-Werror")
EOF = 1  # rp_wait: the file ended before the bytes asked for


def compiler():
    for name in (os.environ.get("CC"), "cc", "gcc"):
        found = name and shutil.which(name)
        if found:
            return found
    return None


def build():
    """The shared library's path (compiled now if not cached), or None with no working compiler."""
    cc = compiler()
    if cc is None or not SOURCE.is_file():
        return None
    key = hashlib.sha256(repr((SOURCE.read_bytes(), FLAGS, os.uname().machine)).encode()).hexdigest()[:20]
    path = env.cache_root() / "native" / f"read_pool-{key}.so"
    if path.is_file():
        return path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with replacing(path) as tmp:
            subprocess.run([cc, *FLAGS, "-o", str(tmp), str(SOURCE)], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return path


@functools.lru_cache(maxsize=None)
def library():
    """The loaded read pool (ctypes), or None: no compiler, a failed build, or CNNINFER_NATIVE=0."""
    if not env.native():
        return None
    path = build()
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(str(path))
    except OSError:
        return None
    p, size = ctypes.c_void_p, ctypes.c_size_t
    for name, args, result in (("rp_create", [ctypes.c_int], p), ("rp_destroy", [p], None),
                               ("rp_submit", [p, ctypes.c_int, p, size, ctypes.c_longlong, size], p),
                               ("rp_wait", [p, p], ctypes.c_int), ("rp_busy_ns", [p], ctypes.c_longlong)):
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, result
    return lib


class ReadPool:
    """Native threads reading byte ranges of files into memory; submit() returns a ticket whose
    wait() blocks (without the interpreter lock) until its bytes are in."""

    def __init__(self, lib, threads):
        self.lib, self.threads = lib, threads
        self.pool = lib.rp_create(threads)
        if not self.pool:
            raise OSError("cannot start the native reader threads")

    def submit(self, fd, address, nbytes, offset, piece):
        ticket = self.lib.rp_submit(self.pool, fd, address, nbytes, offset, piece)
        if not ticket:
            raise MemoryError("no memory for a read's ticket")
        return ticket

    def wait(self, ticket):
        """0, EOF, or -errno (each ticket waited for exactly once)."""
        return self.lib.rp_wait(self.pool, ticket)

    @property
    def busy_s(self):
        return self.lib.rp_busy_ns(self.pool) / 1e9

    def close(self):
        if self.pool:
            self.lib.rp_destroy(self.pool)
            self.pool = None
