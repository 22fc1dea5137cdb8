"""The GPU backend's planning, which needs no GPU: splits over GPUs and streamed blocks on a
chunked file's chunk edges, and what fits in device memory."""
import pytest

from infer.errors import InputError
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


MNIST_SCRATCH = lambda c: 5000 * c  # noqa: E731  (about fused-wgmma's floats of scratch per image)


def memory(n, free, chunk=None, wire=3136, streamed=False, streams=4):
    return plan.memory(n, free, streams, chunk, 2048, MNIST_SCRATCH, 10, wire, 3136, streamed, 25 << 20, streams + 2)


def test_a_streamed_launch_takes_a_whole_host_block():
    block = 25 << 20
    assert plan.streamed_chunk(8192, 28 * 28 * 4, block) == 8192  # float32: a block is 8,192 images
    assert plan.streamed_chunk(8192, 28 * 28, block) == 32768  # uint8: four times as many, one launch
    assert plan.streamed_chunk(8192, 96 * 96 * 12, block) == 8192  # larger images: never below the least
    chunk = plan.streamed_chunk(8192, 28 * 28, block)
    assert plan.ring(10**6, chunk, True, 28 * 28, block, 6) == (32768, 6)  # the block is that one launch


def test_a_batch_that_fits_stays_resident_in_chunks_for_every_stream():
    assert memory(10_000, 80 << 30) == (2048, True)
    assert memory(3_000, 80 << 30) == (750, True)  # fewer images: each of 4 streams still gets a chunk
    assert memory(10_000, 80 << 30, chunk=333) == (333, True)
    assert memory(1, 80 << 30) == (1, True)


def test_the_default_streams_take_10000_images_in_one_round():
    """8 streams: 8 chunks of 1,250 run at once; on 4, a fifth chunk of 2,048 ran alone (54a8bfc)."""
    from infer.options import STREAMS

    chunk, resident = memory(10_000, 80 << 30, streams=STREAMS)
    assert resident and chunk * STREAMS >= 10_000 and chunk == 1250


def test_images_over_two_fifths_of_free_memory_are_staged_not_resident():
    n, free = 1_000_000, 4 << 30  # 3.1 GB of float32 images, 4 GiB free
    chunk, resident = memory(n, free)
    assert not resident and chunk == 2048
    assert memory(n, free, streamed=True) == (2048, True)  # streamed: a ring of ~25 MB blocks


def test_chunks_halve_until_scratch_fits_and_too_little_memory_is_one_clear_error():
    chunk, _ = memory(10_000, 100 << 20)  # 80 MB budget: 4 streams x scratch must fit
    assert chunk < 2048 and 4 * (4 * MNIST_SCRATCH(chunk) + chunk * 3136) + 10_000 * 44 <= (100 << 20) * 0.8
    assert 4 * (4 * MNIST_SCRATCH(2 * chunk) + 2 * chunk * 3136) + 10_000 * 44 > (100 << 20) * 0.8
    with pytest.raises(InputError, match="MiB free, too little for even one image per chunk"):
        memory(10_000, 1 << 10)
