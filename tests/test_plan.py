"""The GPU backend's planning, which needs no GPU: splits over GPUs and streamed blocks on a
chunked file's chunk edges."""
import pytest

from infer.gpu import plan


@pytest.mark.parametrize("n,parts,align", [(1_000_000, 2, 1000), (10_000, 3, 1000), (10_007, 4, 64), (400, 2, 1000),
                                           (7, 2, 1), (1, 2, 1), (999, 8, 1)])
def test_split_covers_everything_in_order_and_balanced(n, parts, align):
    ranges = plan.split(n, parts, align)
    assert len(ranges) == parts and ranges[0][0] == 0 and ranges[-1][1] == n
    assert all(hi == lo for (_, hi), (lo, _) in zip(ranges, ranges[1:]))
    usable = align if align <= n // parts else 1
    assert all(lo % usable == 0 for lo, _ in ranges[1:])
    sizes = [hi - lo for lo, hi in ranges]
    assert max(sizes) - min(sizes) <= usable + 1


def test_streamed_blocks_never_cut_a_file_chunk():
    chunk = plan.aligned_chunk(8192, 1000)
    assert chunk == 8000
    for image_bytes in (3136, 784):  # float32 and uint8 MNIST
        block, slots = plan.ring(1_000_000, chunk, True, image_bytes, 25 << 20, 4)
        assert block % 1000 == 0 and block % chunk == 0 and slots == 4
    assert plan.aligned_chunk(8192, 1) == 8192
    assert plan.aligned_chunk(2048, 5000) == 2048  # chunks larger than a launch: nothing to align to
    assert plan.ring(5000, 2048, False, 3136, 25 << 20, 4) == (5000, 1)
