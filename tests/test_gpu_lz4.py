"""blosc_lz4_kernel2 (cuda/lz4.cu) and blosc_lz4_kernel1 (dev/cuda/lz4_early.cu) alone: c-blosc
chunks written by hdf5plugin (lz4, bitshuffle) of MNIST images, of values repeating at distances of
1 to 15,000 values (periods under 32 bytes and longer ones) and of random runs between zeros (literal
runs of up to ~10 KB, their lengths' extensions past a 32-byte window) decode to their bitshuffled
values, nothing written past a chunk's output, a chunk left out (stored size 0) untouched, and a
damaged chunk's number in the flag; bitunshuffle_kernel1 and 2 against the host's bitshuffle. Needs
a GPU."""
import h5py
import numpy as np
import pytest

from tests.conftest import build, dev_module
from tests.test_reader import bit_shuffle

pytestmark = pytest.mark.gpu
hdf5plugin = pytest.importorskip("hdf5plugin")
GUARD = 64
KERNELS = ("blosc_lz4_kernel1", "blosc_lz4_kernel2")  # dev/cuda/lz4_early.py's; the product's 2


@pytest.fixture(params=KERNELS)
def kernel(request):
    return dev_module("lz4_early").KERNELS[request.param]


def repeats(rng, n):
    """n float32 values with repeats at distances of 1 to 60,000 bytes: every path of a match."""
    out = np.zeros(n, np.float32)
    at = 0
    while at < n:
        kind = rng.integers(0, 3)
        if kind == 0 or at < 16:
            k = int(rng.integers(1, 40))
            out[at:at + k] = rng.random(min(k, n - at)) * 100
        else:
            dist = int(rng.choice([1, 2, 3, 7, 9, 31, 40, 100, 2000, 5000, 15000]))
            dist = min(dist, at)
            k = int(rng.integers(4, 3000))
            for i in range(at, min(at + k, n)):
                out[i] = out[i - dist]
        at += k
    return out


def chunks(tmp_path, values, per):
    """values (rows x columns, float32) written in chunks of `per` rows: (stored chunks, block values)."""
    with h5py.File(tmp_path / "l.h5", "w") as f:
        d = f.create_dataset("x", data=values, chunks=(per, values.shape[1]),
                             **hdf5plugin.Blosc(cname="lz4", clevel=9, shuffle=hdf5plugin.Blosc.BITSHUFFLE))
        stored = [np.frombuffer(d.id.read_direct_chunk(d.id.get_chunk_info(i).chunk_offset)[1], np.uint8)
                  for i in range(d.id.get_num_chunks())]
    return stored, int.from_bytes(stored[0][8:12].tobytes(), "little") // 4


def decode(gpu, kernel, stored, chunk_bytes, block_bytes, left_out=()):
    """Run `kernel` (a launcher class) on the stored chunks (those in left_out with size 0): (outputs,
    guards intact, flag)."""
    import pycuda.driver as cuda

    at = np.concatenate([[0], np.cumsum([len(s) + 3 for s in stored])[:-1]]) + 1  # odd starts
    src = np.zeros(int(at[-1]) + len(stored[-1]) + 16, np.uint8)
    for a, s in zip(at, stored):
        src[a:a + len(s)] = s
    stride = chunk_bytes + GUARD
    d_src, d_out = cuda.to_device(src), cuda.to_device(np.full(stride * len(stored), 0xA5, np.uint8))
    sizes = [0 if k in left_out else len(s) for k, s in enumerate(stored)]
    table = cuda.to_device(np.array([int(d_src) + at, sizes, int(d_out) + stride * np.arange(len(stored))], np.uint64))
    bad = cuda.to_device(np.array([2**31 - 1], np.int32))
    n, t = len(stored), int(table)
    kernel(build(gpu))(cuda.Stream(), n, t, t + 8 * n, t + 16 * n, chunk_bytes, block_bytes, 4, 100, bad)
    cuda.Context.synchronize()
    out = cuda.from_device(d_out, (n, stride), np.uint8)
    return out[:, :chunk_bytes], (out[:, chunk_bytes:] == 0xA5).all(axis=1), int(cuda.from_device(bad, 1, np.int32)[0])


def literals(rng, n):
    """n float32 values: random runs of up to 70,000 between runs of zeros, so literal runs of up to
    ~10 KB a bit plane (their lengths' extensions past 32 bytes of 255s)."""
    out = np.zeros(n, np.float32)
    at = 0
    while at < n:
        k = int(rng.integers(1, 70000))
        out[at:at + k] = rng.random(min(k, n - at))
        at += k + int(rng.integers(100, 5000))
    return out


@pytest.mark.parametrize("data", ["mnist", "repeats", "literals"])
def test_chunks_decode_to_their_bitshuffled_values(tmp_path, ece408, gpu, rng, data, kernel):
    if data == "mnist":
        with h5py.File(ece408 / "testfull.hdf5") as f:
            values = f["x"][:503].reshape(503, -1)
    else:
        values = (repeats if data == "repeats" else literals)(rng, 503 * 900).reshape(503, 900)
    stored, block = chunks(tmp_path, values, 100)  # 78,400 or 90,000 values a chunk: blocks split, a shorter last one
    out, guards, bad = decode(gpu, kernel, stored, 100 * values[0].nbytes, 4 * block)
    assert bad == 2**31 - 1 and guards.all()
    padded = np.zeros((600, values.shape[1]), np.float32)
    padded[:503] = values
    for k in range(len(stored)):
        np.testing.assert_array_equal(out[k], bit_shuffle(block, True)(padded[100 * k:100 * k + 100].reshape(-1)))


def test_a_chunk_left_out_is_untouched_and_a_damaged_one_flagged(tmp_path, ece408, gpu, kernel):
    with h5py.File(ece408 / "testfull.hdf5") as f:
        values = f["x"][:400].reshape(400, -1)
    stored, block = chunks(tmp_path, values, 100)
    stored = [s.copy() for s in stored]
    first = int.from_bytes(stored[2][16:20].tobytes(), "little") + 4  # chunk 2's first stream
    stored[2][first:first + 40] = [0xF0] + [0xFF] * 39  # more literals than the stream holds
    out, guards, bad = decode(gpu, kernel, stored, 100 * values[0].nbytes, 4 * block, left_out=(1,))
    assert bad == 100 + 2 and guards.all()
    assert (out[1] == 0xA5).all()
    np.testing.assert_array_equal(out[3], bit_shuffle(block, True)(values[300:400].reshape(-1)))


def test_a_match_reaching_before_the_output_is_damage(tmp_path, ece408, gpu, kernel):
    """LZ4's offset counts back from the output written so far: an offset past its start (here the
    first match's, 0xFFFF) is damage, flagged, not a read of the memory before the chunk's output."""
    with h5py.File(ece408 / "testfull.hdf5") as f:
        values = f["x"][:200].reshape(200, -1)
    stored, block = chunks(tmp_path, values, 100)
    damaged = stored[1].copy()
    pos = int.from_bytes(damaged[16:20].tobytes(), "little") + 4  # chunk 1's first stream: its first token
    literals, pos = int(damaged[pos]) >> 4, pos + 1
    extra = 255 if literals == 15 else 0  # a length of 15 goes on in bytes, while they are 255
    while extra == 255:
        extra, pos = int(damaged[pos]), pos + 1
        literals += extra
    assert 0 < int.from_bytes(damaged[pos + literals:pos + literals + 2].tobytes(), "little") <= literals
    damaged[pos + literals:pos + literals + 2] = 0xFF
    out, guards, bad = decode(gpu, kernel, [stored[0], damaged], 100 * values[0].nbytes, 4 * block)
    assert bad == 100 + 1 and guards.all()
    np.testing.assert_array_equal(out[0], bit_shuffle(block, True)(values[:100].reshape(-1)))


@pytest.mark.parametrize("value_bytes", [1, 2, 4, 8])
@pytest.mark.parametrize("first,count", [(0, 3 * 1000), (5, 3 * 1000 - 5), (997, 1004), (1003, 13), (1992, 8)])
def test_bitunshuffle_kernels_give_the_values_bitshuffled_on_the_host(gpu, rng, value_bytes, first, count):
    """3 chunks of 1,000 values (blocks of 512 then 488: a shorter, bitshuffled last block) bitshuffled
    by the host's reference (c-blosc's layout, tests.test_reader.bit_shuffle): version 1 unshuffles
    them all, version 2 any range of them, to the values; nothing written past the range."""
    import pycuda.driver as cuda

    from infer.gpu.launch import BitUnshuffle, BitUnshuffleRange

    dtype = np.dtype(f"u{value_bytes}")
    values = rng.integers(0, 256, 3000 * value_bytes, np.uint8).view(dtype)
    shuffled = np.concatenate([bit_shuffle(512, True)(values[k:k + 1000]) for k in range(0, 3000, 1000)])
    src = cuda.to_device(shuffled)
    whole, part = cuda.mem_alloc(3000 * value_bytes), cuda.to_device(np.full((count + 8) * value_bytes, 0xA5, np.uint8))
    BitUnshuffle(build(gpu), value_bytes)(cuda.Stream(), src, whole, 3, 1000, 512, True)
    BitUnshuffleRange(build(gpu), value_bytes)(cuda.Stream(), src, part, 3, 1000, 512, True, first, count)
    cuda.Context.synchronize()
    np.testing.assert_array_equal(cuda.from_device(whole, 3000, dtype), values)
    got = cuda.from_device(part, (count + 8) * value_bytes, np.uint8)
    np.testing.assert_array_equal(got[:count * value_bytes].view(dtype), values[first:first + count])
    assert (got[count * value_bytes:] == 0xA5).all()
