"""c-blosc's chunks (hdf5plugin's Blosc filter) decoded on the GPU: lz4 + bitshuffle (BloscLz4) and
zstd (BloscZstd); the overview: infer/gpu/codecs/__init__.py."""
import os

import numpy as np

from ...errors import InputError
from .. import launch
from .deflate import Deflate, Zstd, _copy_rows, cut_geometry


class BloscLz4:
    """hdf5plugin's Blosc filter (c-blosc 1's format 2) with lz4 and its bitshuffle: the chunks'
    streams decoded by blosc_lz4_kernel2 into chunks back to back, the bits unshuffled as the images
    are placed (bitunshuffle_kernel2), or, where chunks cut images, as the images are assembled from
    them (assemble_kernel2). The host checks each chunk's header in the page-locked block; a chunk
    stored otherwise (copied whole, byte shuffled, another codec or block size) is decoded by the
    reader threads, as without a GPU, and goes into place after the others (where chunks cut
    images, with every chunk of its row of chunks)."""
    LZ4 = 1  # c-blosc's codec number, in a header's flags >> 5
    SHUFFLE = 0x04  # a header's flags & 0x0f: bitshuffled, neither byte-shuffled (0x01) nor copied whole (0x02)
    LAYOUT = "BITS"  # how assemble_kernel2 reads the decoded chunks

    def __init__(self, build, rows):
        self.lz4 = launch.BloscLz4(build)
        self.rows, self.itemsize = rows, rows.dtype.itemsize
        self.unshuffle = self._unshuffle(build, rows)
        self.block_bytes = self.block_values * self.itemsize
        self.pending = []  # (page-locked rows decoded on the host, the event after their upload)

    def _unshuffle(self, build, rows):
        """The kernel placing a block's images: the bitshuffled chunks' layout (block_values,
        exact_tail) noted, assemble_kernel2 made where chunks cut images (self.assemble), else the
        bit-unshuffle returned."""
        self.block_values, self.exact_tail = rows.bitshuffle
        self.assemble = launch.AssembleBlocks(build, self.itemsize) if rows.cut else None
        return None if rows.cut else launch.BitUnshuffleRange(build, self.itemsize)

    @classmethod
    def unsupported(cls, rows):
        if rows.bitshuffle is None or not rows.bitshuffle[1]:
            return "the GPU decodes Blosc lz4 chunks bitshuffled or byte-shuffled, with a native reader"
        head = os.pread(rows.fd, 16, int(rows.index[0][0]))
        if len(head) < 16 or head[2] >> 5 != cls.LZ4:
            return "the GPU decodes Blosc's lz4, not its other codecs"
        return None

    arrays = 3  # of the table, uint64 a chunk: start, stored size, output
    rows_per_chunk = staticmethod(Deflate.rows_per_chunk)
    scratch = 0.0
    copies_stored = False  # a file with chunks stored without the codec is the host's
    assembles = True  # chunks cutting images are assembled from their bitshuffled bytes as they are placed
    # Chunks cutting images too (H200, 1M MNIST images in chunks of (250, 7, 28, 1), 2026-12-05: lz4
    # 5.41-6.72M images/s assembled on the GPU, 3.09-3.29M on the reader threads; zstd 4.70-5.07M, 2.78-2.85M)
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
        return f"{self.lz4.kernel} + {self._placing()}"

    def _placing(self):
        return "assemble (chunks cut images)" if self.assemble else "bitunshuffle"

    def warm_up(self, alloc):
        import pycuda.driver as cuda

        size = self.itemsize  # one block of 8 values, not split, its stream stored as it is
        head = bytes([2, 1, self.LZ4 << 5 | self.SHUFFLE, size])
        chunk = np.frombuffer(head + np.array([8 * size, 8 * size, 24 + 8 * size, 20, 8 * size], "<u4").tobytes()
                              + bytes(8 * size), np.uint8)
        src, out, values, table, bad = alloc(len(chunk)), alloc(8 * size), alloc(8 * size), alloc(24), alloc(4)
        cuda.memcpy_htod(src, chunk)
        cuda.memcpy_htod(table, np.array([int(src), len(chunk), int(out)], np.uint64))
        t, stream = int(table), cuda.Stream()
        self.lz4(stream, 1, t, t + 8, t + 16, 8 * size, 8 * size, size, 0, bad)
        self._warm_place(stream, out, values)

    def _warm_place(self, stream, out, values):
        """The kernel placing images, on one chunk of 8 values (out) bitshuffled in one block."""
        if self.assemble:  # (an image of 1 x 8 x 1 values, a chunk of one)
            self.assemble(stream, out, values, (1, 8, 1), (1, 1, 8, 1), 0, 1, 8 * self.itemsize, self.assemble.BITS,
                          8, self.exact_tail)
        else:
            self.unshuffle(stream, out, values, 1, 8, 8, self.exact_tail, 0, 8)

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
        return bool(taken.any()), self._host_rows(dec, block, ~taken)

    def taken(self, buf, at, sizes, chunk_bytes):
        """Which chunks stored at offsets `at` of buf (sizes bytes each) the GPU decodes (blosc_chunks)."""
        return blosc_chunks(buf, at, sizes, chunk_bytes, self.itemsize, self.block_bytes, self.SHUFFLE)

    def _host_rows(self, dec, block, left):
        """The block's rows held by the chunks `left` (a mask of its chunks) decoded by the reader
        threads into page-locked memory, a row of chunks (one chunk but where chunks cut images) at
        a time: [(row in the block, page-locked rows)]."""
        import pycuda.driver as cuda

        done = []
        for r in np.unique((block.c0 + np.flatnonzero(left)) // dec.slab):
            lo, hi = max(r * dec.per, block.lo), min((r + 1) * dec.per, block.lo + len(block), self.rows.shape[0])
            out = cuda.pagelocked_empty(int(hi - lo) * dec.row_bytes, np.uint8)  # (PyCUDA takes Python ints)
            self.rows.submit(dec.pool.native, int(lo), int(hi), out).result()
            done.append((int(lo) - block.lo, out))
        return done

    def decode(self, dec, stream, count, table, decoded, c0, scratch, extras):
        starts, sizes, outputs = dec.columns(table)
        self.lz4(stream, count, starts, sizes, outputs, dec.chunk_bytes, self.block_bytes, self.itemsize, c0, dec.flags)

    def place(self, dec, stream, piece, decoded, dst):
        if self.assemble:
            self.assemble(stream, decoded, dst, *cut_geometry(self.rows, dec, piece), piece.images, dec.stride,
                          getattr(self.assemble, self.LAYOUT), self.block_values, self.exact_tail)
        else:
            values = dec.row_bytes // self.itemsize
            self._place_whole(dec, stream, piece, decoded, dst, values, piece.lo - piece.c0 * dec.per)
        self._place_host_decoded(dec, stream, piece.extra, dst)

    def _place_whole(self, dec, stream, piece, decoded, dst, values, first):
        """Images of whole chunks placed from row `first` of the piece's first chunk on (values a row)."""
        self.unshuffle(stream, decoded, dst, piece.chunks, dec.per * values, self.block_values, self.exact_tail,
                       first * values, piece.images * values)

    def _place_host_decoded(self, dec, stream, host, dst):
        """The rows the reader threads decoded (row in the block, page-locked rows), over what the
        GPU made of those chunks' bytes; their buffers kept until the copies are done."""
        import pycuda.driver as cuda

        from ..executor import event

        for row, out in host:
            cuda.memcpy_htod_async(dst + row * dec.row_bytes, out, stream)
        if host:
            self.pending.append(([out for _, out in host], event(stream)))

    def failure(self, dec, j, which):
        return InputError(f"{self.rows.label}: chunk {j} cannot be decompressed ({self.rows.codec_name} lz4: "
                          f"damaged data, or not {dec.chunk_bytes} bytes once decoded)")


class BloscLz4Bytes(BloscLz4):
    """BloscLz4 for c-blosc's byte shuffle (hdf5plugin's Blosc default): the same kernel, each block's
    streams (one a value byte where c-blosc split the block) decoded into place, the shuffle undone a
    block at a time as the images are placed (blosc_unshuffle_kernel1), or as they are assembled
    where chunks cut images (assemble_kernel2); one-byte values, which the shuffle leaves as they
    are, copied. Under --decode auto the reader threads decode the streams and leave the shuffle to
    the GPU (shuffled.Placer), which ran faster."""
    SHUFFLE = 0x01
    # H200, 1M MNIST images (2026-12-05): 6.07-6.50M images/s, the reader threads with the GPU unshuffling 7.10-7.31M
    host_first = ("the reader threads' LZ4, the GPU undoing the shuffle, outran the GPU's on an H200 (--decode gpu "
                  "decodes it on the GPU)")

    def _unshuffle(self, build, rows):
        """(the block size read from the first chunk's header, as the chunks are checked against it)"""
        block = int.from_bytes(os.pread(rows.fd, 16, int(rows.index[0][0]))[8:12], "little")
        self.block_values, self.exact_tail = block // self.itemsize, False
        self.LAYOUT = "BYTES" if self.itemsize > 1 else "PLAIN"
        self.assemble = launch.AssembleBlocks(build, self.itemsize) if rows.cut else None
        return launch.BloscUnshuffle(build, self.itemsize) if self.itemsize > 1 and not rows.cut else None

    @classmethod
    def unsupported(cls, rows):
        if not rows.native:
            return "the GPU decodes Blosc lz4 chunks with a native reader beside it"
        block = int.from_bytes(os.pread(rows.fd, 16, int(rows.index[0][0]))[8:12], "little")
        if block <= 0 or block % rows.dtype.itemsize:
            return "its Blosc blocks do not hold whole values"
        return None  # (codec_for read the lz4 and the shuffle in the first chunk's header)

    def _placing(self):
        return "assemble (chunks cut images)" if self.assemble else "blosc unshuffle" if self.unshuffle else "copy"

    def _warm_place(self, stream, out, values):
        if self.assemble:  # (as BloscLz4's, byte-shuffled)
            self.assemble(stream, out, values, (1, 8, 1), (1, 1, 8, 1), 0, 1, 8 * self.itemsize,
                          getattr(self.assemble, self.LAYOUT), 8)
        elif self.unshuffle:
            self.unshuffle(stream, out, values, 0, 8, 8, 8 * self.itemsize, 8)

    def _place_whole(self, dec, stream, piece, decoded, dst, values, first):
        if self.unshuffle:
            self.unshuffle(stream, decoded, dst, first * values, piece.images * values, dec.per * values, dec.stride,
                           self.block_values)
        else:
            _copy_rows(dec, stream, piece, first, decoded, dst)


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
    c-blosc's shuffle, a block at a time, undone as the images are placed (blosc_unshuffle_kernel1),
    or as they are assembled where chunks cut images (assemble_kernel2).
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
        self.assemble = launch.AssembleBlocks(build, self.itemsize) if rows.cut else None
        self.unshuffle = launch.BloscUnshuffle(build, self.itemsize) if self.shuffled and not rows.cut else None
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
        return (f"zstd_kernel1 (Blosc blocks){' + blosc unshuffle' if self.unshuffle else ''}"
                f"{' + assemble (chunks cut images)' if self.assemble else ''}")

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
        n = 4096 // self.itemsize
        if self.assemble:  # (an image of 1 x n x 1 values, a chunk of one)
            self.assemble(stream, out, values, (1, n, 1), (1, 1, n, 1), 0, 1, 4096,
                          self.assemble.BYTES if self.shuffled else self.assemble.PLAIN, n // 2)
        elif self.unshuffle:
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
        return bool(taken.any()), (copies, self._host_rows(dec, block, ~taken))

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
        if self.assemble:
            layout = self.assemble.BYTES if self.shuffled else self.assemble.PLAIN
            self.assemble(stream, decoded, dst, *cut_geometry(self.rows, dec, piece), piece.images, dec.stride, layout,
                          self.blosc_block // self.itemsize)
        elif self.shuffled:
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


def blosc_chunks(data, at, sizes, chunk_bytes, itemsize, block_bytes, shuffle=BloscLz4.SHUFFLE):
    """Which of the c-blosc chunks stored in `data` (bytes) at offsets `at`, `sizes` bytes each,
    blosc_lz4_kernel2 decodes: c-blosc 1's format 2, shuffled as `shuffle` says (flags & 0x0f: 4,
    bitshuffled; 1, byte-shuffled; neither copied whole: flag 2), lz4, values of itemsize bytes,
    decoding to chunk_bytes in blocks of block_bytes, and as long as the header says and room for each
    block's start."""
    at = np.asarray(at, np.int64)
    if len(data) < 16:
        return np.zeros(len(at), bool)
    hdr = data[np.minimum(at[:, None] + np.arange(16), len(data) - 1)]
    words = hdr.view("<u4").astype(np.int64)
    flags = hdr[:, 2]
    return ((sizes >= 16 + 4 * -(-chunk_bytes // block_bytes)) & (hdr[:, 0] == 2) & (flags & 0x0f == shuffle)
            & (flags >> 5 == BloscLz4.LZ4) & (hdr[:, 3] == itemsize) & (words[:, 1] == chunk_bytes)
            & (words[:, 2] == block_bytes) & (words[:, 3] == sizes))
