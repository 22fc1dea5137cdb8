"""A front end's side of the engine (`cnninfer serve --workers N`, engine.py): RemoteBatcher stands
in for the Batcher, and Region is the shared memory its large requests' images travel in."""
import asyncio
import bisect
import itertools
import json
import mmap
import os
import struct
import time

import numpy as np

from .batcher import QUIET_S, Draining, Expired
from .wire import (ANSWER, ATTACH_CODE, ATTACHED, CODES, OFFSET, OK, REQUEST, SCORES, SHARED, STATS, STATS_CODE,
                   error)
from ..errors import InputError

SHARED_BYTES = 64 << 20  # a front end's shared memory for images; its pages are touched as used
SHARED_MIN = 64 << 10  # smaller requests' images go on the socket: a write either way


class RemoteBatcher:
    """A front end's stand-in for Batcher: submit() hands the images to the engine and waits for its
    answer (Expired past the timeout, Draining once abandoned). Connects as the app starts.

    Requests of one image type and shape go to the engine together, as one request of all their
    images: while MAX_IN_FLIGHT of this front end's groups are in the engine, new ones wait in the
    outbox and leave with the next answer. A lone request (none in flight or waiting, no answer
    for QUIET_S) leaves at once, from submit, not a turn of the loop later; under load the
    engine's work per request (its event loop is the server's narrowest point) is divided by the
    group's size. A group refused for one request's input is sent again request by request, so
    only that request fails.

    A group of SHARED_MIN bytes of images or more is copied into this front end's shared memory,
    which the engine maps (the socket carries its offset); where that is full or was not mapped,
    the images go on the socket."""
    MAX_IN_FLIGHT = 2

    def __init__(self, path):
        self.path = path
        self.expecting = 0  # the app counts requests being received; the engine batches by its queue
        self.metrics = None
        self.hello = None
        self.reader = self.writer = self.task = None
        self.pending = {}  # id -> (its kind, or None for STATS; its members [(images, future)]; its
        #                    (offset, size) in the shared memory, or None), sent
        self.region = None  # the shared memory, once the engine has mapped it
        self.outbox = {}  # (dtype code, image shape, scores) -> members not sent yet
        self.flushing = False
        self.ids = itertools.count()
        self.gone = None  # the error every request gets once the engine's connection has ended
        self.answered = 0.0  # perf_counter() as the last answer came

    async def start(self):
        self.reader, self.writer = await asyncio.open_unix_connection(self.path)
        (size,) = struct.unpack("<I", await self.reader.readexactly(4))
        self.hello = json.loads(await self.reader.readexactly(size))
        await self._attach()
        self.task = asyncio.get_running_loop().create_task(self._read())

    async def _attach(self):
        """Share memory for images with the engine; without it (no memfd, the engine could not map
        it) every request's images go on the socket."""
        try:
            region = Region(SHARED_BYTES)
        except OSError:
            return
        path = region.path.encode()
        self.writer.write(REQUEST.pack(next(self.ids), ATTACH_CODE, 0, len(path), 0, 0, 0, 0.0, 0) + path)
        _, kind, _, size = ANSWER.unpack(await self.reader.readexactly(ANSWER.size))
        await self.reader.readexactly(size)
        if kind == ATTACHED:
            self.region = region
        else:
            region.close()

    async def submit(self, x, scores=False, timeout=None):
        x = np.ascontiguousarray(x, np.dtype(x.dtype).newbyteorder("<"))
        key = (CODES[x.dtype], x.shape[1:], bool(scores))

        def file(future):
            if not self.outbox and not self._in_flight() and time.perf_counter() - self.answered >= QUIET_S:
                # a lone request; under load it waits for this turn's others (_flush_soon)
                self._send(key, 0.0 if timeout is None else timeout, [(x, future)])
            else:
                self.outbox.setdefault(key, []).append((x, future, timeout))

        try:
            return await self._wait(file, timeout)
        except TimeoutError:
            raise Expired(f"not answered within {timeout:g} s") from None

    async def stats(self):
        """The engine's batch metrics, as Prometheus text."""
        return await self._wait(lambda future: self._send(None, 0, [(None, future)]), 10)

    async def _wait(self, queue, timeout):
        """queue(future) files the request; its outcome (TimeoutError past timeout)."""
        if self.gone is not None:
            raise self.gone
        future = asyncio.get_running_loop().create_future()
        queue(future)
        self._flush_soon()
        async with asyncio.timeout(timeout):
            return await future  # cancelled with its caller: the group's answer skips it

    def _flush_soon(self):
        if self.outbox and not self.flushing and self._in_flight() < self.MAX_IN_FLIGHT:
            self.flushing = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _in_flight(self):
        return sum(1 for kind, _, _ in self.pending.values() if kind is not None)

    def _flush(self):
        """Send each kind of waiting request as one group (its members still waited for)."""
        self.flushing = False
        outbox, self.outbox = self.outbox, {}
        for kind, members in outbox.items():
            members = [m for m in members if not m[1].done()]
            if members:
                timeouts = [m[2] for m in members]
                self._send(kind, 0.0 if None in timeouts else max(timeouts), [m[:2] for m in members])

    def _send(self, kind, timeout, members):
        """One request to the engine: `members`' images as one (kind None: the STATS request)."""
        rid = next(self.ids)
        if kind is None:
            self.pending[rid] = kind, members, None
            self.writer.write(REQUEST.pack(rid, STATS_CODE, 0, 0, 0, 0, 0, 0.0, 0))
            return
        code, image_shape, scores = kind
        size = sum(x.nbytes for x, _ in members)
        at = self.region.take(size) if self.region is not None and size >= SHARED_MIN else None
        self.pending[rid] = kind, members, None if at is None else (at, size)
        head = REQUEST.pack(rid, code, SCORES * scores | SHARED * (at is not None), sum(len(x) for x, _ in members),
                            *image_shape, timeout, len(members))
        if at is not None:
            for x, _ in members:
                self.region.bytes[at:at + x.nbytes] = x.reshape(-1).view(np.uint8)
                at += x.nbytes
            self.writer.write(head + OFFSET.pack(at - size))
            return
        self.writer.write(head)
        for x, _ in members:
            self.writer.write(memoryview(x).cast("B"))

    async def _read(self):
        classes = self.hello["classes"]
        try:
            while True:
                rid, kind, n, size = ANSWER.unpack(await self.reader.readexactly(ANSWER.size))
                if kind == STATS:
                    outcome = (await self.reader.readexactly(size)).decode()
                elif kind != OK:
                    outcome = error(kind, (await self.reader.readexactly(size)).decode())
                else:
                    labels = np.frombuffer(await self.reader.readexactly(8 * n), "<i8")
                    kept = np.frombuffer(await self.reader.readexactly(size), "<f4").reshape(n, classes) if size else None
                    outcome = labels, kept
                self.answered = time.perf_counter()
                kind, members, slot = self.pending.pop(rid, (None, (), None))
                if slot is not None:  # answered: the engine is done with the images
                    self.region.give(*slot)
                self._settle(kind, members, outcome)
                self._flush_soon()
        except (asyncio.IncompleteReadError, ConnectionError):
            self.gone = RuntimeError("the engine process went away")
            self.abandon(self.gone)

    def _settle(self, kind, members, outcome):
        if isinstance(outcome, InputError) and len(members) > 1:  # which one? each again, alone
            for x, future in members:
                if not future.done():
                    self._send(kind, 0.0, [(x, future)])
            return
        at = 0
        for x, future in members:
            if not future.done():
                if isinstance(outcome, Exception):
                    future.set_exception(outcome)
                elif x is None:
                    future.set_result(outcome)
                else:
                    labels, kept = outcome
                    future.set_result((labels[at:at + len(x)], None if kept is None else kept[at:at + len(x)]))
            if x is not None:
                at += len(x)

    def abandon(self, error=None):
        """Fail every request waiting for the engine (Draining: the server is shutting down)."""
        waiting = [m for _, members, _ in self.pending.values() for m in members] + \
                  [m for members in self.outbox.values() for m in members]
        for m in waiting:
            if not m[1].done():
                m[1].set_exception(error or Draining())

    async def stop(self):
        if self.writer is not None:
            self.writer.close()
        if self.task is not None:
            self.task.cancel()

    def close(self):
        pass


class Region:
    """A front end's shared memory for images: a memfd the engine maps read-only through /proc,
    given out first fit (a few groups are in flight at once)."""
    ALIGN = 64

    def __init__(self, size):
        self.fd = os.memfd_create("cnninfer-images", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, size)
            self.bytes = np.frombuffer(mmap.mmap(self.fd, size), np.uint8)
        except OSError:
            os.close(self.fd)
            raise
        self.path = f"/proc/{os.getpid()}/fd/{self.fd}"
        self.free = [(0, size)]  # (start, end) of each free extent, in order

    def take(self, size):
        """The offset of `size` bytes not in use, or None where no extent holds them."""
        size = -(-size // self.ALIGN) * self.ALIGN
        for i, (start, end) in enumerate(self.free):
            if end - start >= size:
                if end - start == size:
                    del self.free[i]
                else:
                    self.free[i] = (start + size, end)
                return start
        return None

    def give(self, start, size):
        """Bytes from take() free again (merged with the free extents beside them)."""
        end = start + -(-size // self.ALIGN) * self.ALIGN
        i = bisect.bisect(self.free, (start, end))
        if i < len(self.free) and self.free[i][0] == end:
            end = self.free.pop(i)[1]
        if i > 0 and self.free[i - 1][1] == start:
            start = self.free.pop(i - 1)[0]
            i -= 1
        self.free.insert(i, (start, end))

    def close(self):
        os.close(self.fd)
