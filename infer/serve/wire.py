"""The frames between a front end and the engine (`cnninfer serve --workers N`: front.py, engine.py),
on a Unix socket, little-endian:
    engine -> front end, once:  u32 length, then JSON {classes, backend, device}
    front end -> engine, once:  REQUEST with code ATTACH and N the length of the path that follows:
                                the front end's shared memory for images (a memfd, opened through
                                /proc), answered with kind ATTACHED (or FAILED: none is used)
    front end -> engine:        REQUEST (id, dtype code, flags: 1 scores wanted, 2 images shared;
                                N, H, W, C, timeout s, clients' requests merged in it), then the
                                images' bytes (C order), or, flagged shared, the u64 offset of
                                the images in the shared memory; code STATS (no images):
                                the engine's batch metrics, answered with kind STATS and the text
    engine -> front end:        ANSWER (id, kind, N, bytes after the labels), then the labels
                                (int64, N) and the scores where asked (float32, N x classes); or,
                                for a failure, its one-line message
"""
import struct

import numpy as np

from .batcher import Busy, Draining, Expired
from ..errors import InputError

REQUEST = struct.Struct("<QBBIIIIdI")
OFFSET = struct.Struct("<Q")
ANSWER = struct.Struct("<QBII")
DTYPES = tuple(np.dtype(t).newbyteorder("<") for t in ("u1", "i1", "u2", "i2", "u4", "i4", "u8", "i8", "f2", "f4", "f8"))
CODES = {d: i for i, d in enumerate(DTYPES)}
STATS_CODE, ATTACH_CODE = 255, 254
SCORES, SHARED = 1, 2  # REQUEST's flags
OK, INPUT, BUSY, EXPIRED, DRAINING, FAILED, STATS, ATTACHED = range(8)


def kind_of(error):
    """The ANSWER kind of a request's failure."""
    return (INPUT if isinstance(error, InputError) else BUSY if isinstance(error, Busy) else
            EXPIRED if isinstance(error, Expired) else DRAINING if isinstance(error, Draining) else FAILED)


def error(kind, message):
    """The exception a front end raises for an ANSWER of a failed kind."""
    if kind == INPUT:
        return InputError(message)
    if kind == BUSY:
        return Busy(message)
    if kind == EXPIRED:
        return Expired(message)
    if kind == DRAINING:
        return Draining()
    return RuntimeError(message)
