"""Rows of a dataset (images or labels) read into the caller's buffers on several threads.

HDF5 through h5py serializes on one global lock, so a single reader tops out near 6 GB/s. Where
the layout allows, the dataset's bytes are read straight from the file instead, with calls that
release the GIL, so reader threads run in parallel:
- `pread`: a contiguous dataset is one run of bytes at a known file offset, read straight into the
  destination (page-locked memory for the GPU), no intermediate copy: by the native read pool
  (native.py: threads that never need the interpreter lock) where it builds, else os.preadv;
- `chunks`: a chunked dataset (chunks of whole rows, or cutting them along any dimension), raw or
  compressed with deflate or (with the native library) LZF, optionally after shuffle and with a
  fletcher32 checksum: each chunk read, checked, decoded (libdeflate or zlib, LZF), unshuffled and
  placed by read_pool/chunks.c, on the native pool's threads for reads in the stored type, else on the
  Python thread that reads (ctypes releases the GIL); without the native library, raw and deflate
  chunks are decoded in Python. 1M MNIST images on the H100 host, 15 threads: gzip 1 5.5-5.7M
  images/s, lzf 4.9-5.5M (h5py: 0.06M);
- with the native library, chunks coded by one of hdf5plugin's filters (Blosc, Blosc2, Zstd, LZ4,
  Bitshuffle, bzip2...; the `plugins` extra) take the `chunks` path too: Zstd, LZ4, Blosc and
  Blosc2 (where its blocks hold whole rows) decoded by their codec, straight into place
  (native.direct_codec), the others by the plugin's own decoding function (native.plugin_filter),
  on the pool's threads, without HDF5 or its lock;
- `h5py`: any other layout (chunks never written, HDF5's own scale-offset, n-bit and szip filters,
  non-numeric values in the other byte order, lzf, fletcher32 and plugins without the native
  library), through h5py, which serializes every call in a process on one lock: one thread at a
  time, or for datasets of 64 MB and more, `h5py processes`, pieces read in parallel by worker
  processes (h5py_workers.py);
- `array`: rows of a NumPy array (the Python API), copied on threads.
Numbers stored in the other byte order (big-endian files here) take the same paths and are
swapped on the reading thread (`swapped`). Every row is read in the dataset's own type, in this
machine's byte order; converting to float32 and checking values is the caller's choice (see `fill`).
"""
import ctypes
import functools
import os
import threading
import time
import zlib
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from . import codes, h5py_workers, native
from ..errors import InputError

PIECE_BYTES = 4 << 20  # bytes per read call and thread: large enough to amortize the call
NATIVE_PIECE_MIN = 1 << 20  # pieces of a native read: about one per thread, at least this
LABEL_PIECE = 8192  # label rows a native job reads (in steps of 256 KB) and takes the first maxima of
_H5PY = threading.Lock()  # h5py is thread-safe, but serial: one caller at a time, in order


def native_piece(nbytes, pool):
    """Bytes a native read job takes of an nbytes read: about one piece per thread, within bounds."""
    return min(PIECE_BYTES, max(NATIVE_PIECE_MIN, -(-nbytes // pool.threads)))


def default_threads(native=False):
    """Reader threads: one per core, at most 16 (where parallel reads of cached files level off);
    native ones one core short of that, leaving one to the thread launching the kernels (H100
    machine, 1M images streamed, 8 threads against 15: float32 7.4 / 7.3-7.9M images/s, where 8
    read 25 GB/s; decoding chunks, gzip 2.7-3.0 / 3.4-3.6M, lzf 2.5-2.9 / 4.6-4.8M), at least 8."""
    cores = os.cpu_count() or 1
    if not native:
        return min(16, cores)
    return max(min(8, cores), min(15, cores - 1))


class Rows:
    """Rows [lo, hi) of one dataset; `read(lo, hi, out)` fills out (hi - lo, ...) in the stored type."""
    kind = None
    filters = ""  # the dataset's HDF5 filters as stored, in order ("shuffle+deflate"), for --json
    swapped = False  # values stored in the other byte order, swapped as they are read (dtype: this order's)
    align = 1  # pieces start on multiples of this many rows (a chunk's rows)
    native = False  # submit(pool, lo, hi, out) reads on the native pool
    takes_codes = False  # submit_codes(pool, lo, hi, out) reads float32 rows as their 8-bit codes there

    def __init__(self, label, shape, dtype):
        self.label, self.shape, self.dtype = label, tuple(shape), np.dtype(dtype)
        self.row_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize

    def submit_labels(self, pool, lo, hi, out):
        """The labels of rows [lo, hi) read on the native pool (a Ticket), or None: Python's threads
        read them (dataset._labels)."""
        return None

    def close(self):
        pass


class ArrayRows(Rows):
    kind = "array"

    def __init__(self, array, label):
        super().__init__(label, array.shape, array.dtype)
        self.array = array

    def read(self, lo, hi, out):
        np.copyto(out, self.array[lo:hi])  # releases the GIL


class H5pyRows(Rows):
    """Through h5py: in this process, one call at a time, or where the dataset holds at least
    PROCESS_BYTES and there are cores to spare, in worker processes, a piece each (h5py_workers)."""
    kind = "h5py"
    PROCESS_BYTES = 64 << 20

    def __init__(self, ds, label, path=None):
        super().__init__(label, ds.shape, ds.dtype.newbyteorder("="))
        self.ds, self.path = ds, path
        self.workers = None
        self.pids = set()  # the worker processes that read
        if path is not None and self.shape[0] * self.row_bytes >= self.PROCESS_BYTES and (os.cpu_count() or 1) > 1:
            self.kind = "h5py processes"
            self._lock = threading.Lock()

    def read(self, lo, hi, out):
        try:
            if self.kind == "h5py":
                with _H5PY:
                    self.ds.read_direct(out, np.s_[lo:hi])
                return
            with self._lock:
                if self.workers is None:
                    self.workers = h5py_workers.Workers()
            rows, pid = self.workers.read(self.path, self.ds.name, lo, hi, out.dtype)
            self.pids.add(pid)
            out[...] = rows
        except h5py_workers.WorkerDied as e:
            raise InputError(f"{self.label}: cannot read: a reader process died ({e})") from None
        except Exception as e:  # h5py raises OSError, ValueError... on damaged files
            raise InputError(f"{self.label}: cannot read: {' '.join(str(e).split()) or type(e).__name__}") from None

    def close(self):
        if self.workers is not None:
            self.workers.close()
            self.workers = None


class _FileRows(Rows):
    """A dataset read from the file's bytes on a descriptor of our own (pread: no shared position);
    values stored in the other byte order are swapped after the read (or the decoding)."""

    def __init__(self, path, ds, label):
        super().__init__(label, ds.shape, ds.dtype.newbyteorder("="))
        self.swapped = swappable(ds.dtype)
        self.fd = os.open(path, os.O_RDONLY)
        self.file_size = os.fstat(self.fd).st_size

    def _pread(self, view, offset):
        """Fill the byte view from the file at offset; a short file is an InputError."""
        done = 0
        while done < len(view):
            got = os.preadv(self.fd, [view[done:]], offset + done)
            if got == 0:
                raise self.truncated(offset + len(view))
            done += got

    def submit_bytes(self, pool, address, nbytes, offset, swap=0):
        """nbytes of the file from offset into address on the native pool, about a piece per
        thread (swap: values of that size reversed): a Ticket whose failure is an InputError (a
        short file: truncated)."""
        end = offset + nbytes
        return Ticket(pool, pool.submit(self.fd, address, nbytes, offset, native_piece(nbytes, pool), swap),
                      lambda status, _: self.read_failure(status, end))

    def read_failure(self, status, end):
        """The InputError for a native read's failure (EOF or -errno) of bytes up to `end`."""
        if status == native.EOF:
            return self.truncated(end)
        return InputError(f"{self.label}: cannot read: {os.strerror(-status)}")

    def truncated(self, end):
        return InputError(f"{self.label}: the file is truncated: its values need bytes up to {end}, "
                          f"but the file has {os.fstat(self.fd).st_size}")

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class ContiguousRows(_FileRows):
    kind = "pread"

    def __init__(self, path, ds, label):
        super().__init__(path, ds, label)
        self.offset = ds.id.get_offset()
        end = self.offset + self.shape[0] * self.row_bytes
        if end > self.file_size:
            self.close()
            raise InputError(f"{label}: the file is truncated: the dataset's values need bytes up to {end}, "
                             f"but the file has {self.file_size}")

    native = True

    @property
    def takes_codes(self):
        return self.dtype == np.float32 and not self.swapped

    def read(self, lo, hi, out):
        self._pread(memoryview(out).cast("B"), self.offset + lo * self.row_bytes)
        if self.swapped:
            out.byteswap(inplace=True)

    def submit(self, pool, lo, hi, out):
        """Rows [lo, hi) into out (C-contiguous, the stored type) on the native pool: a Ticket."""
        return self.submit_bytes(pool, out.ctypes.data, (hi - lo) * self.row_bytes, self.offset + lo * self.row_bytes,
                                 self.dtype.itemsize if self.swapped else 0)

    def submit_codes(self, pool, lo, hi, out):
        """Rows [lo, hi) of float32 values (this machine's byte order) into out (a codes wire,
        C-contiguous) as their 8-bit codes in its scaling, on the native pool: a Ticket failing with
        codes.NotCodes where one is not."""
        nbytes, end = (hi - lo) * self.row_bytes, self.offset + hi * self.row_bytes
        return Ticket(pool, pool.submit_codes(self.fd, out.ctypes.data, nbytes, self.offset + lo * self.row_bytes,
                                              native_piece(nbytes, pool), codes.SCALINGS[out.dtype]),
                      lambda status, _: codes.NotCodes() if status == native.NOT_CODES else self.read_failure(status, end))

    def submit_labels(self, pool, lo, hi, out):
        """The first maximum of each of rows [lo, hi) into out (int64, contiguous) on the native pool,
        a value that is not finite refused: a Ticket; None where the pool does not read this type."""
        kind = native.LABEL_KINDS.get(self.dtype.str[1:])
        if kind is None or pool.native is None or out.dtype != np.int64 or not out.flags.c_contiguous:
            return None
        ticket = pool.native.submit_labels(self.fd, self.offset + lo * self.row_bytes, hi - lo, self.row_bytes //
                                           self.dtype.itemsize, kind, self.swapped, out, LABEL_PIECE, lo)
        return Ticket(pool.native, ticket, lambda status, row: self._label_failure(status, row, hi), out)

    def _label_failure(self, status, row, hi):
        if status == native.NOT_FINITE:  # the row read again, for check_finite's message
            one = np.empty((1,) + self.shape[1:], self.dtype)
            self.read(row, row + 1, one)
            try:
                check_finite(one, one, self.label, row)
            except InputError as e:
                return e
            return InputError(f"{self.label}: row {row} changed while it was read (a value was not finite)")
        return self.read_failure(status, self.offset + hi * self.row_bytes)


class ChunkedRows(_FileRows):
    kind = "chunks"

    def __init__(self, path, ds, label, chunks, index, filters, plist):
        super().__init__(path, ds, label)
        self.chunks, self.align, self.index = tuple(chunks), chunks[0], index
        # Chunks per row of chunks (index[j]: row of chunks j // per), 1 where chunks hold whole rows
        self.grid = tuple(-(-n // c) for n, c in zip(self.shape[1:], self.chunks[1:]))
        self.per = int(np.prod(self.grid, dtype=np.int64))
        self.cut = self.chunks[1:] != self.shape[1:]
        self.chunk_bytes = int(np.prod(self.chunks, dtype=np.int64)) * self.dtype.itemsize
        self._local = threading.local()
        # Bit i of a chunk's filter mask set: filter i was skipped for that chunk (lzf is optional:
        # h5py stores a chunk that would not shrink as it is).
        self.shuffle = FILTER_SHUFFLE in filters
        codec = next((f for f in filters if f not in (FILTER_SHUFFLE, FILTER_FLETCHER32)), None)
        self.codec_bit = 1 << filters.index(codec) if codec else None
        self.codec_values = plist.get_filter(filters.index(codec))[1:3] if codec else None  # (flags, cd_values)
        self.summed = FILTER_FLETCHER32 in filters  # 4 bytes of checksum after the (coded) data
        self.codec = codec
        for offset, size, _ in index:
            if offset + size > self.file_size:
                self.close()
                raise InputError(f"{label}: the file is truncated: a chunk needs bytes up to {offset + size}, "
                                 f"but the file has {self.file_size}")
        self.bitshuffle = None  # (values a block, exact tail) where whole chunks stay bitshuffled: _kept_shuffled
        self.blosc_shuffle = None  # values a block where they stay byte-shuffled a c-blosc block at a time
        self.spec = self._native_spec()
        self.native = self.spec is not None

    def _native_spec(self):
        """The native pool's recipe for these chunks, or None where it cannot decode them."""
        lib = native.library()
        codec = {None: native.RAW, FILTER_LZF: native.LZF, FILTER_DEFLATE: native.DEFLATE}.get(self.codec, native.PLUGIN)
        plugin = native.plugin_filter(self.codec) if codec == native.PLUGIN else None
        decoder_missing = {native.DEFLATE: native.INFLATER is None, native.PLUGIN: plugin is None}.get(codec, False)
        if lib is None or decoder_missing:
            return None
        self.offsets = np.array([offset for offset, _, _ in self.index], np.int64)
        self.sizes = np.array([size for _, size, _ in self.index], np.int64)
        self.masks = np.array([mask for _, _, mask in self.index], np.uint32)
        dims = np.array([self.shape, self.chunks], np.int64)
        spec = lib.rp_chunks(self.fd, self.dtype.itemsize, self.shuffle, self.swapped, codec, self.codec_bit or 0,
                             self.summed, len(self.shape), dims[0].ctypes.data, dims[1].ctypes.data)
        if not spec:
            raise MemoryError("no memory for the chunk reader")
        if plugin:  # the plugin's function, and its codec's where it is called directly (the plugin
            # then takes the Blosc2 chunks the codec cannot place)
            flags, values = self.codec_values
            cd = np.array(values, np.uint32)
            direct = native.direct_codec(self.codec)
            if (lib.rp_chunks_plugin(spec, plugin[0], flags, len(cd), cd.ctypes.data)
                    or (direct and lib.rp_chunks_direct(spec, *direct))):
                lib.rp_chunks_free(spec)
                return None
            self.codec_name = plugin[1]
            kept = self._kept_shuffled(lib, spec)  # (kind, values a block, exact tail), or None
            if kept and kept[0] == native.BYTES_BLOSC:
                self.blosc_shuffle = kept[1]
            elif kept:
                self.bitshuffle = kept[1:]
        return spec

    def _kept_shuffled(self, lib, spec):
        """How whole chunks a read keeps shuffled lie, where the read pool decodes their blocks' lz4
        or zstd itself for the GPU to undo the rest (rp_chunks_bits): (BITS_BSHUF, BITS_BLOSC or
        BITS_BLOSC2, values a block, whether a shorter last block is bitshuffled only when whole
        groups of 8) for the Bitshuffle filter's, c-blosc's or Blosc2's bitshuffled blocks;
        (BYTES_BLOSC, values a block, False) for c-blosc's byte-shuffled ones (hdf5plugin's Blosc
        default; values wider than a byte); else None. Read from the first chunk: a chunk stored
        otherwise is shuffled again by the pool."""
        if (self.codec not in (FILTER_BLOSC, FILTER_BITSHUFFLE, FILTER_BLOSC2) or self.shuffle or self.swapped
                or self.masks[0]):
            return None
        head = os.pread(self.fd, 16, int(self.offsets[0]))
        if len(head) < 16:
            return None
        codecs, size = native.block_codecs(self.codec), self.dtype.itemsize
        if self.codec == FILTER_BITSHUFFLE:
            cd = self.codec_values[1]
            name = {2: "lz4", 3: "zstd"}.get(cd[4] if len(cd) > 4 else 0)
            block_bytes, kind, exact_tail = int.from_bytes(head[8:12], "big"), native.BITS_BSHUF, False
            fns = [codecs.get(k) if k == name else None for k in ("lz4", "zstd")]  # its codec's alone
            usable = name in codecs and int.from_bytes(head[:8], "big") == self.chunk_bytes
        elif self.codec == FILTER_BLOSC:  # c-blosc 1's format 2, bitshuffled (flag 4) or byte-shuffled (1), not copied (2)
            kind = {0x04: native.BITS_BLOSC, 0x01: native.BYTES_BLOSC}.get(head[2] & 0x0f)
            block_bytes, exact_tail = int.from_bytes(head[8:12], "little"), kind == native.BITS_BLOSC
            fns = [codecs.get("lz4"), codecs.get("zstd")]
            usable = (kind is not None and (kind == native.BITS_BLOSC or size > 1) and head[0] == 2 and head[3] == size
                      and {1: "lz4", 4: "zstd"}.get(head[2] >> 5) in codecs)
        else:  # Blosc2: its frame's one chunk (rp_blosc2_chunk: padded past the HDF5 chunk's rows or not),
            # its blocks bitshuffled as the Bitshuffle filter's
            frame = os.pread(self.fd, int(self.sizes[0]) - 4 * self.summed, int(self.offsets[0]))  # (not its fletcher32)
            padded = ctypes.c_size_t(0)
            at = lib.rp_blosc2_chunk(spec, frame, len(frame), ctypes.byref(padded))
            if at < 0:
                return None
            chunk = frame[at:at + 32]
            block_bytes, kind, exact_tail = int.from_bytes(chunk[8:12], "little"), native.BITS_BLOSC2, False
            fns = [codecs.get("lz4"), codecs.get("zstd")]
            usable = (3 <= chunk[0] <= 5 and chunk[2] & 0x17 == 0x15 and chunk[3] == size and chunk[31] == 0
                      and chunk[16:22] == bytes([0, 0, 0, 0, 0, 2]) and int.from_bytes(chunk[4:8], "little") == padded.value
                      and {1: "lz4", 4: "zstd"}.get(chunk[2] >> 5) in codecs)
        block = block_bytes // size  # rp_chunks_bits refuses bitshuffled blocks not a positive multiple of 8 values
        if not usable or block * size != block_bytes or lib.rp_chunks_bits(spec, kind, block, *fns):
            return None
        return kind, block, exact_tail

    def close(self):
        if getattr(self, "spec", None):
            native.library().rp_chunks_free(self.spec)
            self.spec = None
        super().close()

    def submit(self, pool, lo, hi, out, keep_shuffled=False):
        """Rows [lo, hi) into out (C-contiguous, the stored type), a job per chunk on the native
        pool: a Ticket. keep_shuffled: see ReadPool.submit_chunks."""
        ticket = pool.submit_chunks(self.spec, lo, hi, self.offsets, self.sizes, self.masks, out.ctypes.data,
                                    keep_shuffled)
        return Ticket(pool, ticket, self.failed)

    def submit_summed(self, pool, address, c0, c1, positions):
        """Chunks [c0, c1) as they are stored into address + positions (int64, a chunk each), each
        chunk's fletcher32 checked as it is read, a job a chunk on the native pool: a Ticket."""
        positions = np.ascontiguousarray(positions, np.int64)
        ticket = pool.submit_summed(self.fd, address, self.offsets[c0:c1], self.sizes[c0:c1], positions, c0)
        return Ticket(pool, ticket, self.failed)

    @property
    def takes_codes(self):
        """Whether the native pool reads these rows as 8-bit codes (submit_codes): float32 in this
        machine's byte order, in chunks of whole images stored without a codec or shuffle (read a
        step at a time), or in chunks cutting images (any filters: assembled from the threads'
        decoded chunks as codes). Whole-image chunks a codec decodes go straight into place as
        float32 (see chunks.c's decode_chunk)."""
        return (self.native and self.dtype == np.float32 and not self.swapped
                and (self.cut or (self.codec is None and not self.shuffle)))

    def submit_codes(self, pool, lo, hi, out):
        """Rows [lo, hi) into out (a codes wire, C-contiguous) as their 8-bit codes, a job per chunk on
        the native pool (each chunk's checksum checked over all its bytes): a Ticket failing with
        codes.NotCodes where a value is not one."""
        ticket = pool.submit_chunks(self.spec, lo, hi, self.offsets, self.sizes, self.masks, out.ctypes.data,
                                    scaling=codes.SCALINGS[out.dtype])
        return Ticket(pool, ticket, lambda status, j: codes.NotCodes() if status == native.NOT_CODES
                      else self.failed(status, j))

    def failed(self, status, j):
        what = f"{self.label}: chunk {j}"
        if status == native.EOF:
            return self.truncated(int(self.offsets[j] + self.sizes[j]))
        if status == native.DAMAGED:
            name = native.INFLATER if self.codec == FILTER_DEFLATE else "lzf" if self.codec == FILTER_LZF else self.codec_name
            return InputError(f"{what} cannot be decompressed ({name}: damaged data)")
        if status == native.SIZE:
            return InputError(f"{what} does not decode to its {self.chunk_bytes} bytes")
        if status == native.CHECKSUM:
            return InputError(f"{what} fails its fletcher32 checksum: the file is damaged")
        return InputError(f"{what}: cannot read: {os.strerror(-status)}")

    def read(self, lo, hi, out):
        """Rows [lo, hi) into out on the calling thread: natively where the library builds (the
        same decoding as the pool's), else chunk by chunk in Python (raw or deflate, shuffled or not)."""
        if self.spec is None:
            return self._read_python(lo, hi, out)
        target = out if out.flags.c_contiguous else np.empty_like(out)
        where = ctypes.c_longlong(0)
        status = native.library().rp_read_chunks(self.spec, lo, hi, self.offsets.ctypes.data, self.sizes.ctypes.data,
                                                 self.masks.ctypes.data, target.ctypes.data, ctypes.byref(where))
        if status:
            raise self.failed(status, where.value)
        if target is not out:
            out[...] = target

    def _scratch(self, name, nbytes):
        """A buffer of this thread's, reused: large allocations per chunk would serialize the
        threads on the kernel's memory-map lock (mmap, page faults, munmap)."""
        buf = getattr(self._local, name, None)
        if buf is None or len(buf) < nbytes:
            buf = np.empty(nbytes, np.uint8)
            setattr(self._local, name, buf)
        return buf[:nbytes]

    def _chunk(self, j):
        """Chunk j decoded in Python, in a scratch buffer: deflate undone, then shuffle (unless this
        chunk skipped them). Only raw and deflate chunks come here (rows() sends the rest to h5py
        where the native library is missing)."""
        offset, size, mask = self.index[j]
        nbytes = self.chunk_bytes
        raw = self._scratch("raw", size)
        self._pread(memoryview(raw), offset)
        if self.codec is not None and not mask & self.codec_bit:
            out = self._scratch("out", nbytes)
            _inflate(raw, out, f"{self.label}: chunk {j}")
        elif size != nbytes:
            raise InputError(f"{self.label}: chunk {j} holds {size} bytes, expected {nbytes}")
        else:
            out = raw
        if self.shuffle and not mask & 1:  # shuffle stored byte k of every value together
            out = out.reshape(self.dtype.itemsize, -1).T.reshape(-1)
        if self.swapped:
            out = out.reshape(-1, self.dtype.itemsize)[:, ::-1].reshape(-1)
        return out

    def _read_python(self, lo, hi, out):
        """Rows [lo, hi): each chunk decoded, its block of rows (and of H, W, C where chunks cut the
        images) copied into place."""
        for r in range(lo // self.align, -(-hi // self.align)):
            first = r * self.align
            rows = slice(max(lo, first) - first, min(hi, first + self.align) - first)
            for k, at in enumerate(np.ndindex(*self.grid)):
                block = self._chunk(r * self.per + k).view(self.dtype).reshape(self.chunks)
                origin = [i * c for i, c in zip(at, self.chunks[1:])]
                inner = tuple(slice(0, min(c, n - o)) for c, n, o in zip(self.chunks[1:], self.shape[1:], origin))
                place = tuple(slice(o, o + s.stop) for o, s in zip(origin, inner))
                out[(slice(rows.start + first - lo, rows.stop + first - lo),) + place] = block[(rows,) + inner]


@functools.lru_cache(maxsize=None)
def _libz():
    """zlib's uncompress() through ctypes (which releases the GIL): it inflates into a buffer we
    own; Python's zlib module returns a new bytes object each time. None where libz is missing."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("z")
    if not name:
        return None
    lib = ctypes.CDLL(name)
    lib.uncompress.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_ulong), ctypes.c_void_p, ctypes.c_ulong]
    lib.uncompress.restype = ctypes.c_int
    return lib


@functools.lru_cache(maxsize=None)
def _libdeflate():
    """The `deflate` package (libdeflate, a dependency), or None where it is missing: it inflated
    MNIST chunks at 2.1-2.2 GB/s a thread here, zlib at 0.51-0.57, both without the GIL."""
    try:
        import deflate
    except ImportError:
        return None
    return deflate


def _inflate(src, dst, label):
    """Inflate the zlib stream src into dst (both uint8 arrays), which it must fill exactly."""
    fast = _libdeflate()
    lib = None if fast else _libz()
    if lib is None:  # a new bytes object, copied into dst
        name, errors = ("libdeflate", fast.DeflateError) if fast else ("zlib", zlib.error)
        try:
            data = fast.zlib_decompress(src, len(dst)) if fast else zlib.decompress(src)
        except errors as e:
            raise InputError(f"{label} cannot be decompressed ({name}: {e})") from None
        if len(data) != len(dst):
            raise InputError(f"{label} holds {len(data)} bytes once decompressed, expected {len(dst)}")
        dst[...] = np.frombuffer(data, np.uint8)
        return
    import ctypes

    length = ctypes.c_ulong(len(dst))
    status = lib.uncompress(dst.ctypes.data, ctypes.byref(length), src.ctypes.data, len(src))
    if status != 0 or length.value != len(dst):
        raise InputError(f"{label} cannot be decompressed (zlib status {status}, {length.value} of {len(dst)} bytes)")


FILTER_SHUFFLE, FILTER_DEFLATE, FILTER_FLETCHER32, FILTER_LZF = 2, 1, 3, 32000  # HDF5's numbers (lzf: h5py's)
FILTER_BLOSC, FILTER_LZ4, FILTER_BITSHUFFLE, FILTER_ZSTD, FILTER_BLOSC2 = 32001, 32004, 32008, 32015, 32026  # hdf5plugin's


def _chunk_index(ds):
    """[(file offset, stored size, filter mask)] of every chunk, rows of chunks in order and in C
    order within each, or None if any chunk was never written (its values are fill values: h5py
    knows them)."""
    d, chunks = ds.id, ds.chunks  # (ds.chunks asks the file each time: once, not once a chunk)
    grid = [-(-n // c) for n, c in zip(ds.shape, chunks)]
    count = int(np.prod(grid, dtype=np.int64))
    if d.get_num_chunks() < count:
        return None
    index = [None] * count
    if hasattr(d, "chunk_iter"):
        infos = []
        d.chunk_iter(infos.append)
    else:
        infos = [d.get_chunk_info(i) for i in range(d.get_num_chunks())]
    for info in infos:
        flat = 0
        for o, c, g in zip(info.chunk_offset, chunks, grid):  # the chunk's place in C order
            flat = flat * g + o // c
        index[flat] = (info.byte_offset, info.size, info.filter_mask)
    return None if None in index else index


def rows(path, ds, label):
    """The fastest reader this dataset's layout allows (see the module's doc)."""
    import h5py

    path = str(path)
    in_order = ds.dtype.isnative or ds.dtype.itemsize == 1 or swappable(ds.dtype)  # or swapped as read
    plist = ds.id.get_create_plist()
    layout = plist.get_layout()
    if in_order and layout == h5py.h5d.CONTIGUOUS and ds.id.get_offset() is not None:
        return ContiguousRows(path, ds, label)
    filters = [plist.get_filter(i)[0] for i in range(plist.get_nfilters())]
    _require_filters(filters, label)
    rows = _fastest(path, ds, label, plist, layout, filters, in_order)
    rows.filters = "+".join(FILTER_NAMES.get(f) or PLUGIN_FILTERS.get(f, f"filter {f}").lower() for f in filters)
    return rows


def swappable(dtype):
    """Numbers stored in the other byte order, which the file readers reverse as they read."""
    return not dtype.isnative and dtype.kind in "iuf" and dtype.itemsize in (2, 4, 8)


def _fastest(path, ds, label, plist, layout, filters, in_order):
    import h5py

    if in_order and layout == h5py.h5d.CHUNKED and 1 <= len(ds.shape) <= 8 and 0 not in ds.shape:
        # [shuffle] [deflate | lzf | an hdf5plugin filter] [fletcher32], in that order; all but raw
        # and deflate chunks need the native library
        have = native.library() is not None
        rest = filters[1:] if filters[:1] == [FILTER_SHUFFLE] else filters
        rest = rest[:-1] if rest[-1:] == [FILTER_FLETCHER32] and have else rest
        if (rest in ([], [FILTER_DEFLATE]) or (rest == [FILTER_LZF] and have)
                or (len(rest) == 1 and have and native.plugin_filter(rest[0]))):
            index = _chunk_index(ds)
            if index is not None:
                rows = ChunkedRows(path, ds, label, ds.chunks, index, filters, plist)
                if rows.spec is not None or rest in ([], [FILTER_DEFLATE]):
                    return rows
                rows.close()
    return H5pyRows(ds, label, path)


FILTER_NAMES = {1: "deflate", 2: "shuffle", 3: "fletcher32", 4: "szip", 5: "nbit", 6: "scaleoffset", 32000: "lzf"}
PLUGIN_FILTERS = {32001: "Blosc", 32004: "LZ4", 32008: "Bitshuffle", 32015: "Zstd", 32026: "Blosc2", 307: "bzip2",
                  32017: "SZ", 32013: "ZFP", 32018: "FCIDECOMP", 32024: "SZ3"}


def _require_filters(filters, label):
    """Every filter of the dataset decodable by this HDF5: hdf5plugin's (an extra) registered when
    one is missing, else one line naming the filter and what to install."""
    import h5py

    missing = [f for f in filters if not h5py.h5z.filter_avail(f)]
    if missing:
        try:
            import hdf5plugin  # noqa: F401  (registers its filters with HDF5 on import)
        except ImportError:
            pass
        missing = [f for f in missing if not h5py.h5z.filter_avail(f)]
    if missing:
        names = ", ".join(f"{f} ({PLUGIN_FILTERS[f]})" if f in PLUGIN_FILTERS else str(f) for f in missing)
        raise InputError(f"{label}: compressed with HDF5 filter {names}, which this HDF5 cannot decode: "
                         "pip install 'cnninfer[plugins]' (hdf5plugin)")


def pieces(lo, hi, row_bytes, align, threads):
    """[lo, hi) cut into about one piece per thread (none over PIECE_BYTES), on multiples of align."""
    per = max(1, min(-(-(hi - lo) // threads), PIECE_BYTES // max(row_bytes, 1)))
    per = -(-per // align) * align
    cuts = list(range(lo - lo % align + per, hi, per))
    return list(zip([lo] + cuts, cuts + [hi]))


def first_max(values, out):
    """Each row's first maximum of values (2-D, C-contiguous, in the machine's byte order) into out
    (int64, contiguous) in native code, without the interpreter lock: True, or False where it was not
    done (no native library, another type, or a value that is not finite: check_finite names it)."""
    lib, kind = native.library(), native.LABEL_KINDS.get(values.dtype.str[1:])
    if lib is None or kind is None or out.dtype != np.int64 or not out.flags.c_contiguous:
        return False
    return lib.rp_first_max(values.ctypes.data, len(values), values.shape[1], kind, out.ctypes.data) == -1


def check_finite(values, original, label, offset):
    """Refuse any value of `values` that is not a finite number, naming the first (row offset added)."""
    bad = ~np.isfinite(values)
    if bad.any():
        first = np.unravel_index(np.argmax(bad), values.shape)
        index = (int(first[0]) + offset,) + tuple(int(i) for i in first[1:])
        raise InputError(f"{label}: value at index {index} is {original[first].item()!r}, "
                         f"not a finite {values.dtype} number")


def fill(rows, lo, hi, out, check):
    """Rows [lo, hi) into out: in the stored type, or converted to out's type (float32) and checked
    to be finite there; `check` also checks float32 rows stored as such. Into a codes wire, float32
    rows as their 8-bit codes (codes.NotCodes where one is not)."""
    if out.dtype in codes.WIRES:
        raw = np.empty((hi - lo,) + rows.shape[1:], rows.dtype)
        rows.read(lo, hi, raw)
        if codes.pack(raw, out.dtype, out) is None:
            raise codes.NotCodes()
        return
    if out.dtype == rows.dtype:
        rows.read(lo, hi, out)
        if check and out.dtype.kind == "f":
            check_finite(out, out, rows.label, lo)
        return
    raw = np.empty((hi - lo,) + rows.shape[1:], rows.dtype)
    rows.read(lo, hi, raw)
    with np.errstate(over="ignore", invalid="ignore"):
        out[...] = raw
    if raw.dtype.kind == "f" or out.dtype.kind != "f":  # integers are always finite in float32
        check_finite(out, raw, rows.label, lo)


class Ticket:
    """A read on the native pool, waited for as a future is (result, exception); a failure is
    failed(status, chunk)."""

    def __init__(self, pool, ticket, failed, holds=None):
        self.pool, self.ticket, self.failed = pool, ticket, failed
        self.holds = holds  # what the threads write into, alive until they are done
        self.status = None

    def result(self):
        if self.status is None:
            self.status = self.pool.finish(self.ticket)  # exactly once: it frees the ticket
            self.holds = None
        if self.status[0]:
            raise self.failed(*self.status)

    def exception(self):
        try:
            self.result()
        except BaseException as e:
            return e
        return None


class Reader:
    """A pool of reader threads; `submit` cuts a read into pieces, `read` also waits for them.
    Contiguous rows and whole-row chunks read in their stored type, unchecked (what the GPU takes)
    go to the native pool where it builds (`pool` says which ran). `busy_s` adds up the threads' reading time."""

    def __init__(self, threads=None, use_native=True):
        self.threads = threads or default_threads()
        self.pool = ThreadPoolExecutor(self.threads, thread_name_prefix="cnninfer-reader")
        lib = native.library() if use_native else None
        self.native = native.ReadPool(lib, threads or default_threads(native=True)) if lib is not None else None
        self.python_busy_s = 0.0
        self.used_native = False
        self._lock = threading.Lock()
        self._start_threads()

    def _start_threads(self):
        """Start the pool's threads now rather than inside the first timed read: two GPUs' first
        streamed run lost ~10 ms to starting 32 threads (49-55 ms against 60-63, 2 H200, uint8)."""
        started = threading.Barrier(self.threads + 1)
        try:
            for _ in range(self.threads):
                self.pool.submit(started.wait)
            started.wait()
        except (RuntimeError, threading.BrokenBarrierError):
            started.abort()  # threads that cannot start now start when first needed

    @property
    def busy_s(self):
        return self.python_busy_s + (self.native.busy_s if self.native is not None else 0.0)

    @property
    def kind(self):
        return "native threads" if self.used_native else "python threads"

    @property
    def threads_used(self):
        return self.native.threads if self.used_native else self.threads

    def _timed(self, fn, *args):
        t = time.perf_counter()
        try:
            return fn(*args)
        finally:
            with self._lock:
                self.python_busy_s += time.perf_counter() - t

    def submit(self, rows, lo, hi, out, check):
        """Futures filling out (hi - lo rows) from rows [lo, hi), in row order."""
        if (self.native is not None and rows.native and out.dtype == rows.dtype
                and not check and out.flags.c_contiguous and hi > lo):
            self.used_native = True
            return [rows.submit(self.native, lo, hi, out)]
        if (self.native is not None and out.dtype in codes.WIRES and rows.takes_codes
                and out.flags.c_contiguous and hi > lo):
            self.used_native = True
            return [rows.submit_codes(self.native, lo, hi, out)]
        return [self.pool.submit(self._timed, fill, rows, a, b, out[a - lo:b - lo], check)
                for a, b in pieces(lo, hi, rows.row_bytes, rows.align, self.threads)]

    def call(self, fn, *args):
        return self.pool.submit(self._timed, fn, *args)

    def aside(self, fn, *args):
        """fn(*args) on a pool thread, not counted as reading: a future."""
        return self.pool.submit(fn, *args)

    def read(self, rows, lo, hi, out, check):
        wait(self.submit(rows, lo, hi, out, check))
        return out

    def close(self):
        self.pool.shutdown(wait=True, cancel_futures=True)
        if self.native is not None:
            self.native.close()


class Inline:
    """A Reader's submit done at once on the calling thread: for a small array in memory, handing
    its copy to the pool's threads costs more than the copy (and, in a server, GIL hand-offs)."""

    @staticmethod
    def submit(rows, lo, hi, out, check):
        f = Future()
        try:
            f.set_result(fill(rows, lo, hi, out, check))
        except BaseException as e:
            f.set_exception(e)
        return [f]


INLINE_BYTES = 4 << 20  # arrays up to this size are copied on the calling thread


def wait(futures):
    """Results of futures in order; the first failure (in order, so the first bad row) is raised
    once every future has finished, so no thread still writes into a buffer being reused."""
    error = None
    results = []
    for f in futures:
        try:
            results.append(f.result())
        except BaseException as e:
            error = error or e
    if error is not None:
        raise error
    return results
