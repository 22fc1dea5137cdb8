"""A data set as the engine reads it: the first n images of one or more data files (shards) taken
in order as one, or a NumPy array of images (the Python API). Images and labels are read by a
reader.Reader's threads; ranges of images may span shards."""
import glob
import os
import re

import numpy as np

from . import codes, loader, reader
from .. import env
from ..errors import InputError, where

# Labels per reader call: one call per streamed block (32768 uint8 images at most). A stream waits
# for its labels only at its end, so thinner pieces only add Python calls contending for the
# interpreter lock with the GPU threads (2 H200, 1M uint8 images: one call per block 40.1 ms,
# 8192-row calls 41.6 ms, medians of 10)
LABEL_ROWS = 32768
LABEL_STEP = 4096  # rows such a call reads at a time, so its buffer stays small on each of 16 threads
CODES_SAMPLE = 64  # images read to tell whether, and in which scaling, a file holds 8-bit codes
OUTPUT_BYTES_PER_IMAGE = 24  # label and prediction (int64 each), labels on the device and back (int32)


def expand(paths):
    """Data file arguments with glob patterns expanded (in natural order: shard2 before shard10);
    a pattern that matches nothing is an InputError."""
    def natural(p):
        return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p)]

    out = []
    for p in map(str, paths):
        if glob.has_magic(p) and not os.path.exists(p):
            matches = sorted(glob.glob(p), key=natural)
            if not matches:
                raise InputError(f"{p}: no file matches this pattern")
            out += matches
        else:
            out.append(p)
    return out


class DataSet:
    """Images [0, size) over parts (label for messages, x rows, y rows or None, first image)."""

    def __init__(self, parts, files=()):
        self.parts, self.files = parts, list(files)
        self.size = sum(count for *_, count in parts)
        x = parts[0][1]
        self.image_shape, self.classes = x.shape[1:], None if parts[0][2] is None else parts[0][2].shape[1]
        dtypes = {p[1].dtype for p in parts}
        self.dtype = dtypes.pop() if len(dtypes) == 1 else None  # a common stored type, if any
        self.kind = "+".join(sorted({p[1].kind for p in parts}))
        self.filters = "+".join(sorted({p[1].filters for p in parts} - {""})) or "none"
        # Rows per chunk of a single chunked file: streamed blocks cut on these decode no chunk twice
        self.align = x.align if len(parts) == 1 else 1
        self._codes = None  # the codes wire of the images, or False (codes_wire), once asked
        self.wire = None  # the type the images travelled in, set by the run (numpy dtype)

    @classmethod
    def open(cls, paths, model, n=None):
        """The first n images (all by default) of the data files, checked against the model and
        against each other before anything is read."""
        if n is not None and n <= 0:
            raise InputError(f"N must be positive, got {n}")
        files = []
        try:
            parts, total = [], 0
            for path in paths:
                if n is not None and total >= n:
                    break
                d = loader.open_data(path, model)
                files.append(d)
                if parts and d.x.shape[1:] != parts[0][1].shape[1:]:
                    raise InputError(f"{where(path, 'x')}: images of shape {d.x.shape[1:]}, but {paths[0]} has "
                                     f"{parts[0][1].shape[1:]}: the shards of one data set must agree")
                count = d.size if n is None else min(d.size, n - total)
                parts.append((d.path, d.x, d.y, count))
                total += count
            if n is not None and total < n:
                held = f"{where(paths[0], 'x')}: holds" if len(paths) == 1 else f"the {len(paths)} data files hold"
                raise InputError(f"{held} {total} images, fewer than the {n} asked for")
            _check_outputs(paths[0], total)
            return cls(parts, files)
        except BaseException:
            for d in files:
                d.close()
            raise

    @classmethod
    def from_array(cls, x, label="x"):
        return cls([(label, reader.ArrayRows(x, label), None, len(x))])

    @property
    def shards(self):
        """[(file, first image, end)] in the data set's numbering."""
        out, lo = [], 0
        for label, _, _, count in self.parts:
            out.append((label, lo, lo + count))
            lo += count
        return out

    def _segments(self, lo, hi):
        """(part, first row in the part, rows, offset into [lo, hi)) covering images [lo, hi)."""
        base = 0
        for part in self.parts:
            count = part[3]
            a, b = max(lo, base), min(hi, base + count)
            if a < b:
                yield part, a - base, b - a, a - lo
            base += count

    def image_bytes(self, dtype):
        return int(np.prod(self.image_shape)) * np.dtype(dtype).itemsize

    def codes_wire(self):
        """The codes wire (codes.py) the images may travel in, or None: float32 in this machine's
        byte order, read straight from contiguous datasets (pread) or chunks stored without a codec
        (fletcher32 or not) on the native pool, whose first CODES_SAMPLE images in every file are
        codes of one scaling (the first of codes.WIRES they fit), unless CNNINFER_CODES=0; every
        value is checked again as it is read (a failure: codes.NotCodes)."""
        if self._codes is None:
            self._codes = False
            if env.codes() and self.dtype == np.float32 and all(x.takes_codes for _, x, _, _ in self.parts):
                fits = set(codes.WIRES)
                for _, x, _, count in self.parts:
                    sample = np.empty((min(count, CODES_SAMPLE),) + self.image_shape, np.float32)
                    x.read(0, len(sample), sample)
                    fits = {w for w in fits if codes.pack(sample, w) is not None}
                self._codes = next((w for w in codes.WIRES if w in fits), False)
        return self._codes or None

    def no_codes(self):
        """A read found a value that is no code: the images travel as float32 from now on."""
        self._codes = False

    def submit_images(self, pool, lo, hi, out, check):
        """Futures filling out (hi - lo images, in out's type) from images [lo, hi)."""
        futures = []
        for (_, x, _, _), row, count, at in self._segments(lo, hi):
            futures += pool.submit(x, row, row + count, out[at:at + count], check)
        return futures

    def submit_labels(self, pool, lo, hi, out):
        """Futures filling out (hi - lo) int64 with the labels of images [lo, hi): on the native
        pool where it reads the labels' file (rows.submit_labels), else LABEL_ROWS at a time on the
        pool's Python threads."""
        futures = []
        for (_, _, y, _), row, count, at in self._segments(lo, hi):
            ticket = y.submit_labels(pool, row, row + count, out[at:at + count])
            futures += [ticket] if ticket else [pool.call(_labels, y, a, b, out[at + a - row:at + b - row])
                                                for a, b in _steps(row, row + count, LABEL_ROWS)]
        return futures

    def bad_value(self, image):
        """The InputError for image `image`, which the GPU found to hold a value that is not finite:
        the image read again and checked on the host, for the message the host check gives."""
        for (_, x, _, _), row, _, _ in self._segments(image, image + 1):
            one = np.empty((1,) + self.image_shape, np.float32)
            try:
                reader.fill(x, row, row + 1, one, check=True)
            except InputError as e:
                return e
        return InputError(f"{self.parts[0][0]}: image {image} changed while it was read (a value was not finite)")

    def close(self):
        for d in self.files:
            d.close()
        self.files = []


def _steps(lo, hi, step):
    return [(a, min(hi, a + step)) for a in range(lo, hi, step)]


def _labels(y, lo, hi, out):
    raw = np.empty((min(hi - lo, LABEL_STEP), y.shape[1]), y.dtype)
    for a, b in _steps(lo, hi, LABEL_STEP):
        part = raw[:b - a]
        y.read(a, b, part)
        if not reader.first_max(part.reshape(b - a, -1), out[a - lo:b - lo]):
            reader.check_finite(part, part, y.label, a)
            out[a - lo:b - lo] = np.argmax(part, axis=1)


def _check_outputs(path, n, limit=None):
    """Refuse, before allocating, n images whose labels and predictions alone would not fit in
    half of this machine's memory (the images themselves stream, so they never need to)."""
    need = n * OUTPUT_BYTES_PER_IMAGE
    limit = limit or os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    if need > limit:
        raise InputError(f"{where(path, 'x')}: {n} images need {need / 2**30:.1f} GiB for their labels and "
                         f"predictions, more than the {limit / 2**30:.1f} GiB this machine allows; ask for fewer images (N)")
