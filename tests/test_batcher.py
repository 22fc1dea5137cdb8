"""The dynamic batcher alone (no HTTP): what it merges, the order, the bounds, and failures that
stay with the request that caused them."""
import asyncio

import numpy as np
import pytest

from infer.serve.batcher import Batcher, Busy
from infer.errors import InputError


class Recorder:
    """classify: label = the image's first value, scores = its first value in every column;
    records the batches it was given; an image whose first value is -1 fails its batch."""

    def __init__(self):
        self.batches = []

    def __call__(self, x, scores):
        self.batches.append((len(x), x.dtype))
        first = x.reshape(len(x), -1)[:, 0]
        if (first == -1).any():
            raise InputError(f"x: image {int(np.argmax(first == -1))} is bad")
        return first.astype(np.int64), np.repeat(first[:, None].astype(np.float32), 3, 1) if scores else None


def images(values, dtype=np.float32):
    x = np.zeros((len(values), 2, 2, 1), dtype)
    x[:, 0, 0, 0] = values
    return x


def run(batcher, coroutines):
    async def main():
        batcher.start()
        try:
            return await asyncio.gather(*coroutines(), return_exceptions=True)
        finally:
            await batcher.stop()
            batcher.close()

    return asyncio.run(main())


def test_requests_arriving_together_are_one_pass_each_getting_its_rows():
    rec = Recorder()
    b = Batcher(rec, max_batch=100, max_delay_s=0.05)
    out = run(b, lambda: [b.submit(images(range(i * 10, i * 10 + k)), scores=i % 2 == 0)
                          for i, k in enumerate((3, 1, 5, 2))])
    assert rec.batches == [(11, np.float32)]
    for i, (k, (labels, scores)) in enumerate(zip((3, 1, 5, 2), out)):
        assert labels.tolist() == list(range(i * 10, i * 10 + k))
        assert (scores is None) == (i % 2 == 1)
        if scores is not None:
            assert scores.shape == (k, 3) and scores[:, 0].tolist() == labels.tolist()


def test_max_batch_bounds_a_pass_and_order_is_kept():
    rec = Recorder()
    b = Batcher(rec, max_batch=4, max_delay_s=0.05)
    out = run(b, lambda: [b.submit(images([i] * k)) for i, k in enumerate((3, 2, 2, 6, 1))])
    assert [n for n, _ in rec.batches] == [3, 4, 6, 1]  # 3 | 2+2 | 6 (alone: larger than max_batch) | 1
    assert [o[0].tolist() for o in out] == [[i] * k for i, k in enumerate((3, 2, 2, 6, 1))]


def test_types_are_not_mixed_in_a_pass():
    rec = Recorder()
    b = Batcher(rec, max_batch=100, max_delay_s=0.05)
    out = run(b, lambda: [b.submit(images([1], np.uint8)), b.submit(images([2])), b.submit(images([3], np.uint8))])
    assert rec.batches == [(1, np.uint8), (1, np.float32), (1, np.uint8)]
    assert [o[0].tolist() for o in out] == [[1], [2], [3]]


def test_a_failing_request_fails_alone():
    rec = Recorder()
    b = Batcher(rec, max_batch=100, max_delay_s=0.05)
    out = run(b, lambda: [b.submit(images([5])), b.submit(images([7, -1])), b.submit(images([9]))])
    assert out[0][0].tolist() == [5] and out[2][0].tolist() == [9]
    assert isinstance(out[1], InputError) and "image 1 is bad" in str(out[1])


def test_a_cancelled_request_is_skipped():
    rec = Recorder()
    b = Batcher(rec, max_batch=100, max_delay_s=0.05)

    async def cancelled():
        task = asyncio.ensure_future(b.submit(images([4])))
        await asyncio.sleep(0)
        task.cancel()
        return await asyncio.gather(task, return_exceptions=True)

    out = run(b, lambda: [cancelled(), b.submit(images([6]))])
    assert isinstance(out[0][0], asyncio.CancelledError) and out[1][0].tolist() == [6]
    assert rec.batches == [(1, np.float32)]


def test_a_full_queue_is_busy():
    def classify(x, scores):
        return np.zeros(len(x), np.int64), None

    b = Batcher(classify, max_batch=2, max_delay_s=10, max_queued=4)

    async def flood():
        b.start()
        first = [asyncio.ensure_future(b.submit(images([1, 1]))) for _ in range(2)]
        await asyncio.sleep(0)
        with pytest.raises(Busy, match="images are waiting already"):
            await b.submit(images([1]))
        await asyncio.gather(*first)
        await b.stop()
        b.close()

    asyncio.run(flood())


def test_padded_passes_are_all_one_size_and_large_requests_are_split():
    rec = Recorder()
    b = Batcher(rec, max_batch=4, max_delay_s=0.05, pad_to=(4,))
    out = run(b, lambda: [b.submit(images([1])), b.submit(images(range(10, 19)), scores=True)])
    assert {n for n, _ in rec.batches} == {4}
    assert out[0][0].tolist() == [1]
    labels, scores = out[1]
    assert labels.tolist() == list(range(10, 19)) and scores.shape == (9, 3)


def test_the_ladder_is_the_powers_of_two_below_max_batch_then_max_batch():
    from infer.serve.batcher import ladder

    assert ladder(1) == (1,)
    assert ladder(4096) == tuple(1 << k for k in range(13))
    assert ladder(100) == (1, 2, 4, 8, 16, 32, 64, 100)


def test_a_pass_is_padded_to_the_smallest_rung_that_holds_it():
    """A lone image runs in a pass of 1; 3 images waiting together in one of 4; 9 images in a pass of
    16; a 40-image request (past max_batch 32) in passes of 32 and 8."""
    from infer.serve.batcher import ladder

    rec = Recorder()

    def served(*requests):
        b = Batcher(rec, max_batch=32, max_delay_s=0.05, pad_to=ladder(32))
        return [labels.tolist() for labels, _ in run(b, lambda: [b.submit(images(r)) for r in requests])]

    assert served([7]) == [[7]]
    assert served([1], [2, 3]) == [[1], [2, 3]]
    assert served(range(9)) == [list(range(9))]
    assert served(range(100, 140)) == [list(range(100, 140))]
    assert [n for n, _ in rec.batches] == [1, 4, 16, 32, 8]


def test_a_pass_that_fails_on_the_device_fails_its_requests_once_not_replayed():
    """Not an InputError (the device, say): every request of the pass gets it, in one pass."""
    calls = []

    def broken(x, scores):
        calls.append(len(x))
        raise RuntimeError("device lost")

    b = Batcher(broken, max_batch=100, max_delay_s=0.05)
    out = run(b, lambda: [b.submit(images([i])) for i in range(5)])
    assert calls == [5]
    assert all(isinstance(e, RuntimeError) for e in out)


def test_a_request_past_its_deadline_is_expired_and_skipped():
    """The first pass blocks until released; the request behind it expires, and its pass never runs."""
    import threading

    from infer.serve.batcher import Expired

    release, seen = threading.Event(), []

    def slow(x, scores):
        seen.append(x.reshape(len(x), -1)[:, 0].tolist())
        release.wait(10)
        return np.zeros(len(x), np.int64), None

    b = Batcher(slow, max_batch=1, max_delay_s=0)

    async def second():
        try:
            return await b.submit(images([2]), timeout=0.2)
        finally:
            release.set()

    out = run(b, lambda: [b.submit(images([1])), second()])
    assert out[0][0].tolist() == [0]
    assert isinstance(out[1], Expired) and "0.2 s" in str(out[1])
    assert seen == [[1.0]], "the expired request's pass was skipped"


def test_abandon_fails_what_waits_and_what_runs_with_draining():
    import threading

    from infer.serve.batcher import Draining

    started, release = threading.Event(), threading.Event()

    def held(x, scores):
        started.set()
        release.wait(10)
        return np.zeros(len(x), np.int64), None

    b = Batcher(held, max_batch=1, max_delay_s=0)

    async def abandon_once_running():
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 10)
        b.abandon()
        release.set()

    out = run(b, lambda: [b.submit(images([1])), b.submit(images([2])), abandon_once_running()])
    assert isinstance(out[0], Draining) and isinstance(out[1], Draining)


async def taken(batcher):
    """Until the batcher has taken every queued request into the batch it is forming (its state,
    not a time: a bounded number of turns of the event loop)."""
    for _ in range(10_000):  # the request counted as queued...
        if batcher.queued:
            break
        await asyncio.sleep(0)
    for _ in range(10_000):  # ...then taken by the batch
        if batcher.queued == 0:
            return
        await asyncio.sleep(0)
    raise AssertionError("the batcher never took the queued request")


def test_a_batch_waits_for_requests_still_being_received_and_a_lone_request_does_not_wait():
    """With a request being received (expecting), the batch opened by the first waits for it (one
    pass of two); with none, a lone request is passed at once, not after max_delay."""
    import time

    rec = Recorder()
    b = Batcher(rec, max_batch=100, max_delay_s=1.0)

    async def main():
        b.start()
        b.expecting = 1  # the second request is still being received when the first is queued
        first = asyncio.ensure_future(b.submit(images([1])))
        await taken(b)  # the batch has opened with the first request
        second = asyncio.ensure_future(b.submit(images([2])))
        merged = await asyncio.gather(first, second)
        b.expecting = 0
        t = time.perf_counter()
        lone = await b.submit(images([3]))
        lone_s = time.perf_counter() - t
        await b.stop()
        b.close()
        return merged, lone, lone_s

    merged, lone, lone_s = asyncio.run(main())
    assert [m[0].tolist() for m in merged] == [[1], [2]] and lone[0].tolist() == [3]
    assert [n for n, _ in rec.batches] == [2, 1], "the first two in one pass, the lone one alone"
    assert lone_s < 0.5, f"a lone request waited {lone_s:.3f} s of the 1 s max_delay"


def test_a_batch_waits_no_longer_than_max_delay():
    import time

    rec = Recorder()
    b = Batcher(rec, max_batch=100, max_delay_s=0.3)

    async def main():
        b.start()
        b.expecting = 1  # a request that never arrives
        t = time.perf_counter()
        out = await b.submit(images([5]))
        took = time.perf_counter() - t
        await b.stop()
        b.close()
        return out, took

    out, took = asyncio.run(main())
    assert out[0].tolist() == [5] and 0.25 <= took < 5


def test_a_request_cancelled_during_its_pass_leaves_the_others_answered():
    """The pass is held inside classify (an event); the first request is cancelled meanwhile; the
    pass ends and the second gets its rows; the batcher goes on (a third request answered)."""
    import threading

    entered, release = threading.Event(), threading.Event()
    seen = []

    def held(x, scores):
        seen.append(len(x))
        if len(seen) == 1:
            entered.set()
            assert release.wait(10)
        first = x.reshape(len(x), -1)[:, 0]
        return first.astype(np.int64), None

    b = Batcher(held, max_batch=100, max_delay_s=0.5)

    async def main():
        b.start()
        b.expecting = 1
        a = asyncio.ensure_future(b.submit(images([1])))
        await taken(b)
        c = asyncio.ensure_future(b.submit(images([2])))
        await asyncio.get_running_loop().run_in_executor(None, entered.wait, 10)
        b.expecting = 0
        a.cancel()
        release.set()
        results = await asyncio.gather(a, c, return_exceptions=True)
        third = await b.submit(images([3]))
        await b.stop()
        b.close()
        return results, third

    (a, c), third = asyncio.run(main())
    assert isinstance(a, asyncio.CancelledError) and c[0].tolist() == [2] and third[0].tolist() == [3]
    assert seen == [2, 1], "the cancelled request's pass ran once, with both"


def test_inline_passes_run_on_the_loops_thread_and_what_arrives_meanwhile_is_the_next_pass():
    """inline: classify is called on the event loop's own thread (no executor); the loop waits for
    the pass, so the requests submitted as it runs queue and form the next pass together, each
    answered with its own rows; a bad one still fails alone."""
    import threading

    threads, later = [], []

    class Calling(Recorder):
        def __call__(self, x, scores):
            threads.append(threading.get_ident())
            if not later:  # the first pass: three requests arrive while it runs
                later.extend(asyncio.ensure_future(b.submit(images(v))) for v in ([7], [8, 9], [-1]))
            return super().__call__(x, scores)

    rec = Calling()
    b = Batcher(rec, max_batch=100, max_delay_s=0, inline=True)
    assert b.thread is None

    async def rest():
        await asyncio.sleep(0.01)
        return await asyncio.gather(*later, return_exceptions=True)

    first, others = run(b, lambda: [b.submit(images([5])), rest()])
    assert first[0].tolist() == [5]
    assert [o[0].tolist() for o in others[:2]] == [[7], [8, 9]] and isinstance(others[2], InputError)
    assert [n for n, _ in rec.batches[:2]] == [1, 4]  # then the retry request by request
    assert set(threads) == {threading.get_ident()}


def test_now_runs_a_lone_request_at_once_only_where_inline_idle_and_quiet():
    """now(): on an inline batcher whose loop waits for a first request, and whose last pass ended
    QUIET_S ago or more, the pass runs in the call, padded to the ladder and counted in the
    metrics; right after a pass (passes following one another: load), with a request queued (it
    would be overtaken), on a batcher that is not inline, or past max_batch, None (the caller
    submits). A bad image raises as submit does, and the batcher stays usable."""
    from infer.serve.batcher import ladder
    from infer.serve.metrics import Metrics

    rec = Recorder()
    metrics = Metrics(8)
    b = Batcher(rec, max_batch=8, max_delay_s=0, pad_to=ladder(8), metrics=metrics, inline=True)
    b.QUIET_S = 0.05

    async def main():
        assert b.now(images([1])) is None  # not started: its loop is not waiting
        b.start()
        await asyncio.sleep(0)
        labels, kept = b.now(images([4, 5, 6]), scores=True)
        assert labels.tolist() == [4, 5, 6] and kept[:, 0].tolist() == [4, 5, 6]
        assert rec.batches == [(4, np.float32)]  # padded to the ladder's 4, in this call
        assert b.now(images([2])) is None  # a pass just ended: not quiet
        b.QUIET_S = 0
        with pytest.raises(InputError):
            b.now(images([3, -1]))
        assert b.now(images(range(9))) is None  # past max_batch: split by submit
        queued = asyncio.ensure_future(b.submit(images([7])))
        await asyncio.sleep(0)  # in the queue, the loop not yet run
        assert not b.queue.empty() and b.now(images([8])) is None
        assert (await queued)[0].tolist() == [7]
        await asyncio.sleep(0)
        assert b.now(images([9]))[0].tolist() == [9]
        await b.stop()
        assert b.now(images([1])) is None  # stopped
        b.close()

    asyncio.run(main())
    assert [n for n, _ in rec.batches] == [4, 2, 1, 1]
    text = metrics.batch_text()  # the passes answered: 3 images and 1 now, 1 through the queue
    assert "cnninfer_batch_images_sum 5\n" in text and "cnninfer_batch_images_count 3\n" in text

    threaded = Batcher(Recorder(), max_batch=8, max_delay_s=0)

    async def other():
        threaded.start()
        await asyncio.sleep(0)
        assert threaded.now(images([1])) is None
        await threaded.stop()
        threaded.close()

    asyncio.run(other())
