"""What limits a streamed run, measured piece by piece on the device: reading a cached file into
page-locked memory on threads (piece size x threads), the upload alone, both at once, the reads
while the main thread keeps the GIL busy, and the file's pages registered for DMA in place (mmap +
cuMemHostRegister, read-only, on 1-16 threads), and the native read pool (infer/read_pool.c) with the main thread busy.
Usage:  python3 tools/device_reader_probe.py FILE.hdf5"""
import ctypes
import itertools
import mmap
import os
import sys
import threading
import time

import h5py
import numpy as np
import pycuda.autoinit  # a context for page-locked memory and copies
import pycuda.driver as cuda

RING = 256 << 20


def dataset(path):
    with h5py.File(path) as f:
        d = f["x"]
        return d.id.get_offset(), d.size * d.dtype.itemsize


def read(path, offset, nbytes, threads, piece, ring, busy_main=False, during=None):
    """GB/s reading nbytes at offset in `piece`-byte reads on `threads` threads into the ring."""
    slots = len(ring) // piece
    count = -(-nbytes // piece)
    ticket = itertools.count()
    fd = os.open(path, os.O_RDONLY)

    def work():
        while (i := next(ticket)) < count:
            lo = i * piece
            n = min(piece, nbytes - lo)
            dst = memoryview(ring)[(i % slots) * piece:(i % slots) * piece + n]
            done = 0
            while done < n:
                done += os.preadv(fd, [dst[done:]], offset + lo + done)

    t = time.perf_counter()
    ts = [threading.Thread(target=work) for _ in range(threads)]
    for th in ts:
        th.start()
    spins = 0
    if busy_main:  # the consumer doing Python work all the time (the worst case for the GIL)
        while any(th.is_alive() for th in ts):
            sum(range(200))
            spins += 1
    if during is not None:
        during()
    for th in ts:
        th.join()
    os.close(fd)
    return nbytes / (time.perf_counter() - t) / 1e9


def native_read(path, offset, nbytes, threads, ring, block=64 << 20, busy_main=False):
    """GB/s through the native pool: blocks of the ring submitted in turn, two in flight."""
    from infer import native

    pool = native.ReadPool(native.library(), threads)
    fd = os.open(path, os.O_RDONLY)
    base = ring.ctypes.data
    slots = len(ring) // block
    t = time.perf_counter()
    inflight = []
    for i, lo in enumerate(range(0, nbytes, block)):
        if len(inflight) == 2:
            assert pool.wait(inflight.pop(0)) == 0
            if busy_main:  # Python work between blocks, with the interpreter lock held
                for _ in range(2000):
                    sum(range(200))
        n = min(block, nbytes - lo)
        inflight.append(pool.submit(fd, base + (i % slots) * block, n, offset + lo, max(1 << 20, n // threads)))
    for ticket in inflight:
        assert pool.wait(ticket) == 0
    rate = nbytes / (time.perf_counter() - t) / 1e9
    pool.close()
    os.close(fd)
    return rate


def upload(nbytes, src, dev, stream, piece=32 << 20, whole=False):
    """GB/s copying nbytes from src in pieces, to the same device window (or across all of dev)."""
    t = time.perf_counter()
    for lo in range(0, nbytes, piece):
        n = min(piece, nbytes - lo)
        cuda.memcpy_htod_async(int(dev) + (lo if whole else lo % (len(src) // piece * piece)), src[:n], stream)
    stream.synchronize()
    return nbytes / (time.perf_counter() - t) / 1e9


def registered(path, offset, nbytes, window, dev, threads, copy=True):
    """GB/s uploading the file's bytes straight from a fresh mapping of it, window by window on
    `threads` threads (each with its own stream; ctypes calls release the GIL): register the
    window's pages for DMA (read-only), copy, unregister; copy=False registers only. And the share
    of a thread's time spent registering."""
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuMemHostRegister_v2.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
    lib.cuMemHostUnregister.argtypes = [ctypes.c_void_p]
    lib.cuMemcpyHtoDAsync_v2.argtypes = [ctypes.c_ulonglong, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    lib.cuStreamSynchronize.argtypes = [ctypes.c_void_p]
    fd = os.open(path, os.O_RDONLY)
    size = os.fstat(fd).st_size
    mm = mmap.mmap(fd, size, prot=mmap.PROT_READ)
    base = np.frombuffer(mm, np.uint8)
    lo, hi = base.ctypes.data + offset, base.ctypes.data + offset + nbytes
    page = mmap.PAGESIZE
    edges = list(range(lo // page * page, hi, window)) + [-(-hi // page) * page]  # page-aligned, disjoint
    windows, ticket, errors, reg = list(zip(edges[:-1], edges[1:])), itertools.count(), [], []

    streams = [cuda.Stream() for _ in range(threads)]  # made and freed where the context is current

    def work(stream):
        pycuda.autoinit.context.push()
        r = 0.0
        try:
            while (i := next(ticket)) < len(windows) and not errors:
                a, b = windows[i]
                t0 = time.perf_counter()
                if rc := lib.cuMemHostRegister_v2(a, b - a, 8):  # CU_MEMHOSTREGISTER_READ_ONLY
                    errors.append(f"cuMemHostRegister failed: CUDA error {rc}")
                r += time.perf_counter() - t0
                if copy and not rc:
                    s, e = max(a, lo), min(b, hi)
                    lib.cuMemcpyHtoDAsync_v2(int(dev) + (s - lo) % (RING - window), s, e - s, stream.handle)
                    lib.cuStreamSynchronize(stream.handle)
                t0 = time.perf_counter()
                if not rc:
                    lib.cuMemHostUnregister(a)
                r += time.perf_counter() - t0
        finally:
            reg.append(r)
            cuda.Context.pop()

    t = time.perf_counter()
    ts = [threading.Thread(target=work, args=(s,)) for s in streams]
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    wall = time.perf_counter() - t
    del base
    mm.close()
    os.close(fd)
    return errors[0] if errors else f"{nbytes / wall / 1e9:.1f} GB/s, a thread registering {100 * sum(reg) / threads / wall:.0f}% of the time"


def main(path):
    offset, nbytes = dataset(path)
    print(f"{path}: {nbytes / 1e9:.2f} GB of x at offset {offset}; {os.cpu_count()} CPUs")
    ring = cuda.pagelocked_empty(RING, np.uint8)
    ring[:] = 1
    src = cuda.pagelocked_empty(RING, np.uint8)
    dev = cuda.mem_alloc(RING)
    stream = cuda.Stream()
    read(path, offset, nbytes, 16, 4 << 20, ring)  # warm the page cache
    for piece in (1 << 20, 4 << 20, 16 << 20):
        rates = [read(path, offset, nbytes, t, piece, ring) for t in (1, 4, 8, 16)]
        print(f"read, {piece >> 20:2d} MB pieces, 1/4/8/16 threads: " + " ".join(f"{r:5.1f}" for r in rates) + " GB/s")
    print(f"upload alone (32 MB pieces): {upload(nbytes, src, dev, stream):.1f} GB/s")
    fresh = cuda.mem_alloc(nbytes)
    first, again = (upload(nbytes, src, fresh, stream, whole=True) for _ in range(2))
    print(f"upload into {nbytes >> 20} MiB of fresh device memory: first pass {first:.1f} GB/s, again {again:.1f}")
    fresh.free()
    up = {}
    r = read(path, offset, nbytes, 16, 4 << 20, ring, during=lambda: up.setdefault("u", upload(nbytes, src, dev, stream)))
    print(f"both at once: read {r:.1f} GB/s (16 threads, 4 MB), upload {up['u']:.1f} GB/s")
    for t in (4, 16):
        print(f"read with the main thread busy in Python, {t} threads, 4 MB: "
              f"{read(path, offset, nbytes, t, 4 << 20, ring, busy_main=True):.1f} GB/s")
    for t in (4, 8, 16):
        print(f"native pool, {t} threads, 64 MB blocks: {native_read(path, offset, nbytes, t, ring):.1f} GB/s; "
              f"with the main thread busy between blocks: {native_read(path, offset, nbytes, t, ring, busy_main=True):.1f}")
    for copy in (False, True):
        for window in (16 << 20, 64 << 20):
            for t in (1, 2, 4, 8, 16):
                print(f"{'registered in place + copied' if copy else 'registered only'}, {window >> 20} MB windows, "
                      f"{t} threads: {registered(path, offset, nbytes, window, dev, t, copy)}", flush=True)

if __name__ == "__main__":
    main(sys.argv[1])
