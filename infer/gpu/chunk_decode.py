"""A compressed data set streamed to the GPU as its compressed bytes, decoded there.

The reader threads only read each block's chunks (pread, no decoding) into page-locked memory; the
block goes up as it is stored, its page-locked buffer free again once it is up, and a codec (CODECS)
decodes the chunks of a group of blocks, in one launch, into a device buffer of whole chunks and
places each block as the images the network reads (gpu/codecs/: deflate, Zstd, LZF, Blosc lz4 +
bitshuffle, Blosc zstd, LZ4, Bitshuffle lz4, Blosc2 lz4 + bitshuffle, each with its kernels and its
figures). Where chunks cut images (all but Blosc2's), a block holds whole rows of chunks, and the
codec assembles its images from them.
Speed comes from chunks in flight: groups decode on several streams at once (up to MAX_STREAMS) into
a deep ring of device slots. Host memory holds only the few small blocks being read or uploaded: a
launch takes a group of them (the codec's `group`), so the chunks in flight cost device memory,
not host memory.
"""
from typing import NamedTuple

import numpy as np

from ..data import reader
from . import launch
from .codecs import CODECS, codec_for

IN_FLIGHT_BYTES = 5 << 30  # decoded bytes decoding at once at most (~1,700 such chunks), an eighth of the free memory
# Decode streams, a group each: with the network's 8 and the uploads', about DECODE_QUEUES. More
# streams than queues share them and wait on each other (1M images, shuffle + gzip 6, groups of 2
# blocks on 16 streams: 105-109 ms against 100-103 for the plan's; the same on 24 queues: 97 ms, but
# 470 MB of peak RSS).
MAX_STREAMS = 8
# Compressed bytes the host's ring of blocks may pin: their pages count in the peak RSS (about 290
# MB without them, 400 the aim). 1M MNIST images: gzip 1 in 128 MB blocks pins 53 MB, LZF 72 (peak
# 364 MB), shuffled gzip 1 102 (393); shuffled LZF would pin 137, so its blocks are halved (72 MB,
# 351 peak). Blosc lz4 + bitshuffle in 64 MB blocks pinned 128 (394 peak): its own are 32 MB.
RING_PINNED = 112 << 20
MIN_BLOCK_BYTES = 16 << 20
SPARE_GROUPS = 1  # device slots beyond one group per decode stream: blocks decoded, waiting for or in compute


def warm_up(build, rows):
    """Load the kernels decoding `rows` (a ChunkedRows), decoding one small stream, so no timed run
    pays for it."""
    import pycuda.driver as cuda

    codec = codec_for(rows)(build, rows)
    taken = []

    def alloc(nbytes):
        taken.append(cuda.mem_alloc(max(nbytes, 4)))
        return taken[-1]
    try:
        codec.warm_up(alloc)
        cuda.Context.synchronize()
    finally:
        for buf in taken:
            buf.free()


class Plan(NamedTuple):
    """How a codec's blocks travel: blocks a decode launch takes, decoded bytes a host block (one
    read, one upload), page-locked blocks being read or uploaded; the kernel's scratch memory,
    bytes a decoded byte."""
    group: int
    block_bytes: int
    ring: int
    scratch: float = 0.0


def plan(rows):
    """The Plan of `rows` (a ChunkedRows the GPU decodes): its codec's, its blocks halved (and its
    groups doubled: the same decoded bytes a launch) until the host ring's page-locked blocks of
    the file's compressed chunks fit RING_PINNED, down to MIN_BLOCK_BYTES."""
    codec = codec_for(rows)
    block_bytes, group = codec.block_bytes, codec.group
    while (block_bytes > MIN_BLOCK_BYTES
           and codec.ring * layout(rows, max(1, block_bytes // rows.row_bytes))[1] > RING_PINNED):
        block_bytes, group = block_bytes // 2, group * 2
    return Plan(group, block_bytes, codec.ring, codec.scratch)


def slots(free, plan):
    """Device slots of decoded blocks, in groups (a Plan's), for a GPU with `free` bytes free: a
    group per decode stream, and spares."""
    decoding = min(IN_FLIGHT_BYTES, int(free // 8 / (1 + plan.scratch)))  # an eighth: decoded and scratch bytes
    streams = max(1, min(MAX_STREAMS, decoding // (plan.group * plan.block_bytes)))
    return (streams + SPARE_GROUPS) * plan.group


def shape(slots, group, blocks):
    """(decode streams, blocks a group) for a run of `blocks` blocks over a ring of `slots` device
    slots in groups of `group` (see slots). Where the run's blocks all fit the ring, no slot is used
    twice: a stream for each group, so every chunk decodes at once (a 1M-image deflate file's 1,000
    MNIST chunks in 4 groups on 4 streams, not some of them and the rest after)."""
    if blocks <= slots:
        return min(MAX_STREAMS, -(-blocks // group)), min(group, slots)
    return max(1, slots // group - SPARE_GROUPS), min(group, slots)


def unsupported(data, wire):
    """None where the GPU can decode the images of `data` (a DataSet) as they travel in type
    `wire`, else why not, in a phrase."""
    if len(data.parts) != 1:
        return "the data set spans several files"
    rows = data.parts[0][1]
    if not isinstance(rows, reader.ChunkedRows):
        return f"its images are not stored in chunks ({rows.kind})"
    if rows.codec not in CODECS:
        return ("the GPU decodes deflate (gzip), LZF, Zstd, LZ4, Bitshuffle lz4, Blosc lz4 and zstd and Blosc2 lz4 "
                f"chunks, not {rows.filters or 'raw chunks'}")
    if rows.cut and not codec_for(rows).assembles:
        return (f"its chunks cut images, which the GPU assembles from deflate, LZF, Zstd, LZ4, Bitshuffle and Blosc "
                f"chunks, not {reader.PLUGIN_FILTERS.get(rows.codec, rows.filters)}'s")
    if rows.cut and not 2 <= len(rows.shape) <= 4:
        return f"its chunks cut images of {len(rows.shape) - 1} dimensions (the GPU assembles up to 3)"
    skippable = rows.codec_bit if codec_for(rows).copies_stored else 0
    if any(mask & ~skippable for _, _, mask in rows.index):
        return "some chunks were stored with a filter skipped"
    if rows.dtype != wire:
        return f"its {rows.dtype} values are converted on the host"
    if rows.swapped:
        return "its values are stored in the other byte order, swapped on the host"
    if rows.shuffle and rows.dtype.itemsize not in (1, 2, 4, 8):
        return f"no unshuffle for {rows.dtype.itemsize}-byte values"
    return codec_for(rows).unsupported(rows)


def host_by_default(data):
    """None where --decode auto decodes the chunks of `data` (a DataSet the GPU can decode) on the
    GPU, else why it leaves them to the reader threads, in a phrase: the codec's host_first."""
    return codec_for(data.parts[0][1]).host_first


def declined(data, wire, mode):
    """None where a GPU backend decoding `mode` (auto or gpu) decodes the chunks of `data` as they
    travel in `wire`, else why not: unsupported's reason, or under auto the codec's host_first."""
    return unsupported(data, wire) or (host_by_default(data) if mode == "auto" else None)


def layout(rows, block):
    """(chunks a block of `block` images of `rows`, a ChunkedRows the GPU decodes, holds at most;
    the most bytes any block's chunks take, back to back, as they are read into page-locked memory).
    Where chunks cut images, a block holds whole rows of chunks (rows.per chunks each)."""
    sizes = np.array(rows.index, np.int64).reshape(-1, 3)[:, 1]
    chunks = (-(-block // rows.align) + 1) * rows.per  # a block may start inside a row of chunks
    sums = np.concatenate([[0], np.cumsum(sizes)])
    k = min(chunks, len(sizes))
    return chunks, int((sums[k:] - sums[:-k]).max())


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
    bytes, `end` of them read); len() is its images."""

    def __init__(self, buf, images):
        self.buf, self.images = buf, images
        self.lo = self.c0 = self.end = 0
        self.positions = None

    def __len__(self):
        return self.images


class Piece(NamedTuple):
    """What placing a block needs once its page-locked buffer is read into again: its first image,
    first chunk, chunks, images, and what the codec's prepare said of it."""
    lo: int
    c0: int
    chunks: int
    images: int
    extra: object


class Lane:
    """A decode stream and its buffers: on the device the group's table (`table_bytes`, then its
    blocks' bytes back to back), its chunks decoded a stride apart and, where the codec's kernel takes
    some, its scratch memory; the table in page-locked memory."""

    def __init__(self, alloc, table_bytes, capacity, decoded_bytes, arrays, rows, scratch_bytes):
        import pycuda.driver as cuda

        # rounded up to 256 bytes: the Zstandard kernels load the aligned 8-byte words holding a frame's bytes
        self.comp, self.decoded = alloc(table_bytes + -(-capacity // 256) * 256), alloc(decoded_bytes)
        self.scratch = alloc(256 + scratch_bytes) if scratch_bytes else None  # its first 8 bytes count what is taken
        self.data = int(self.comp) + table_bytes
        self.table = cuda.pagelocked_empty((arrays, rows), np.uint64)
        self.stream = cuda.Stream()
        self.table_sent = None  # the event after the table's last upload: the host may write it again
        self.read = None  # the event after the last group's decoding: its compressed bytes are read


class Decoder:
    """The device side of streamed files: blocks uploaded on one copy stream, as they come, into
    the buffers of a decode stream (Lane) until it holds a group of them (the codec's, or fewer at a
    gap in the chunks or the end: flush), then decoded in one launch and placed block by block; one
    pair of failure flags for the whole run; the codec's kernels (Deflate, BloscLz4). Built as the
    run is prepared and kept for the next file whose chunks it fits (bind), so no timed stream
    allocates its device memory (several GB: the groups in flight)."""

    def __init__(self, build, rows, block, streams, alloc, buffers, group, copy):
        self.build, self.buffers = build, buffers  # buffers: what alloc took
        codec = codec_for(rows)
        self.chunk_bytes = rows.chunk_bytes
        self.stride = codec.stride(self.chunk_bytes)
        self.max_chunks, self.capacity = layout(rows, block)
        self.group, self.group_chunks = group, group * self.max_chunks
        self.group_rows = self.group_chunks * codec.rows_per_chunk(rows)  # the table's rows
        table_bytes = -(-codec.arrays * 8 * self.group_rows // 256) * 256
        self.flags = alloc(8)
        self.scratch_bytes = -(-int(self.group_chunks * self.stride * codec.scratch) // 256) * 256
        self.lanes = [Lane(alloc, table_bytes, group * self.capacity, self.group_chunks * self.stride, codec.arrays,
                           self.group_rows, self.scratch_bytes) for _ in range(streams)]
        self.copy = copy  # the stream of the uploads: the backend's, not sharing a hardware queue with a lane
        self.used, self.pool, self.lane, self.pieces = 0, None, None, []
        self.split = True  # whether a codec that can split its streams (deflate's) does: see backend's _decoder_for
        self.bind(rows)

    def fits(self, rows, block):
        """Whether this decoder's buffers serve blocks of `block` images of `rows`."""
        chunks, capacity = layout(rows, block)
        codec = codec_for(rows)
        return (rows.chunk_bytes == self.chunk_bytes and codec.stride(rows.chunk_bytes) == self.stride
                and self.lanes[0].table.shape == (codec.arrays, self.group_chunks * codec.rows_per_chunk(rows))
                and chunks == self.max_chunks and capacity <= self.capacity
                and codec.scratch == codec_for(self.rows).scratch)

    def bind(self, rows):
        """Decode the chunks of `rows` (a ChunkedRows that fits) from now on."""
        self.rows = rows
        index = np.array(rows.index, np.int64).reshape(-1, 3)
        self.offsets, self.stored, self.masks = index[:, 0], index[:, 1], index[:, 2]
        # what the codecs decode: a chunk's bytes but its fletcher32, which the reader threads check
        self.sizes = self.stored - 4 if rows.summed else self.stored
        self.per, self.row_bytes = rows.align, rows.row_bytes
        self.slab = rows.per  # chunks a row of chunks: 1 but where chunks cut images
        self.codec = codec_for(rows)(self.build, rows)

    def describe(self):
        return f"GPU: {self.codec.describe()}, {len(self.lanes)} streams"

    def columns(self, table):
        """The device addresses of the codec's table arrays, a group's rows each (a row a chunk, or
        the codec's rows_per_chunk), from `table` on."""
        return [table + k * 8 * self.group_rows for k in range(self.codec.arrays)]

    def start(self):
        import pycuda.driver as cuda

        cuda.memset_d32(self.flags, launch.INT_MAX, 2)
        self.used, self.lane, self.pieces = 0, None, []

    def read(self, pool, lo, hi, block):
        """Submit the reads of the chunks holding images [lo, hi) into block: one read per run of
        chunks stored back to back (a read a chunk, its fletcher32 checked as it is read, where the
        chunks carry one); futures."""
        self.pool = pool  # where a codec has chunks decoded on the host
        c0, c1 = lo // self.per * self.slab, -(-hi // self.per) * self.slab
        sizes, offsets = self.stored[c0:c1], self.offsets[c0:c1]
        positions = np.concatenate([[0], np.cumsum(sizes[:-1])])
        block.lo, block.c0, block.positions = lo, c0, positions
        block.end = int(positions[-1] + sizes[-1])
        if self.rows.summed:  # (the backend's pool is native wherever the library builds; without it h5py reads them)
            pool.used_native = True
            return [self.rows.submit_summed(pool.native, block.buf.ctypes.data, c0, c1, positions)]
        runs = np.flatnonzero((offsets[1:] != offsets[:-1] + sizes[:-1]) | (positions[1:] != positions[:-1] + sizes[:-1])) + 1
        futures, base = [], block.buf.ctypes.data
        for a, b in zip(np.concatenate([[0], runs]), np.concatenate([runs, [len(sizes)]])):
            nbytes = int(positions[b - 1] + sizes[b - 1] - positions[a])
            futures.append(self._read(pool, base + int(positions[a]), nbytes, int(offsets[a]),
                                      block.buf[int(positions[a]):][:nbytes]))
        return futures

    def _read(self, pool, address, nbytes, offset, view):
        if pool.native is None:
            return pool.call(self.rows._pread, memoryview(view), offset)
        pool.used_native = True
        return self.rows.submit_bytes(pool.native, address, nbytes, offset)

    def enqueue(self, dst, block, waits=(), token=None):
        """Queue block's upload into the open group (opening one on the next lane), to be decoded
        with the group and placed at device address dst after the events `waits` (its slot free):
        (the event after the upload, which frees the host buffer; [(token, the event after its images
        are in place)] for each block the group decoded and placed if this call closed one)."""
        import pycuda.driver as cuda

        from .executor import event

        placed = []
        if self.pieces and (block.c0 != self.next_chunk or len(self.pieces) == self.group):
            placed = self.flush()
        if not self.pieces:
            self._open()
        lane, n = self.lane, len(block.positions)
        gpu, extra = self.codec.prepare(self, block, lane.table, self.count, lane.data + self.filled,
                                        int(lane.decoded) + self.count * self.stride)
        cuda.memcpy_htod_async(lane.data + self.filled, block.buf[:block.end], self.copy)
        self.pieces.append((Piece(block.lo, block.c0, n, len(block), extra), self.count, dst, waits, token))
        self.count, self.filled, self.next_chunk = self.count + n, self.filled + block.end, block.c0 + n
        self.gpu |= gpu
        uploaded = event(self.copy)
        if len(self.pieces) == self.group:
            placed += self.flush()
        return uploaded, placed

    def _open(self):
        """The next lane takes the blocks from now on: its page-locked table written again once its last
        upload is done, its compressed bytes once its last group is decoded."""
        self.lane = self.lanes[self.used % len(self.lanes)]
        self.used += 1
        if self.lane.table_sent is not None:
            self.lane.table_sent.synchronize()
        if self.lane.read is not None:
            self.copy.wait_for_event(self.lane.read)
        self.count = self.filled = 0
        self.gpu = False

    def flush(self):
        """Decode the open group and place its blocks: [(token, the event after its images are in
        place)] per block; [] where no group is open."""
        import pycuda.driver as cuda

        from .executor import event

        if not self.pieces:
            return []
        lane, pieces = self.lane, self.pieces
        cuda.memcpy_htod_async(lane.comp, lane.table, self.copy)
        lane.table_sent = event(self.copy)
        lane.stream.wait_for_event(lane.table_sent)
        if self.gpu:
            self.codec.decode(self, lane.stream, self.count, int(lane.comp), lane.decoded, pieces[0][0].c0, lane.scratch,
                              [piece.extra for piece, *_ in pieces])
        lane.read = event(lane.stream)
        placed = []
        for piece, o, dst, waits, token in pieces:
            for e in waits:  # the slot's previous images computed
                lane.stream.wait_for_event(e)
            self.codec.place(self, lane.stream, piece, int(lane.decoded) + o * self.stride, dst)
            placed.append((token, event(lane.stream)))
        self.pieces = []
        return placed

    def synchronize(self):
        self.copy.synchronize()
        for lane in self.lanes:
            lane.stream.synchronize()

    def free(self):
        self.synchronize()
        for buf in self.buffers:
            buf.free()
        self.buffers, self.lanes = [], []

    def failures(self):
        """The InputError for the lowest chunk that failed to decode or its checksum, or None."""
        import pycuda.driver as cuda

        self.synchronize()
        flags = np.empty(2, np.int32)
        cuda.memcpy_dtoh(flags, self.flags)
        if flags.min() == launch.INT_MAX:
            return None
        j = int(flags.min())
        return self.codec.failure(self, j, 0 if flags[0] == j else 1)
