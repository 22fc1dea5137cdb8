"""Dynamic batching: requests that arrive together are merged into one forward pass and each gets
its own rows of the answer back.

A batch opens with the oldest waiting request and takes the requests behind it, in order, while
they have its image type and shape and the batch stays within max_batch images. It waits for more
only while requests are being received (`expecting`), and at most max_delay after its first
request arrived: a lone client never waits, and requests that queued during the previous pass
have waited already. One forward pass at a time, on one thread that owns the session.

With pad_to, a ladder of pass sizes (the CUDA backend: each batch size has its own device and
page-locked buffers and CUDA graph, ~10 ms to make, kept once made), a pass is padded with zeros
to the smallest size of the ladder that holds it, and a request larger than max_batch is split
into passes of max_batch. A pass that fails on a
request's input (InputError: values that overflow, say) is run again request by request, so a
bad request fails alone; a pass that fails otherwise (the device) fails every request in it
once, not replayed. A request whose caller went away, or whose deadline passed while it
waited (Expired), is skipped.
"""
import asyncio
import bisect
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..errors import InputError


STOP = object()  # queued by stop(): the requests before it are answered first
# A lone request: one that comes QUIET_S or more after the last pass ended (Batcher.now) or the
# last answer came (a front end's send, front.py); one connection's requests come ~150-300 us apart
QUIET_S = 100e-6


def ladder(max_batch):
    """The pass sizes a batch is padded to: the powers of two below max_batch, and max_batch."""
    return tuple(1 << k for k in range(max_batch.bit_length()) if 1 << k < max_batch) + (max_batch,)


class Busy(Exception):
    """More images wait than the queue holds (HTTP 503)."""


class Expired(Exception):
    """A request not answered within its deadline (HTTP 504)."""


class Draining(Exception):
    """The server stopped waiting for this request's pass as it shut down (HTTP 503)."""


class Pending:
    __slots__ = ("x", "scores", "future", "arrived", "requests")

    def __init__(self, x, scores, future, requests=1):
        self.x, self.scores, self.future, self.arrived = x, scores, future, time.perf_counter()
        self.requests = requests  # the clients' requests it stands for (a front end's group)

    def fits(self, other):
        return self.x.dtype == other.x.dtype and self.x.shape[1:] == other.x.shape[1:]


class Batcher:
    QUIET_S = QUIET_S

    def __init__(self, classify, max_batch, max_delay_s, metrics=None, max_queued=None, pad_to=None, thread=None,
                 inline=False):
        """classify(x, scores) -> (labels, scores or None), called on the batch thread, or with
        inline on the loop's own thread (the loop runs where classify must: the server engine's,
        on the GPU session's thread, so a lone request's pass costs no thread hop); pad_to: the
        ladder of pass sizes (ascending, the last max_batch), or None."""
        assert not pad_to or pad_to[-1] == max_batch, "the ladder ends at max_batch"
        self.classify, self.max_batch, self.max_delay_s = classify, max_batch, max_delay_s
        self.pad_to = pad_to
        self.metrics = metrics
        self.max_queued = max_queued or max(64 * max_batch, 1 << 16)
        self.expecting = 0  # requests being received that will be submitted (the server counts them)
        self.queue = asyncio.Queue()
        self.held = None  # a request taken from the queue that opens the next batch
        self.queued = 0  # images waiting
        self.inline = inline
        self.owns_thread = thread is None and not inline
        self.thread = None if inline else thread or ThreadPoolExecutor(1, thread_name_prefix="cnninfer-batch")
        self.task = None
        self.running = []  # the requests of the pass in progress
        self.passed = None  # a future done as the pass in progress ends
        self.idle = False  # the loop waits for a first request, none queued or held (now())
        self.ended = 0.0  # perf_counter() as the last pass ended

    def start(self):
        self.task = asyncio.get_running_loop().create_task(self._loop())

    async def submit(self, x, scores=False, timeout=None, requests=1):
        """(labels, scores or None) of images x (at least one), computed in some batch; Expired
        when that takes longer than timeout seconds (None: no limit). requests: how many clients'
        requests x holds (the metrics count them)."""
        try:
            async with asyncio.timeout(timeout):
                return await self._submit(x, scores, requests)
        except TimeoutError:
            raise Expired(f"not answered within {timeout:g} s") from None

    async def _submit(self, x, scores, requests=1):
        if self.pad_to and len(x) > self.max_batch:
            parts = await asyncio.gather(*(self._submit(x[i:i + self.max_batch], scores, requests if i == 0 else 0)
                                           for i in range(0, len(x), self.max_batch)))
            labels, kept = zip(*parts)
            return np.concatenate(labels), np.concatenate(kept) if scores else None
        if self.queued + len(x) > self.max_queued and self.queued:
            raise Busy(f"{self.queued} images are waiting already (at most {self.max_queued})")
        future = asyncio.get_running_loop().create_future()
        self._count(len(x))
        await self.queue.put(Pending(x, scores, future, requests))
        return await future  # cancelled with the request (or its deadline): the batch skips it

    def _count(self, images):
        self.queued += images
        if self.metrics is not None:
            self.metrics.queued = self.queued

    async def _next(self, timeout):
        """The held request, else the queue's next (None when none came within timeout)."""
        if self.held is not None:
            item, self.held = self.held, None
            return item
        if timeout is None:
            return await self.queue.get()
        if not self.queue.empty():
            return self.queue.get_nowait()
        if timeout <= 0:
            return None
        try:
            return await asyncio.wait_for(self.queue.get(), timeout)
        except asyncio.TimeoutError:
            return None

    def now(self, x, scores=False, requests=1):
        """(labels, scores or None) of images x from a pass run now, on the loop's thread, where
        the batcher runs inline and has been idle for QUIET_S: no request queued, held or in a
        batch forming, so none is overtaken and x would have opened the next batch alone. A lone
        request then costs the loop no hops through the queue and the tasks around it. None where
        it is not (the caller submits): under load passes follow one another, and the requests
        read in one turn of the loop still merge into one pass. A failed pass raises, as submit
        does."""
        if not (self.inline and self.idle and self.queue.empty() and len(x) <= self.max_batch
                and time.perf_counter() - self.ended >= self.QUIET_S):
            return None
        try:
            labels, kept = self.classify(self._padded(x, len(x)), scores)
        finally:
            self.ended = time.perf_counter()
        if self.metrics is not None:
            self.metrics.batch(len(x), requests)
        return labels[:len(x)], kept[:len(x)] if scores else None

    def _padded(self, x, images):
        """x with zero images after it up to the ladder's next size, where there is a ladder."""
        if self.pad_to:
            size = self.pad_to[bisect.bisect_left(self.pad_to, images)]
            if size > images:
                x = np.concatenate([x, np.zeros((size - images,) + x.shape[1:], x.dtype)])
        return x

    async def _loop(self):
        loop = asyncio.get_running_loop()
        while True:
            self.idle = self.held is None
            try:
                first = await self._next(None)
            finally:
                self.idle = False
            if first is STOP:
                return
            self._count(-len(first.x))
            if first.future.done():  # its caller went away
                continue
            batch, images = [first], len(first.x)
            while images < self.max_batch:
                wait = first.arrived + self.max_delay_s - time.perf_counter() if self.expecting > 0 else 0
                item = await self._next(wait)
                if item is None:
                    break
                if item is STOP or not (item.fits(first) and images + len(item.x) <= self.max_batch):
                    self.held = item  # opens the next batch: order is kept
                    break
                self._count(-len(item.x))
                if not item.future.done():
                    batch.append(item)
                    images += len(item.x)
            await self._run(loop, batch, images)

    async def _run(self, loop, batch, images):
        scores = any(p.scores for p in batch)
        x = self._padded(batch[0].x if len(batch) == 1 else np.concatenate([p.x for p in batch]), images)
        self.running, self.passed = batch, loop.create_future()
        try:
            if self.inline:  # the loop waits: what arrives meanwhile queues for the next pass
                labels, kept = self.classify(x, scores)
            else:
                labels, kept = await loop.run_in_executor(self.thread, self.classify, x, scores)
        except Exception as e:
            self._passed()
            if len(batch) == 1 or not isinstance(e, InputError):
                for p in batch:
                    _settle(p, exception=e)
                return
            for p in batch:  # each alone: only the bad one fails
                await self._run(loop, [p], len(p.x))
            return
        self._passed()
        if self.metrics is not None:
            self.metrics.batch(images, sum(p.requests for p in batch))
        at = 0
        for p in batch:
            n = len(p.x)
            _settle(p, result=(labels[at:at + n], kept[at:at + n] if p.scores else None))
            at += n

    def _passed(self):
        self.running = []
        self.passed.set_result(None)
        self.ended = time.perf_counter()

    async def released(self, x):
        """Once no pass in progress reads x's memory (a request that failed or expired, its
        pass still running: its memory is reused once it is answered)."""
        while any(np.may_share_memory(p.x, x) for p in self.running):
            await asyncio.shield(self.passed)

    def abandon(self):
        """Fail every request waiting, or in the pass in progress, with Draining (a drain's end):
        the passes still run, their answers unused."""
        waiting = [p for p in self.queue._queue if p is not STOP] + [self.held] * (self.held not in (None, STOP))
        for p in waiting + self.running:
            _settle(p, exception=Draining())

    async def stop(self):
        """Answer every request already queued, then stop taking more."""
        if self.task is not None:
            await self.queue.put(STOP)
            await self.task
            self.task = None

    def close(self):
        """Stop the batch thread, where it is the batcher's own."""
        if self.owns_thread:
            self.thread.shutdown()


def _settle(pending, result=None, exception=None):
    if pending.future.done():
        return
    if exception is not None:
        pending.future.set_exception(exception)
    else:
        pending.future.set_result(result)
