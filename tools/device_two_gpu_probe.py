"""What bounds streaming one file into several GPUs on the host side, without any compute: each
GPU's share of a cached file read into its own page-locked ring by its own threads (os.preadv,
which releases the GIL), the rings uploaded to their GPUs, and both at once, for 1 GPU (the whole
file) and for every GPU (a contiguous share each). Prints GB/s and the images/s they allow
(float32: bytes per image = the dataset's). Usage (nvidia-h200-x2):
    python3 tools/make_big.py "$CNNINFER_DATA" /tmp big && python3 tools/device_two_gpu_probe.py /tmp/big.hdf5"""
import os
import sys
import threading
import time

import h5py
import pycuda.driver as cuda

RING, PIECE, READERS = 256 << 20, 4 << 20, 8


def dataset(path):
    with h5py.File(path) as f:
        d = f["x"]
        return d.id.get_offset(), d.size * d.dtype.itemsize, d.shape[0]


class Gpu:
    """A context, a page-locked ring and a device buffer of the same size, on device `ordinal`."""

    def __init__(self, ordinal):
        self.ctx = cuda.Device(ordinal).make_context()
        self.ring = cuda.pagelocked_empty(RING, "u1")
        self.dev = cuda.mem_alloc(RING)
        self.stream = cuda.Stream()
        cuda.Context.pop()

    def close(self):
        self.ctx.push()
        self.dev.free()
        self.ring.base.free()
        cuda.Context.pop()
        self.ctx.detach()

    def read(self, path, offset, nbytes):
        """Read [offset, + nbytes) of the file into the ring, piece by piece, on READERS threads."""
        count, lock, state = -(-nbytes // PIECE), threading.Lock(), {"next": 0}
        fd = os.open(path, os.O_RDONLY)

        def work():
            while True:
                with lock:
                    i = state["next"]
                    state["next"] += 1
                if i >= count:
                    return
                lo, slot = i * PIECE, (i % (RING // PIECE)) * PIECE
                n, done = min(PIECE, nbytes - lo), 0
                dst = memoryview(self.ring)[slot:slot + n]
                while done < n:
                    done += os.preadv(fd, [dst[done:]], offset + lo + done)

        threads = [threading.Thread(target=work) for _ in range(READERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        os.close(fd)

    def upload(self, nbytes):
        """Upload the ring to the device until nbytes have gone."""
        self.ctx.push()
        try:
            for lo in range(0, nbytes, RING):
                cuda.memcpy_htod_async(self.dev, self.ring[:min(RING, nbytes - lo)], self.stream)
            self.stream.synchronize()
        finally:
            cuda.Context.pop()


def timed(jobs):
    """Seconds for the jobs (callables) run at once, one thread each."""
    threads = [threading.Thread(target=j) for j in jobs]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return time.perf_counter() - t


def main(path):
    cuda.init()
    offset, nbytes, n = dataset(path)
    per_image = nbytes / n
    gpus = [Gpu(i) for i in range(cuda.Device.count())]
    print(f"{path}: {n} images, {nbytes / 1e9:.2f} GB; {len(gpus)} GPUs, {READERS} reader threads each, "
          f"{PIECE >> 20} MB reads, {os.cpu_count()} CPUs")
    for used in sorted({1, len(gpus)}):
        share = nbytes // used
        parts = [(g, offset + i * share, share) for i, g in enumerate(gpus[:used])]
        for name, jobs in (("read", [lambda g=g, o=o, s=s: g.read(path, o, s) for g, o, s in parts]),
                           ("upload", [lambda g=g, s=s: g.upload(s) for g, _, s in parts]),
                           ("read + upload", [lambda g=g, o=o, s=s: g.read(path, o, s) for g, o, s in parts]
                            + [lambda g=g, s=s: g.upload(s) for g, _, s in parts])):
            best = min(timed(jobs) for _ in range(3))
            moved = share * used
            print(f"{used} GPU(s) {name:14}: {moved / best / 1e9:6.1f} GB/s = {moved / per_image / best / 1e6:5.2f}M images/s "
                  f"(best of 3, {best * 1e3:.0f} ms)", flush=True)
    for g in gpus:
        g.close()


if __name__ == "__main__":
    main(sys.argv[1])
