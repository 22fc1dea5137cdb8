"""Planning with no GPU in sight (unit-tested on any machine): how images split over GPUs, how a
batch is cut into chunks (one launch) and a streamed one into blocks (one read, one upload), and
what fits in the device's memory."""
import numpy as np

from ..errors import InputError


# About the bytes per streamed block (a whole number of chunks): 8192 float32 MNIST images or
# 32768 uint8 ones, so a block amortizes the reads and the Python work around it whatever the
# stored type (uint8 in 8192-image blocks left two GPUs waiting on the host: 1.24x one GPU)
STREAM_BYTES = 25 << 20
# Images over two blocks stream even within the host budget: read whole, 160,000 float32 MNIST
# images took 314-378 ms to pin and fill before the GPU started (H100 host, fresh runs), streamed
# they were read and classified in 54-69 ms (4be89fa)
STREAM_FROM = 2 * STREAM_BYTES
# Streamed blocks in flight (being read, uploaded, computed): 6 of ~25 MB pinned, whatever --streams
# is (8 streams with 10 blocks held 100 MB more, peak RSS 485 against 385 MB, for no more speed);
# 5 where the host decodes the file's chunks (their decoding, not the ring, paces those runs: the
# same speed, 22 MB less, which brought Blosc2's 403-405 MB under 400)
RING_DEPTH = 6
DECODED_RING_DEPTH = 5
# 3 where they assemble chunks cutting images into 8-bit codes (blocks of 4x the images): each
# thread holds a decoded chunk too, and the threads' decoding paces those runs
DECODED_CODES_RING_DEPTH = 3


def wire_dtype(stored):
    """The type images of NumPy type `stored` travel in: integers in their own, converted on the
    GPU; float32 as it is; other floats converted (and checked) by the reader threads."""
    if stored is not None and stored.kind in "iu" and stored.isnative:
        return np.dtype(stored)
    return np.dtype(np.float32)


def split(n, parts, align=1):
    """Contiguous [lo, hi) ranges of n items, as equal as possible with inner edges on multiples
    of align (a file's chunk rows: no chunk decoded by two GPUs' readers)."""
    align = align if align <= n // parts else 1
    edges = [0] + [round(n * i / parts / align) * align for i in range(1, parts)] + [n]
    return list(zip(edges[:-1], edges[1:]))


def aligned_chunk(best, align):
    """Images per chunk of a streamed batch: `best`, cut down to a multiple of the file's chunk
    rows where they fit, so blocks of whole chunks never cut a file chunk (8192-image blocks of
    1000-image chunks decoded a fifth of them twice)."""
    return best - best % align if align <= best else best


def streamed_chunk(least, image_bytes, block_bytes):
    """Whole multiples of `least` images filling about block_bytes (at least one). As the images
    per launch of a streamed batch, a host block is one launch whatever the image's type (uint8
    blocks hold 4x the float32 images: at 8,192 a launch, four launches a block left the host
    enqueueing kernels while the GPU waited)."""
    return least * max(1, block_bytes // (least * image_bytes))


def ring(n, chunk, streamed, image_bytes, block_bytes, depth):
    """(images per resident block, blocks): all n images in one block, or for a streamed batch
    a ring of blocks of whole chunks, about block_bytes each, at most depth deep."""
    if not streamed:
        return n, 1
    block = min(n, streamed_chunk(chunk, image_bytes, block_bytes))
    return block, min(depth, -(-n // block))


def memory(n, free, streams, chunk, best, scratch_floats, classes, wire_bytes, float_bytes, streamed,
           block_bytes, depth):
    """(images per chunk, whether the images stay resident) for n images of wire_bytes each
    (float_bytes once converted) with `free` device bytes: the whole input resident when it takes at
    most 40% of the free memory (streamed: a ring of blocks, see ring), else staged per stream;
    `chunk` as asked, else `best` or fewer so every stream has work; halved until the streams'
    scratch (scratch_floats(chunk) floats each), staging and the outputs fit in 80%."""
    budget = int(free * 0.8)
    chunk = min(chunk or min(best, -(-n // streams)), n)

    def images_bytes(c):
        block, slots = ring(n, c, streamed, wire_bytes, block_bytes, depth)
        return block * slots * wire_bytes

    resident = images_bytes(chunk) <= budget // 2
    converts = wire_bytes != float_bytes

    def need(c):
        per_stream = 4 * scratch_floats(c) + (0 if resident else c * wire_bytes) + (c * float_bytes if converts else 0)
        return streams * per_stream + (images_bytes(c) if resident else 0) + 4 * n * (1 + classes)

    while chunk > 1 and need(chunk) > budget:
        chunk //= 2
    if need(chunk) > budget:
        raise InputError(f"the GPU has {free / 2**20:.0f} MiB free, too little for even one image per chunk")
    return chunk, resident
