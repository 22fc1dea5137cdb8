"""A compressed data set streamed to the GPU as its compressed bytes, decoded there.

The reader threads only read each block's chunks (pread, no decoding) into page-locked memory; the
block goes up as it is stored, inflate_kernel1 (cuda/inflate.cu: a warp a chunk) decodes its chunks
into a device buffer of whole chunks, a kernel checks them (the kernel's status, the decoded size,
deflate's adler32) and HDF5's shuffle is undone as the images are placed where the network reads
them. A chunk of 1,000 MNIST images takes one warp 43-71 ms (H100), and an SM holds twelve: speed
comes from chunks in flight, so blocks decode on several streams at once (up to MAX_STREAMS) into a
deep ring of device slots.
"""
import numpy as np

from .. import reader
from ..errors import InputError
from . import launch

# HDF5 filter -> (bytes before the codec's stream, bytes after it, adler32 trailer)
GPU_CODECS = {reader.FILTER_DEFLATE: (2, 4, True)}
BLOCK_BYTES = 128 << 20  # decoded bytes per block: 40 MNIST chunks of 1,000 float32 images
IN_FLIGHT_BYTES = 3 << 30  # decoded bytes decoding at once at most (~1,000 such chunks), an eighth of the free memory
MAX_STREAMS = 24  # decode streams, a block each; with the network's and the copies', within 32 hardware queues
SPARE_SLOTS = 3  # device slots beyond one per decode stream: blocks decoded, waiting for or in compute


def warm_up(build, rows):
    """Load the kernels decoding `rows` (a ChunkedRows), decoding one small stream, so no timed run
    pays for it."""
    import zlib

    import pycuda.driver as cuda

    launch.DecodeCheck(build)
    if rows.shuffle and rows.dtype.itemsize > 1:
        launch.Unshuffle(build, rows.dtype.itemsize)
    taken = []

    def alloc(nbytes):
        taken.append(cuda.mem_alloc(max(nbytes, 4)))
        return taken[-1]
    try:
        inflate = launch.Inflate(build)
        stream = np.frombuffer(zlib.compress(bytes(4096))[2:-4], np.uint8)
        src, out, table = alloc(len(stream)), alloc(4096), alloc(48)
        cuda.memcpy_htod(src, stream)
        cuda.memcpy_htod(table, np.array([int(src), len(stream), 4096, 0, int(out), 0], np.uint64))
        t = int(table)
        inflate(cuda.Stream(), 1, t, t + 8, t + 16, t + 24, t + 32, t + 40)
        cuda.Context.synchronize()
    finally:
        for buf in taken:
            buf.free()


def slots(free):
    """Device slots of decoded blocks for a GPU with `free` bytes free: a decode stream each, and spares."""
    return max(1, min(MAX_STREAMS, min(IN_FLIGHT_BYTES, free // 8) // BLOCK_BYTES)) + SPARE_SLOTS


def unsupported(data, wire):
    """None where the GPU can decode the images of `data` (a DataSet) as they travel in type
    `wire`, else why not, in a phrase."""
    if len(data.parts) != 1:
        return "the data set spans several files"
    rows = data.parts[0][1]
    if not isinstance(rows, reader.ChunkedRows):
        return f"its images are not stored in chunks ({rows.kind})"
    if rows.codec not in GPU_CODECS:
        return f"the GPU decodes deflate (gzip) chunks, not {rows.filters or 'raw chunks'}"
    if rows.cut:
        return "its chunks cut images (the GPU path takes chunks of whole images)"
    if rows.summed:
        return "its chunks carry fletcher32 checksums"
    if any(mask for _, _, mask in rows.index):
        return "some chunks were stored with a filter skipped"
    if rows.dtype != wire:
        return f"its {rows.dtype} values are converted on the host"
    if rows.swapped:
        return "its values are stored in the other byte order, swapped on the host"
    if rows.shuffle and rows.dtype.itemsize not in (1, 2, 4, 8):
        return f"no unshuffle for {rows.dtype.itemsize}-byte values"
    return None


def layout(rows, block):
    """How blocks of `block` images of `rows` (a ChunkedRows the GPU decodes) lie in page-locked
    memory: (chunks a block holds at most, bytes of its chunk table, bytes of a block: the table,
    then the most any block's chunks take, back to back)."""
    sizes = np.array(rows.index, np.int64).reshape(-1, 3)[:, 1]
    chunks = -(-block // rows.align) + 1  # a block may start inside a chunk
    table = -(-6 * 8 * chunks // 256) * 256
    sums = np.concatenate([[0], np.cumsum(sizes)])
    k = min(chunks, len(sizes))
    return chunks, table, table + int((sums[k:] - sums[:-k]).max())


class Blocks:
    """The data set as a Ring reads it for the GPU decoder: a block's images are its chunks' bytes
    (see Decoder.read); labels as the data set reads them."""

    def __init__(self, data, decoder):
        self.data, self.decoder, self.classes = data, decoder, data.classes

    def submit_images(self, pool, lo, hi, block, check):
        return self.decoder.read(pool, lo, hi, block)

    def submit_labels(self, pool, lo, hi, out):
        return self.data.submit_labels(pool, lo, hi, out)


class Block:
    """Images [lo, hi) of the data set as chunks c0.. stored at `positions` in `buf` (page-locked
    bytes: the chunk table, then the chunks' bytes); len() is its images."""

    def __init__(self, buf, images):
        self.buf, self.images = buf, images
        self.lo = self.c0 = self.end = 0
        self.positions = None

    def __len__(self):
        return self.images


class Decoder:
    """The device side of streamed files: per decode stream, the compressed block and its chunks
    decoded (a stride apart); one pair of failure flags for the whole run. Built as the run is
    prepared and kept for the next file whose chunks it fits (bind), so no timed stream allocates
    its ~3 GB of device memory."""

    def __init__(self, build, rows, block, streams, alloc, buffers):
        import pycuda.driver as cuda

        self.build, self.buffers = build, buffers  # buffers: what alloc took
        self.chunk_bytes = rows.chunk_bytes
        self.stride = -(-self.chunk_bytes // 256) * 256
        self.max_chunks, self.table_bytes, self.capacity = layout(rows, block)
        self.inflate, self.check = launch.Inflate(build), launch.DecodeCheck(build)
        self.flags = alloc(8)
        self.streams, self.scratch = [], []
        for _ in range(streams):
            self.scratch.append((alloc(self.capacity), alloc(self.max_chunks * self.stride)))
            self.streams.append(cuda.Stream())
        self.used = 0
        self.bind(rows)

    def fits(self, rows, block):
        """Whether this decoder's buffers serve blocks of `block` images of `rows`."""
        chunks, table, capacity = layout(rows, block)
        return (rows.chunk_bytes == self.chunk_bytes and (chunks, table) == (self.max_chunks, self.table_bytes)
                and capacity <= self.capacity)

    def bind(self, rows):
        """Decode the chunks of `rows` (a ChunkedRows that fits) from now on."""
        self.rows = rows
        self.head, self.tail, self.adler = GPU_CODECS[rows.codec]
        index = np.array(rows.index, np.int64).reshape(-1, 3)
        self.offsets, self.sizes = index[:, 0], index[:, 1]
        self.per, self.row_bytes = rows.align, rows.row_bytes
        self.shuffled = rows.shuffle and rows.dtype.itemsize > 1
        self.unshuffle = launch.Unshuffle(self.build, rows.dtype.itemsize) if self.shuffled else None

    def describe(self):
        return f"GPU: inflate_kernel1{' + unshuffle' if self.shuffled else ''}, {len(self.streams)} streams"

    def start(self):
        import pycuda.driver as cuda

        cuda.memset_d32(self.flags, launch.INT_MAX, 2)
        self.used = 0

    def read(self, pool, lo, hi, block):
        """Submit the reads of the chunks holding images [lo, hi) into block: one read per run of
        chunks stored back to back; futures."""
        c0, c1 = lo // self.per, -(-hi // self.per)
        sizes, offsets = self.sizes[c0:c1], self.offsets[c0:c1]
        positions = np.concatenate([[0], np.cumsum(sizes[:-1])])
        block.lo, block.c0, block.positions = lo, c0, positions
        block.end = int(positions[-1] + sizes[-1])
        runs = np.flatnonzero((offsets[1:] != offsets[:-1] + sizes[:-1]) | (positions[1:] != positions[:-1] + sizes[:-1])) + 1
        futures, base = [], block.buf.ctypes.data + self.table_bytes
        for a, b in zip(np.concatenate([[0], runs]), np.concatenate([runs, [len(sizes)]])):
            nbytes = int(positions[b - 1] + sizes[b - 1] - positions[a])
            futures.append(self._read(pool, base + int(positions[a]), nbytes, int(offsets[a]),
                                      block.buf[self.table_bytes + int(positions[a]):][:nbytes]))
        return futures

    def _read(self, pool, address, nbytes, offset, view):
        if pool.native is None:
            return pool.call(self.rows._pread, memoryview(view), offset)
        pool.used_native = True
        return self.rows.submit_bytes(pool.native, address, nbytes, offset)

    def _headers(self, block, sizes):
        """Refuse, before anything is uploaded, a chunk whose stream does not even start right."""
        data = block.buf[self.table_bytes:]
        at = block.positions
        # zlib: CM 8, window <= 32K, no preset dictionary, the header check
        cmf, flg = data[at].astype(np.int64), data[at + 1].astype(np.int64)
        good = (cmf & 15 == 8) & (cmf >> 4 <= 7) & ((cmf * 256 + flg) % 31 == 0) & (flg & 32 == 0)
        good &= sizes > self.head + self.tail
        if not good.all():
            k = int(np.argmin(good))
            raise InputError(f"{self.rows.label}: chunk {block.c0 + k} cannot be decompressed (not a zlib stream)")

    def enqueue(self, dst, block, waits=()):
        """Queue block's upload, decoding, check and placing at device address dst on the next
        decode stream, placing after the events `waits` (its slot free): (the event after the
        upload, which frees the host buffer; the event after the images are in place)."""
        import pycuda.driver as cuda

        from .executor import event

        stream = self.streams[self.used % len(self.streams)]
        comp, decoded = self.scratch[self.used % len(self.streams)]
        self.used += 1
        n = len(block.positions)
        sizes = self.sizes[block.c0:block.c0 + n]
        self._headers(block, sizes)
        table = block.buf[:self.table_bytes].view(np.uint64)
        m = self.max_chunks
        table[0:n] = int(comp) + self.table_bytes + block.positions + self.head
        table[m:m + n] = sizes - self.head - self.tail
        table[2 * m:2 * m + n] = self.chunk_bytes
        table[3 * m:3 * m + n] = int(decoded) + np.arange(n, dtype=np.uint64) * self.stride
        cuda.memcpy_htod_async(comp, block.buf[:self.table_bytes + block.end], stream)
        uploaded = event(stream)
        at = [int(comp) + k * 8 * m for k in range(6)]
        self.inflate(stream, n, at[0], at[1], at[2], at[4], at[3], at[5])
        self.check(stream, n, at[0], at[1], at[4], at[5], decoded, self.chunk_bytes, self.stride, self.adler, block.c0,
                   self.flags)
        for e in waits:  # the slot's previous images computed
            stream.wait_for_event(e)
        first = block.lo - block.c0 * self.per  # rows of the first chunk before the block
        if self.shuffled:
            values = self.row_bytes // self.rows.dtype.itemsize
            self.unshuffle(stream, decoded, dst, first * values, len(block) * values, self.per * values, self.stride)
        elif self.stride == self.chunk_bytes:
            cuda.memcpy_dtod_async(dst, int(decoded) + first * self.row_bytes, len(block) * self.row_bytes, stream)
        else:
            done = 0
            for k in range(n):
                lo = first if k == 0 else k * self.per
                rows = min(self.per * (k + 1), first + len(block)) - lo
                cuda.memcpy_dtod_async(dst + done * self.row_bytes, int(decoded) + k * self.stride
                                       + (lo - k * self.per) * self.row_bytes, rows * self.row_bytes, stream)
                done += rows
        return uploaded, event(stream)

    def synchronize(self):
        for s in self.streams:
            s.synchronize()

    def free(self):
        self.synchronize()
        for buf in self.buffers:
            buf.free()
        self.buffers, self.streams, self.scratch = [], [], []

    def failures(self):
        """The InputError for the lowest chunk that failed to decode or its checksum, or None."""
        import pycuda.driver as cuda

        self.synchronize()
        flags = np.empty(2, np.int32)
        cuda.memcpy_dtoh(flags, self.flags)
        if flags.min() == launch.INT_MAX:
            return None
        j = int(flags.min())
        what = f"{self.rows.label}: chunk {j}"
        if flags[0] == j:
            return InputError(f"{what} cannot be decompressed (damaged deflate data, or not {self.chunk_bytes} "
                              "bytes once decoded)")
        return InputError(f"{what} fails its adler32 checksum once decompressed: the file is damaged")
