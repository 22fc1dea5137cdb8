"""A data set larger than host memory through one GPU: the blocks the reader threads fill (a
host.Ring) uploaded and computed as they arrive, each buffer handed back to the readers as soon as
its upload is done, so reading, uploads and kernels overlap."""
import collections

import numpy as np

from ..errors import BadValue, ScoresOverflow
from .executor import event


def forward_stream(ex, copies, ring, progress, out, aside, model_path, decoder=None, placer=None):
    """Labels found (and scores) of the images streamed from `ring` by executor ex, into out (see
    host.outputs). Where the images are resident a block is one upload on the `copies` stream
    (never queued behind kernels; with a placer, shuffled.Placer, up and unshuffled into place),
    or with a decoder (chunk_decode.Decoder) its compressed chunks
    uploaded, then decoded with its group on one of the decoder's streams, and its chunks' kernels
    queued once the group is (they wait for it); the
    labels come back once, at the end: little Python work per block. aside(fn, *args) runs fn on a
    reader thread."""
    run, streams = ex.run, ex.streams
    ex.clear_flags()
    # The outputs are written only after the last kernel, on this thread; their fresh pages are
    # faulted in on a reader thread while the GPU works (1M images, H100 machine: the time from
    # the GPU done to the outputs in place fell from 3.4-3.8 ms to 1.4-1.7).
    faulted = aside(_fault_in, out[0], out[2])
    pending = collections.deque()
    computed = collections.deque()  # per block, in order: events after its kernels, on every stream used

    def compute(at, count, ready, x=None):
        """Queue the kernels of the block of count images from image `at`, after event `ready` (its
        resident images in place), or uploading x chunk by chunk through the streams' staging
        buffers; the uploads' events."""
        first, uploads = at // run.chunk, []
        for offset in range(0, count, run.chunk):
            i, n = first + offset // run.chunk, min(run.chunk, count - offset)
            stream = streams[i % len(streams)]
            if ready is None:
                ex.upload(stream, i, at + offset, x[offset:offset + n])
                uploads.append(event(stream))
            else:
                stream.wait_for_event(ready)
            ex.compute(i, at + offset, n)
        if ready is not None:
            used = min(len(streams), -(-count // run.chunk))
            computed.append([event(streams[(first + j) % len(streams)]) for j in range(used)])
        return uploads

    def hand_back():
        uploads, buf, count = pending.popleft()
        for e in uploads:
            e.synchronize()
        ring.release(buf)
        progress.update(count)

    for b, (start, x, buf) in enumerate(ring):
        at = start - ring.start
        if not run.resident:
            uploads = compute(at, len(x), None, x)
        else:
            # The slot's previous block computed (a decoder holds back at most a group of blocks,
            # fewer than the slots, so that block's kernels are queued)
            free = computed.popleft() if b >= run.slots else ()
            dst = run.images(at // run.chunk, at, len(streams))
            if decoder is not None:
                uploaded, placed = decoder.enqueue(dst, x, free, (at, len(x)))
                for (a, count), ready in placed:
                    compute(a, count, ready)
            else:
                for e in free:
                    copies.wait_for_event(e)
                if placer is not None:
                    uploaded, ready = placer.enqueue(copies, dst, x, start)
                else:
                    ex.upload(copies, at // run.chunk, at, x)
                    uploaded = ready = event(copies)
                compute(at, len(x), ready)
            uploads = [uploaded]
        pending.append((uploads, buf, len(x)))
        while pending and (len(pending) >= ring.depth - 1 or all(e.query() for e in pending[0][0])):
            hand_back()
    if decoder is not None:
        for (a, count), ready in decoder.flush():
            compute(a, count, ready)
    while pending:
        hand_back()
    for s in streams:
        s.synchronize()
    failure = decoder and decoder.failures()  # garbage decoded from a damaged chunk is no bad image
    if failure:
        raise failure
    try:
        ex.check_flags(model_path)
    except (ScoresOverflow, BadValue) as e:
        raise e.shifted(ring.start) from None
    ex.download(streams[0], 0, ring.stop - ring.start)
    streams[0].synchronize()
    faulted.result()
    np.copyto(out[0], run.labels)
    if out[2] is not None:
        np.copyto(out[2], run.scores)


def _fault_in(*arrays):
    """Touch every page of the arrays (None skipped) so writing them later takes no page faults;
    NumPy fills large arrays without the interpreter lock."""
    for a in arrays:
        if a is not None:
            a.fill(0)
