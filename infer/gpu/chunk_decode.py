"""A compressed data set streamed to the GPU as its compressed bytes, decoded there.

The reader threads only read each block's chunks (pread, no decoding) into page-locked memory; the
block goes up as it is stored, its page-locked buffer free again once it is up, and a codec (CODECS)
decodes the chunks of a group of blocks, in one launch, into a device buffer of whole chunks and
places each block as the images the network reads:
- deflate (Deflate): inflate_kernel1 (cuda/inflate.cu: a warp a chunk), a kernel checking them (the
  kernel's status, the decoded size, deflate's adler32), HDF5's shuffle undone as they are placed. A
  chunk of 1,000 MNIST images takes one warp 43-71 ms (H100), and an SM holds twelve;
- Zstd (Zstd): zstd_kernel2 (cuda/zstd.cu: 3 warps a frame, two decoding its blocks apart into
  scratch memory, one carrying their sequences out in order), checked and unshuffled as deflate's. A
  1,000-image MNIST chunk takes 15 ms alone (H100), shuffled 23;
- LZF (Lzf): lzf_kernel1 (cuda/lzf.cu: a warp a chunk, 32 tokens parsed a batch, its output built
  in a ring in shared memory), checked and unshuffled as deflate's. A 1,000-image MNIST chunk takes
  35 ms alone (H100), shuffled 52;
- Blosc lz4 + bitshuffle (BloscLz4): blosc_lz4_kernel1 (cuda/lz4.cu: a warp per stream of a block,
  ~21 a 1,000-image chunk, ~13 ms each), the bits unshuffled as they are placed.
Speed comes from chunks in flight: groups decode on several streams at once (up to MAX_STREAMS) into
a deep ring of device slots. Host memory holds only the few small blocks being read or uploaded: a
launch takes a group of them (the codec's `group`), so the chunks in flight cost device memory,
not host memory.
"""
import os
from typing import NamedTuple

import numpy as np

from ..data import reader
from ..errors import InputError
from . import launch

IN_FLIGHT_BYTES = 5 << 30  # decoded bytes decoding at once at most (~1,700 such chunks), an eighth of the free memory
MAX_STREAMS = 8  # decode streams, a group each; with the network's 8 and the uploads', about DECODE_QUEUES
SPARE_GROUPS = 1  # device slots beyond one group per decode stream: blocks decoded, waiting for or in compute


def warm_up(build, rows):
    """Load the kernels decoding `rows` (a ChunkedRows), decoding one small stream, so no timed run
    pays for it."""
    import pycuda.driver as cuda

    codec = CODECS[rows.codec](build, rows)
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
    """The Plan of `rows` (a ChunkedRows the GPU decodes): its codec's."""
    codec = CODECS[rows.codec]
    return Plan(codec.group, codec.block_bytes, codec.ring, codec.scratch)


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
        return f"the GPU decodes deflate (gzip), LZF, Zstd and Blosc lz4 chunks, not {rows.filters or 'raw chunks'}"
    if rows.cut:
        return "its chunks cut images (the GPU path takes chunks of whole images)"
    if rows.summed:
        return "its chunks carry fletcher32 checksums"
    skippable = rows.codec_bit if CODECS[rows.codec].copies_stored else 0
    if any(mask & ~skippable for _, _, mask in rows.index):
        return "some chunks were stored with a filter skipped"
    if rows.dtype != wire:
        return f"its {rows.dtype} values are converted on the host"
    if rows.swapped:
        return "its values are stored in the other byte order, swapped on the host"
    if rows.shuffle and rows.dtype.itemsize not in (1, 2, 4, 8):
        return f"no unshuffle for {rows.dtype.itemsize}-byte values"
    return CODECS[rows.codec].unsupported(rows)


def layout(rows, block):
    """(chunks a block of `block` images of `rows`, a ChunkedRows the GPU decodes, holds at most;
    the most bytes any block's chunks take, back to back, as they are read into page-locked memory)."""
    sizes = np.array(rows.index, np.int64).reshape(-1, 3)[:, 1]
    chunks = -(-block // rows.align) + 1  # a block may start inside a chunk
    sums = np.concatenate([[0], np.cumsum(sizes)])
    k = min(chunks, len(sizes))
    return chunks, int((sums[k:] - sums[:-k]).max())


class Deflate:
    """HDF5's deflate filter: a zlib stream a chunk (its 2-byte header and adler32 trailer around the
    deflate data), decoded by inflate_kernel1 into chunks 256 bytes apart, checked by
    decode_check_kernel1 (status, size, adler32), and HDF5's shuffle undone as the images are placed."""
    head, tail = 2, 4  # bytes of the zlib stream around its deflate data
    kernel, adler, what, frame = launch.Inflate, True, "deflate", "not a zlib stream"
    scratch = 0.0  # the kernel's scratch memory, bytes a decoded byte

    def __init__(self, build, rows):
        self.decoder, self.check = self.kernel(build), launch.DecodeCheck(build)
        self.shuffled = rows.shuffle and rows.dtype.itemsize > 1
        self.unshuffle = launch.Unshuffle(build, rows.dtype.itemsize) if self.shuffled else None
        self.rows = rows

    @staticmethod
    def unsupported(rows):
        return None

    copies_stored = True  # chunks stored without the codec (their filter skipped) are copied into place
    arrays = 6  # of the table, uint64 a chunk: stream, size, capacity, output, decoded size, status
    # A launch takes 20 blocks of 64 MB (320 MNIST chunks, a warp each, ~60 ms), read 6 at a time: a
    # 1M-image file's 1,000 chunks all in flight at once. (Blocks of 32 MB, 4 deep: gzip 1 4.6-5.7M
    # images/s against 5.9-6.3M, shuffled 4.2-4.3M against 4.6-4.8M, H100, one host)
    group, block_bytes, ring = 20, 64 << 20, 6

    @staticmethod
    def stride(chunk_bytes):
        return -(-chunk_bytes // 256) * 256

    def describe(self):
        return f"{self.kernel.kernel}{' + unshuffle' if self.shuffled else ''}"

    @staticmethod
    def sample():
        """A stream of 4096 zero bytes, as the kernel takes it."""
        import zlib

        return zlib.compress(bytes(4096))[2:-4]

    def warm_up(self, alloc):
        import pycuda.driver as cuda

        stream = np.frombuffer(self.sample(), np.uint8)
        src, out, table = alloc(len(stream)), alloc(4096), alloc(48)
        cuda.memcpy_htod(src, stream)
        cuda.memcpy_htod(table, np.array([int(src), len(stream), 4096, 0, int(out), 0], np.uint64))
        t = int(table)
        scratch = alloc(256 + int(4096 * self.scratch)) if self.scratch else None
        self.run(cuda.Stream(), 1, [t, t + 8, t + 16, t + 32, t + 24, t + 40], scratch, int(4096 * self.scratch))

    def run(self, stream, count, at, scratch, scratch_bytes):
        """The kernel on a group's table columns `at` (see Decoder.columns)."""
        self.decoder(stream, count, at[0], at[1], at[2], at[4], at[3], at[5])

    def prepare(self, dec, block, table, o, data, decoded):
        """Refuse, before anything is uploaded, a chunk whose stream does not even start right, or
        one stored without the codec (its filter skipped: h5py's lzf leaves a chunk that did not
        shrink so) at another size than decoded; then the block's rows of the group's table (from
        row o): per chunk its stream (the block's bytes go up to device address `data`), size,
        capacity, output (from `decoded` on), decoded size (out), status (out). A chunk stored
        without the codec has size and capacity 0 (the kernels decode nothing of it, the check
        passes it over) and is copied into its slot after the group's decoding. (Whether the GPU
        decodes any of its chunks; what decode needs of it: those copies, (slot, bytes, size).)"""
        n = len(block.positions)
        sizes = dec.sizes[block.c0:block.c0 + n]
        stored = dec.masks[block.c0:block.c0 + n] != 0  # unsupported(): only the codec's bit
        good = self.starts_right(block.buf, block.positions, sizes) | stored
        wrong = stored & (sizes != dec.chunk_bytes)
        if not good.all() or wrong.any():
            k = int(np.argmax(~good | wrong))
            why = f"stored without its filter, {sizes[k]} bytes, not {dec.chunk_bytes}" if wrong[k] else self.frame
            raise InputError(f"{self.rows.label}: chunk {block.c0 + k} cannot be decompressed ({why})")
        rows = slice(o, o + n)
        slots = decoded + np.arange(n, dtype=np.uint64) * dec.stride
        table[0, rows] = data + block.positions + self.head
        table[1, rows] = np.where(stored, 0, sizes - self.head - self.tail)
        table[2, rows] = np.where(stored, 0, dec.chunk_bytes)
        table[3, rows] = slots
        return True, [(int(slots[k]), data + int(block.positions[k]), dec.chunk_bytes) for k in np.flatnonzero(stored)]

    def starts_right(self, buf, at, sizes):
        """Per chunk stored in buf at offsets at, sizes bytes each: whether its zlib header is one the
        kernel takes (CM 8, window <= 32K, no preset dictionary, the header check)."""
        cmf, flg = buf[at].astype(np.int64), buf[at + 1].astype(np.int64)
        good = (cmf & 15 == 8) & (cmf >> 4 <= 7) & ((cmf * 256 + flg) % 31 == 0) & (flg & 32 == 0)
        return good & (sizes > self.head + self.tail)

    def decode(self, dec, stream, count, table, decoded, c0, scratch, extras):
        """Decode a group's count chunks, file chunks c0 on, as its table (device address) says,
        into decoded on (scratch: the lane's scratch memory, where the codec takes some); extras:
        what prepare said of each of its blocks."""
        import pycuda.driver as cuda

        at = dec.columns(table)
        self.run(stream, count, at, scratch, dec.scratch_bytes)
        self.check(stream, count, at[0], at[1], at[4], at[5], decoded, dec.chunk_bytes, dec.stride, self.adler, c0,
                   dec.flags)
        for slot, src, nbytes in (copy for stored in extras for copy in stored):  # before the lane's bytes
            cuda.memcpy_dtod_async(slot, src, nbytes, stream)                      # are uploaded over (flush)

    def place(self, dec, stream, piece, decoded, dst):
        import pycuda.driver as cuda

        per, row_bytes = dec.per, dec.row_bytes
        first = piece.lo - piece.c0 * per  # rows of the first chunk before the block
        if self.shuffled:
            values = row_bytes // self.rows.dtype.itemsize
            self.unshuffle(stream, decoded, dst, first * values, piece.images * values, per * values, dec.stride)
        elif dec.stride == dec.chunk_bytes:
            cuda.memcpy_dtod_async(dst, decoded + first * row_bytes, piece.images * row_bytes, stream)
        else:
            done = 0
            for k in range(piece.chunks):
                lo = first if k == 0 else k * per
                rows = min(per * (k + 1), first + piece.images) - lo
                cuda.memcpy_dtod_async(dst + done * row_bytes, decoded + k * dec.stride + (lo - k * per) * row_bytes,
                                       rows * row_bytes, stream)
                done += rows

    def failure(self, dec, j, which):
        what = f"{self.rows.label}: chunk {j}"
        if which == 0:
            return InputError(f"{what} cannot be decompressed (damaged {self.what} data, or not {dec.chunk_bytes} "
                              "bytes once decoded)")
        return InputError(f"{what} fails its adler32 checksum once decompressed: the file is damaged")


class Zstd(Deflate):
    """hdf5plugin's Zstd filter: a Zstandard frame a chunk (as hdf5plugin writes them: no dictionary,
    no content checksum), decoded by zstd_kernel2 into chunks 256 bytes apart, checked by
    decode_check_kernel1 (status and size: the frame's own structure catches damage), HDF5's shuffle
    undone as the images are placed. The group, block and ring of deflate's plan. Frames with a
    checksum (which the host's libzstd checks and the GPU does not) or a dictionary are the host's."""
    head = tail = 0
    kernel, adler, what = launch.ZstdApart, False, "Zstandard"
    scratch = launch.ZstdApart.SCRATCH
    frame = ("not a Zstandard frame the GPU decodes: damaged, or with a checksum or dictionary, which --decode "
             "host reads")
    MAGIC = bytes([0x28, 0xB5, 0x2F, 0xFD])
    OTHERS = 0x07  # frame header flags: content checksum, dictionary id

    OUT_MAX = (1 << 30) - 1  # zstd.cuh's ZOUT_MAX: a frame's most output (32-bit positions)

    @classmethod
    def unsupported(cls, rows):
        if rows.chunk_bytes > cls.OUT_MAX:
            return f"its chunks decode to more than the GPU's Zstandard decoder takes ({cls.OUT_MAX:,} bytes)"
        head = os.pread(rows.fd, 5, int(rows.index[0][0]))
        if len(head) == 5 and head[:4] == cls.MAGIC and head[4] & cls.OTHERS:
            return "its Zstandard frames carry a checksum or name a dictionary (the host's libzstd reads them)"
        return None

    @staticmethod
    def sample():
        # one stored block of 4096 zero bytes; a single segment, its size in 2 bytes (4096 - 256)
        return Zstd.MAGIC + bytes([0x60, 0x00, 0x0F]) + (1 | 4096 << 3).to_bytes(3, "little") + bytes(4096)

    def run(self, stream, count, at, scratch, scratch_bytes):
        self.decoder(stream, count, at[0], at[1], at[2], at[4], at[3], at[5], scratch, scratch_bytes)

    def starts_right(self, buf, at, sizes):
        """Per chunk: its magic number, and a frame header without a checksum or dictionary."""
        head = buf[np.minimum(at[:, None] + np.arange(5), len(buf) - 1)]
        return ((sizes >= 8) & (head[:, :4] == np.frombuffer(self.MAGIC, np.uint8)).all(axis=1)
                & (head[:, 4] & self.OTHERS == 0))


class Lzf(Deflate):
    """h5py's lzf filter: an LZF stream a chunk (liblzf's format, nothing around it), decoded by
    lzf_kernel1 into chunks 256 bytes apart, checked by decode_check_kernel1 (status and size; LZF
    has no checksum), HDF5's shuffle undone as the images are placed. A chunk that did not shrink is
    stored as it is (its filter skipped) and copied into place (Deflate.prepare)."""
    head = tail = 0
    kernel, adler, what, frame = launch.Lzf, False, "LZF", "an empty LZF stream"
    # deflate's group and blocks, read 4 at a time: LZF keeps a quarter of MNIST's bytes shuffled
    # (gzip 1 a fifth), and 6 such blocks took the peak RSS to 414 MB
    group, block_bytes, ring = 20, 64 << 20, 4

    @staticmethod
    def sample():
        """4,096 zero bytes: runs of 32 literals, each followed by a reference one byte back."""
        unit = bytes([31]) + bytes(32) + bytes([0xE0, 255, 0])  # 32 literals, then 264 bytes
        return unit * 13 + bytes([31]) + bytes(32) + bytes([0xE0, 207, 0])  # the last reference 216 bytes

    def starts_right(self, buf, at, sizes):
        return sizes > 0


class BloscLz4:
    """hdf5plugin's Blosc filter (c-blosc 1's format 2) with lz4 and its bitshuffle: the chunks'
    streams decoded by blosc_lz4_kernel1 into chunks back to back, the bits unshuffled as the images
    are placed (bitunshuffle_kernel2). The host checks each chunk's header in the page-locked block;
    a chunk stored otherwise (copied whole, byte shuffled, another codec or block size) is decoded
    by the reader threads, as without a GPU, and goes into place after the others."""
    LZ4 = 1  # c-blosc's codec number, in a header's flags >> 5

    def __init__(self, build, rows):
        self.lz4 = launch.BloscLz4(build)
        self.unshuffle = launch.BitUnshuffleRange(build, rows.dtype.itemsize)
        self.rows, self.itemsize = rows, rows.dtype.itemsize
        self.block_values, self.exact_tail = rows.bitshuffle
        self.block_bytes = self.block_values * self.itemsize
        self.pending = []  # (page-locked rows decoded on the host, the event after their upload)

    @classmethod
    def unsupported(cls, rows):
        if rows.bitshuffle is None or not rows.bitshuffle[1]:
            return "the GPU decodes Blosc chunks that are bitshuffled, with a native reader"
        head = os.pread(rows.fd, 16, int(rows.index[0][0]))
        if len(head) < 16 or head[2] >> 5 != cls.LZ4:
            return "the GPU decodes Blosc's lz4, not its other codecs"
        return None

    arrays = 3  # of the table, uint64 a chunk: start, stored size, output
    scratch = 0.0
    copies_stored = False  # a file with chunks stored without the codec is the host's
    # A launch takes 10 blocks of 32 MB (80 MNIST chunks, ~1,700 warps of ~13 ms), read 4 at a time:
    # the host's 4 compressed blocks keep the peak RSS under 400 MB (6 of 64 MB: 7.0M images/s, 484 MB)
    group, block_bytes, ring = 10, 32 << 20, 4

    @staticmethod
    def stride(chunk_bytes):
        return chunk_bytes

    def describe(self):
        return "blosc_lz4_kernel1 + bitunshuffle"

    def warm_up(self, alloc):
        import pycuda.driver as cuda

        size = self.itemsize  # one block of 8 values, not split, its stream stored as it is
        chunk = np.frombuffer(bytes([2, 1, 0x24, size]) + np.array([8 * size, 8 * size, 24 + 8 * size, 20, 8 * size],
                                                                   "<u4").tobytes() + bytes(8 * size), np.uint8)
        src, out, values, table, bad = alloc(len(chunk)), alloc(8 * size), alloc(8 * size), alloc(24), alloc(4)
        cuda.memcpy_htod(src, chunk)
        cuda.memcpy_htod(table, np.array([int(src), len(chunk), int(out)], np.uint64))
        t, stream = int(table), cuda.Stream()
        self.lz4(stream, 1, t, t + 8, t + 16, 8 * size, 8 * size, size, 0, bad)
        self.unshuffle(stream, out, values, 1, 8, 8, 1, 0, 8)

    def prepare(self, dec, block, table, o, data, decoded):
        """The block's rows of the group's table (from row o): per chunk its start (the block's bytes
        go up to device address `data`), stored size (0 where the GPU does not take it) and output
        (from `decoded` on); the chunks it does not take decoded on the host now (a damaged one is
        refused here, as without a GPU). (Whether the GPU decodes any of its chunks, the rows the
        host decoded: (row in the block, page-locked rows).)"""
        n = len(block.positions)
        sizes = dec.sizes[block.c0:block.c0 + n]
        taken = blosc_chunks(block.buf[:block.end], block.positions, sizes, dec.chunk_bytes, self.itemsize,
                             self.block_bytes)
        self.pending = [(buf, e) for buf, e in self.pending if not e.query()]
        rows = slice(o, o + n)
        table[0, rows] = data + block.positions
        table[1, rows] = np.where(taken, sizes, 0)  # 0: left to the host
        table[2, rows] = decoded + np.arange(n, dtype=np.uint64) * dec.stride
        return bool(taken.any()), [self._host_decoded(dec, block, int(k)) for k in np.flatnonzero(~taken)]

    def _host_decoded(self, dec, block, k):
        """Chunk k of the block (its rows in the block) decoded by the reader threads into page-locked memory."""
        import pycuda.driver as cuda

        c = block.c0 + k
        lo, hi = max(c * dec.per, block.lo), min((c + 1) * dec.per, block.lo + len(block), self.rows.shape[0])
        out = cuda.pagelocked_empty((hi - lo) * dec.row_bytes, np.uint8)
        self.rows.submit(dec.pool.native, lo, hi, out).result()
        return lo - block.lo, out

    def decode(self, dec, stream, count, table, decoded, c0, scratch, extras):
        starts, sizes, outputs = dec.columns(table)
        self.lz4(stream, count, starts, sizes, outputs, dec.chunk_bytes, self.block_bytes, self.itemsize, c0, dec.flags)

    def place(self, dec, stream, piece, decoded, dst):
        import pycuda.driver as cuda

        from .executor import event

        values = dec.row_bytes // self.itemsize
        first = piece.lo - piece.c0 * dec.per
        self.unshuffle(stream, decoded, dst, piece.chunks, dec.per * values, self.block_values, self.exact_tail,
                       first * values, piece.images * values)
        for row, out in piece.extra:  # over what the unshuffle made of the chunk's undecoded bytes
            cuda.memcpy_htod_async(dst + row * dec.row_bytes, out, stream)
        if piece.extra:
            self.pending.append(([out for _, out in piece.extra], event(stream)))

    def failure(self, dec, j, which):
        return InputError(f"{self.rows.label}: chunk {j} cannot be decompressed ({self.rows.codec_name} lz4: "
                          f"damaged data, or not {dec.chunk_bytes} bytes once decoded)")


def blosc_chunks(data, at, sizes, chunk_bytes, itemsize, block_bytes):
    """Which of the c-blosc chunks stored in `data` (bytes) at offsets `at`, `sizes` bytes each,
    blosc_lz4_kernel1 decodes: c-blosc 1's format 2, bitshuffled (flag 4; neither byte-shuffled nor
    copied whole: flags 1, 2), lz4, values of itemsize bytes, decoding to chunk_bytes in blocks of
    block_bytes, and as long as the header says and room for each block's start."""
    at = np.asarray(at, np.int64)
    if len(data) < 16:
        return np.zeros(len(at), bool)
    hdr = data[np.minimum(at[:, None] + np.arange(16), len(data) - 1)]
    words = hdr.view("<u4").astype(np.int64)
    flags = hdr[:, 2]
    return ((sizes >= 16 + 4 * -(-chunk_bytes // block_bytes)) & (hdr[:, 0] == 2) & (flags & 0x0f == 0x04)
            & (flags >> 5 == BloscLz4.LZ4) & (hdr[:, 3] == itemsize) & (words[:, 1] == chunk_bytes)
            & (words[:, 2] == block_bytes) & (words[:, 3] == sizes))


# HDF5 filter -> how the GPU decodes it
CODECS = {reader.FILTER_DEFLATE: Deflate, reader.FILTER_LZF: Lzf, reader.FILTER_ZSTD: Zstd,
          reader.FILTER_BLOSC: BloscLz4}


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
        self.chunk_bytes = rows.chunk_bytes
        self.stride = CODECS[rows.codec].stride(self.chunk_bytes)
        self.max_chunks, self.capacity = layout(rows, block)
        self.group, self.group_chunks = group, group * self.max_chunks
        arrays = CODECS[rows.codec].arrays
        table_bytes = -(-arrays * 8 * self.group_chunks // 256) * 256
        self.flags = alloc(8)
        self.scratch_bytes = -(-int(self.group_chunks * self.stride * CODECS[rows.codec].scratch) // 256) * 256
        self.lanes = [Lane(alloc, table_bytes, group * self.capacity, self.group_chunks * self.stride, arrays,
                           self.group_chunks, self.scratch_bytes) for _ in range(streams)]
        self.copy = copy  # the stream of the uploads: the backend's, not sharing a hardware queue with a lane
        self.used, self.pool, self.lane, self.pieces = 0, None, None, []
        self.bind(rows)

    def fits(self, rows, block):
        """Whether this decoder's buffers serve blocks of `block` images of `rows`."""
        chunks, capacity = layout(rows, block)
        codec = CODECS[rows.codec]
        return (rows.chunk_bytes == self.chunk_bytes and codec.stride(rows.chunk_bytes) == self.stride
                and self.lanes[0].table.shape[0] == codec.arrays and chunks == self.max_chunks
                and capacity <= self.capacity and codec.scratch == CODECS[self.rows.codec].scratch)

    def bind(self, rows):
        """Decode the chunks of `rows` (a ChunkedRows that fits) from now on."""
        self.rows = rows
        index = np.array(rows.index, np.int64).reshape(-1, 3)
        self.offsets, self.sizes, self.masks = index[:, 0], index[:, 1], index[:, 2]
        self.per, self.row_bytes = rows.align, rows.row_bytes
        self.codec = CODECS[rows.codec](self.build, rows)

    def describe(self):
        return f"GPU: {self.codec.describe()}, {len(self.lanes)} streams"

    def columns(self, table):
        """The device addresses of the codec's table arrays, a group's rows each, from `table` on."""
        return [table + k * 8 * self.group_chunks for k in range(self.codec.arrays)]

    def start(self):
        import pycuda.driver as cuda

        cuda.memset_d32(self.flags, launch.INT_MAX, 2)
        self.used, self.lane, self.pieces = 0, None, []

    def read(self, pool, lo, hi, block):
        """Submit the reads of the chunks holding images [lo, hi) into block: one read per run of
        chunks stored back to back; futures."""
        self.pool = pool  # where a codec has chunks decoded on the host
        c0, c1 = lo // self.per, -(-hi // self.per)
        sizes, offsets = self.sizes[c0:c1], self.offsets[c0:c1]
        positions = np.concatenate([[0], np.cumsum(sizes[:-1])])
        block.lo, block.c0, block.positions = lo, c0, positions
        block.end = int(positions[-1] + sizes[-1])
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
