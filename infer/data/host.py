"""What the CPU and CUDA backends share on the host: buffers kept for repeated runs, the reader
threads, and data sets larger than the host-memory budget streamed through a ring of host buffers
(page-locked for CUDA) that reader threads fill block by block while the backend computes on
earlier blocks, so file reading, upload and compute overlap and host memory stays bounded."""
import queue
import threading
import time

import numpy as np

from . import reader


class Ring:
    """Blocks of `block` images [start, stop) of a data set, read ahead into `buffers` by the
    reader's threads (several blocks in flight); iterate for (first image, images, buffer) in order
    and hand each buffer back with release() once it has been consumed. The images of a block are
    view(buffer, count) (default: the buffer's first rows) as data.submit_images fills them."""

    def __init__(self, data, start, stop, buffers, block, pool, check, labels, view=None):
        self.data, self.start, self.stop, self.pool, self.check = data, start, stop, pool, check
        self.view = view or (lambda buf, count: buf[:count])  # a buffer as a block of `count` images
        self.block, self.depth = block, len(buffers)
        self.labels = labels  # (stop - start) int64, filled with the true labels
        self.wait_s = 0.0  # the consumer waiting for reads
        # Labels are only needed at the end: a block goes to compute once its images are in
        self.label_reads = []
        self.free, self.filled = queue.Queue(), queue.Queue()
        for b in buffers:
            self.free.put(b)
        self.thread = threading.Thread(target=self._schedule, name="cnninfer-ring", daemon=True)
        self.thread.start()

    def _schedule(self):
        """Submit each block's reads as soon as a buffer is free; blocks complete in any order."""
        try:
            for lo in range(self.start, self.stop, self.block):
                buf = self.free.get()
                if buf is None:  # the consumer gave up
                    return
                hi = min(self.stop, lo + self.block)
                x = self.view(buf, hi - lo)
                futures = self.data.submit_images(self.pool, lo, hi, x, self.check)
                if self.data.classes is not None:
                    self.label_reads += self.data.submit_labels(self.pool, lo, hi,
                                                                self.labels[lo - self.start:hi - self.start])
                self.filled.put((lo, x, buf, futures))
            self.filled.put(None)
        except BaseException as e:  # re-raised in the consumer's thread
            self.filled.put(e)

    def __iter__(self):
        while True:
            t = time.perf_counter()
            item = self.filled.get()
            if item is None:
                reader.wait(self.label_reads)
                self.wait_s += time.perf_counter() - t
                return
            if isinstance(item, BaseException):
                raise item
            lo, x, buf, futures = item
            reader.wait(futures)
            self.wait_s += time.perf_counter() - t
            yield lo, x, buf

    def release(self, buf):
        self.free.put(buf)

    def close(self):
        """Stop scheduling and wait for every read in flight: no thread writes into the buffers
        once this returns."""
        self.free.put(None)
        self.thread.join()
        while not self.filled.empty():
            item = self.filled.get()
            if isinstance(item, tuple):
                for f in item[3]:
                    f.exception()
        for f in self.label_reads:
            f.exception()


KEPT_BUFFERS = 32
KEPT_BYTES = 256 << 20


class HostSide:
    """What the CPU and CUDA backends share on the host: buffers kept for repeated runs of the same
    shape, a pool of reader threads, and streaming a data set through a ring of those buffers."""
    readers = None  # reader threads (None: reader.default_threads())
    ring_depth = 4
    concurrent = False  # whether forward may run on several threads at once (see Session._forward)

    def host_buffers(self, shape, dtype, count=1):
        """`count` host buffers of shape and dtype, the same ones again for the same request. The
        sets of the latest requests are kept (a server's batch sizes each have theirs), at most
        KEPT_BUFFERS sets and KEPT_BYTES, the least recently used freed first."""
        key = (tuple(shape), np.dtype(dtype).str, count)
        cache = self.__dict__.setdefault("_host_buffers", {})
        if key in cache:
            cache[key] = cache.pop(key)  # the latest last
        else:
            cache[key] = [self.new_host_buffer(shape, dtype) for _ in range(count)]
            while len(cache) > 1 and (len(cache) > KEPT_BUFFERS or
                                      sum(b.nbytes for bufs in cache.values() for b in bufs) > KEPT_BYTES):
                for b in cache.pop(next(iter(cache))):
                    self.free_host_buffer(b)
        return cache[key]

    def free_host_buffers(self):
        for buffers in self.__dict__.pop("_host_buffers", {}).values():
            for b in buffers:
                self.free_host_buffer(b)

    def free_host_buffer(self, buf):
        pass

    @property
    def reader(self):
        if self.__dict__.get("_reader") is None:
            self._reader = reader.Reader(self.readers)
        return self._reader

    @property
    def reader_threads(self):
        """Reader threads the last read used (for --json)."""
        return self.reader.threads_used

    def stream(self, data, start, stop, progress, out=None):
        """Images [start, stop) of `data` streamed through a ring of this backend's host buffers:
        (labels found, true labels, scores or None, reader busy seconds, seconds compute waited).
        The outputs go into `out` (see outputs) where given: several GPUs fill one set in place."""
        out = out or self.outputs(stop - start)
        source, buffers, view = self.stream_source(data, start, stop)
        busy = self.reader.busy_s
        ring = Ring(source, start, stop, buffers, min(self.stream_block, stop - start), self.reader,
                    not self.checks_values, out[1], view)
        try:
            self.forward_stream(ring, progress, out)
        finally:
            ring.close()
        return out + ((self.reader.busy_s - busy) / self.reader.threads_used, ring.wait_s)

    def stream_source(self, data, start, stop):
        """(what the ring reads, its buffers, how a buffer is cut to a block (None: its first rows)):
        here the data set's images, in blocks of stream_block images of the wire type."""
        shape = (min(self.stream_block, stop - start),) + tuple(data.image_shape)
        return data, self.host_buffers(shape, self.stream_wire(data), self.host_ring_depth(data)), None

    def stream_wire(self, data):
        """The type `data`'s images are streamed in."""
        return self.wire_dtype(data.dtype)

    def host_ring_depth(self, data):
        """Host buffers in the ring that streams `data`."""
        return self.ring_depth

    def outputs(self, n):
        """A fresh set of outputs for n images of the prepared model (see outputs)."""
        return outputs(n, self.model.fc2.shape[1], self.keep_scores)

    def close_host(self):
        if self.__dict__.get("_reader") is not None:
            self._reader.close()
            self._reader = None
        self.free_host_buffers()


def outputs(n, classes, scores):
    """What a run of n images fills: (labels found, true labels, scores or None)."""
    return np.empty(n, np.int64), np.empty(n, np.int64), np.empty((n, classes), np.float32) if scores else None
