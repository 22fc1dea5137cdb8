"""chunk_decode's Decoder end to end without a GPU, for every GPU decoder (deflate, LZF, Zstd, LZ4,
Bitshuffle, Blosc2, Blosc lz4 and zstd; whole images and chunks cutting them): every block of a streamed file enqueued as
the backend does (groups of 3 blocks over 2 lanes, a shorter last group, tables filled from the
group's row o on, blocks uploaded back to back), each launch run on device memory that is a NumPy
array: the decoders by the reference decoders (zlib, an LZF decoder here, the c-blosc walk, libzstd,
lz4_walk built for the host; the deflate family's check with its adler32), every placing kernel (unshuffles, bit-unshuffles, assembles) by decode.cu's own per-value
arithmetic built for the host. The images placed are h5py's, value for value."""
import zlib
from types import SimpleNamespace

import h5py
import numpy as np
import pytest

from infer.data import loader, reader
from infer.errors import InputError
from infer.data.dataset import DataSet
from infer.gpu import chunk_decode, codecs, launch
from infer.gpu.launch.base import _StandIn
from tests.conftest import small_model
from tests.test_blosc_cut import BLOSC, PLAIN, BYTES, BITS, Kernels, assembled, images  # noqa: F401 (a fixture)
from tests.test_blosc_zstd import zstd_decompress
from tests.test_gpu_decode import reserved_block
from tests.test_lz4_blocks import fake_driver, lz4_walk  # noqa: F401 (a fixture)
from tests.test_reader import bit_shuffle, blosc_shuffle, byte_shuffle, shuffled_rows

hdf5plugin = pytest.importorskip("hdf5plugin")


class Emulated(Kernels):
    """Kernels, with a bump allocator over its memory, memsets, and every placing launcher: each
    reads values as decode.cu's chunk_value does (through the host build of `assembled`)."""

    def __init__(self, walk, dtype, assemble):
        super().__init__(walk, dtype, assemble)
        self.mem = np.zeros(96 << 20, np.uint8)
        self.top = 1 << 16

    def alloc(self, nbytes):
        self.top += -(-max(nbytes, 4) // 256) * 256
        assert self.top <= len(self.mem), "the emulated device is full"
        return self.top - -(-max(nbytes, 4) // 256) * 256

    def memset_d32(self, at, value, count, stream=None):
        self.mem[at:at + 4 * count] = np.full(count, value, np.uint32).view(np.uint8)

    def _values(self, src, chunk_values, stride, layout, block, exact_tail, first_value, values):
        """values values from value first_value of chunks of chunk_values values, stride bytes apart,
        stored in `layout` (decode.cu's chunk_value, a chunk as an image of 1 x chunk_values x 1)."""
        chunks = -(-(first_value + values) // chunk_values)
        got = self.host_assemble(self.mem.ctypes.data + src, self.dtype, (1, chunk_values, 1), (1, 1, chunk_values, 1),
                                 0, chunks, stride, layout, block, exact_tail)
        return got[first_value:first_value + values]

    def bit_unshuffle(self, stream, src, dst, chunks, chunk_values, block, exact_tail, first_value, values):
        self.put(dst, self._values(src, chunk_values, chunk_values * self.dtype.itemsize, BITS, block, exact_tail,
                                   first_value, values))

    def unshuffle(self, stream, decoded, dst, first_value, values, chunk_values, stride):
        self.put(dst, self._values(decoded, chunk_values, stride, BYTES, chunk_values, False, first_value, values))

    def blosc_unshuffle(self, stream, decoded, dst, first_value, values, chunk_values, stride, block_values):
        self.put(dst, self._values(decoded, chunk_values, stride, BYTES, block_values, False, first_value, values))

    def streams(self, decode, count, src_ptrs, src_bytes, dst_bytes, actual_bytes, dst_ptrs, statuses):
        """A FrameDecoder's launch: each stream of a stored size decoded by decode(bytes, capacity)
        into its output, its decoded size and status (0, or 1: damaged) noted."""
        rows = zip(self.u64(src_ptrs, count), self.u64(src_bytes, count), self.u64(dst_bytes, count),
                   self.u64(dst_ptrs, count))
        status = self.mem[statuses:statuses + 4 * count].view(np.int32)
        for k, (at, size, capacity, out) in enumerate(rows):
            if size:
                try:
                    got = np.frombuffer(decode(self.mem[at:at + size].tobytes(), capacity), np.uint8)
                    status[k] = int(len(got) > capacity)
                    self.mem[out:out + min(len(got), capacity)] = got[:capacity]
                except (zlib.error, IndexError, ValueError):
                    got, status[k] = b"", 1
                self.mem[actual_bytes + 8 * k:][:8] = np.array([len(got)], np.uint64).view(np.uint8)

    def inflate(self, stream, count, *table, scratch=None, scratch_bytes=0, split=True, spread=False):
        self.streams(lambda data, cap: zlib.decompressobj(-15).decompress(data, cap + 1), count, *table[:6])

    def lzf(self, stream, count, *table):
        self.streams(lzf_decoded, count, *table)

    def zstd_apart(self, stream, count, *table):
        decompress = zstd_decompress()

        def decode(data, cap):
            out = np.empty(cap, np.uint8)
            n = decompress(out.ctypes.data, cap, data, len(data))
            if n > cap:
                raise ValueError("damaged")
            return out[:n].tobytes()
        self.streams(decode, count, *table[:6])

    def decode_check(self, stream, count, src_ptrs, src_bytes, decoded_bytes, statuses, decoded, chunk_bytes, stride,
                     adler, first, bad):
        """decode_check_kernel1: status and size into bad[0], adler32 (the 4 big-endian bytes after the
        stream) into bad[1]."""
        status = self.mem[statuses:statuses + 4 * count].view(np.int32)
        rows = zip(self.u64(src_ptrs, count), self.u64(src_bytes, count), self.u64(decoded_bytes, count))
        for c, (at, size, n) in enumerate(rows):
            if not size:
                continue
            if status[c] or n != chunk_bytes:
                self.flag(bad, first + c)
            elif adler and zlib.adler32(self.mem[decoded + c * stride:][:chunk_bytes].tobytes()) != int.from_bytes(
                    self.mem[at + size:at + size + 4].tobytes(), "big"):
                self.flag(bad + 4, first + c)

    def assemble1(self, stream, decoded, dst, image, chunk, first, rows, stride, shuffled):
        values = int(np.prod(chunk))
        self(stream, decoded, dst, image, chunk, first, rows, stride, BYTES if shuffled else PLAIN, values)


def lzf_decoded(src, capacity):
    """liblzf's format: a control byte under 32 starts that many plus one literals, else a back
    reference (its length in the top 3 bits, 7: one more byte of it; its distance in 13 bits)."""
    out, i = bytearray(), 0
    while i < len(src):
        ctrl = src[i]
        i += 1
        if ctrl < 32:
            out += src[i:i + ctrl + 1]
            i += ctrl + 1
            continue
        n, ref = ctrl >> 5, len(out) - ((ctrl & 31) << 8) - 1
        if n == 7:
            n += src[i]
            i += 1
        ref -= src[i]
        i += 1
        if ref < 0:
            raise ValueError("a reference before the output's start")
        for _ in range(n + 2):
            out.append(out[ref])
            ref += 1
    return bytes(out)


FILES = [  # (filters, chunks, shuffle before)
    (lambda: dict(compression="gzip", compression_opts=1), (40, 13, 13, 1), True),
    (lambda: dict(compression="gzip", compression_opts=6), (40, 5, 6, 1), False),
    (lambda: dict(compression="lzf"), (40, 13, 13, 1), True),
    (lambda: dict(compression="lzf"), (40, 7, 13, 1), False),
    (lambda: dict(hdf5plugin.Zstd(clevel=3)), (40, 13, 13, 1), True),
    (lambda: dict(hdf5plugin.Zstd(clevel=3)), (40, 7, 13, 1), True),
    (BLOSC["blosc_lz4"], (40, 13, 13, 1), False),
    (BLOSC["blosc_zstd"], (40, 13, 13, 1), False),
    (BLOSC["blosc_lz4"], (40, 7, 13, 1), False),
    (BLOSC["blosc_zstd"], (40, 7, 13, 1), False),
    (BLOSC["blosc_zstd_noshuffle"], (40, 5, 6, 1), False),
    (BLOSC["bitshuffle"], (40, 13, 13, 1), False),
    (BLOSC["bitshuffle"], (40, 7, 13, 1), False),
    (lambda: hdf5plugin.LZ4(nbytes=1000), (40, 13, 13, 1), True),
    (lambda: hdf5plugin.LZ4(nbytes=1000), (40, 7, 13, 1), True),
    (lambda: hdf5plugin.LZ4(), (40, 5, 6, 1), False),
    (lambda: hdf5plugin.Blosc2(cname="lz4", clevel=5, filters=hdf5plugin.Blosc2.BITSHUFFLE), (64, 13, 13, 1), False),
    (lambda: hdf5plugin.Blosc(), (40, 13, 13, 1), False),  # hdf5plugin's default: lz4, byte shuffle
    (lambda: hdf5plugin.Blosc(), (40, 7, 13, 1), False),
    (lambda: hdf5plugin.Blosc(), (100, 13, 13, 1), False),  # blocks of 32 KB, a shorter last one
]
SUMMED = [  # the same with fletcher32: the chunks read on the native pool, each checked as it is read
    (lambda: dict(compression="gzip", compression_opts=1, fletcher32=True), (40, 13, 13, 1), True),
    (lambda: dict(compression="gzip", compression_opts=6, fletcher32=True), (40, 5, 6, 1), False),
    (lambda: dict(compression="lzf", fletcher32=True), (40, 7, 13, 1), True),
    (lambda: dict(hdf5plugin.Zstd(clevel=3), fletcher32=True), (40, 13, 13, 1), False),
    (lambda: dict(BLOSC["blosc_lz4"](), fletcher32=True), (40, 7, 13, 1), False),
    (lambda: dict(BLOSC["blosc_zstd"](), fletcher32=True), (40, 13, 13, 1), False),
    (lambda: dict(BLOSC["bitshuffle"](), fletcher32=True), (40, 13, 13, 1), False),
    (lambda: dict(hdf5plugin.LZ4(nbytes=1000), fletcher32=True), (40, 7, 13, 1), True),
    (lambda: dict(hdf5plugin.Blosc2(cname="lz4", clevel=5, filters=hdf5plugin.Blosc2.BITSHUFFLE), fletcher32=True),
     (64, 13, 13, 1), False),
]


def file_id(filters, chunk, shuffle):
    f = filters()
    return f"{f.get('compression')}-{'x'.join(map(str, chunk))}{'-shuffle' if shuffle else ''}" + (
        "-fletcher32" if f.get("fletcher32") else "")


def streamed(tmp_path, rng, monkeypatch, walk, assemble, x, filters, chunk, shuffle=False, mend=None, model=None):
    """x written in chunks of `chunk` through filters (then mend(path)) and streamed through a
    Decoder on an Emulated device, in blocks of 2 rows of chunks, groups of 3 blocks over 2 lanes:
    (the images placed, the decoder's failures(), the lanes used)."""
    path = tmp_path / "s.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x, chunks=chunk, shuffle=shuffle, **filters())
        f["y"] = np.eye(10)[np.arange(len(x)) % 10]
    if mend:
        mend(path)
    data, pool = DataSet.open([path], model or loader.model_from_arrays(small_model(rng))), None
    try:
        rows = data.parts[0][1]
        assert chunk_decode.unsupported(data, x.dtype) is None
        gpu = Emulated(walk, x.dtype, assemble)
        gpu.install(monkeypatch, rows)
        import pycuda.driver as fake

        fake.mem_alloc = gpu.alloc
        fake.memset_d32 = fake.memset_d32_async = gpu.memset_d32
        fake.memcpy_dtoh = lambda host, at: host.reshape(-1).view(np.uint8).__setitem__(
            slice(None), gpu.mem[at:at + host.nbytes])
        fake.Stream = _StandIn  # (streams and their waits: the emulation runs each launch at once)
        for name, kernel in (("BloscLz4", gpu.blosc_lz4), ("Zstd", gpu.zstd), ("StreamCheck", gpu.check),
                             ("Lz4Index", gpu.index), ("Lz4Blocks", gpu.lz4), ("BitUnshuffleRange", gpu.bit_unshuffle),
                             ("Unshuffle", gpu.unshuffle), ("BloscUnshuffle", gpu.blosc_unshuffle),
                             ("Assemble", gpu.assemble1), ("InflateParts", gpu.inflate), ("Lzf", gpu.lzf),
                             ("ZstdApart", gpu.zstd_apart), ("DecodeCheck", gpu.decode_check)):
            monkeypatch.setattr(launch, name, lambda build, *size, k=kernel: k)
        monkeypatch.setattr(launch, "AssembleBlocks", lambda build, size: gpu)
        for codec, kernel in ((codecs.Deflate, gpu.inflate), (codecs.Zstd, gpu.zstd_apart), (codecs.Lzf, gpu.lzf)):
            monkeypatch.setattr(codec, "kernel", staticmethod(lambda build, k=kernel: k))  # (bound as the class was made)
        block = 2 * rows.align
        decoder = chunk_decode.Decoder(None, rows, block, 2, gpu.alloc, [], 3, _StandIn())
        decoder.start()
        pool = reader.Reader(2) if rows.summed else type("Pool", (), {
            "native": None, "call": staticmethod(lambda fn, *args: fn(*args))})()
        out = gpu.alloc(x.nbytes)
        buf = np.empty(chunk_decode.layout(rows, block)[1], np.uint8)
        used = set()
        for lo in range(0, len(x), block):
            piece = chunk_decode.Block(buf.copy(), min(block, len(x) - lo))
            reads = decoder.read(pool, lo, lo + len(piece), piece)
            if rows.summed:
                reader.wait(reads)
            decoder.enqueue(out + lo * rows.row_bytes, piece)
            used.add(id(decoder.lane))
        decoder.flush()
        return gpu.mem[out:out + x.nbytes].view(x.dtype).reshape(x.shape), decoder.failures(), len(used)
    finally:
        if isinstance(pool, reader.Reader):
            pool.close()
        data.close()


@pytest.mark.parametrize("dtype", ["f4", "i2"])
@pytest.mark.parametrize("filters,chunk,shuffle", FILES + SUMMED, ids=[file_id(*f) for f in FILES + SUMMED])
def test_a_streamed_file_decoded_by_the_decoder_as_the_backend_drives_it(tmp_path, rng, monkeypatch, lz4_walk,
                                                                       assembled, filters, chunk, shuffle, dtype):
    """611 images of 13 x 13 (mostly zeros, a band of noise stored as it is), in blocks of 2 rows of
    chunks: 8 blocks, 3 groups (the last of 2 blocks), the lanes taken in turn."""
    x = images(rng, 611, (13, 13, 1), dtype)
    got, failed, lanes = streamed(tmp_path, rng, monkeypatch, lz4_walk, assembled, x, filters, chunk, shuffle)
    assert failed is None and lanes == 2
    np.testing.assert_array_equal(got, x)


def first_block_size(data, size):
    return data[:12] + size.to_bytes(4, "big") + data[16:]


DAMAGED = [  # (filters, chunks, how chunk 3 is damaged, what the message says)
    # zlib's adler32 trailer; a stored LZF chunk's first control byte a reference before its start
    (lambda: dict(compression="gzip"), (40, 7, 13, 1), lambda data: data[:-1] + bytes([data[-1] ^ 0x5A]),
     "fails its adler32 checksum once decompressed"),
    (lambda: dict(compression="lzf"), (40, 13, 13, 1), lambda data: bytes([0xE0, 0xFF]) + data[2:], "damaged LZF data"),
    (BLOSC["bitshuffle"], (40, 13, 13, 1), lambda data: first_block_size(data, 10 ** 9), "Bitshuffle lz4"),
    (BLOSC["bitshuffle"], (40, 7, 13, 1), lambda data: data[:-1], "Bitshuffle lz4"),  # its last byte gone
    # the first block's token: more literals than it holds
    (lambda: hdf5plugin.LZ4(nbytes=1000), (40, 7, 13, 1),
     lambda data: data[:16] + bytes([0xF0]) + bytes([0xFF]) * 40 + data[57:], "LZ4"),
    # c-blosc: its first block starting past its end; a stream's token asking more than it holds
    (BLOSC["blosc_lz4"], (40, 7, 13, 1), lambda data: data[:16] + (10 ** 9).to_bytes(4, "little") + data[20:], "lz4"),
    (BLOSC["blosc_zstd"], (40, 7, 13, 1), reserved_block, "zstd"),
]


@pytest.mark.parametrize("filters,chunk,mend,what", DAMAGED, ids=[f"{f().get('compression')}-{c[1]}-{k}"
                                                                 for k, (f, c, _, _) in enumerate(DAMAGED)])
def test_a_damaged_chunk_fails_the_run_naming_it(tmp_path, rng, monkeypatch, lz4_walk, assembled, filters, chunk, mend,
                                                 what):
    """Chunk 3 of each decoder's file damaged: the decoder's failures() is one line naming the file,
    the data set, the chunk and its codec (the command line's exit 2)."""
    from tests.test_gpu_decode import blosc_chunk

    x = images(rng, 611, (13, 13, 1), "f4")
    _, failed, _ = streamed(tmp_path, rng, monkeypatch, lz4_walk, assembled, x, filters, chunk,
                            mend=lambda path: blosc_chunk(path, 3, lambda data, rows: bytes(mend(data))))
    assert failed is not None and "s.h5: dataset 'x': chunk 3 " in str(failed), failed
    assert what in str(failed) and "\n" not in str(failed)


@pytest.mark.parametrize("where", ["data", "checksum"])
@pytest.mark.parametrize("filters,chunk", [(SUMMED[0][0], (40, 13, 13, 1)), (SUMMED[4][0], (40, 7, 13, 1))],
                         ids=["gzip", "blosc lz4, chunks cutting images"])
def test_a_chunk_failing_its_fletcher32_stops_the_read_naming_it(tmp_path, rng, monkeypatch, lz4_walk, assembled,
                                                                 filters, chunk, where):
    """Chunk 3's stored bytes, or its stored checksum, changed by a bit: the reader threads' check
    refuses the block holding it as it is read, in one line naming the file, data set and chunk,
    before anything is uploaded."""
    from tests.test_gpu_decode import blosc_chunk

    def flip(data, rows):
        at = len(data) - 2 if where == "checksum" else len(data) // 2
        return data[:at] + bytes([data[at] ^ 0x10]) + data[at + 1:]

    x = images(rng, 611, (13, 13, 1), "f4")
    with pytest.raises(InputError, match=r"/s\.h5: dataset 'x': chunk 3 fails its fletcher32 checksum: the file is "
                                         r"damaged$"):
        streamed(tmp_path, rng, monkeypatch, lz4_walk, assembled, x, filters, chunk,
                 mend=lambda path: blosc_chunk(path, 3, flip))


PLACER_SHUFFLES = {  # what the reader threads left (rows' bitshuffle, blosc_shuffle), and how a chunk lies
    "hdf5 bytes": ((None, None), byte_shuffle), "bitshuffle": (((16, False), None), bit_shuffle(16, False)),
    "blosc bits": (((24, True), None), bit_shuffle(24, True)), "blosc bytes": ((None, 11), blosc_shuffle(11))}


@pytest.mark.parametrize("dtype", ["f4", "i2", "u8"])
@pytest.mark.parametrize("kind", PLACER_SHUFFLES)
def test_the_placer_unshuffles_whole_chunks_and_copies_the_rest(monkeypatch, rng, lz4_walk, assembled, kind, dtype):
    """shuffled.Placer (a streamed block the reader threads decoded but left shuffled) on an Emulated
    device, its unshuffles decode.cu's arithmetic built for the host: chunks of 7 rows of 30 values
    (c-blosc's byte-shuffled blocks of 11 values, a shorter last one), blocks starting and ending
    inside chunks; the images placed are the values."""
    from infer.gpu.shuffled import Placer

    (bits, blosc), shuffle = PLACER_SHUFFLES[kind]
    values = (rng.random((100, 5, 3, 2)) * 200).astype(dtype)
    rows = SimpleNamespace(align=7, dtype=values.dtype, row_bytes=values[0].nbytes, bitshuffle=bits,
                           blosc_shuffle=blosc)
    gpu = Emulated(lz4_walk, values.dtype, assembled)
    fake = fake_driver(monkeypatch)
    fake.memcpy_dtod_async, fake.memcpy_htod_async = gpu.copy, lambda dst, src, stream: gpu.put(dst, src)
    monkeypatch.setattr(launch, "Unshuffle", lambda build, size: gpu.unshuffle)
    monkeypatch.setattr(launch, "BloscUnshuffle", lambda build, size: gpu.blosc_unshuffle)
    monkeypatch.setattr(launch, "BitUnshuffle", lambda build, size: lambda stream, src, dst, chunks, chunk_values, block,
                        exact_tail: gpu.bit_unshuffle(stream, src, dst, chunks, chunk_values, block, exact_tail, 0,
                                                      chunks * chunk_values))
    placer = Placer(None, rows, 40, gpu.alloc)
    for lo, hi in [(0, 35), (5, 40), (14, 21), (93, 100), (3, 4), (8, 20), (60, 63)]:
        dst = gpu.alloc(values[lo:hi].nbytes)
        gpu.put(dst, np.zeros_like(values[lo:hi]))
        placer.enqueue(None, dst, shuffled_rows(values, lo, hi, 7, shuffle), lo)
        got = gpu.mem[dst:dst + values[lo:hi].nbytes].view(values.dtype).reshape(hi - lo, 5, 3, 2)
        np.testing.assert_array_equal(got, values[lo:hi])


@pytest.mark.parametrize("chunk", [(250, 28, 28, 1), (500, 14, 28, 1)], ids=["whole images", "chunks cutting images"])
def test_blosc_lz4_byte_shuffled_blocks_split_a_stream_a_value_byte(tmp_path, rng, monkeypatch, lz4_walk, assembled,
                                                                   ece408, chunk):
    """hdf5plugin's Blosc default on 1,000 MNIST images: 784,000-byte chunks of a 524,288-byte block
    split into 4 streams (a value byte each) and a shorter one that is not; all 4 chunks decoded by
    the GPU's kernel (none left to the host) and placed (the shuffle undone a block at a time, or
    assembled) as h5py reads them."""
    with h5py.File(ece408 / "testfull.hdf5") as f:
        x = f["x"][:1000]
    taken, decode = [], Emulated.blosc_lz4

    def counted(self, stream, count, starts, sizes, *rest):
        taken.append(int((self.u64(sizes, count) > 0).sum()))
        decode(self, stream, count, starts, sizes, *rest)
    monkeypatch.setattr(Emulated, "blosc_lz4", counted)
    got, failed, _ = streamed(tmp_path, rng, monkeypatch, lz4_walk, assembled, x, lambda: dict(hdf5plugin.Blosc()),
                              chunk, model=loader.load_model(ece408 / "model.hdf5"))
    assert failed is None and sum(taken) == 4
    np.testing.assert_array_equal(got, x)


@pytest.mark.parametrize("chunk", [(40, 13, 13, 1), (40, 7, 13, 1)], ids=["whole images", "chunks cutting images"])
def test_blosc_lz4_byte_shuffled_one_byte_values_are_copied(tmp_path, rng, monkeypatch, lz4_walk, assembled, chunk):
    """uint8 images in hdf5plugin's Blosc default: c-blosc flags its shuffle, which leaves one-byte
    values as they are, so the decoded chunks are copied (or assembled as they are)."""
    x = images(rng, 611, (13, 13, 1), "u1")
    got, failed, _ = streamed(tmp_path, rng, monkeypatch, lz4_walk, assembled, x, lambda: dict(hdf5plugin.Blosc()), chunk)
    assert failed is None
    np.testing.assert_array_equal(got, x)
