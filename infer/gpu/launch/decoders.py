"""The launchers of the GPU decoders (codecs/, shuffled.py): deflate, Zstd, LZF and LZ4 (Blosc's, the
LZ4 and Bitshuffle filters', Blosc2's) streams, their checks, and HDF5's shuffle and bitshuffle undone."""
import numpy as np

from .base import INT_MAX, Launcher, ceil_div


class DecodeCheck(Launcher):
    """bad[0] = min(bad[0], first + c) for every chunk c not decoded to chunk_bytes; with
    adler (zlib streams) bad[1] likewise where the decoded bytes fail the stream's adler32."""
    source, kernel, arg_types = "decode", "decode_check_kernel1", "PPPPPqqiiP"

    def __call__(self, stream, chunks, src_ptrs, src_bytes, decoded_bytes, statuses, decoded, chunk_bytes, stride, adler,
                 first, bad):
        self.launch(stream, (chunks, 1), (1024, 1, 1), src_ptrs, src_bytes, decoded_bytes, statuses, decoded,
                    chunk_bytes, stride, int(adler), first, bad)


class StreamCheck(Launcher):
    """bad[0] = min(bad[0], first + s) for every stream s of a stored size whose decoder's status is
    not OK or whose decoded size is not its capacity."""
    source, kernel, arg_types = "decode", "decode_check_kernel2", "PPPPiiP"

    def __call__(self, stream, count, src_bytes, capacities, decoded_bytes, statuses, first, bad):
        if not 0 < count <= INT_MAX or first + count > INT_MAX:
            raise ValueError(f"decode_check_kernel2 checks streams numbered up to {INT_MAX}, not {first + count}")
        self.launch(stream, (min(ceil_div(count, 256), 8192), 1), (256, 1, 1), src_bytes, capacities, decoded_bytes,
                    statuses, count, first, bad)


class FrameDecoder(Launcher):
    """Compressed streams decoded a block each, every stream into its own output; statuses OK, BAD
    (damaged, or reading past its size) or FULL (decoding to more than its output holds)."""
    OK, BAD, FULL = 0, 1, 2
    threads = 32  # a stream's block: a warp

    def check_count(self, count):
        if not 0 < count <= INT_MAX:
            raise ValueError(f"{self.kernel} decodes 1 to {INT_MAX} streams a launch, not {count}")

    def __init__(self, build, **defines):
        import pycuda.driver as cuda

        super().__init__(build, **defines)
        # a block's shared memory (10-17 KB): as many an SM as fit
        self.function.set_attribute(cuda.function_attribute.PREFERRED_SHARED_MEMORY_CARVEOUT, 100)

    def __call__(self, stream, count, src_ptrs, src_bytes, dst_bytes, actual_bytes, dst_ptrs, statuses):
        """Every argument but count a device address of an array of count: source pointers, source
        sizes, output capacities, decoded sizes (out, uint64), output pointers, statuses (out, int32)."""
        self.check_count(count)
        self.launch(stream, (count, 1), (self.threads, 1, 1), src_ptrs, src_bytes, dst_bytes, actual_bytes, dst_ptrs,
                    statuses)


class InflateParts(FrameDecoder):
    """Deflate streams decoded by inflate_kernel3 in PARTS parts at once, a block of two warps each:
    each part past the first starts at the first deflate block its parser finds past its share of
    the stream and writes 16-bit values (bytes, and marks for the bytes before it) into scratch
    memory; a part's parse stops where a later part started; inflate_join_kernel3 then puts the
    parts in order. A stream of under 4,096 bytes, or whose parts' values would not fit the scratch
    memory, is decoded whole by its first part, as inflate_kernel2. window, ring and min_blocks
    (RING, MIN_BLOCKS) size its shared memory and registers: dev/cuda/inflate_early.py times them."""
    source, kernel, arg_types = "inflate", "inflate_kernel3", "PPPPPPQii"
    JOIN = "inflate_join_kernel3"
    threads = 64
    WINDOW = 8192  # recent output bytes a part keeps in shared memory (matches from further back read the output)
    PARTS = 2
    BEFORE = 32768  # the marks ahead of a part's values (inflate.cu's BEFORE)
    RECORD = 32  # bytes a part's record (inflate.cu's Part)
    # scratch bytes a decoded byte: a second part's 16-bit values, for chunks of at least 256 KB (smaller
    # ones, decoding in a few ms, are left whole)
    SCRATCH = 2.25

    RING = 256  # tokens between a part's parser and writer
    MIN_BLOCKS = None  # blocks an SM its registers must allow (None: nvcc's choice, 80 registers)

    def __init__(self, build, window=None, parts=None, ring=None, min_blocks=None):
        import pycuda.driver as cuda

        window, self.parts = window or self.WINDOW, parts or self.PARTS
        ring, min_blocks = ring or self.RING, min_blocks or self.MIN_BLOCKS
        if window < 4096 or window & (window - 1):
            raise ValueError(f"inflate_kernel3's window is a power of two of at least 4096 bytes, not {window}")
        if not 2 <= self.parts <= 8:
            raise ValueError(f"inflate_kernel3 splits a stream in 2 to 8 parts, not {self.parts}")
        if ring < 128 or ring & (ring - 1):
            raise ValueError(f"inflate_kernel3's ring is a power of two of at least 128 tokens, not {ring}")
        bounds = {"MIN_BLOCKS": min_blocks} if min_blocks else {}
        super().__init__(build, WINDOW=window, PARTS=self.parts, RING=ring, **bounds)
        self.join = self.module.get_function(self.JOIN)
        self.join.prepare("PPPPPPQ")
        self.join.set_attribute(cuda.function_attribute.PREFERRED_SHARED_MEMORY_CARVEOUT, 100)

    def records(self, count):
        return ceil_div(count * self.parts * self.RECORD, 256) * 256

    def scratch_for(self, count, capacity):
        """Scratch bytes (past the first 256) that split count streams decoding to up to capacity bytes."""
        return self.records(count) + count * (self.parts - 1) * ceil_div(2 * (self.BEFORE + capacity), 256) * 256

    def __call__(self, stream, count, src_ptrs, src_bytes, dst_bytes, actual_bytes, dst_ptrs, statuses, scratch,
                 scratch_bytes, split=True, spread=False):
        """As FrameDecoder's, and `scratch`: a device buffer of 256 + scratch_bytes bytes (its first
        256 unused), the parts' records set to all ones here, on the stream. split=False: every
        stream decoded whole by its first part (where the GPU is full of streams, splitting them
        costs more than it saves). spread: the parsers on all four schedulers of an SM, not two
        (for streams of mostly literals, whose parse is the longer part: inflate.cu's warp_slot)."""
        import pycuda.driver as cuda

        self.check_count(count)
        if count * self.parts > INT_MAX:
            raise ValueError(f"inflate_kernel3 decodes up to {INT_MAX // self.parts} streams a launch, not {count}")
        records = self.records(count)
        if scratch_bytes < records:
            raise ValueError(f"inflate_kernel3 needs {records} bytes of scratch memory for {count} streams, "
                             f"not {scratch_bytes}")
        stride = (scratch_bytes - records) // (count * (self.parts - 1)) // 256 * 256 if split else 0
        parts = int(scratch) + 256
        cuda.memset_d8_async(parts, 0xFF, records, stream)
        self.launch(stream, (count * self.parts, 1), (64, 1, 1), src_ptrs, src_bytes, dst_bytes, dst_ptrs, parts,
                    parts + records, stride, count, int(spread))
        self.launch(stream, (count, 1), (256, 1, 1), dst_bytes, actual_bytes, dst_ptrs, statuses, parts,
                    parts + records, stride, function=self.join, name=self.JOIN)


class Zstd(FrameDecoder):
    """Zstandard frames (no dictionary; a content checksum skipped) decoded by zstd_kernel1."""
    source, kernel, arg_types = "zstd", "zstd_kernel1", "PPPPPP"


class Lzf(FrameDecoder):
    """LZF streams (h5py's lzf filter: liblzf's format, no header) decoded by lzf_kernel1."""
    source, kernel, arg_types = "lzf", "lzf_kernel1", "PPPPPP"


class ZstdApart(FrameDecoder):
    """Zstandard frames decoded by zstd_kernel2: a frame's blocks decoded apart by WARPS - 1 warps
    into scratch memory, their sequences carried out in order by another; a frame of more than 128
    blocks, or finding the scratch pool taken, decoded whole by one warp (zstd_kernel1's way)."""
    source, kernel, arg_types = "zstd", "zstd_kernel2", "PPPPPPPQP"
    WARPS = 3
    SCRATCH = 1.0  # scratch bytes a frame's decoded byte (MNIST: Zstd 3 takes 0.35, shuffled 0.61)
    TABLE_BYTES = 15368  # a decoding warp's tables (zstd.cuh's ZTables; the build asserts the size)

    def __init__(self, build):
        import pycuda.driver as cuda

        super().__init__(build, **self.defines())
        self.shared = (self.WARPS - 1) * self.TABLE_BYTES
        self.function.set_attribute(cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, self.shared)

    @classmethod
    def defines(cls):
        return dict(ZWARPS=cls.WARPS, ZTABLES_BYTES=cls.TABLE_BYTES)

    def __call__(self, stream, count, src_ptrs, src_bytes, dst_bytes, actual_bytes, dst_ptrs, statuses, scratch,
                 scratch_bytes):
        """As FrameDecoder's, and `scratch`: a device buffer of 256 + scratch_bytes bytes, its first
        8 counting what the frames take (zeroed here, on the stream)."""
        import pycuda.driver as cuda

        self.check_count(count)
        scratch = int(scratch)
        cuda.memset_d32_async(scratch, 0, 2, stream)
        self.launch(stream, (count, 1), (32 * self.WARPS, 1, 1), src_ptrs, src_bytes, dst_bytes, actual_bytes, dst_ptrs,
                    statuses, scratch + 256, scratch_bytes, scratch, shared=self.shared)


class BloscLz4(Launcher):
    """c-blosc chunks of lz4 streams decoded by blosc_lz4_kernel2, a warp per (chunk, block, value
    byte), each chunk into its own output, a warp's last WIN_BYTES of output kept in shared memory;
    bad[0] = min(bad[0], first + every chunk that fails)."""
    source, kernel, arg_types = "lz4", "blosc_lz4_kernel2", "PPPiqqiiP"
    WARPS = 4
    WIN_BYTES = 4096  # 8 KB: 1,000 chunks decode in 63 ms, not 42 (fewer blocks an SM)

    def __init__(self, build):
        super().__init__(build, **self.defines())

    @classmethod
    def defines(cls):
        return {"WARPS": cls.WARPS, "WIN_BYTES": cls.WIN_BYTES}

    def __call__(self, stream, count, chunk_ptrs, chunk_sizes, out_ptrs, chunk_bytes, block_bytes, typesize, first, bad):
        """chunk_ptrs, chunk_sizes, out_ptrs: device addresses of arrays of count uint64."""
        warps = count * ceil_div(chunk_bytes, block_bytes) * typesize
        if not 0 < count or warps > INT_MAX * self.WARPS:
            raise ValueError(f"{self.kernel} takes 1 to {INT_MAX * self.WARPS} warps a launch, not {warps}")
        self.launch(stream, (ceil_div(warps, self.WARPS), 1), (32 * self.WARPS, 1, 1), chunk_ptrs, chunk_sizes, out_ptrs,
                    count, chunk_bytes, block_bytes, typesize, first, bad)


class Lz4Index(BloscLz4):
    """The chained blocks of chunks of hdf5plugin's LZ4 filter or Bitshuffle's (lz4) found by
    lz4_index_kernel1, a thread a chunk: each block's start and stored size into index (2 uint32 a
    block, `blocks` a chunk), the `tail` bytes after the last block copied to the end of the chunk's
    output; bad[0] = min(bad[0], first + every chunk whose sizes do not add up). (A BloscLz4 for its
    module: lz4.cu built as blosc_lz4_kernel2 is.)"""
    kernel, arg_types = "lz4_index_kernel1", "PPPiqiiPiP"
    THREADS = 128

    def __call__(self, stream, count, chunk_ptrs, chunk_sizes, out_ptrs, chunk_bytes, blocks, tail, index, first, bad):
        if not 0 < count or not 0 < blocks <= INT_MAX // 2 or not 0 <= tail < chunk_bytes:
            raise ValueError(f"{self.kernel}: {count} chunks of {blocks} blocks and {tail} bytes after them")
        self.launch(stream, (ceil_div(count, self.THREADS), 1), (self.THREADS, 1, 1), chunk_ptrs, chunk_sizes, out_ptrs,
                    count, chunk_bytes, blocks, tail, index, first, bad)


class Lz4Blocks(BloscLz4):
    """The blocks Lz4Index found decoded by lz4_blocks_kernel1, a warp a block (WARPS a CUDA block, as
    blosc_lz4_kernel2), into the chunks' outputs block_bytes apart (the last last_bytes long; raw: a
    block stored in its decoded size is stored as it is, LZ4's filter); bad[0] = min(bad[0], first +
    every chunk that fails)."""
    kernel, arg_types = "lz4_blocks_kernel1", "PPPiqiqiPiP"

    def __call__(self, stream, count, chunk_ptrs, chunk_sizes, out_ptrs, block_bytes, blocks, last_bytes, raw, index,
                 first, bad):
        warps = count * blocks
        if not 0 < count or warps > INT_MAX * self.WARPS or not 0 < last_bytes <= block_bytes:
            raise ValueError(f"{self.kernel} takes 1 to {INT_MAX * self.WARPS} blocks of at most {block_bytes} bytes, "
                             f"not {warps} (the last {last_bytes})")
        self.launch(stream, (ceil_div(warps, self.WARPS), 1), (32 * self.WARPS, 1, 1), chunk_ptrs, chunk_sizes, out_ptrs,
                    count, block_bytes, blocks, last_bytes, int(raw), index, first, bad)


class _PerValueSize(Launcher):
    """A decode.cu kernel built for values of value_bytes bytes (1, 2, 4 or 8)."""
    source = "decode"

    def __init__(self, build, value_bytes):
        if value_bytes not in (1, 2, 4, 8):
            raise ValueError(f"no {self.kernel} for {value_bytes}-byte values")
        super().__init__(build, VALUE_BYTES=value_bytes)


class Unshuffle(_PerValueSize):
    """values values of value_bytes bytes from value first_value of decoded chunks stored
    byte-shuffled (HDF5's shuffle), chunk_values values each, stride bytes apart, into consecutive
    values of dst."""
    kernel, arg_types = "unshuffle_kernel1", "PPqqqq"

    def __call__(self, stream, decoded, dst, first_value, values, chunk_values, stride):
        self.launch(stream, (min(ceil_div(values, 256), 8192), 1), (256, 1, 1), decoded, dst, first_value, values,
                    chunk_values, stride)


class Assemble(_PerValueSize):
    """Rows of `image` values (H, W, C) from chunks cutting them, each `chunk` (R, h, w, c) values,
    stored a row of chunks at a time in row-major order, decoded stride bytes apart (byte-shuffled
    where shuffled): `rows` rows from row `first` of the first row of chunks on, into dst."""
    kernel, arg_types = "assemble_kernel1", "PPiiiiiiiqqqi"

    def __call__(self, stream, decoded, dst, image, chunk, first, rows, stride, shuffled):
        self._launch_rows(stream, decoded, dst, image, chunk, first, rows, stride, int(shuffled))

    def _launch_rows(self, stream, decoded, dst, image, chunk, first, rows, stride, *layout):
        """The shapes checked, then a thread a value of the rows (grid-stride past 8,192 blocks);
        layout: the kernel's arguments after stride."""
        if len(image) != 3 or len(chunk) != 4 or min(*image, *chunk) <= 0 or int(np.prod(image)) > INT_MAX:
            raise ValueError(f"{self.kernel} takes rows of H x W x C values in chunks of R x h x w x c, not "
                             f"{image} in {chunk}")
        if not 0 <= first < chunk[0]:
            raise ValueError(f"the first row is one of the first row of chunks' {chunk[0]}, not {first}")
        self.launch(stream, (min(ceil_div(rows * int(np.prod(image)), 256), 8192), 1), (256, 1, 1), decoded, dst,
                    *image, *chunk, first, rows, stride, *layout)


class AssembleBlocks(Assemble):
    """Assemble for chunks stored in a `layout` of decode.cu's: PLAIN, BYTES (byte-shuffled `block`
    values at a time, the last block shorter: c-blosc's shuffle) or BITS (bitshuffled in blocks of
    `block` values, exact_tail as bitunshuffle_kernel1's: c-blosc's and Bitshuffle's)."""
    kernel, arg_types = "assemble_kernel2", "PPiiiiiiiqqqiqi"
    PLAIN, BYTES, BITS = 0, 1, 2

    def __call__(self, stream, decoded, dst, image, chunk, first, rows, stride, layout, block, exact_tail=False):
        if layout not in (self.PLAIN, self.BYTES, self.BITS) or block <= 0 or (layout == self.BITS and block % 8):
            raise ValueError(f"{self.kernel}: layout {layout} in blocks of {block} values (bitshuffled: a multiple "
                             "of 8)")
        self._launch_rows(stream, decoded, dst, image, chunk, first, rows, stride, layout, block, int(exact_tail))


class BloscUnshuffle(_PerValueSize):
    """Unshuffle for c-blosc's byte shuffle: each chunk (chunk_values values, stride bytes apart)
    shuffled a block of block_values values at a time, the last block shorter."""
    kernel, arg_types = "blosc_unshuffle_kernel1", "PPqqqqq"

    def __call__(self, stream, decoded, dst, first_value, values, chunk_values, stride, block_values):
        if block_values <= 0:
            raise ValueError(f"c-blosc's blocks hold a positive number of values, not {block_values}")
        self.launch(stream, (min(ceil_div(values, 256), 8192), 1), (256, 1, 1), decoded, dst, first_value, values,
                    chunk_values, stride, block_values)


class BitUnshuffle(_PerValueSize):
    """chunks of chunk_values values of value_bytes bytes stored back to back, each bitshuffled in
    blocks of `block` values (see decode.cu), into consecutive values of dst."""
    kernel, arg_types = "bitunshuffle_kernel1", "PPqqqi"

    def __call__(self, stream, src, dst, chunks, chunk_values, block, exact_tail):
        if block <= 0 or block % 8:
            raise ValueError(f"bitshuffled blocks hold a positive multiple of 8 values, not {block}")
        groups = chunks * ceil_div(chunk_values, 8)
        self.launch(stream, (min(ceil_div(groups, 256), 8192), 1), (256, 1, 1), src, dst, chunks, chunk_values, block,
                    int(exact_tail))


class BitUnshuffleRange(_PerValueSize):
    """BitUnshuffle keeping `values` values from value first_value of the chunks on (numbered across
    them), written from dst on."""
    kernel, arg_types = "bitunshuffle_kernel2", "PPqqqiqq"

    def __call__(self, stream, src, dst, chunks, chunk_values, block, exact_tail, first_value, values):
        if block <= 0 or block % 8:
            raise ValueError(f"bitshuffled blocks hold a positive multiple of 8 values, not {block}")
        if not 0 <= first_value and first_value + values <= chunks * chunk_values:
            raise ValueError(f"values {first_value} to {first_value + values} lie outside {chunks} chunks")
        groups = ceil_div(values, 8) + 2  # those holding the values, a partial one at each end
        self.launch(stream, (min(ceil_div(groups, 256), 8192), 1), (256, 1, 1), src, dst, chunks, chunk_values, block,
                    int(exact_tail), first_value, values)
