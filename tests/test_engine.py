"""The engine and a front end's RemoteBatcher over a real Unix socket, with a stub session: requests
of one front end reach the engine as groups, each answered with its own rows; a bad request
fails alone; a request given up while it waits is not sent; large requests' images travel in
shared memory, reused only once the engine is done with them, or on the socket where it is full."""
import asyncio
import sys
import threading
from types import SimpleNamespace

import numpy as np
import pytest

from infer.serve.batcher import Expired
from infer.serve import front as front_module
from infer.serve.engine import Engine
from infer.serve.front import Region, RemoteBatcher
from infer.errors import InputError
from tests.test_batcher import Recorder, images


class StubSession(Recorder):
    """The batcher tests' Recorder as a session (label = the image's first value, -1 bad input),
    also keeping each pass's first values; `gate`, where set, holds each pass until released."""
    classes, executor, device = 3, None, "stub"
    backend = SimpleNamespace(name="stub")

    def __init__(self, gate=None):
        super().__init__()
        self.passes, self.gate = [], gate

    def classify(self, x, scores):
        if self.gate is not None:
            self.gate.wait(10)
        self.passes.append(x.reshape(len(x), -1)[:, 0].tolist())
        return self(x, scores)

    def pin(self, array):  # as a CPU session: memory it cannot register (Pinning below can)
        return False

    def unpin(self, array):
        pass


RUN = asyncio.run  # how served() runs its loop: asyncio's, or uvloop's where the fixture says


@pytest.fixture(autouse=True, params=["asyncio", "uvloop"])
def loop_kind(request, monkeypatch):
    """Every test on asyncio's event loop and on uvloop's (the engine's where it is installed)."""
    if request.param == "uvloop":
        monkeypatch.setattr(sys.modules[__name__], "RUN", pytest.importorskip("uvloop").run)
    return request.param


def test_the_engine_loop_is_uvloops_where_installed_else_asyncios(monkeypatch):
    from infer.serve.server import run_loop

    async def kind():
        return type(asyncio.get_running_loop()).__module__

    pytest.importorskip("uvloop")
    assert run_loop(kind()).startswith("uvloop")
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as if not installed: its import fails
    assert run_loop(kind()).startswith("asyncio")


async def turns(n=3):
    """A few turns of the event loop (no timed wait): tasks just made take their first steps and
    the callbacks they schedule run."""
    for _ in range(n):
        await asyncio.sleep(0)


async def holding(front, engine, x):
    """x submitted, once its pass is running in the engine (held there by the stub's gate)."""
    held = asyncio.ensure_future(front.submit(x))
    while not engine.batcher.running:
        await asyncio.sleep(0.001)
    return held


def served(tmp_path, session, body, inline=False):
    """body(front) with an engine over `session` and one front end connected to it."""
    async def main():
        engine = Engine(session, SimpleNamespace(max_batch=1000, max_delay_ms=0), inline=inline)
        path = str(tmp_path / "engine.sock")
        await engine.start(path)
        front = RemoteBatcher(path)
        await front.start()
        try:
            return await body(front, engine)
        finally:
            await front.stop()
            await engine.stop()

    return RUN(main())


def test_requests_that_wait_together_go_as_one_group_and_get_their_own_rows(tmp_path):
    """The first request leaves alone and is held in the engine's pass; the next ten leave at once
    as one group (two groups in flight at most); the 40 after them wait in the outbox, one group per
    kind (with and without scores), until an answer comes. Each answer is its request's own rows."""
    gate = threading.Event()
    session = StubSession(gate)

    async def body(front, engine):
        first = await holding(front, engine, images([5]))
        second = [asyncio.ensure_future(front.submit(images([100 + i]))) for i in range(10)]
        await turns()  # the submits run, then the outbox's flush
        assert not front.outbox and front._in_flight() == 2
        rest = [asyncio.ensure_future(front.submit(images([i, i + 1]), scores=i % 4 == 0)) for i in range(0, 80, 2)]
        await turns()  # the submits run, then the outbox's flush
        assert sorted(len(m) for m in front.outbox.values()) == [20, 20]
        gate.set()
        return await first, await asyncio.gather(*second), await asyncio.gather(*rest)

    (labels, kept), second, rest = served(tmp_path, session, body)
    assert labels.tolist() == [5] and kept is None
    assert [a[0].tolist() for a in second] == [[100 + i] for i in range(10)]
    for i, (labels, kept) in zip(range(0, 80, 2), rest):
        assert labels.tolist() == [i, i + 1]
        assert (kept is None) == (i % 4 == 2)
        if kept is not None:
            assert kept[:, 0].tolist() == [i, i + 1]
    assert session.passes[:2] == [[5], list(range(100, 110))] and sum(len(p) for p in session.passes) == 91
    assert len(session.passes) <= 4


def test_a_bad_request_in_a_group_fails_alone(tmp_path):
    gate = threading.Event()
    session = StubSession(gate)

    async def body(front, engine):
        held = await holding(front, engine, images([1]))
        group = [asyncio.ensure_future(front.submit(images(v))) for v in ([2, 3], [4, -1], [6])]
        await turns()  # the submits run, then the outbox's flush
        gate.set()
        await held
        return await asyncio.gather(*group, return_exceptions=True)

    out = served(tmp_path, session, body)
    assert out[0][0].tolist() == [2, 3] and out[2][0].tolist() == [6]
    assert isinstance(out[1], InputError) and "image 1 is bad" in out[1].message


def test_a_request_given_up_while_it_waits_is_not_sent(tmp_path):
    gate = threading.Event()
    session = StubSession(gate)

    async def body(front, engine):
        held = await holding(front, engine, images([1]))
        behind = asyncio.ensure_future(front.submit(images([2])))  # the second group in flight
        await turns()  # the submits run, then the outbox's flush
        early = asyncio.ensure_future(front.submit(images([7]), timeout=0.01))
        kept = asyncio.ensure_future(front.submit(images([8])))
        with pytest.raises(Expired):
            await early
        gate.set()
        return await held, await behind, await kept

    (first, _), (behind, _), (last, _) = served(tmp_path, session, body)
    assert first.tolist() == [1] and behind.tolist() == [2] and last.tolist() == [8]
    assert [7] not in session.passes and all(7 not in p for p in session.passes)


def test_requests_larger_than_the_staging_buffer_are_read_whole_between_small_ones(tmp_path, monkeypatch):
    """Images past the engine's 256 KiB staging buffer (and too large for the shared memory, here
    1 MiB) are read straight into their array; small requests before and after them, in the same
    reads, are parsed from the staging buffer."""
    monkeypatch.setattr(front_module, "SHARED_BYTES", 1 << 20)
    rng = np.random.default_rng(3)
    session = StubSession()
    big = rng.random((70, 64, 64, 1), np.float32)  # 1.1 MiB
    big[:, 0, 0, 0] = np.arange(70)

    async def body(front, engine):
        small = [images([i]) for i in range(5)]
        asks = [front.submit(small[0]), front.submit(big), front.submit(small[1]), front.submit(big[:3], scores=True)]
        out = await asyncio.gather(*asks)
        more = await asyncio.gather(*(front.submit(x) for x in small[2:]))
        # the large request's buffer is reused for the next of its size, which gets its own answer
        assert engine.spare_bytes == big.nbytes
        again = big[::-1].copy()
        assert (await front.submit(again))[0].tolist() == list(range(69, -1, -1))
        assert engine.spare_bytes == big.nbytes
        return out, more

    out, more = served(tmp_path, session, body)
    assert out[0][0].tolist() == [0] and out[1][0].tolist() == list(range(70)) and out[2][0].tolist() == [1]
    assert out[3][0].tolist() == [0, 1, 2] and out[3][1].shape == (3, 3)
    assert [m[0].tolist() for m in more] == [[2], [3], [4]]


def large(rng, first, size=(37, 23, 29, 1)):
    """Seeded images of an odd shape, 96 KiB each request (past SHARED_MIN), their first values
    `first`."""
    x = rng.random(size, np.float32)
    x[:, 0, 0, 0] = first
    return x


def test_large_requests_travel_in_shared_memory_each_answered_with_its_own_rows(tmp_path):
    rng = np.random.default_rng(11)
    session = StubSession()
    xs = [large(rng, np.arange(37) + 100 * i) for i in range(9)]

    async def body(front, engine):
        assert front.region is not None and engine.spare_bytes == 0
        out = await asyncio.gather(*(front.submit(x, scores=i % 2 == 1) for i, x in enumerate(xs)))
        # every answer's images given back: the memory is one free extent again; none on the socket
        assert front.region.free == [(0, front_module.SHARED_BYTES)] and not engine.spare
        return out

    out = served(tmp_path, session, body)
    for i, (labels, kept) in enumerate(out):
        assert labels.tolist() == list(range(100 * i, 100 * i + 37))
        assert (kept is None) == (i % 2 == 0)
    # the engine read the images the front end wrote: every value, not only the labels' column
    assert sum(len(p) for p in session.passes) == 9 * 37


def test_shared_memory_is_reused_only_once_the_pass_reading_it_ends(tmp_path):
    """A request that expires while its pass runs is answered (504) at the front end at once, but
    its shared memory is given back only when the engine answers, after the pass: the next request
    is written elsewhere, so the running pass reads the images it was given."""
    rng = np.random.default_rng(5)
    gate = threading.Event()
    seen = []

    class Watching(StubSession):
        def classify(self, x, scores):
            out = super().classify(x, scores)
            seen.append(x.copy())  # what the pass read, as it ends
            return out

    session = Watching(gate)
    first = large(rng, np.arange(37))

    async def body(front, engine):
        held = asyncio.ensure_future(front.submit(first, timeout=0.05))
        while not engine.batcher.running:
            await asyncio.sleep(0.001)
        with pytest.raises(Expired):
            await held
        await asyncio.sleep(0.1)  # the engine's own deadline passes too: its answer waits for the pass
        assert front.region.free[0][0] > 0  # the first request's memory is still in use
        after = asyncio.ensure_future(front.submit(large(rng, np.arange(37) + 500)))
        await turns()
        gate.set()
        labels, _ = await after
        assert front.region.free == [(0, front_module.SHARED_BYTES)]
        return labels

    labels = served(tmp_path, session, body)
    assert labels.tolist() == list(range(500, 537))
    np.testing.assert_array_equal(seen[0], first)


def test_without_shared_memory_every_request_goes_on_the_socket(tmp_path, monkeypatch):
    """An engine that cannot map the front end's memory (here: a path that is not there) says so,
    and the front end sends every request's images on the socket."""
    made = Region.__init__

    def elsewhere(self, size):
        made(self, size)
        self.path = "/nonexistent/cnninfer"

    monkeypatch.setattr(Region, "__init__", elsewhere)
    rng = np.random.default_rng(7)
    session = StubSession()
    x = large(rng, np.arange(120) * 3, (120, 23, 29, 1))  # past the staging buffer: read into its own

    async def body(front, engine):
        assert front.region is None
        return (await front.submit(x))[0], engine.spare_bytes

    labels, spare = served(tmp_path, session, body)
    assert labels.tolist() == list(range(0, 360, 3)) and spare == x.nbytes


def test_the_shared_memory_allocator_matches_a_model_of_its_extents():
    """First fit, freed extents merged with their neighbours: after a seeded run of takes and gives
    the free list is exactly the complement of what is in use, and nothing in use overlaps."""
    rng = np.random.default_rng(13)
    region = Region(1 << 16)
    used = {}
    for _ in range(2000):
        if used and rng.random() < 0.5:
            start = list(used)[rng.integers(len(used))]
            region.give(start, used.pop(start))
        else:
            size = int(rng.integers(1, 9000))
            start = region.take(size)
            if start is None:
                continue
            used[start] = size
        taken = np.zeros(1 << 16, bool)
        for start, size in used.items():
            end = start + -(-size // Region.ALIGN) * Region.ALIGN
            assert not taken[start:end].any()
            taken[start:end] = True
        free = np.zeros(1 << 16, bool)
        for start, end in region.free:
            free[start:end] = True
        assert (free == ~taken).all()
        assert all(a[1] < b[0] for a, b in zip(region.free, region.free[1:]))  # merged: never touching
    region.close()


def test_a_front_ends_shared_memory_is_pinned_as_it_attaches_and_unpinned_as_it_goes(tmp_path):
    """An inline engine (its loop on the session's thread: here the test's) runs its passes on the
    loop's thread and pins a front end's shared memory there, once, as the front end attaches
    (before any request: never in the middle of serving), and unpins it when the front end
    disconnects. An engine that is not inline (a CPU session: passes on a thread of the batcher's)
    pins nothing."""
    calls = []

    class Pinning(StubSession):
        def classify(self, x, scores):
            calls.append(("pass", None, threading.get_ident()))
            return super().classify(x, scores)

        def pin(self, array):
            calls.append(("pin", array, threading.get_ident()))
            return True

        def unpin(self, array):
            calls.append(("unpin", array, threading.get_ident()))

    rng = np.random.default_rng(13)

    async def body(front, engine):
        assert [c[0] for c in calls] == (["pin"] if engine.inline else [])  # attached
        await front.submit(images([1, 2]))
        for i in range(3):
            labels, _ = await front.submit(large(rng, np.arange(37) + i))
            assert labels.tolist() == list(range(i, 37 + i))
        (link,) = engine.connections
        assert f"cnninfer_pinned_bytes {front_module.SHARED_BYTES if engine.inline else 0}\n" in engine.metrics.batch_text()
        return link.shared, engine

    shared, engine = served(tmp_path, Pinning(), body, inline=True)
    assert engine.metrics.pinned == 0  # unpinned as the front end went
    assert [c[0] for c in calls] == ["pin", "pass", "pass", "pass", "pass", "unpin"]
    assert all(c[1] is shared for c in calls if c[0] != "pass")
    assert {c[2] for c in calls} == {threading.get_ident()}
    calls.clear()
    served(tmp_path, Pinning(), body)
    assert [c[0] for c in calls] == ["pass"] * 4 and threading.get_ident() not in {c[2] for c in calls}


def test_a_lone_request_leaves_at_once_and_requests_after_a_recent_answer_wait_for_their_turn(tmp_path,
                                                                                             monkeypatch):
    """With nothing in flight or waiting and no answer for QUIET_S, a request is sent from submit
    (the first of two submitted together leaves alone); within QUIET_S of an answer (load) requests
    wait for the loop's turn, so those of one turn leave as one group."""
    sent = []

    async def body(front, engine):
        send = front._send

        def recorded(kind, timeout, members):
            sent.append([len(x) for x, _ in members])
            return send(kind, timeout, members)

        front._send = recorded
        monkeypatch.setattr(front_module, "QUIET_S", 0)
        first = await asyncio.gather(front.submit(images([1])), front.submit(images([2, 3])))
        monkeypatch.setattr(front_module, "QUIET_S", 60)
        then = await asyncio.gather(front.submit(images([4])), front.submit(images([5, 6])))
        return [a[0].tolist() for a in first + then]

    assert served(tmp_path, StubSession(), body) == [[1], [2, 3], [4], [5, 6]]
    assert sent == [[1], [2], [1, 2]]


def test_an_idle_inline_engine_runs_a_lone_request_as_it_arrives_without_queueing_it(tmp_path, monkeypatch):
    """Inline and idle, the engine runs a request's pass in the turn of its loop that read it
    (Batcher.now): nothing goes through the batcher's queue, answers are the request's own rows
    (scores too), a bad image fails its request alone and the next is served. Right after a pass
    (within QUIET_S: under load) a request goes through the queue as before."""
    queued = []
    session = StubSession()

    monkeypatch.setattr(front_module, "QUIET_S", 0)

    async def body(front, engine):
        engine.batcher.QUIET_S = 0
        submit = engine.batcher.submit

        async def recorded(x, *args):
            queued.append(len(x))
            return await submit(x, *args)

        engine.batcher.submit = recorded
        first = await front.submit(images([5]), scores=True)
        with pytest.raises(InputError):
            await front.submit(images([4, -1]))
        group = await asyncio.gather(front.submit(images([1])), front.submit(images([2, 3])))
        assert queued == []
        engine.batcher.QUIET_S = 60
        assert (await front.submit(images([8])))[0].tolist() == [8]
        return first, group

    (labels, kept), group = served(tmp_path, session, body, inline=True)
    assert labels.tolist() == [5] and kept[:, 0].tolist() == [5]
    assert [g[0].tolist() for g in group] == [[1], [2, 3]]
    assert queued == [1] and session.passes == [[5], [4, -1], [1], [2, 3], [8]]  # the first of two leaves alone
