"""cuda/zstd.cuh, the Zstandard decoders of zstd_kernel1 and 2, against libzstd: built for the host (no GPU
needed), every level's frames of literal-heavy, match-heavy, periodic, incompressible and constant
data (Huffman literals in 1 or 4 streams, stored and RLE literals and blocks, FSE tables predefined,
RLE, described and repeated), checksums, frames without a content size, small windows (many blocks),
outputs exactly full and a byte short; damaged frames: where it decodes one, libzstd gives the same
bytes, where libzstd refuses one, so does it, and it never writes past its output. zstd_kernel2's
way (a frame's blocks decoded apart, last to first, then carried out in order) on frames of many
blocks with treeless literals and repeated tables, without scratch room, and damaged. On a GPU,
zstd_kernel1 and zstd_kernel2 give the host build's statuses and bytes for all of them."""
import numpy as np
import pytest

from tests.conftest import build
from tests.stream_kernels import assert_as_on_the_host, on_gpu
from tests.zstd_frames import (BAD, CHECKSUM, CONTENT_SIZE, FULL, OK, WINDOW_LOG, compress, host_build,
                               host_decoder, host_decoder2, lib_decompress, libzstd)

__all__ = ["host_build", "host_decoder", "host_decoder2"]  # fixtures
LEVELS = [-5, 1, 3, 9, 19]
# a frame made by hand: one compressed block of RLE literals (b"x" 20 times) and no sequences
RLE_LITERALS = bytes([0x28, 0xB5, 0x2F, 0xFD, 0x20, 20]) + (1 | 2 << 1 | 3 << 3).to_bytes(3, "little") \
    + bytes([1 | 20 << 3, ord("x"), 0])


def samples(rng):
    """name -> bytes: what the frames hold (seeded, odd sizes)."""
    mnist = (rng.random(30_011) < 0.2) * rng.integers(1, 256, 30_011) / 255.0
    words = [bytes(rng.integers(97, 123, rng.integers(2, 9)).astype(np.uint8)) for _ in range(300)]
    text = b" ".join(words[i] for i in rng.integers(0, 300, 40_000))
    periodic = b"".join(bytes(rng.integers(0, 256, p).astype(np.uint8)) * (700 // p) for p in range(1, 40))
    units = [rng.integers(0, 256, 1000).astype(np.uint8).tobytes() for _ in range(8)]
    return {"mnist-like float32": mnist.astype(np.float32).tobytes(), "text": text,
            # blocks whose literals are all b"Q" and whose sequences share their codes: RLE literals and tables
            "segments": b"".join(units[k] + b"Q" for k in rng.integers(0, 8, 400)),
            "short literals": bytes(rng.choice(np.frombuffer(b"acgt", np.uint8), 251).astype(np.uint8)),
            "periodic 1-39": periodic * 9, "incompressible": rng.integers(0, 256, 70_001).astype(np.uint8).tobytes(),
            "constant": bytes(200_003), "small": text[:777], "tiny": b"abcabcabcab",
            "literals": bytes(rng.choice(np.arange(40, 60), 90_001).astype(np.uint8))}


@pytest.fixture(scope="module")
def lib():
    return libzstd()


@pytest.fixture(scope="module")
def data():
    return samples(np.random.default_rng(2027))


def frames(lib, data):
    """(name, frame, decoded) for every sample at every level, and the frame options."""
    out = [(f"{name} L{level}", compress(lib, raw, level), raw) for name, raw in data.items() for level in LEVELS]
    raw = data["text"] + data["mnist-like float32"]
    out += [("checksum", compress(lib, raw, 3, {CHECKSUM: 1}), raw),
            ("no content size", compress(lib, raw, 3, {CONTENT_SIZE: 0}), raw),
            ("window of 1 KB: 1 KB blocks", compress(lib, raw, 19, {WINDOW_LOG: 10}), raw)]
    return out


def test_frames_decode_to_their_bytes(lib, data, host_decoder):
    for name, frame, raw in frames(lib, data):
        status, got = host_decoder(frame, len(raw))
        assert status == OK and got == raw, name
        assert lib_decompress(lib, frame, len(raw)) == raw


def test_an_output_a_byte_short_is_full(lib, data, host_decoder):
    for name in ("text", "constant", "incompressible", "small"):
        raw = data[name]
        status, _ = host_decoder(compress(lib, raw, 3), len(raw) - 1)
        assert status == FULL, name
        status, _ = host_decoder(compress(lib, raw, 3, {CONTENT_SIZE: 0}), len(raw) - 1)
        assert status == FULL, name


def mended(frame, at, value):
    b = bytearray(frame)
    b[at] = value
    return bytes(b)


def test_frames_it_does_not_take_are_bad(lib, data, host_decoder):
    raw = data["text"]
    frame = compress(lib, raw, 3)
    for name, bad in [("magic", mended(frame, 0, 0x29)), ("reserved bit", mended(frame, 4, frame[4] | 8)),
                      ("bytes after the frame", frame + b"\0"), ("truncated", frame[:-1]), ("empty", b""),
                      ("a second frame", frame + frame), ("a dictionary", with_dictionary_id(frame)),
                      ("a skippable frame first", skippable(b"cnninfer") + frame)]:
        assert host_decoder(bad, len(raw))[0] == BAD, name


def with_dictionary_id(frame):
    """The frame with a 1-byte Dictionary_ID (7) in its header (RFC 8878 3.1.1.1): its blocks need
    a dictionary no HDF5 chunk carries, so the decoder must refuse it, not decode without."""
    fhd = frame[4]
    at = 5 + (0 if fhd & 0x20 else 1)  # after the Window_Descriptor, present unless Single_Segment
    return frame[:4] + bytes([fhd | 1]) + frame[5:at] + b"\x07" + frame[at:]


def skippable(payload):
    """A skippable frame (RFC 8878 3.1.2): magic 0x184D2A50, a 4-byte size, the payload."""
    return (0x184D2A50).to_bytes(4, "little") + len(payload).to_bytes(4, "little") + payload


def damaged(lib, data, rng, count):
    """count frames of the samples, each with 1-3 bits flipped (half of them in the first 64 bytes,
    where the headers and tables are) or cut short."""
    names = ("text", "mnist-like float32", "periodic 1-39", "literals")
    return damaged_from([(compress(lib, data[k], level), len(data[k])) for k in names for level in (1, 19)], count, rng,
                        head=0.5, cut=0.15)


def damaged_from(frames_, count, rng, head=0.0, cut=0.1):
    """count of frames_ ((frame, cap) pairs), each with 1-3 bits flipped (a `head` share of the flips
    in the first 64 bytes), `cut` of them then cut short."""
    out = []
    for _ in range(count):
        frame, cap = frames_[int(rng.integers(0, len(frames_)))]
        b = bytearray(frame)
        for _ in range(int(rng.integers(1, 4))):
            at = int(rng.integers(0, min(64, len(b)) if head and rng.random() < head else len(b)))
            b[at] ^= 1 << int(rng.integers(0, 8))
        if rng.random() < cut:
            b = b[:int(rng.integers(1, len(b)))]
        out.append((bytes(b), cap))
    return out


def test_damaged_frames_are_refused_or_decoded_as_libzstd_decodes_them(lib, data, host_decoder):
    """libzstd's fast Huffman path does not check that each literal stream is used exactly (RFC 8878
    says it must be), so some frames libzstd decodes are refused here; never the other way round."""
    statuses = []
    for frame, cap in damaged(lib, data, np.random.default_rng(5), 400):
        status, got = host_decoder(frame, cap)
        want = lib_decompress(lib, frame, cap)
        statuses.append(status)
        if status == OK:
            assert got == want
        if want is None:
            assert status != OK
    assert statuses.count(BAD) > 100 and statuses.count(OK) > 10


def blocky(lib, data):
    """(name, frame, decoded): frames of 7-53 blocks (128 KB and 16 KB windows) whose blocks lean on
    the ones before: treeless literals (every level) and repeated tables (levels 9 and 19), raw literals."""
    raw = data["text"] + data["mnist-like float32"] + data["literals"] + data["segments"]
    return [(f"L{level} window 2^{log}", compress(lib, raw, level, {WINDOW_LOG: log}), raw)
            for level in (1, 3, 9, 19) for log in (14, 17)]


def test_blocks_decoded_apart_give_the_frames_bytes(lib, data, host_decoder2):
    for name, frame, raw in blocky(lib, data):
        assert host_decoder2(frame, len(raw)) == (OK, raw, True), name
        assert host_decoder2(frame, len(raw) - 1)[0] == FULL, name
    for name, frame, raw in frames(lib, data):  # the 1 KB window's ~1,000 blocks exceed a plan: decoded whole
        status, got, apart = host_decoder2(frame, len(raw))
        assert status == OK and got == raw and apart == (name != "window of 1 KB: 1 KB blocks"), name


def test_without_scratch_room_a_frame_is_decoded_whole(lib, data, host_decoder2):
    name, frame, raw = blocky(lib, data)[5]
    assert host_decoder2(frame, len(raw), scratch_bytes=len(raw) // 10) == (OK, raw, False), name


def test_damaged_frames_decoded_apart_are_refused_or_decoded_as_libzstd_decodes_them(lib, data, host_decoder,
                                                                                      host_decoder2):
    """And refused or decoded exactly where zstd_kernel1's decoder refuses or decodes them."""
    sources = [(frame, len(raw)) for _, frame, raw in blocky(lib, data)]
    apart = 0
    for frame, cap in (damaged(lib, data, np.random.default_rng(6), 300)
                       + damaged_from(sources, 300, np.random.default_rng(8))):
        status, got, planned = host_decoder2(frame, cap)
        want = lib_decompress(lib, frame, cap)
        apart += planned
        if status == OK:
            assert got == want
        if want is None:
            assert status != OK
        whole, got_whole = host_decoder(frame, cap)
        assert (status == OK) == (whole == OK) and (status != OK or got == got_whole)
    assert apart > 300


def gpu_cases(lib, data):
    cases = [(frame, len(raw)) for _, frame, raw in frames(lib, data)]
    cases += [(frame, len(raw) - 1) for _, frame, raw in frames(lib, data)[:8]]
    return cases + damaged(lib, data, np.random.default_rng(9), 300) + [(RLE_LITERALS, 20), (RLE_LITERALS, 19)]


@pytest.mark.gpu
def test_zstd_kernel1_gives_the_host_builds_statuses_and_bytes(gpu, lib, data, host_decoder):
    """Every frame above and 300 damaged ones in one launch, each at a different misalignment."""
    from infer.gpu.launch import Zstd

    cases = gpu_cases(lib, data)
    assert_as_on_the_host(cases, on_gpu(cases, Zstd(build(gpu))), host_decoder)


@pytest.mark.gpu
def test_zstd_kernel2_gives_the_host_builds_statuses_and_bytes(gpu, lib, data, host_decoder2):
    """The frames above, those of many blocks and 300 of them damaged, in one launch: with scratch
    room for all, statuses and bytes as on the host; with room for a few, the others decoded whole
    (the same bytes; a damaged frame refused, if not always with the same status)."""
    import pycuda.driver as cuda

    from infer.gpu.launch import ZstdApart

    sources = [(frame, len(raw)) for _, frame, raw in blocky(lib, data)]
    cases = gpu_cases(lib, data) + sources + damaged_from(sources, 300, np.random.default_rng(10))
    kernel = ZstdApart(build(gpu))
    room = sum(4 * cap + 4096 for _, cap in cases)
    scratch = cuda.mem_alloc(256 + room)
    assert_as_on_the_host(cases, on_gpu(cases, kernel, 64, scratch, room), host_decoder2)
    used = cuda.from_device_like(scratch, np.zeros(1, np.uint64))[0]
    assert 0 < used <= room
    assert_as_on_the_host(cases, on_gpu(cases, kernel, 64, scratch, used // 4), host_decoder2, same_status=False)


def test_a_block_of_rle_literals_alone(lib, host_decoder):
    """libzstd's compressor gives RLE literals rarely: RLE_LITERALS, made by hand."""
    frame = RLE_LITERALS
    assert lib_decompress(lib, frame, 20) == b"x" * 20
    assert host_decoder(frame, 20) == (OK, b"x" * 20)
    assert host_decoder(frame, 19)[0] == FULL
