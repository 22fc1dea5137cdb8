"""Session.pin: calls on images that lie in pinned memory (a server engine's view of its front
ends' shared memory: a read-only mapping of a memfd) read them where they lie, one upload and no
host copy, with the answers of the same images copied as usual; after unpin they are copied."""
import mmap
import os

import numpy as np
import pytest

import cnninfer

gpu = pytest.mark.gpu


def test_a_cpu_session_pins_nothing(rng):
    with cnninfer.Session(backend="cpu") as s:
        x = np.zeros((3, 28, 28, 1), np.uint8)
        assert s.pin(x) is False
        s.unpin(x)  # nothing pinned: nothing to undo
        assert s.predict(x).shape == (3,)


def shared(nbytes):
    """A memfd written through one mapping and read through another, read-only one (the engine's)."""
    fd = os.memfd_create("cnninfer-test")
    os.ftruncate(fd, nbytes)
    try:
        writer = np.frombuffer(mmap.mmap(fd, nbytes), np.uint8)
        reader = np.frombuffer(mmap.mmap(fd, nbytes, prot=mmap.PROT_READ), np.uint8)
    finally:
        os.close(fd)
    return writer, reader


def calls(session, x, in_place):
    """session.classify(x) with forward's in_place argument recorded."""
    backend = session.backend
    seen, forward = [], backend.forward

    def recording(images, progress=None, in_place=False):
        seen.append(in_place)
        return forward(images, progress, in_place=in_place)

    backend.forward = recording
    try:
        out = session.classify(x, scores=True)
    finally:
        del backend.forward
    assert seen == [in_place]
    return out


@gpu
@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_images_in_pinned_memory_are_read_in_place_with_the_copied_answers(ece408, rng, dtype):
    import h5py

    with h5py.File(ece408 / "testfull.hdf5") as f:
        images = f["x"][:437]
    # float32 off the 8-bit codes (which travel as codes: a host conversion, not in place)
    x = ((images * 255).round().astype(np.uint8) if dtype == np.uint8 else
         images + rng.random(images.shape, np.float32) * np.float32(1e-3))
    x = x[rng.permutation(len(x))]
    writer, reader = shared(4 << 20)
    offset = 4096 * 3 + 64  # not at the memory's start: a view inside it
    view = reader[offset:offset + x.nbytes].view(dtype).reshape(x.shape)
    writer[offset:offset + x.nbytes] = x.reshape(-1).view(np.uint8)
    with cnninfer.Session(ece408 / "model.hdf5", "cuda") as s:
        expected = s.classify(x.copy(), scores=True)
        assert s.pin(reader) is True
        assert s.pin(reader) is True  # again: already pinned
        for _ in range(2):  # the second call replays the run's graph
            labels, scores = calls(s, view, in_place=True)
            np.testing.assert_array_equal(labels, expected[0])
            np.testing.assert_array_equal(scores, expected[1])
        # new images in the same memory: read afresh, not an answer kept
        flipped = x[::-1].copy()
        writer[offset:offset + x.nbytes] = flipped.reshape(-1).view(np.uint8)
        np.testing.assert_array_equal(calls(s, view, in_place=True)[0], expected[0][::-1])
        assert s.backend.reads_in_place(view) and not s.backend.reads_in_place(x)
        s.unpin(reader)
        assert not s.backend.reads_in_place(view)
        np.testing.assert_array_equal(calls(s, view, in_place=False)[0], expected[0][::-1])


@gpu
def test_a_bad_value_in_pinned_memory_is_refused_naming_its_image(ece408):
    writer, reader = shared(1 << 20)
    x = np.random.default_rng(3).random((29, 28, 28, 1), np.float32)
    x[17, 3, 5, 0] = np.nan
    writer[:x.nbytes] = x.reshape(-1).view(np.uint8)
    with cnninfer.Session(ece408 / "model.hdf5", "cuda") as s:
        assert s.pin(reader)
        with pytest.raises(cnninfer.InputError, match=r"\(17, 3, 5, 0\) is nan"):
            calls(s, reader[:x.nbytes].view(np.float32).reshape(x.shape), in_place=True)
