"""A byte-shuffled chunked data set streamed with the host decoding the codec and the GPU undoing
HDF5's shuffle: the reader threads decode each chunk lying wholly in a block straight into the
page-locked block, still shuffled, so no thread holds a chunk-sized buffer to unshuffle from (15
threads' 3.1 MB buffers were 54 MB of peak RSS) nor spends the unshuffle's memory pass; the block
goes up to a device staging buffer and unshuffle_kernel1 places its whole chunks where the network
reads them (the rows of chunks it cuts at its ends come unshuffled by the host)."""
from .. import reader
from . import launch


def unsupported(data, wire, native):
    """None where the GPU can unshuffle the images of `data` (a DataSet) streamed in type `wire`
    by the native pool `native` (None: no native reader), else why not, in a phrase."""
    if len(data.parts) != 1:
        return "the data set spans several files"
    rows = data.parts[0][1]
    if not isinstance(rows, reader.ChunkedRows) or not rows.shuffle or rows.dtype.itemsize == 1:
        return "its chunks are not byte-shuffled"
    if native is None or not rows.native:
        return "no native reader decodes its chunks"
    if rows.cut:
        return "its chunks cut images"
    if rows.dtype != wire or rows.swapped or rows.dtype.itemsize not in (2, 4, 8):
        return f"its {rows.dtype} values are converted or swapped on the host"
    if (rows.masks & 1).any():
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
        self.staging = alloc(block * self.row_bytes)
        self.unshuffle = launch.Unshuffle(build, self.itemsize)

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
            values = self.row_bytes // self.itemsize
            chunk_bytes = per * self.row_bytes
            self.unshuffle(stream, int(self.staging) + a * self.row_bytes, dst + a * self.row_bytes, 0,
                           (b - a) * values, per * values, chunk_bytes)
        return uploaded, event(stream)
