"""Deflate, Zstd and LZF chunks decoded on the GPU (the overview: infer/gpu/codecs/__init__.py), and
chunks of whole rows copied into place (_copy_rows; Blosc zstd and LZ4 place through Deflate.place too),
and the geometry of chunks cutting images (cut_geometry)."""
import os

import numpy as np

from ...errors import InputError
from .. import launch


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
        first = piece.lo - piece.c0 * per  # rows of the first chunk before the block
        if self.rows.cut:  # (BloscZstd places its unshuffled chunks here too: never cut)
            self.assemble(stream, decoded, dst, *cut_geometry(self.rows, dec, piece), piece.images, dec.stride,
                          self.shuffled)
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


def cut_geometry(rows, dec, piece):
    """(image, chunk, first) of an assemble launch placing `piece`, a block of the chunks of `rows`
    cutting images (whole rows of them): rows of H x W x C values, chunks of R x h x w x c, the
    block's first row in its first row of chunks."""
    image, chunk = rows.shape[1:], rows.chunks
    pad = (1,) * (4 - len(chunk))
    return pad + image, chunk[:1] + pad + chunk[1:], piece.lo - piece.c0 // dec.slab * dec.per


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
