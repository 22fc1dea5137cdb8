"""Data sets larger than the host-memory budget: a reader thread fills a ring of host buffers
(page-locked for CUDA) block by block while the backend computes on earlier blocks, so file
reading, upload and compute overlap and host memory stays bounded whatever the file's size."""
import queue
import sys
import threading
import time

import click
import numpy as np

from . import loader


class Ring:
    """Blocks of images [start, stop) of `data`, read ahead into `buffers`; iterate for
    (first image, images, buffer) and hand each buffer back with release() once uploaded."""

    def __init__(self, data, start, stop, buffers):
        self.data, self.start, self.stop = data, start, stop
        self.block, self.depth = len(buffers[0]), len(buffers)
        self.labels = np.empty(stop - start, np.int64)
        self.read_s = self.wait_s = 0.0  # reader busy; consumer waiting for the reader
        self.free, self.filled = queue.Queue(), queue.Queue()
        for b in buffers:
            self.free.put(b)
        self.thread = threading.Thread(target=self._read, name="cnninfer-reader", daemon=True)
        self.thread.start()

    def _read(self):
        try:
            for lo in range(self.start, self.stop, self.block):
                buf = self.free.get()
                if buf is None:  # the consumer gave up
                    return
                hi = min(self.stop, lo + self.block)
                t = time.perf_counter()
                loader.read_images(self.data, lo, hi, buf[:hi - lo])
                self.labels[lo - self.start:hi - self.start] = loader.read_labels(self.data, lo, hi)
                self.read_s += time.perf_counter() - t
                self.filled.put((lo, buf[:hi - lo], buf))
            self.filled.put(None)
        except BaseException as e:  # re-raised in the consumer's thread
            self.filled.put(e)

    def __iter__(self):
        while True:
            t = time.perf_counter()
            item = self.filled.get()
            self.wait_s += time.perf_counter() - t
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def release(self, buf):
        self.free.put(buf)

    def close(self):
        """Stop the reader (it finishes the block in hand) and wait for it."""
        self.free.put(None)
        self.thread.join()


def through(backend, data, start, stop, progress):
    """Images [start, stop) of `data` through `backend` via a ring of its own host buffers:
    (predictions, labels, reader busy seconds, seconds compute waited for the reader)."""
    shape = (backend.stream_block,) + data.x.shape[1:]
    ring = Ring(data, start, stop, [backend.host_buffer(shape) for _ in range(backend.ring_depth)])
    try:
        predictions = backend.forward_stream(ring, progress)
    finally:
        ring.close()
    return predictions, ring.labels, ring.read_s, ring.wait_s


class Progress:
    """A progress bar on stderr, shown once a run has taken 2 s, only when stderr is a terminal."""
    DELAY_S = 2.0

    def __init__(self, total, enabled=True):
        self.total, self.done, self.bar = total, 0, None
        self.enabled = enabled and sys.stderr.isatty()
        self.t0 = time.perf_counter()
        self.lock = threading.Lock()  # several GPUs' threads report

    def update(self, count):
        with self.lock:
            self._update(count)

    def _update(self, count):
        self.done += count
        if self.bar is not None:
            self.bar.update(count)
        elif self.enabled and time.perf_counter() - self.t0 > self.DELAY_S:
            self.bar = click.progressbar(length=self.total, label="images", file=sys.stderr)
            self.bar.__enter__()
            self.bar.update(self.done)

    def close(self):
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None


class NoProgress:
    def update(self, count):
        pass

    def close(self):
        pass
