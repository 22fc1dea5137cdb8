"""inflate_kernel3 and 2 (cuda/inflate.cu) and inflate_kernel1 (dev/cuda/inflate_early.cu) against zlib:
every level and strategy, window sizes, flushes that add stored and empty blocks, literal-heavy and match-heavy data, distances from 1 to 32,768
(copied from the kernel's window in shared memory, of 1 KB to 32 KB, or read back from the output),
streams at every misalignment, outputs exactly full and one byte short; and damaged streams: where
zlib decodes one, the kernel gives the same bytes, and it never writes past its output. Needs a GPU."""
import zlib

import numpy as np
import pytest

from infer.gpu import launch
from tests.conftest import build, dev_module

pytestmark = pytest.mark.gpu
GUARD = 64  # bytes after each output that must stay as they were
OK, BAD, FULL = launch.FrameDecoder.OK, launch.FrameDecoder.BAD, launch.FrameDecoder.FULL
KERNELS = ("inflate_kernel1", "inflate_kernel2", "inflate_kernel3")  # dev/cuda/inflate_early.py's; the product's 3


@pytest.fixture(params=KERNELS)
def kernel(request):
    return dev_module("inflate_early").KERNELS[request.param]


def deflate(data, level=6, strategy=zlib.Z_DEFAULT_STRATEGY, wbits=15, flush_every=None, mem=8):
    """A raw deflate stream (what HDF5's chunks hold between zlib's header and trailer)."""
    c = zlib.compressobj(level, zlib.DEFLATED, -wbits, mem, strategy)
    if not flush_every:
        return c.compress(data) + c.flush()
    parts = [c.compress(data[i:i + flush_every]) + c.flush(zlib.Z_SYNC_FLUSH if i % 2 else zlib.Z_FULL_FLUSH)
             for i in range(0, len(data), flush_every)]
    return b"".join(parts) + c.flush()


def inflate(gpu, kernel, streams, caps, skews=None, window=None, parts=None, records=None, spread=False, **options):
    """Run the kernel (keeping `window` bytes in shared memory; inflate_kernel3 in `parts` parts,
    with the scratch memory it takes) over streams (bytes), stream k starting skews[k] bytes past a
    16-byte boundary, into outputs of caps[k] bytes: (statuses, decoded sizes, outputs, guards
    intact). records: a list that takes inflate_kernel3's parts' records (start bit, status, next
    part, length: an array of (streams, parts, 4)). spread: inflate_kernel3's parsers on every
    scheduler. options: inflate_kernel3's other build options (ring, min_blocks)."""
    import pycuda.driver as cuda

    if kernel is launch.InflateParts and window and window < 4096:
        pytest.skip("inflate_kernel3 keeps a window of at least 4 KB (2,048 16-bit values)")

    n = len(streams)
    skews = skews or [k % 4 for k in range(n)]
    at, src = [], bytearray()
    for s, skew in zip(streams, skews):
        src += bytes(-len(src) % 16 + skew)
        at.append(len(src))
        src += s
    src += bytes(16)
    stride = [-(-(cap + GUARD) // 256) * 256 for cap in caps]
    outs = np.concatenate([[0], np.cumsum(stride)])
    d_src = cuda.to_device(np.frombuffer(bytes(src), np.uint8))
    d_out = cuda.to_device(np.full(int(outs[-1]), 0xA5, np.uint8))
    table = np.array([[int(d_src) + a for a in at], [len(s) for s in streams], list(caps), [0] * n,
                      [int(d_out) + int(o) for o in outs[:-1]]], np.uint64)
    d_table = cuda.to_device(table)
    d_status = cuda.to_device(np.full(n, -1, np.int32))
    row = [int(d_table) + 8 * n * k for k in range(5)]
    decoder = kernel(build(gpu), window, **(dict(options, parts=parts) if parts else options))
    scratch = ()
    if hasattr(decoder, "scratch_for"):
        nbytes = decoder.scratch_for(n, max(caps))
        scratch = (cuda.mem_alloc(256 + nbytes), nbytes, True, spread)
    decoder(cuda.Stream(), n, row[0], row[1], row[2], row[3], row[4], d_status, *scratch)
    cuda.Context.synchronize()
    if records is not None:
        raw = cuda.from_device(int(scratch[0]) + 256, (n, decoder.parts, 4), np.int64)
        records.append(np.stack([raw[..., 0], raw[..., 1] & 0xFFFFFFFF, raw[..., 1] >> 32, raw[..., 2] & 0xFFFFFFFF], -1))
    status, back, out = cuda.from_device_like(d_status, np.zeros(n, np.int32)), cuda.from_device_like(d_table, table), \
        cuda.from_device_like(d_out, np.zeros(int(outs[-1]), np.uint8))
    outputs = [out[outs[k]:outs[k] + caps[k]].tobytes() for k in range(n)]
    guards = [bool((out[outs[k] + caps[k]:outs[k] + caps[k] + GUARD] == 0xA5).all()) for k in range(n)]
    return status, back[3].astype(np.int64), outputs, guards


def corpus(rng):
    """Named byte strings of odd sizes, each stressing one part of the decoder."""
    with_text = b" ".join(rng.choice([b"the", b"cnninfer", b"deflate", b"chunk", b"warp", b"GPU", b"\n"], 20_000))
    period = lambda p, n: np.tile(rng.integers(0, 256, p, dtype=np.uint8), n // p + 1)[:n].tobytes()
    far = rng.integers(0, 256, 32_768, dtype=np.uint8).tobytes()
    mnist = np.where(rng.random((37, 28, 28)) < 0.8, 0, rng.integers(1, 256, (37, 28, 28)) / np.float32(255)).astype(np.float32)
    return {
        "empty": b"", "one byte": b"\x07", "random 100,003": rng.integers(0, 256, 100_003, dtype=np.uint8).tobytes(),
        "four symbols": rng.integers(0, 4, 77_777, dtype=np.uint8).tobytes(), "words": with_text,
        "zeros 300,001": bytes(300_001), **{f"period {p}": period(p, 50_001) for p in (1, 2, 3, 4, 5, 7, 31, 32, 33, 100, 258)},
        "far matches": far + far[:20_000] + far[1:3000] + far, "mnist-like": mnist.tobytes(),
        "mnist-like, shuffled": mnist.view(np.uint8).reshape(-1, 4).T.tobytes(),
    }


SETTINGS = {"level 0": dict(level=0), "level 1": dict(level=1), "level 6": dict(level=6), "level 9": dict(level=9),
            "filtered": dict(strategy=zlib.Z_FILTERED), "huffman only": dict(strategy=zlib.Z_HUFFMAN_ONLY),
            "rle": dict(strategy=zlib.Z_RLE), "fixed": dict(strategy=zlib.Z_FIXED), "window 512": dict(wbits=9),
            "flushes": dict(level=1, flush_every=7_001), "small memory": dict(level=4, mem=1)}


@pytest.mark.parametrize("window", [1024, None, 32768])  # None: the launcher's own
@pytest.mark.parametrize("setting", SETTINGS)
def test_the_kernel_decodes_what_zlib_does(gpu, kernel, rng, setting, window):
    data = corpus(rng)
    names = list(data)
    streams = [deflate(data[k], **SETTINGS[setting]) for k in names]
    caps = [len(data[k]) for k in names]
    status, sizes, outputs, guards = inflate(gpu, kernel, streams, caps, window=window)
    for k, name in enumerate(names):
        assert (status[k], sizes[k], guards[k]) == (OK, caps[k], True), name
        assert outputs[k] == data[name], name


@pytest.mark.parametrize("spread", [False, True])
def test_kernel3_with_its_parsers_spread_or_not(gpu, rng, spread):
    """inflate_kernel3 decodes the corpus at levels 1 and 6, and shuffled, as zlib does whichever warp
    of each block parses (spread: chosen by the warp's slot)."""
    data = corpus(rng)
    names = list(data) * 3
    shuffled = [np.frombuffer(v, np.uint8)[:len(v) // 4 * 4].reshape(-1, 4).T.tobytes() for v in data.values()]
    raw = list(data.values()) * 2 + shuffled
    streams = [deflate(v, level=1 if i < len(data) else 6) for i, v in enumerate(raw)]
    status, sizes, outputs, guards = inflate(gpu, launch.InflateParts, streams, [len(v) for v in raw], spread=spread)
    for k, name in enumerate(names):
        assert (status[k], sizes[k], guards[k]) == (OK, len(raw[k]), True), name
        assert outputs[k] == raw[k], name


@pytest.mark.parametrize("ring,min_blocks", [(128, 15), (512, None)])
def test_kernel3_with_another_ring_and_registers(gpu, rng, ring, min_blocks):
    """inflate_kernel3 built with a ring of `ring` tokens, and registers for min_blocks blocks an SM
    (64 a thread: the 15-block build dev/cuda/inflate_early.py times), decodes the corpus at levels
    1 and 6 as zlib does."""
    data = corpus(rng)
    names = list(data) * 2
    streams = [deflate(data[k], level=1 if i < len(data) else 6) for i, k in enumerate(names)]
    caps = [len(data[k]) for k in names]
    status, sizes, outputs, guards = inflate(gpu, launch.InflateParts, streams, caps, window=4096, ring=ring,
                                             min_blocks=min_blocks)
    for k, name in enumerate(names):
        assert (status[k], sizes[k], guards[k]) == (OK, caps[k], True), name
        assert outputs[k] == data[name], name


def test_every_misalignment_and_a_full_output(gpu, kernel, rng):
    data = rng.integers(0, 6, 50_001, dtype=np.uint8).tobytes()
    s = deflate(data, level=1)
    status, sizes, outputs, guards = inflate(gpu, kernel, [s] * 8, [len(data)] * 4 + [len(data) - 1] * 4,
                                             skews=[0, 1, 2, 3] * 2)
    assert list(status) == [OK] * 4 + [FULL] * 4 and all(guards)
    assert all(o == data for o in outputs[:4]) and list(sizes[:4]) == [len(data)] * 4


def test_streams_that_end_early_or_are_not_deflate(gpu, kernel, rng):
    data = rng.integers(0, 6, 20_000, dtype=np.uint8).tobytes()
    s = deflate(data, level=6)
    cases = [s[:len(s) // 2], s[:-1], b"\xff" * 100, bytes([0x07]) + bytes(50), b"\x00\x05\x00\x00\x00"]
    status, _, _, guards = inflate(gpu, kernel, cases, [len(data)] * len(cases))
    assert list(status) == [BAD] * len(cases) and all(guards)


def test_damaged_streams_decode_as_zlib_does_or_fail(gpu, kernel, rng):
    """400 streams with 1-8 bytes changed: where zlib decodes one whole, the kernel gives its bytes;
    where zlib refuses it, the kernel fails too or gives other bytes than the stream's (which the
    chunk's adler32 then refuses); never a byte past the output."""
    base = corpus(rng)
    sources = [deflate(base[k], level=lv) for k in ("words", "mnist-like", "four symbols", "far matches") for lv in (1, 6)]
    originals = [base[k] for k in ("words", "mnist-like", "four symbols", "far matches") for _ in (1, 6)]
    streams, caps, expect = [], [], []
    for i in range(400):
        j = i % len(sources)
        s = bytearray(sources[j])
        for at in rng.choice(len(s), int(rng.integers(1, 9)), replace=False):
            s[at] ^= int(rng.integers(1, 256))
        d = zlib.decompressobj(-15)
        try:
            out = d.decompress(bytes(s), len(originals[j]) + 1)
            whole = d.eof and len(out) <= len(originals[j])
        except zlib.error:
            out, whole = None, False
        streams.append(bytes(s))
        caps.append(len(originals[j]))
        expect.append((out if whole else None, originals[j]))
    status, sizes, outputs, guards = inflate(gpu, kernel, streams, caps)
    assert all(guards)
    for k, (want, original) in enumerate(expect):
        if want is not None:
            assert status[k] == OK and outputs[k][:sizes[k]] == want, k
        else:
            assert status[k] != OK or outputs[k][:sizes[k]] != original, k


@pytest.mark.parametrize("parts", [2, 3, 5])
def test_kernel3_decodes_its_parts_from_the_blocks_it_finds(gpu, rng, parts):
    """Streams of many deflate blocks (MNIST-like floats, shuffled or not, text, flushes adding stored
    and empty blocks between) decoded in parts: the bytes zlib gives, and the parts did start at
    blocks (each part's record: the block it found, the part its predecessor's parse reached), so
    a wrong start or join cannot pass as the first part decoding the whole stream."""
    data = corpus(rng)
    mnist = np.where(rng.random((301, 28, 28)) < 0.8, 0, rng.integers(1, 256, (301, 28, 28)) / np.float32(255))
    mnist = mnist.astype(np.float32)
    sources = {"mnist": mnist.tobytes(), "mnist, shuffled": mnist.view(np.uint8).reshape(-1, 4).T.tobytes(),
               "words": data["words"] * 5, "four symbols": data["four symbols"] * 3}
    streams, caps, names = [], [], []
    for name, raw in sources.items():
        for setting in (dict(level=1), dict(level=6), dict(level=1, flush_every=40_003), dict(level=6, mem=1)):
            streams.append(deflate(raw, **setting))
            caps.append(len(raw))
            names.append(f"{name} {setting}")
    records = []
    status, sizes, outputs, guards = inflate(gpu, launch.InflateParts, streams, caps, parts=parts, records=records)
    rec = records[0]
    joined = 0
    for k, name in enumerate(names):
        raw = sources[name.split(" {")[0]]
        assert (status[k], sizes[k], guards[k]) == (OK, caps[k], True), name
        assert outputs[k] == raw, name
        chain, j = [], 0
        while rec[k, j, 2] > 0:  # the parts whose starts a parse reached, in order
            j = int(rec[k, j, 2])
            chain.append(j)
        assert chain == sorted(set(chain)) and all(rec[k, i, 0] > 0 and rec[k, i, 1] == OK for i in chain), name
        assert sum(int(rec[k, i, 3]) for i in [0] + chain) == caps[k], name
        joined += len(chain)
    assert joined >= len(names) * (parts - 1) // 2  # most of the parts joined

