"""LZ4 blocks decoded on the GPU by lz4_blocks_kernel1: hdf5plugin's LZ4 (Lz4) and Bitshuffle (Bitshuffle)
filters, their chained blocks found by lz4_index_kernel1, and Blosc2's lz4 + bitshuffle (Blosc2), its
table of block starts read by the host; the overview: infer/gpu/codecs/__init__.py."""
import os

import numpy as np

from ...errors import InputError
from .. import launch
from .blosc import BloscLz4, _u32
from .deflate import Deflate


class Bitshuffle(BloscLz4):
    """hdf5plugin's Bitshuffle filter with lz4 (MNIST's chunk of 1,000 float32 images: 383 blocks of 8
    KB): each chunk's blocks found by lz4_index_kernel1 (a thread walks a chunk's block sizes) and
    decoded by lz4_blocks_kernel1 (a warp a block) into chunks back to back, still bitshuffled as the
    reader threads would leave them, the bits unshuffled as the images are placed (bitunshuffle_kernel2)
    or, where chunks cut images, as they are assembled (assemble_kernel2).
    The host checks each chunk's 12-byte header in the page-locked block; a chunk of another size or
    block size is decoded by the reader threads and goes into place after the others."""
    raw = False  # an LZ4 block is always one: none is stored as it is
    scratch = 1 / 64  # the index: 8 bytes a block (unsupported: blocks of at least 512 bytes)
    # Not yet timed on a GPU against the reader threads' LZ4 (1M MNIST images on an H200 host:
    # Bitshuffle 5.0-9.2M images/s, LZ4 9.9-13.1M), so only --decode gpu takes it
    # H200, 1M MNIST images (2026-12-05): the reader threads' LZ4 ran 1.05-2.3x the GPU's (docs/performance.md)
    host_first = "the reader threads' LZ4 outran the GPU's on an H200 (--decode gpu decodes it on the GPU)"
    what = "Bitshuffle lz4"

    def __init__(self, build, rows):
        self.index, self.lz4 = launch.Lz4Index(build), launch.Lz4Blocks(build)
        self.rows, self.itemsize = rows, rows.dtype.itemsize
        self.block_bytes, self.blocks, self.last_bytes, self.tail = self.framing(rows, self._block_of(rows))
        self.unshuffle = self._unshuffle(build, rows)
        self.pending = []

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
        return cls._blocks_unsupported(rows, cls._block_of(rows))

    @classmethod
    def _blocks_unsupported(cls, rows, block):
        """Why lz4_blocks_kernel1 cannot take the chunks of `rows` in blocks of `block` bytes, or None."""
        block, blocks, _, _ = cls.framing(rows, block)
        if block <= 0 or blocks == 0:
            return f"its chunks hold no whole LZ4 block ({block}-byte blocks)"
        if cls.scratch and 8 * blocks > rows.chunk_bytes * cls.scratch:
            return (f"its {rows.chunk_bytes:,}-byte chunks hold {blocks} LZ4 blocks, more than the GPU's index takes "
                    "(a block each 512 bytes)")
        if min(block, rows.chunk_bytes) >= 1 << 31:
            return f"its {block}-byte LZ4 blocks are past the GPU decoder's 2 GB"
        return None

    def describe(self):
        return f"{self.index.kernel} + {self.lz4.kernel} + {self._placing()}"

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
        return cls._blocks_unsupported(rows, cls._block_of(rows))

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
    assembles = False  # a chunk's b2nd blocks may split its images' rows: chunks cutting images are the host's
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

        from ...data import native

        frame = os.pread(rows.fd, int(rows.index[0][1]) - 4 * rows.summed, int(rows.index[0][0]))  # (not its fletcher32)
        padded = ctypes.c_size_t(0)
        at = native.library().rp_blosc2_chunk(rows.spec, frame, len(frame), ctypes.byref(padded))
        if at < 0:
            return None
        return frame[:Blosc2.HEAD], at, int.from_bytes(frame[at + 8:at + 12], "little"), padded.value

    @staticmethod
    def rows_per_chunk(rows):
        """The table's rows a chunk: its blocks (the first chunk's block size)."""
        first = Blosc2._first(rows)
        return Blosc2.framing(rows, first[2])[1] if first else 1

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
        return cls._blocks_unsupported(rows, block)

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
        return bool(taken.any()), self._host_rows(dec, block, ~taken)

    def decode(self, dec, stream, count, table, decoded, c0, scratch, extras):
        *chunks, index = dec.columns(table)
        self._blocks(dec, stream, count, chunks, index, c0)
