"""A shuffled chunked data set streamed with the host decoding the codec and the GPU undoing the
shuffle: the reader threads decode each chunk lying wholly in a block straight into the
page-locked block, still shuffled, and the GPU places its values where the network reads them.
- HDF5's byte shuffle: no thread holds a chunk-sized buffer to unshuffle from (15 threads' 3.1 MB
  buffers were 54 MB of peak RSS) nor spends the unshuffle's memory pass (unshuffle_kernel1);
- Bitshuffle's, c-blosc's and Blosc2's bitshuffle (lz4 or zstd blocks): the reader threads decode the
  blocks' codec themselves and leave the bit transpose, which hdf5plugin's SSE2 builds spend
  ~40% of a chunk's decoding on, to bitunshuffle_kernel1;
- c-blosc's byte shuffle (hdf5plugin's Blosc default, lz4 or zstd): the same, a block's streams
  decoded into place, its byte shuffle left to blosc_unshuffle_kernel1.
A block goes up to a device staging buffer; the rows of chunks it cuts at its ends come decoded
whole by the host and are copied."""
from ..data import reader
from . import launch


def unsupported(data, wire, native):
    """None where the GPU can unshuffle the images of `data` (a DataSet) streamed in type `wire`
    by the native pool `native` (None: no native reader), else why not, in a phrase."""
    if len(data.parts) != 1:
        return "the data set spans several files"
    rows = data.parts[0][1]
    if not isinstance(rows, reader.ChunkedRows):
        return "its images are not stored in chunks"
    if not (rows.shuffle and rows.dtype.itemsize > 1) and rows.bitshuffle is None and rows.blosc_shuffle is None:
        return "its chunks are not shuffled, or not in a way the GPU undoes"
    if native is None or not rows.native:
        return "no native reader decodes its chunks"
    if rows.cut:
        return "its chunks cut images"
    if rows.dtype != wire or rows.swapped or rows.dtype.itemsize not in (1, 2, 4, 8):
        return f"its {rows.dtype} values are converted or swapped on the host"
    if rows.shuffle and (rows.masks & 1).any():
        return "some chunks were stored with the shuffle skipped"
    return None


class Source:
    """The data set as a Ring reads it for a Placer: the images of whole chunks left shuffled."""

    def __init__(self, data):
        self.data, self.classes = data, data.classes
        self.rows = data.parts[0][1]

    def submit_images(self, pool, lo, hi, out, check):
        pool.used_native = True
        return [self.rows.submit(pool.native, lo, hi, out, keep_shuffled=True)]

    def submit_labels(self, pool, lo, hi, out):
        return self.data.submit_labels(pool, lo, hi, out)


class Placer:
    """Uploads a block read by a Source to a staging buffer, then places it unshuffled."""

    def __init__(self, build, rows, block, alloc):
        self.rows_per, self.row_bytes, self.itemsize = rows.align, rows.row_bytes, rows.dtype.itemsize
        self.bits = rows.bitshuffle  # (values per block, exact tail), or None
        self.blosc = rows.blosc_shuffle  # values per c-blosc block, each byte-shuffled, or None: HDF5's byte shuffle
        self.block = block
        self.staging = alloc(block * self.row_bytes)
        kernel = launch.BitUnshuffle if self.bits else launch.BloscUnshuffle if self.blosc else launch.Unshuffle
        self.unshuffle = kernel(build, self.itemsize)

    def fits(self, rows, block):
        """Whether this placer unshuffles `rows` (a ChunkedRows) in blocks of `block` images as it is:
        the same chunk rows, image bytes, value size and shuffle, and a staging block as large."""
        return ((rows.align, rows.row_bytes, rows.dtype.itemsize, rows.bitshuffle, rows.blosc_shuffle)
                == (self.rows_per, self.row_bytes, self.itemsize, self.bits, self.blosc) and block <= self.block)

    def enqueue(self, stream, dst, x, lo):
        """Queue block x (images from lo on) up and into dst on stream: (the event after the upload,
        which frees x's buffer; the event after the images are in place)."""
        import pycuda.driver as cuda

        from .executor import event

        cuda.memcpy_htod_async(self.staging, x, stream)
        uploaded = event(stream)
        n, per = len(x), self.rows_per
        a = min(n, -lo % per)  # rows before the block's first whole chunk, and from its last one's end
        b = a + (n - a) // per * per
        for r0, r1 in ((0, a), (b, n)):
            if r1 > r0:
                cuda.memcpy_dtod_async(dst + r0 * self.row_bytes, int(self.staging) + r0 * self.row_bytes,
                                       (r1 - r0) * self.row_bytes, stream)
        if b > a:
            chunk_values = per * self.row_bytes // self.itemsize
            src, into = int(self.staging) + a * self.row_bytes, dst + a * self.row_bytes
            if self.bits:
                self.unshuffle(stream, src, into, (b - a) // per, chunk_values, *self.bits)
            elif self.blosc:
                self.unshuffle(stream, src, into, 0, (b - a) // per * chunk_values, chunk_values, per * self.row_bytes,
                               self.blosc)
            else:
                self.unshuffle(stream, src, into, 0, (b - a) // per * chunk_values, chunk_values, per * self.row_bytes)
        return uploaded, event(stream)
