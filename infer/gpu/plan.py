"""Planning with no GPU in sight (unit-tested on any machine): how images split over GPUs, and how
a streamed batch is cut into chunks (one launch) and blocks (one read, one upload)."""


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


def ring(n, chunk, streamed, image_bytes, block_bytes, depth):
    """(images per resident block, blocks): all n images in one block, or for a streamed batch
    a ring of blocks of whole chunks, about block_bytes each, at most depth deep."""
    if not streamed:
        return n, 1
    block = min(n, chunk * max(1, block_bytes // (chunk * image_bytes)))
    return block, min(depth, -(-n // block))
