"""Native libraries built once with the C compiler ($CC, cc or gcc), cached on disk beside the
kernels, loaded with ctypes (`build`, used for the CPU network too: infer/cpu/net.py), and the read
pool (read_pool/, its .c files built together). Where no compiler or build works, `library()` is
None and Python threads read instead; CNNINFER_NATIVE=0 forces it."""
import ctypes
import ctypes.util
import functools
import hashlib
import os
import platform
import shutil
import subprocess
from pathlib import Path

from .atomic import replacing
from .. import env

HERE = Path(__file__).parent
FLAGS = ("-O2", "-shared", "-fPIC", "-pthread", "-Wall", "-Wextra", "-Werror")
# rp_wait's failures besides -errno: the file ended before the bytes asked for; a chunk that does
# not decode, one that decodes to another size, one that fails its checksum; a label row with a
# value that is not finite; a float32 value that is no 8-bit code times float32(1/255)
EOF, DAMAGED, SIZE, CHECKSUM, NOT_FINITE, NOT_CODES = 1, 2, 3, 4, 5, 6
# rp_submit_labels' and rp_first_max's value types (in the machine's byte order)
LABEL_KINDS = {t: k for k, t in enumerate(("f4", "f8", "i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8"), 1)}
RAW, DEFLATE, LZF, PLUGIN, ZSTD, LZ4, BLOSC, BLOSC2 = 0, 1, 2, 3, 4, 5, 6, 7  # rp_chunks' codecs
BITS_BSHUF, BITS_BLOSC, BITS_BLOSC2 = 1, 2, 3  # rp_chunks_bits: whole chunks left bitshuffled: the Bitshuffle
# filter's, c-blosc's or Blosc2's; or left byte-shuffled a c-blosc block at a time:
BYTES_BLOSC = 4
# hdf5plugin's filters whose codec the read pool calls itself (rp_chunks_direct): the function
# their plugin library exports, and the read pool's codec
DIRECT = {32015: ("ZSTD_decompress", ZSTD), 32004: ("LZ4_decompress_safe", LZ4), 32001: ("blosc_decompress_ctx", BLOSC),
          32026: ("blosc2_getitem", BLOSC2)}


def compiler():
    for name in (os.environ.get("CC"), "cc", "gcc"):
        found = name and shutil.which(name)
        if found:
            return found
    return None


@functools.lru_cache(maxsize=None)
def cpu_identity():
    """This CPU's model and feature flags (Linux), else what platform knows."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    wanted = [line for line in lines if line.split(":")[0].strip() in ("model name", "flags", "Features")]
    return "\n".join(dict.fromkeys(wanted)) or platform.processor() or platform.machine()


FAILED = {}  # a C file's name without .c -> why its last build failed (the compiler's first error line)


def build(source, flags=FLAGS, machine_specific=False):
    """The shared library built from `source`, a C file or a folder of them (its .c files compiled
    together, its .h beside them), compiled now if not cached; or None with no working compiler
    (FAILED[the file's name without .c, or the folder's] says why it did not build). The cache's
    key covers every source file's bytes."""
    name, cc = source.stem, compiler()
    files = sorted(source.glob("*.c")) if source.is_dir() else [source] if source.is_file() else []
    if cc is None or not files:
        FAILED[name] = "no C compiler ($CC, cc or gcc) on the PATH" if cc is None else f"{source} is missing"
        return None
    headers = sorted(source.glob("*.h")) if source.is_dir() else []
    what = ([f.read_bytes() for f in files + headers], flags, os.uname().machine, cpu_identity() if machine_specific else "")
    path = env.cache_root() / "native" / f"{name}-{hashlib.sha256(repr(what).encode()).hexdigest()[:20]}.so"
    if path.is_file():
        return path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with replacing(path) as tmp:
            subprocess.run([cc, *flags, "-o", str(tmp), *map(str, files)], check=True, capture_output=True, text=True)
    except subprocess.CalledProcessError as e:
        errors = [line for line in (e.stderr or "").splitlines() if "error" in line] or ["(no message)"]
        FAILED[name] = f"{source.name} did not build with {Path(cc).name} {' '.join(flags[:1])}: {errors[0].strip()}"
        return None
    except OSError as e:
        FAILED[name] = f"{source.name} did not build: {e}"
        return None
    FAILED.pop(name, None)
    return path


def _load(path):
    try:
        return ctypes.CDLL(str(path))
    except OSError:
        return None


@functools.lru_cache(maxsize=None)
def library():
    """The loaded read pool (ctypes), or None: no compiler, a failed build, or CNNINFER_NATIVE=0."""
    if not env.native():
        return None
    path = build(HERE / "read_pool")
    lib = path and _load(path)
    if not lib:
        return None
    p, size, i64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_longlong
    for name, args, result in (("rp_create", [ctypes.c_int], p), ("rp_destroy", [p], None),
                               ("rp_submit", [p, ctypes.c_int, p, size, i64, size, size], p),
                               ("rp_submit_codes", [p, ctypes.c_int, p, size, i64, size, ctypes.c_int], p),
                               ("rp_submit_summed", [p, ctypes.c_int, p, i64, p, p, p, i64], p),
                               ("rp_pack_codes", [p, p, size, ctypes.c_int, ctypes.c_int], ctypes.c_int),
                               ("rp_wait", [p, p, ctypes.POINTER(i64)], ctypes.c_int), ("rp_busy_ns", [p], i64),
                               ("rp_chunks", [ctypes.c_int, size, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_uint,
                                             ctypes.c_int, ctypes.c_int, p, p], p),
                               ("rp_chunks_free", [p], None), ("rp_set_inflater", [p, p, p, p], None),
                               ("rp_chunks_plugin", [p, p, ctypes.c_uint, size, p], ctypes.c_int),
                               ("rp_chunks_direct", [p, ctypes.c_int, p], ctypes.c_int),
                               ("rp_chunks_bits", [p, ctypes.c_int, size, p, p], ctypes.c_int),
                               ("rp_blosc2_chunk", [p, p, size, p], i64),
                               ("rp_submit_chunks", [p, p, i64, i64, p, p, p, p, ctypes.c_int, ctypes.c_int], p),
                               ("rp_read_chunks", [p, i64, i64, p, p, p, p, ctypes.POINTER(i64)], ctypes.c_int),
                               ("rp_submit_labels", [p, ctypes.c_int, i64, i64, size, ctypes.c_int, ctypes.c_int, p,
                                                     i64, i64], p),
                               ("rp_first_max", [p, i64, size, ctypes.c_int, p], i64)):
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, result
    use_inflater(lib, "libdeflate")
    return lib


def _address(lib, name):
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


def use_inflater(lib, name):
    """Hand the read pool its inflater for deflate chunks: "libdeflate" (the `deflate` package's
    extension exports libdeflate's functions; 2.1-2.2 GB/s a thread here) or else, or where that is
    missing, zlib's uncompress (0.51-0.57). Returns the one handed over, or None: neither is here."""
    global INFLATER
    INFLATER = None
    lib.rp_set_inflater(None, None, None, None)
    if name == "libdeflate":
        try:
            from deflate import _deflate

            ld = ctypes.CDLL(_deflate.__file__)
            lib.rp_set_inflater(_address(ld, "libdeflate_alloc_decompressor"),
                                _address(ld, "libdeflate_free_decompressor"),
                                _address(ld, "libdeflate_zlib_decompress"), None)
            INFLATER = name
            return INFLATER
        except (ImportError, OSError, AttributeError):
            pass
    found = ctypes.util.find_library("z")
    try:
        z = found and ctypes.CDLL(found)
        if z:
            lib.rp_set_inflater(None, None, None, _address(z, "uncompress"))
            INFLATER = "zlib"
    except (OSError, AttributeError):
        pass
    return INFLATER


INFLATER = None  # what use_inflater handed over


class _FilterClass(ctypes.Structure):
    """HDF5's H5Z_class2_t, what a filter plugin's H5PLget_plugin_info returns."""
    _fields_ = [("version", ctypes.c_int), ("id", ctypes.c_int), ("encoder_present", ctypes.c_uint),
                ("decoder_present", ctypes.c_uint), ("name", ctypes.c_char_p), ("can_apply", ctypes.c_void_p),
                ("set_local", ctypes.c_void_p), ("filter", ctypes.c_void_p)]


@functools.lru_cache(maxsize=None)
def plugin_filter(filter_id):
    """(address of the decoding function, name, library) of hdf5plugin's plugin for an HDF5 filter id, for
    the read pool's threads to call without HDF5 (the plugins hdf5plugin builds call no HDF5
    function on success; on a damaged chunk they push onto HDF5's error stack), or None where
    hdf5plugin (an extra) does not have it."""
    try:
        import hdf5plugin
    except ImportError:
        return None
    name = next((k for k, v in hdf5plugin.FILTERS.items() if v == filter_id), None)
    path = hdf5plugin.get_config().registered_filters.get(name)
    if path is None or not os.path.isfile(path):
        return None
    if name in ("blosc", "blosc2"):
        # c-blosc takes a global lock per call unless BLOSC_NOLOCK is set; read at every call
        os.environ.setdefault("BLOSC_NOLOCK", "1")
    try:
        info = ctypes.CDLL(path).H5PLget_plugin_info
    except (OSError, AttributeError):
        return None
    info.restype = ctypes.POINTER(_FilterClass)
    cls = info()
    if not cls or cls.contents.version != 1 or cls.contents.id != filter_id or not cls.contents.decoder_present:
        return None
    return cls.contents.filter, name, path


@functools.lru_cache(maxsize=None)
def direct_codec(filter_id):
    """(the read pool's codec, the address of the codec function inside the plugin's library) for
    the hdf5plugin filters whose data is one codec's stream (Zstd, LZ4, Blosc; Blosc2's frames where
    their blocks hold whole rows): decoded straight into place, without the plugin's own output
    buffer (4.6 MB a thread, and a copy). None for the others, or where the library does not
    export the function."""
    plugin = plugin_filter(filter_id)
    if plugin is None or filter_id not in DIRECT:
        return None
    symbol, codec = DIRECT[filter_id]
    library = ctypes.CDLL(plugin[2])
    fn = getattr(library, symbol, None)
    if fn is None or (codec == BLOSC2 and not hasattr(library, "blosc2_init")):
        return None
    if codec == BLOSC2:
        library.blosc2_init()  # once: the codecs' global tables (the plugin calls it per chunk)
    return codec, ctypes.cast(fn, ctypes.c_void_p).value


@functools.lru_cache(maxsize=None)
def block_codecs(filter_id):
    """{"lz4": LZ4_decompress_safe's address, "zstd": ZSTD_decompress's} as the library of hdf5plugin's
    plugin for an HDF5 filter id exports them (the Blosc and Bitshuffle plugins link both), for
    the blocks of bitshuffled chunks the read pool decodes itself (rp_chunks_bits)."""
    plugin = plugin_filter(filter_id)
    if plugin is None:
        return {}
    library = ctypes.CDLL(plugin[2])
    found = {name: getattr(library, symbol, None) for name, symbol in (("lz4", "LZ4_decompress_safe"),
                                                                        ("zstd", "ZSTD_decompress"))}
    return {name: ctypes.cast(fn, ctypes.c_void_p).value for name, fn in found.items() if fn is not None}


class ReadPool:
    """Native threads reading byte ranges of files into memory; submit() returns a ticket whose
    wait() blocks (without the interpreter lock) until its bytes are in."""

    def __init__(self, lib, threads):
        self.lib, self.threads = lib, threads
        self.pool = lib.rp_create(threads)
        if not self.pool:
            raise OSError("cannot start the native reader threads")

    def submit(self, fd, address, nbytes, offset, piece, swap=0):
        """nbytes of fd from offset into address, in pieces of `piece` bytes; swap: the size of values
        stored in the other byte order, reversed once read (0: none)."""
        ticket = self.lib.rp_submit(self.pool, fd, address, nbytes, offset, piece, swap)
        if not ticket:
            raise MemoryError("no memory for a read's ticket")
        return ticket

    def submit_codes(self, fd, address, nbytes, offset, piece, scaling):
        """nbytes of float32 values of fd from offset into address as their 8-bit codes (nbytes / 4
        bytes; scaling: codes.SCALINGS'), in pieces of about `piece` bytes of the file; fails with
        NOT_CODES where one is not."""
        ticket = self.lib.rp_submit_codes(self.pool, fd, address, nbytes, offset, piece, scaling)
        if not ticket:
            raise MemoryError("no memory for a read's ticket")
        return ticket

    def submit_summed(self, fd, address, offsets, sizes, positions, first):
        """Chunks as they are stored (offsets, sizes, positions: C-contiguous int64 arrays, a chunk
        each, read before this returns; the first chunk numbered `first`) into address + positions, a
        job a chunk, each one's fletcher32 (its last 4 bytes) checked as it is read; fails with
        CHECKSUM naming the lowest chunk failing it."""
        ticket = self.lib.rp_submit_summed(self.pool, fd, address, len(offsets), offsets.ctypes.data,
                                           sizes.ctypes.data, positions.ctypes.data, first)
        if not ticket:
            raise MemoryError("no memory for a read's ticket")
        return ticket

    def submit_chunks(self, spec, lo, hi, offsets, sizes, masks, address, keep_shuffled=False, scaling=None):
        """Rows [lo, hi) of a chunked dataset (spec: rp_chunks; offsets, sizes and masks: arrays
        over all its chunks, int64, int64, uint32) into address; keep_shuffled: the chunks lying
        wholly in [lo, hi) placed as the shuffle filter left them (for the GPU to unshuffle);
        scaling (codes.SCALINGS'): float32 values stored without a codec as their 8-bit codes,
        failing with NOT_CODES where one is not."""
        ticket = self.lib.rp_submit_chunks(self.pool, spec, lo, hi, offsets.ctypes.data, sizes.ctypes.data,
                                           masks.ctypes.data, address, int(keep_shuffled),
                                           0 if scaling is None else 1 + scaling)
        if not ticket:
            raise MemoryError("no memory for a read's ticket")
        return ticket

    def submit_labels(self, fd, offset, rows, classes, kind, swapped, out, piece, first):
        """The labels of `rows` one-hot rows (classes values of LABEL_KINDS type `kind` each, at
        offset of fd, the first row `first` of its dataset) into out (int64), `piece` rows a job."""
        ticket = self.lib.rp_submit_labels(self.pool, fd, offset, rows, classes, kind, int(swapped), out.ctypes.data,
                                           piece, first)
        if not ticket:
            raise MemoryError("no memory for a read's ticket")
        return ticket

    def finish(self, ticket):
        """(status, chunk): 0, EOF, DAMAGED, SIZE, CHECKSUM or -errno, and the lowest chunk that
        failed (each ticket waited for exactly once)."""
        where = ctypes.c_longlong(0)
        return self.lib.rp_wait(self.pool, ticket, ctypes.byref(where)), where.value

    def wait(self, ticket):
        return self.finish(ticket)[0]

    @property
    def busy_s(self):
        return self.lib.rp_busy_ns(self.pool) / 1e9

    def close(self):
        if self.pool:
            self.lib.rp_destroy(self.pool)
            self.pool = None
