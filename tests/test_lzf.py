"""cuda/lzf.cuh, lzf_kernel1's LZF decoder, against liblzf's format: built for the host (no GPU
needed), the streams h5py's lzf filter makes of literal-heavy, match-heavy, periodic and constant
data decode to their bytes; an output a byte short is FULL; hand-made streams reach every rule
(runs of 1 and 32 literals, references of 3 to 264 bytes, 1 to 8,192 bytes back, overlapping);
damaged streams are refused or decoded exactly as liblzf's rules (a reference decoder here) decode
them, and nothing is written past the output. On a GPU, lzf_kernel1 gives the host build's statuses
and bytes for all of them."""
import ctypes

import h5py
import numpy as np
import pytest

from tests.conftest import build
from tests.stream_kernels import assert_as_on_the_host, host_decode, host_library, on_gpu
from tests.test_zstd import samples

OK, BAD, FULL = 0, 1, 2


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """decode(stream, cap) -> (status, bytes written): lzf_kernel1's decoder on one host thread."""
    lib = host_library(tmp_path_factory.mktemp("lzf"), "lzf.cuh")
    p, n = ctypes.c_void_p, ctypes.c_longlong
    lib.lzf_host_decode.argtypes = [p, n, p, n, ctypes.POINTER(n)]
    return lambda stream, cap, guard=64: host_decode(lib.lzf_host_decode, stream, cap, guard)


def reference(stream, cap):
    """liblzf's lzf_decompress, rule for rule: the bytes, or None where it refuses the stream."""
    out, ip = bytearray(), 0
    while ip < len(stream):
        c = stream[ip]
        ip += 1
        if c < 32:
            if len(out) + c + 1 > cap or ip + c + 1 > len(stream):
                return None
            out += stream[ip:ip + c + 1]
            ip += c + 1
            continue
        n = c >> 5
        if ip >= len(stream):
            return None
        if n == 7:
            n += stream[ip]
            ip += 1
            if ip >= len(stream):
                return None
        ref = len(out) - ((c & 31) << 8) - 1 - stream[ip]
        ip += 1
        if len(out) + n + 2 > cap or ref < 0:
            return None
        for k in range(n + 2):
            out.append(out[ref + k])
    return bytes(out)


def h5py_streams(data):
    """(name, stream, decoded) for every sample h5py's lzf filter shrinks (it stores the others raw)."""
    out = []
    with h5py.File("lzf.h5", "w", driver="core", backing_store=False) as f:
        for name, raw in data.items():
            d = f.create_dataset(name, data=np.frombuffer(raw, np.uint8), chunks=(len(raw),), compression="lzf")
            mask, stream = d.id.read_direct_chunk((0,))
            if mask == 0:
                out.append((name, bytes(stream), raw))
    return out


def by_hand():
    """(name, stream, decoded) reaching each rule: literal runs of 1 and 32, references 3 to 264
    bytes long (the 7 + next-byte form from 9 on), 1 to 8,192 bytes back, overlapping their output."""
    lits = bytes(range(1, 33)) * 300  # 9,600 literal bytes in runs of 32, then 1
    stream = b"".join(bytes([31]) + lits[k:k + 32] for k in range(0, 9600, 32)) + bytes([0, 77])
    decoded = bytearray(lits + bytes([77]))
    for length, back in [(3, 1), (8, 2), (9, 8192), (264, 3), (100, 8000), (40, 33)]:
        n, off = length - 2, back - 1
        stream += bytes([min(n, 7) << 5 | off >> 8]) + (bytes([n - 7]) if n >= 7 else b"") + bytes([off & 255])
        for _ in range(length):
            decoded.append(decoded[-back])
    return [("every rule", stream, bytes(decoded)), ("one literal", bytes([0, 5]), bytes([5]))]


@pytest.fixture(scope="module")
def streams():
    made = h5py_streams(samples(np.random.default_rng(2028))) + by_hand()
    assert {"mnist-like float32", "periodic 1-39", "constant", "text"} <= {name for name, _, _ in made}
    return made


def damaged(streams, count, rng):
    """(stream, cap): count streams with 1-3 bytes changed, or cut short, each with its true cap."""
    out = []
    for k in rng.integers(0, len(streams), count):
        _, stream, raw = streams[k]
        s = bytearray(stream)
        if rng.random() < 0.2:
            s = s[:rng.integers(1, len(s))]
        for at in rng.integers(0, len(s), rng.integers(1, 4)):
            s[at] = rng.integers(0, 256)
        out.append((bytes(s), len(raw)))
    return out


def test_streams_decode_to_their_bytes(host, streams):
    for name, stream, raw in streams:
        assert reference(stream, len(raw)) == raw, name
        assert host(stream, len(raw)) == (OK, raw), name


def test_an_output_a_byte_short_is_full(host, streams):
    for name, stream, raw in streams:
        assert host(stream, len(raw) - 1)[0] == FULL, name


@pytest.mark.parametrize("first,back,good", [(0, 1, False), (5, 6, False), (5, 5, True), (300, 301, False),
                                              (300, 300, True)])
def test_a_reference_before_the_outputs_start_is_refused(host, first, back, good):
    """`first` literals, then 3 bytes from `back` bytes back: refused where that is before the output."""
    stream = b"".join(bytes([min(32, first - k) - 1]) + bytes(range(7, 7 + min(32, first - k)))
                      for k in range(0, first, 32))
    stream += bytes([1 << 5 | (back - 1) >> 8, (back - 1) & 255])
    cap = first + 3
    assert (reference(stream, cap) is not None) == good
    assert host(stream, cap)[0] == (OK if good else BAD)


def test_damaged_streams_are_refused_or_decoded_as_liblzf_decodes_them(host, streams):
    refused = 0
    for stream, cap in damaged(streams, 600, np.random.default_rng(5)):
        want, (status, got) = reference(stream, cap), host(stream, cap)
        assert (status == OK) == (want is not None)
        if want is not None:
            assert got == want
        refused += want is None
    assert 100 < refused < 600  # both kinds were met


@pytest.mark.gpu
def test_lzf_kernel1_gives_the_host_builds_statuses_and_bytes(gpu, host, streams):
    """Every stream above, each a byte short, and 300 damaged ones, in one launch."""
    from infer.gpu.launch import Lzf

    cases = [(stream, len(raw)) for _, stream, raw in streams] + [(stream, len(raw) - 1) for _, stream, raw in streams]
    cases += damaged(streams, 300, np.random.default_rng(6))
    assert_as_on_the_host(cases, on_gpu(cases, Lzf(build(gpu))), host)
