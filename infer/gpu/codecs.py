"""How the GPU decodes each HDF5 filter it takes (CODECS, for chunk_decode's stream of compressed
blocks): per codec, its kernels, the table of a group's chunks it fills, its checks, and how it
places a block's images.
- deflate (Deflate): inflate_kernel3 (cuda/inflate.cu: two warps parsing and writing each part of a
  chunk, its parts past the first starting at a deflate block they find, then joined), a kernel
  checking them (the kernel's status, the decoded size, deflate's adler32), HDF5's shuffle undone as
  they are placed. A chunk of 1,024 MNIST images at gzip 1 takes 19.5 ms alone in 2 parts (31 whole:
  H200); an SM holds eleven parts. A run whose chunks are not all in flight at once decodes them whole;
- Zstd (Zstd): zstd_kernel2 (cuda/zstd.cu: 3 warps a frame, two decoding its blocks apart into
  scratch memory, one carrying their sequences out in order), checked and unshuffled as deflate's. A
  1,000-image MNIST chunk takes 15 ms alone (H100), shuffled 23;
- LZF (Lzf): lzf_kernel1 (cuda/lzf.cu: a warp a chunk, a batch's 32 tokens parsed at once, its
  output built in a ring in shared memory), checked and unshuffled as deflate's. A 1,000-image MNIST
  chunk takes 24 ms alone (H200), shuffled 33;
- Blosc lz4 + bitshuffle (BloscLz4): blosc_lz4_kernel2 (cuda/lz4.cu: a warp per stream of a block,
  ~25 a 1,024-image chunk, the stream in a window of registers, the recent output in shared memory):
  80 such chunks alone take 5.4 ms (H200; 1,000-image chunks 16 ms, their last block one stream of
  514 KB), the bits unshuffled as they are placed;
- Blosc zstd (BloscZstd): zstd_kernel1 (a warp a frame) on each c-blosc block's frame (13 of 256 KB
  a 1,000-image MNIST chunk), c-blosc's byte shuffle undone a block at a time as they are placed;
- LZ4 (Lz4), Bitshuffle lz4 (Bitshuffle), Blosc2 lz4 + bitshuffle (Blosc2): lz4_blocks_kernel1 (a warp
  a block, as blosc_lz4_kernel2's streams) on blocks found by lz4_index_kernel1 (LZ4's and Bitshuffle's
  chained framing, a thread a chunk) or read by the host (Blosc2's table of starts). Only
  --decode gpu takes them (host_first): not yet timed on a GPU.
"""
import os

import numpy as np

from ..data import reader
from ..errors import InputError
from . import launch


class Deflate:
    """HDF5's deflate filter: a zlib stream a chunk (its 2-byte header and adler32 trailer around the
    deflate data), decoded by inflate_kernel3 into chunks 256 bytes apart, checked by
    decode_check_kernel1 (status, size, adler32), and HDF5's shuffle undone as the images are placed."""
    head, tail = 2, 4  # bytes of the zlib stream around its deflate data
    kernel, adler, what, frame = launch.InflateParts, True, "deflate", "not a zlib stream"
    scratch = launch.InflateParts.SCRATCH  # the kernel's scratch memory, bytes a decoded byte

    def __init__(self, build, rows):
        self.decoder, self.check = self.kernel(build), launch.DecodeCheck(build)
        self.shuffled = rows.shuffle and rows.dtype.itemsize > 1
        self.unshuffle = launch.Unshuffle(build, rows.dtype.itemsize) if self.shuffled and not rows.cut else None
        self.assemble = launch.Assemble(build, rows.dtype.itemsize) if rows.cut else None
        self.rows = rows

    @staticmethod
    def unsupported(rows):
        return None

    @staticmethod
    def rows_per_chunk(rows):
        """The table's rows a chunk (see Decoder.columns)."""
        return 1

    copies_stored = True  # chunks stored without the codec (their filter skipped) are copied into place
    assembles = True  # chunks cutting images are assembled as they are placed (assemble_kernel1)
    host_first = None  # why --decode auto leaves a streamed file's chunks to the reader threads, if it does
    arrays = 6  # of the table, uint64 a chunk: stream, size, capacity, output, decoded size, status
    # A launch takes 4 blocks of 128 MB (160 MNIST chunks), read 4 at a time: a 1M-image file's 1,000
    # chunks all in flight at once on 7 decode streams (with the network's 8 and the uploads', the 16
    # hardware queues), the first launched as soon as 4 blocks are up, a block (40,000 images) one
    # launch of the network. (H200, 1M images, fresh runs, the same call, against 10 blocks a launch:
    # shuffle + gzip 6 in 1,024-image chunks 94.6-97.1 ms against 98.3-101.4, shuffle + gzip 1 104.6-108.2
    # against 108.5-109.9, gzip 1 88.8-90.3 against 91.0-91.7, shuffle + Zstd 110.2-113.6 against
    # 113.1-115.4, the same peak RSS. 128 MB blocks had beaten 64 MB ones read 6 at a time: gzip 1
    # 111.8-119.4 ms against 121.5-137.6 under inflate_kernel1.)
    group, block_bytes, ring = 4, 128 << 20, 4

    @staticmethod
    def stride(chunk_bytes):
        return -(-chunk_bytes // 256) * 256

    def describe(self):
        return (f"{self.kernel.kernel}{' + unshuffle' if self.shuffled else ''}"
                f"{' + assemble (chunks cut images)' if self.assemble else ''}")

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

    def run(self, stream, count, at, scratch, scratch_bytes, split=True):
        """The kernel on a group's table columns `at` (see Decoder.columns); split: whether
        inflate_kernel3 splits the streams (Decoder.split). A shuffled file's streams are mostly
        literals, so their parse is the longer part: its parsers spread over every scheduler (977
        shuffled gzip 6 chunks 50.7 ms against 55.7; unshuffled, where the writers' copies weigh
        more, gzip 6 43.2 against 41.5: H200, the same call)."""
        self.decoder(stream, count, at[0], at[1], at[2], at[4], at[3], at[5], scratch, scratch_bytes, split,
                     spread=self.shuffled)

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
        self.run(stream, count, at, scratch, dec.scratch_bytes, dec.split)
        self.check(stream, count, at[0], at[1], at[4], at[5], decoded, dec.chunk_bytes, dec.stride, self.adler, c0,
                   dec.flags)
        for slot, src, nbytes in (copy for stored in extras for copy in stored):  # before the lane's bytes
            cuda.memcpy_dtod_async(slot, src, nbytes, stream)                      # are uploaded over (flush)

    def place(self, dec, stream, piece, decoded, dst):
        per = dec.per
        first = piece.lo - piece.c0 // dec.slab * per  # rows of the first chunk before the block
        if self.rows.cut:  # (BloscZstd places its unshuffled chunks here too: never cut)
            image, chunk = self.rows.shape[1:], self.rows.chunks
            pad = (1,) * (4 - len(chunk))  # rows of H x W x C values, chunks of R x h x w x c
            self.assemble(stream, decoded, dst, pad + image, chunk[:1] + pad + chunk[1:], first, piece.images,
                          dec.stride, self.shuffled)
        elif self.shuffled:
            values = dec.row_bytes // self.rows.dtype.itemsize
            self.unshuffle(stream, decoded, dst, first * values, piece.images * values, per * values, dec.stride)
        else:
            _copy_rows(dec, stream, piece, first, decoded, dst)

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

    def run(self, stream, count, at, scratch, scratch_bytes, split=True):
        self.decoder(stream, count, at[0], at[1], at[2], at[4], at[3], at[5], scratch, scratch_bytes)

    @staticmethod
    def sample():
        # one stored block of 4096 zero bytes; a single segment, its size in 2 bytes (4096 - 256)
        return Zstd.MAGIC + bytes([0x60, 0x00, 0x0F]) + (1 | 4096 << 3).to_bytes(3, "little") + bytes(4096)

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
    scratch = 0.0
    # 10 of deflate's blocks a launch (H200, 1M images: 97.3-99.8 ms against 103.8 in 20 blocks of 64 MB a
    # launch, peak RSS 364 MB against 326; shuffled, groups of 4 ran alike, of 2 slower: 103-106 and
    # 124-129 ms against 103-106); shuffled, LZF keeps a quarter of MNIST's bytes, and
    # chunk_decode.plan halves its blocks
    group, block_bytes, ring = 10, Deflate.block_bytes, Deflate.ring

    @staticmethod
    def sample():
        """4,096 zero bytes: runs of 32 literals, each followed by a reference one byte back."""
        unit = bytes([31]) + bytes(32) + bytes([0xE0, 255, 0])  # 32 literals, then 264 bytes
        return unit * 13 + bytes([31]) + bytes(32) + bytes([0xE0, 207, 0])  # the last reference 216 bytes

    def starts_right(self, buf, at, sizes):
        return sizes > 0

    def run(self, stream, count, at, scratch, scratch_bytes, split=True):
        self.decoder(stream, count, at[0], at[1], at[2], at[4], at[3], at[5])


class BloscLz4:
    """hdf5plugin's Blosc filter (c-blosc 1's format 2) with lz4 and its bitshuffle: the chunks'
    streams decoded by blosc_lz4_kernel2 into chunks back to back, the bits unshuffled as the images
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
    rows_per_chunk = staticmethod(Deflate.rows_per_chunk)
    scratch = 0.0
    copies_stored = False  # a file with chunks stored without the codec is the host's
    assembles = False  # chunks cutting images are the host's
    host_first = None
    # A launch takes 10 blocks of 32 MB (80 MNIST chunks, ~1,700 warps of ~13 ms), read 4 at a time:
    # the host's 4 compressed blocks keep the peak RSS under 400 MB (6 of 64 MB: 7.0M images/s, 484 MB).
    # Smaller launches, which helped deflate, do not help here (H200, 1M images in 1,024-image chunks:
    # 5 and 4 blocks 90.0-93.5 and 92.3-92.9 ms against 89.2-90.9; paced by the upload)
    group, block_bytes, ring = 10, 32 << 20, 4

    @staticmethod
    def stride(chunk_bytes):
        return chunk_bytes

    def describe(self):
        return f"{self.lz4.kernel} + bitunshuffle"

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
        taken = self.taken(block.buf[:block.end], np.asarray(block.positions, np.int64), sizes, dec.chunk_bytes)
        self.pending = [(buf, e) for buf, e in self.pending if not e.query()]
        rows = slice(o, o + n)
        table[0, rows] = data + block.positions
        table[1, rows] = np.where(taken, sizes, 0)  # 0: left to the host
        table[2, rows] = decoded + np.arange(n, dtype=np.uint64) * dec.stride
        return bool(taken.any()), [self._host_decoded(dec, block, int(k)) for k in np.flatnonzero(~taken)]

    def taken(self, buf, at, sizes, chunk_bytes):
        """Which chunks stored at offsets `at` of buf (sizes bytes each) the GPU decodes (blosc_chunks)."""
        return blosc_chunks(buf, at, sizes, chunk_bytes, self.itemsize, self.block_bytes)

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
        values = dec.row_bytes // self.itemsize
        first = piece.lo - piece.c0 * dec.per
        self.unshuffle(stream, decoded, dst, piece.chunks, dec.per * values, self.block_values, self.exact_tail,
                       first * values, piece.images * values)
        self._place_host_decoded(dec, stream, piece.extra, dst)

    def _place_host_decoded(self, dec, stream, host, dst):
        """The rows the reader threads decoded (row in the block, page-locked rows), over what the
        GPU made of those chunks' bytes; their buffers kept until the copies are done."""
        import pycuda.driver as cuda

        from .executor import event

        for row, out in host:
            cuda.memcpy_htod_async(dst + row * dec.row_bytes, out, stream)
        if host:
            self.pending.append(([out for _, out in host], event(stream)))

    def failure(self, dec, j, which):
        return InputError(f"{self.rows.label}: chunk {j} cannot be decompressed ({self.rows.codec_name} lz4: "
                          f"damaged data, or not {dec.chunk_bytes} bytes once decoded)")


class Bitshuffle(BloscLz4):
    """hdf5plugin's Bitshuffle filter with lz4 (MNIST's chunk of 1,000 float32 images: 383 blocks of 8
    KB): each chunk's blocks found by lz4_index_kernel1 (a thread walks a chunk's block sizes) and
    decoded by lz4_blocks_kernel1 (a warp a block) into chunks back to back, still bitshuffled as the
    reader threads would leave them, the bits unshuffled as the images are placed (bitunshuffle_kernel2).
    The host checks each chunk's 12-byte header in the page-locked block; a chunk of another size or
    block size is decoded by the reader threads and goes into place after the others."""
    raw = False  # an LZ4 block is always one: none is stored as it is
    scratch = 1 / 64  # the index: 8 bytes a block (unsupported: blocks of at least 512 bytes)
    # Not yet timed on a GPU against the reader threads' LZ4 (1M MNIST images on an H200 host:
    # Bitshuffle 5.0-9.2M images/s, LZ4 9.9-13.1M), so only --decode gpu takes it
    host_first = "the reader threads' LZ4 is the measured path (--decode gpu decodes it on the GPU)"
    what = "Bitshuffle lz4"

    def __init__(self, build, rows):
        self.index, self.lz4 = launch.Lz4Index(build), launch.Lz4Blocks(build)
        self.rows, self.itemsize = rows, rows.dtype.itemsize
        self.block_bytes, self.blocks, self.last_bytes, self.tail = self.framing(rows, self._block_of(rows))
        self.unshuffle = self._unshuffle(build, rows)
        self.pending = []

    def _unshuffle(self, build, rows):
        self.block_values, self.exact_tail = rows.bitshuffle
        return launch.BitUnshuffleRange(build, rows.dtype.itemsize)

    @staticmethod
    def _block_of(rows):
        """The block size the first chunk's header gives (0 where it is shorter than a header)."""
        head = os.pread(rows.fd, 12, int(rows.index[0][0]))
        return int.from_bytes(head[8:12], "big") if len(head) == 12 else 0

    @staticmethod
    def framing(rows, block):
        """(block bytes, blocks, the last block's bytes, bytes after the last block) of a chunk of
        `rows` in blocks of `block` bytes: Bitshuffle's blocks hold whole groups of 8 values, the
        values past them stored as they are (blocks 0 where the chunk holds fewer than 8)."""
        size = rows.dtype.itemsize
        n, per = rows.chunk_bytes // size, block // size
        full, last = n // per, n % per - n % per % 8
        return block, full + (last > 0), (last or per) * size, rows.chunk_bytes - (full * per + last) * size

    @classmethod
    def unsupported(cls, rows):
        if rows.shuffle:
            return "HDF5's shuffle before Bitshuffle is undone on the host"
        cd = rows.codec_values[1]
        if (cd[4] if len(cd) > 4 else 0) != 2:
            return "the GPU decodes Bitshuffle's lz4 blocks, not its zstd or uncompressed ones"
        if rows.bitshuffle is None:
            return "the GPU decodes Bitshuffle chunks with a native reader beside it"
        return cls._too_small(rows, cls._block_of(rows))

    @classmethod
    def _too_small(cls, rows, block):
        block, blocks, _, _ = cls.framing(rows, block)
        if block <= 0 or blocks == 0:
            return f"its chunks hold no whole LZ4 block ({block}-byte blocks)"
        if cls.scratch and 8 * blocks > rows.chunk_bytes * cls.scratch:
            return f"its {block}-byte LZ4 blocks are smaller than the GPU's index takes (512 bytes)"
        return None

    def describe(self):
        return f"{self.index.kernel} + {self.lz4.kernel} + bitunshuffle"

    def warm_up(self, alloc):
        import pycuda.driver as cuda

        n = 8 * self.itemsize  # one block of 8 values, its LZ4 block all literals
        stored = bytes([n << 4] if n < 15 else [0xF0, n - 15]) + bytes(n)
        chunk = np.frombuffer(n.to_bytes(8, "big") + n.to_bytes(4, "big") + len(stored).to_bytes(4, "big") + stored,
                              np.uint8)
        src, out, values, table, index, bad = alloc(len(chunk)), alloc(n), alloc(n), alloc(24), alloc(8), alloc(4)
        cuda.memcpy_htod(src, chunk)
        cuda.memcpy_htod(table, np.array([int(src), len(chunk), int(out)], np.uint64))
        cuda.memcpy_htod(index, np.array([16, len(stored)], np.uint32))
        t, stream = int(table), cuda.Stream()
        if self.index:
            self.index(stream, 1, t, t + 8, t + 16, n, 1, 0, index, 0, bad)
        self.lz4(stream, 1, t, t + 8, t + 16, n, 1, n, self.raw, index, 0, bad)
        self._warm_place(stream, out, values)

    def _warm_place(self, stream, out, values):
        self.unshuffle(stream, out, values, 1, 8, 8, 0, 0, 8)

    def taken(self, buf, at, sizes, chunk_bytes):
        """Which chunks stored at offsets `at` of buf (sizes bytes each) the GPU decodes: their header
        gives this file's chunk and block sizes, and their stored sizes fit 32 bits."""
        if len(buf) < 12:
            return np.zeros(len(at), bool)
        hdr = buf[np.minimum(at[:, None] + np.arange(12), len(buf) - 1)].astype(np.int64)
        total = (hdr[:, :8] << (8 * np.arange(7, -1, -1))).sum(axis=1)
        block = (hdr[:, 8:] << (8 * np.arange(3, -1, -1))).sum(axis=1)
        return (sizes >= 12) & (sizes < 1 << 32) & (total == chunk_bytes) & (block == self.block_bytes)

    def decode(self, dec, stream, count, table, decoded, c0, scratch, extras):
        starts, sizes, outputs = dec.columns(table)
        self.index(stream, count, starts, sizes, outputs, dec.chunk_bytes, self.blocks, self.tail, scratch, c0,
                   dec.flags)
        self._blocks(dec, stream, count, (starts, sizes, outputs), scratch, c0)

    def _blocks(self, dec, stream, count, chunks, index, c0):
        """The group's blocks decoded, as `index` (device address) has them; chunks: the device
        addresses of the table's columns of frames, stored sizes and outputs."""
        self.lz4(stream, count, *chunks, self.block_bytes, self.blocks, self.last_bytes, self.raw, index, c0, dec.flags)

    def failure(self, dec, j, which):
        return InputError(f"{self.rows.label}: chunk {j} cannot be decompressed ({self.what}: damaged data, or not "
                          f"{dec.chunk_bytes} bytes once decoded)")


class Lz4(Bitshuffle):
    """hdf5plugin's LZ4 filter, HDF5's shuffle before it or not: each chunk's LZ4 blocks (of the
    block size the filter was given; by default one a chunk) found and decoded as Bitshuffle's, a
    block stored in its decoded size stored as it is, unshuffled (unshuffle_kernel1), assembled
    (chunks cutting images) or copied as the images are placed. One warp decodes a block, so a chunk
    in one block (a 1,000-image MNIST chunk: 3.1 MB) decodes on one warp."""
    raw = True  # a block of its decoded size is stored as it is
    what = "LZ4"
    assembles = True  # Deflate.place: chunks cutting images assembled as they are placed

    def _unshuffle(self, build, rows):
        self.shuffled = rows.shuffle and self.itemsize > 1
        self.assemble = launch.Assemble(build, self.itemsize) if rows.cut else None
        return launch.Unshuffle(build, self.itemsize) if self.shuffled and not rows.cut else None

    @staticmethod
    def framing(rows, block):
        blocks = -(-rows.chunk_bytes // block) if block > 0 else 0
        return block, blocks, rows.chunk_bytes - (blocks - 1) * block, 0

    @classmethod
    def unsupported(cls, rows):
        if not rows.native:
            return "the GPU decodes LZ4 chunks with a native reader beside it"
        return cls._too_small(rows, cls._block_of(rows))

    def describe(self):
        return (f"{self.index.kernel} + {self.lz4.kernel}{' + unshuffle' if self.unshuffle else ''}"
                f"{' + assemble (chunks cut images)' if self.assemble else ''}")

    def _warm_place(self, stream, out, values):
        if self.unshuffle:
            self.unshuffle(stream, out, values, 0, 8, 8, 8 * self.itemsize)

    def place(self, dec, stream, piece, decoded, dst):
        Deflate.place(self, dec, stream, piece, decoded, dst)
        self._place_host_decoded(dec, stream, piece.extra, dst)


class Blosc2(Bitshuffle):
    """hdf5plugin's Blosc2 filter with lz4 and bitshuffle alone, a frame a chunk whose b2nd blocks
    hold the chunk's rows exactly (no padding past them): its chunk's blocks (a table of starts,
    a stream each) decoded by lz4_blocks_kernel1 (a warp a block; Blosc2's 64-row blocks of MNIST:
    16 of 196 KB a 1,024-image chunk) into chunks back to back, still bitshuffled as the Bitshuffle
    filter lays its blocks out, the bits unshuffled as the images are placed. The starts are a
    table, not a chain, so the host reads each block's start and size out of the page-locked block
    (a table row a block, the index column) and checks them; a chunk stored otherwise (a frame of
    another header, runs, another block size) is decoded by the reader threads."""
    raw = True  # a stream of its block's size is stored as it is
    scratch = 0.0
    arrays = 4  # of the table, uint64: per chunk its frame, stored size, output; per block its index
    what = "Blosc2 lz4"
    host_first = Bitshuffle.host_first
    FILTERS = bytes([0, 0, 0, 0, 0, 2])  # a chunk's filters: bitshuffle alone
    framing = staticmethod(Lz4.framing)  # blocks of the block size, the last shorter
    HEAD = 15  # a frame's bytes alike in every chunk: msgpack's array, "b2frame", the header's length

    def __init__(self, build, rows):
        self.index, self.lz4 = None, launch.Lz4Blocks(build)
        self.rows, self.itemsize = rows, rows.dtype.itemsize
        self.frame, self.at, block, _ = self._first(rows)
        self.block_bytes, self.blocks, self.last_bytes, _ = self.framing(rows, block)
        self.unshuffle = self._unshuffle(build, rows)
        self.pending = []

    @staticmethod
    def _first(rows):
        """(the first frame's first HEAD bytes, where its chunk starts, its block size, the bytes
        its chunk decodes to), or None where the native library does not parse it."""
        import ctypes

        from ..data import native

        frame, padded = os.pread(rows.fd, int(rows.index[0][1]), int(rows.index[0][0])), ctypes.c_size_t(0)
        at = native.library().rp_blosc2_chunk(rows.spec, frame, len(frame), ctypes.byref(padded))
        if at < 0:
            return None
        return frame[:Blosc2.HEAD], at, int.from_bytes(frame[at + 8:at + 12], "little"), padded.value

    @staticmethod
    def rows_per_chunk(rows):
        """The table's rows a chunk: its blocks (the first chunk's block size)."""
        first = Blosc2._first(rows)
        return Lz4.framing(rows, first[2])[1] if first else 1

    @classmethod
    def unsupported(cls, rows):
        first = cls._first(rows) if rows.bitshuffle is not None else None
        if first is None:
            return "the GPU decodes Blosc2 chunks bitshuffled alone, with a native reader beside it"
        _, at, block, padded = first
        if padded != rows.chunk_bytes:
            return ("its Blosc2 frames decode past the HDF5 chunk (b2nd blocks padding its rows), which the reader "
                    "threads cut")
        head = os.pread(rows.fd, 3, int(rows.index[0][0]) + at)
        if head[2] >> 5 != BloscLz4.LZ4:
            return "the GPU decodes Blosc2's lz4, not its other codecs"
        return cls._too_small(rows, block)

    def describe(self):
        return f"{self.lz4.kernel} (Blosc2 blocks) + bitunshuffle"

    def taken(self, buf, at, sizes, chunk_bytes):
        """Which frames stored at offsets `at` of buf (sizes bytes each) the GPU decodes: the first
        frame's header bytes and length, its own length in its header, then a chunk of Blosc2's
        format 3 to 5, lz4, bitshuffle alone, this file's value size and block size, no runs,
        decoding to chunk_bytes, stored within the frame."""
        n = self.at
        if len(buf) < n + 32:
            return np.zeros(len(at), bool)
        frame = buf[np.minimum(at[:, None] + np.arange(n + 32), len(buf) - 1)]
        length = (frame[:, 16:24].astype(np.int64) << (8 * np.arange(7, -1, -1))).sum(axis=1)
        chunk = frame[:, n:]
        words = chunk[:, 4:16].copy().view("<u4").astype(np.int64)
        return ((sizes >= n + 32) & (frame[:, :self.HEAD] == np.frombuffer(self.frame, np.uint8)).all(axis=1)
                & (frame[:, 15] == 0xCF) & (length == sizes) & (chunk[:, 0] >= 3) & (chunk[:, 0] <= 5)
                & (chunk[:, 2] & 0x17 == 0x15) & (chunk[:, 2] >> 5 == BloscLz4.LZ4) & (chunk[:, 3] == self.itemsize)
                & (chunk[:, 31] == 0) & (chunk[:, 16:22] == np.frombuffer(self.FILTERS, np.uint8)).all(axis=1)
                & (words[:, 0] == chunk_bytes) & (words[:, 1] == self.block_bytes) & (words[:, 2] <= sizes - n))

    def prepare(self, dec, block, table, o, data, decoded):
        """The block's rows of the group's table (chunk o of the group on): per chunk its frame (the
        block's bytes go up to device address `data`), stored size (0 for the chunks the host
        decodes) and output (from `decoded` on); per block its stream's start in the frame and size
        (uint32 each, in the index column, a row a block); a chunk whose block starts or sizes run
        past its end refused here, one whose blocks are runs decoded by the host. (Whether the GPU
        decodes any of its chunks, the rows the host decoded.)"""
        n, nb = len(block.positions), self.blocks
        sizes = dec.sizes[block.c0:block.c0 + n]
        buf, at = block.buf[:block.end], np.asarray(block.positions, np.int64)
        taken = self.taken(buf, at, sizes, dec.chunk_bytes)
        chunk = at + self.at
        cbytes = _u32(buf, chunk + 12)
        starts = _u32(buf, chunk[:, None] + 32 + 4 * np.arange(nb))
        csize = _u32(buf, chunk[:, None] + starts).astype(np.int32).astype(np.int64)  # <= 0: runs
        fits = (starts >= 32 + 4 * nb) & (starts + 4 + csize <= cbytes[:, None])  # (runs: to the host, below)
        bad = taken & ~fits.all(axis=1)
        if bad.any():
            raise InputError(f"{self.rows.label}: chunk {block.c0 + int(np.argmax(bad))} cannot be decompressed "
                             "(Blosc2: a block's start or size past the chunk's end)")
        taken &= (csize > 0).all(axis=1)
        self.pending = [(b, e) for b, e in self.pending if not e.query()]
        rows = slice(o, o + n)
        table[0, rows] = data + block.positions
        table[1, rows] = np.where(taken, sizes, 0)  # 0: left to the host
        table[2, rows] = decoded + np.arange(n, dtype=np.uint64) * dec.stride
        pairs = (self.at + starts + 4).astype(np.uint64) | np.maximum(csize, 0).astype(np.uint64) << np.uint64(32)
        table[3, o * nb:(o + n) * nb] = pairs.reshape(-1)
        return bool(taken.any()), [self._host_decoded(dec, block, int(k)) for k in np.flatnonzero(~taken)]

    def decode(self, dec, stream, count, table, decoded, c0, scratch, extras):
        *chunks, index = dec.columns(table)
        self._blocks(dec, stream, count, chunks, index, c0)


def _copy_rows(dec, stream, piece, first, decoded, dst):
    """A block's rows of decoded chunks of whole rows (`first` rows into the first) copied to dst:
    in one copy where the chunks lie back to back, else one a chunk."""
    import pycuda.driver as cuda

    per, row_bytes = dec.per, dec.row_bytes
    if dec.stride == dec.chunk_bytes:
        cuda.memcpy_dtod_async(dst, decoded + first * row_bytes, piece.images * row_bytes, stream)
        return
    done = 0
    for k in range(piece.chunks):
        lo = first if k == 0 else k * per
        rows = min(per * (k + 1), first + piece.images) - lo
        cuda.memcpy_dtod_async(dst + done * row_bytes, decoded + k * dec.stride + (lo - k * per) * row_bytes,
                               rows * row_bytes, stream)
        done += rows


def _u32(buf, at):
    """The little-endian uint32 at each offset `at` (an array) of buf (uint8; offsets past its end
    read its last byte)."""
    b = buf[np.minimum(np.asarray(at, np.int64)[..., None] + np.arange(4), len(buf) - 1)].astype(np.int64)
    return b[..., 0] | b[..., 1] << 8 | b[..., 2] << 16 | b[..., 3] << 24


class BloscZstd(BloscLz4):
    """hdf5plugin's Blosc filter (c-blosc 1's format 2) with zstd, byte-shuffled or not, a stream a
    block (c-blosc's don't-split flag, how it stores zstd): each block's Zstandard frame decoded by
    zstd_kernel1 into its place in the chunk (a table row a block, chunks 256 bytes apart), checked
    by decode_check_kernel2 (status, each block's size: the frames' structure catches damage), and
    c-blosc's shuffle, a block at a time, undone as the images are placed (blosc_unshuffle_kernel1).
    A block stored as it is (it did not shrink) is copied into place; a chunk stored otherwise
    (copied whole, split, another codec or block size) is decoded by the reader threads. A warp a
    frame, not zstd_kernel2's three: a frame is a c-blosc block (a 1,000-image MNIST chunk is 13 of
    256 KB, two Zstandard blocks each), so a run has frames enough to fill every SM, and an SM holds
    14 frames at a warp each, not zstd_kernel2's 5 (128 registers a thread, 38 KB of shared memory a
    frame; 1M images, H200: 110-116 ms, not 176-180). The group, blocks and ring deflate's were until
    2026-12-03."""
    ZSTD = 4  # c-blosc's codec number, in a header's flags >> 5
    arrays = 6  # of the table, uint64 a block: frame, size, capacity, output, decoded size, status
    # (chosen under zstd_kernel2, where 10 of deflate's 128 MB, 4 deep, took 1M images 201 ms; under
    # zstd_kernel1 the two plans run alike: 110.0-113.2 ms against 109.4-111.3, H200)
    group, block_bytes, ring = 20, 64 << 20, 6
    stride = staticmethod(Deflate.stride)

    def __init__(self, build, rows):
        self.decoder, self.check = launch.Zstd(build), launch.StreamCheck(build)
        head = os.pread(rows.fd, 16, int(rows.index[0][0]))
        self.rows, self.itemsize = rows, rows.dtype.itemsize
        self.flags, self.blosc_block = head[2], int.from_bytes(head[8:12], "little")
        self.blocks = self.rows_per_chunk(rows)
        self.shuffled = bool(head[2] & 1) and self.itemsize > 1
        self.unshuffle = launch.BloscUnshuffle(build, self.itemsize) if self.shuffled else None
        self.pending = []

    @staticmethod
    def rows_per_chunk(rows):
        """The table's rows a chunk: its c-blosc blocks (the first chunk's block size)."""
        return -(-rows.chunk_bytes // int.from_bytes(os.pread(rows.fd, 16, int(rows.index[0][0]))[8:12], "little"))

    @classmethod
    def unsupported(cls, rows):
        if rows.shuffle:
            return "HDF5's shuffle before Blosc is undone on the host"
        if not rows.native:
            return "the GPU decodes Blosc zstd chunks with a native reader beside it"
        head = os.pread(rows.fd, 16, int(rows.index[0][0]))
        if len(head) < 16:
            return "its first chunk is shorter than a Blosc header"
        flags, typesize = head[2], head[3]
        nbytes, block = int.from_bytes(head[4:8], "little"), int.from_bytes(head[8:12], "little")
        if head[0] != 2 or flags & 0x06 or not flags & 0x10 or typesize != rows.dtype.itemsize:
            return ("the GPU decodes Blosc zstd chunks of c-blosc 1's format, byte-shuffled or not, a stream a block, "
                    "not these")
        if nbytes != rows.chunk_bytes or block <= 0 or block % typesize or rows.chunk_bytes % block % typesize:
            return "its Blosc blocks do not hold whole values"
        first = int(rows.index[0][0])
        frame = os.pread(rows.fd, 9, first + int.from_bytes(os.pread(rows.fd, 4, first + 16), "little"))
        if len(frame) == 9 and frame[4:8] == Zstd.MAGIC and frame[8] & Zstd.OTHERS:  # (its size, then the frame)
            return "its Zstandard frames carry a checksum or name a dictionary (the host's libzstd reads them)"
        return None

    def describe(self):
        return f"zstd_kernel1 (Blosc blocks){' + blosc unshuffle' if self.shuffled else ''}"

    def warm_up(self, alloc):
        import pycuda.driver as cuda

        frame = np.frombuffer(Zstd.sample(), np.uint8)  # 4,096 zero bytes
        src, out, values, table, bad = alloc(len(frame)), alloc(4096), alloc(4096), alloc(48), alloc(4)
        cuda.memcpy_htod(src, frame)
        cuda.memcpy_htod(table, np.array([int(src), len(frame), 4096, int(out), 0, 0], np.uint64))
        cuda.memset_d32(bad, launch.INT_MAX, 1)
        t, stream = int(table), cuda.Stream()
        self.decoder(stream, 1, t, t + 8, t + 16, t + 32, t + 24, t + 40)
        self.check(stream, 1, t + 8, t + 16, t + 32, t + 40, 0, bad)
        if self.unshuffle:
            n = 4096 // self.itemsize
            self.unshuffle(stream, out, values, 0, n, n, 4096, n // 2)

    def prepare(self, dec, block, table, o, data, decoded):
        """The table's rows of the block's chunks (from chunk o of the group on, self.blocks rows a
        chunk): per c-blosc block its frame (the block's bytes go up to device address `data`), size
        and capacity (0 for a block stored as it is, and for the chunks the host decodes), output
        (from `decoded` on); a chunk whose block starts or sizes run past its bytes refused here, one
        with a frame that is not plain decoded by the host. (Whether the GPU decodes any of its
        chunks; (the blocks to copy into place: (slot, bytes, size), the rows the host decoded: (row
        in the block, page-locked rows)).)"""
        n, nb, size = len(block.positions), self.blocks, self.blosc_block
        sizes = dec.sizes[block.c0:block.c0 + n]
        buf, at = block.buf[:block.end], np.asarray(block.positions, np.int64)
        taken = self.taken(buf, at, sizes, dec.chunk_bytes)
        k = np.arange(nb)
        bsize = np.minimum(size, dec.chunk_bytes - k * size)  # the last block shorter
        starts = _u32(buf, at[:, None] + 16 + 4 * k)
        csize = _u32(buf, at[:, None] + starts)
        fits = (starts >= 16 + 4 * nb) & (starts + 4 <= sizes[:, None]) & (starts + 4 + csize <= sizes[:, None])
        bad = taken & ~fits.all(axis=1)
        if bad.any():
            raise InputError(f"{self.rows.label}: chunk {block.c0 + int(np.argmax(bad))} cannot be decompressed "
                             "(Blosc zstd: a block's start or size past the chunk's end)")
        # a chunk whose frames are not all plain (magic, no checksum nor dictionary) goes to the host,
        # whose libzstd checks checksums and names damage
        frame = at[:, None] + starts + 4
        plain = (_u32(buf, frame) == int.from_bytes(Zstd.MAGIC, "little")) & (
            buf[np.minimum(frame + 4, len(buf) - 1)] & Zstd.OTHERS == 0)
        taken &= (plain | (csize == bsize)).all(axis=1)
        raw, decode = taken[:, None] & (csize == bsize), taken[:, None] & (csize != bsize)
        rows = ((o + np.arange(n)) * nb)[:, None] + k
        outputs = decoded + (np.arange(n, dtype=np.uint64) * dec.stride)[:, None] + (k * size).astype(np.uint64)
        frames = data + frame.astype(np.uint64)
        table[0, rows] = frames
        table[1, rows] = np.where(decode, csize, 0)
        table[2, rows] = np.where(decode, bsize, 0)
        table[3, rows] = outputs
        self.pending = [(b, e) for b, e in self.pending if not e.query()]
        copies = [(int(outputs[i, j]), int(frames[i, j]), int(bsize[j])) for i, j in zip(*np.nonzero(raw))]
        host = [self._host_decoded(dec, block, int(i)) for i in np.flatnonzero(~taken)]
        return bool(taken.any()), (copies, host)

    def taken(self, buf, at, sizes, chunk_bytes):
        """Which chunks stored at offsets `at` of buf (sizes bytes each) the GPU decodes: c-blosc 1's
        format 2, zstd, a stream a block, this file's shuffle, value size and block size, decoding to
        chunk_bytes, stored in the size its header says, room for its block starts."""
        if len(buf) < 16:
            return np.zeros(len(at), bool)
        hdr = buf[np.minimum(at[:, None] + np.arange(16), len(buf) - 1)]
        words = hdr[:, 4:16].copy().view("<u4").astype(np.int64)
        return ((sizes >= 16 + 4 * self.blocks) & (hdr[:, 0] == 2) & (hdr[:, 2] == self.flags)
                & (hdr[:, 3] == self.itemsize) & (words[:, 0] == chunk_bytes) & (words[:, 1] == self.blosc_block)
                & (words[:, 2] == sizes))

    def decode(self, dec, stream, count, table, decoded, c0, scratch, extras):
        import pycuda.driver as cuda

        at, rows = dec.columns(table), count * self.blocks
        self.decoder(stream, rows, at[0], at[1], at[2], at[4], at[3], at[5])
        self.check(stream, rows, at[1], at[2], at[4], at[5], c0 * self.blocks, dec.flags)
        for slot, src, nbytes in (copy for copies, _ in extras for copy in copies):  # before the lane's bytes
            cuda.memcpy_dtod_async(slot, src, nbytes, stream)                         # are uploaded over

    def place(self, dec, stream, piece, decoded, dst):
        if self.shuffled:
            values = dec.row_bytes // self.itemsize
            first = piece.lo - piece.c0 * dec.per
            self.unshuffle(stream, decoded, dst, first * values, piece.images * values, dec.per * values, dec.stride,
                           self.blosc_block // self.itemsize)
        else:
            Deflate.place(self, dec, stream, piece, decoded, dst)
        self._place_host_decoded(dec, stream, piece.extra[1], dst)

    def failure(self, dec, j, which):
        return InputError(f"{self.rows.label}: chunk {j // self.blocks} cannot be decompressed ({self.rows.codec_name} "
                          "zstd: damaged data, or a block not of its size once decoded)")


def blosc_chunks(data, at, sizes, chunk_bytes, itemsize, block_bytes):
    """Which of the c-blosc chunks stored in `data` (bytes) at offsets `at`, `sizes` bytes each,
    blosc_lz4_kernel2 decodes: c-blosc 1's format 2, bitshuffled (flag 4; neither byte-shuffled nor
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


# HDF5 filter -> how the GPU decodes it (Blosc: by the codec its first chunk names, codec_for)
CODECS = {reader.FILTER_DEFLATE: Deflate, reader.FILTER_LZF: Lzf, reader.FILTER_ZSTD: Zstd,
          reader.FILTER_BLOSC: BloscLz4, reader.FILTER_BITSHUFFLE: Bitshuffle, reader.FILTER_LZ4: Lz4,
          reader.FILTER_BLOSC2: Blosc2}


def codec_for(rows):
    """How the GPU decodes the chunks of `rows` (a ChunkedRows whose filter is in CODECS)."""
    codec = CODECS[rows.codec]
    if codec is BloscLz4:
        head = os.pread(rows.fd, 3, int(rows.index[0][0]))
        if len(head) == 3 and head[2] >> 5 == BloscZstd.ZSTD:
            return BloscZstd
    return codec
