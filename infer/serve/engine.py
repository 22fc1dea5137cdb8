"""One engine process behind several HTTP front ends (`cnninfer serve --workers N`, N > 1).

A front end (a process running the HTTP and gRPC app) reads, checks and decodes requests, then
hands each one's images to the engine over a Unix socket; the engine (one process, one Session, so
one CUDA context per GPU) merges the requests of every front end into its batches and sends each
its rows back. Front ends scale the Python that parses requests (~270 us a request, one event loop
each) across cores; the engine keeps the GPU's batches as large as the waiting requests make them.

Frames on a front end's connection, little-endian:
    engine -> front end, once:  u32 length, then JSON {classes, backend, device, max_batch}
    front end -> engine, once:  REQUEST with code ATTACH and N the length of the path that follows:
                                the front end's shared memory for images (a memfd, opened through
                                /proc), answered with kind ATTACHED (or FAILED: none is used)
    front end -> engine:        REQUEST (id, dtype code, flags: 1 scores wanted, 2 images shared;
                                N, H, W, C, timeout s, clients' requests merged in it), then the
                                images' bytes (C order), or, flagged shared, the u64 offset of
                                the images in the shared memory; code STATS (no images):
                                the engine's batch metrics, answered with kind STATS and the text
    engine -> front end:        ANSWER (id, kind, N, bytes after the labels), then the labels
                                (int64, N) and the scores where asked (float32, N x classes); or,
                                for a failure, its one-line message
"""
import asyncio
import bisect
import itertools
import json
import mmap
import os
import struct

import numpy as np

from .batcher import Batcher, Busy, Draining, Expired
from ..errors import InputError, about_request

REQUEST = struct.Struct("<QBBIIIIdI")
OFFSET = struct.Struct("<Q")
ANSWER = struct.Struct("<QBII")
DTYPES = tuple(np.dtype(t).newbyteorder("<") for t in ("u1", "i1", "u2", "i2", "u4", "i4", "u8", "i8", "f2", "f4", "f8"))
CODES = {d: i for i, d in enumerate(DTYPES)}
STATS_CODE, ATTACH_CODE = 255, 254
SCORES, SHARED = 1, 2  # REQUEST's flags
OK, INPUT, BUSY, EXPIRED, DRAINING, FAILED, STATS, ATTACHED = range(8)
SPARE_BYTES = 256 << 20
SHARED_BYTES = 64 << 20  # a front end's shared memory for images; its pages are touched as used
SHARED_MIN = 64 << 10  # smaller requests' images go on the socket: a write either way


class Engine:
    """The engine's side: a Batcher over the session, served on a Unix socket."""

    def __init__(self, session, settings, pad_to=None):
        self.session, self.settings = session, settings
        self.classes = session.classes
        from .metrics import Metrics

        self.metrics = Metrics(settings.max_batch)  # the batches', reported to the front ends' /metrics
        self.batcher = Batcher(session.classify, settings.max_batch, settings.max_delay_ms / 1e3,
                               metrics=self.metrics, thread=session.executor, pad_to=pad_to)
        self.hello = json.dumps(dict(classes=self.classes, backend=session.backend.name,
                                     device=session.device)).encode()
        self.server = None
        self.connections = set()
        self.spare = {}  # size -> buffers of large requests answered, for the next ones (see Link)
        self.spare_bytes = 0

    async def start(self, path):
        self.batcher.start()
        self.server = await asyncio.get_running_loop().create_unix_server(lambda: Link(self), path=path)

    async def stop(self):
        """Stop taking connections, answer what is queued, close."""
        if self.server is not None:
            self.server.close()
        await self.batcher.stop()
        for link in list(self.connections):
            link.transport.close()
        self.batcher.close()

    def take(self, size):
        """A buffer of `size` bytes for a large request: one given back, else a new one."""
        kept = self.spare.get(size)
        if kept:
            self.spare_bytes -= size
            return kept.pop()
        return bytearray(size)

    def give(self, buf):
        """A large request's buffer, its pass done with it (kept up to SPARE_BYTES in all)."""
        if self.spare_bytes + len(buf) <= SPARE_BYTES:
            self.spare.setdefault(len(buf), []).append(buf)
            self.spare_bytes += len(buf)

    def request(self, link, head, body, taken=None, shared=False):
        """A request read whole: its REQUEST fields, its images' bytes (None for STATS); taken: the
        buffer under them where it came from take(); shared: they lie in the front end's shared
        memory, which it reuses once the request is answered."""
        rid, code, flags, n, h, w, c, timeout, requests = head
        if code == STATS_CODE:
            text = self.metrics.batch_text().encode()
            link.transport.write(ANSWER.pack(rid, STATS, 0, len(text)) + text)
            return
        x = np.frombuffer(body, DTYPES[code]).reshape(n, h, w, c)
        asyncio.get_running_loop().create_task(self._answer(link.transport, rid, x, bool(flags & SCORES),
                                                            timeout or None, requests, taken, shared))

    async def _answer(self, writer, rid, x, scores, timeout, requests, taken=None, shared=False):
        try:
            labels, kept = await self.batcher.submit(x, scores, timeout, requests)
            if taken is not None:  # answered: its pass has read the images (not so when it failed
                self.give(taken)   # or expired: a pass may still be reading them)
        except Exception as e:
            kind = (INPUT if isinstance(e, InputError) else BUSY if isinstance(e, Busy) else
                    EXPIRED if isinstance(e, Expired) else DRAINING if isinstance(e, Draining) else FAILED)
            message = (about_request(e) if isinstance(e, InputError) else
                       " ".join(f"{type(e).__name__}: {e}".split())).encode()
            if shared:  # the front end reuses the memory once answered: not while a pass reads it
                await self.batcher.released(x)
            writer.write(ANSWER.pack(rid, kind, 0, len(message)) + message)
            return
        extra = np.ascontiguousarray(kept, "<f4").tobytes() if scores else b""
        parts = [ANSWER.pack(rid, OK, len(labels), len(extra)), np.ascontiguousarray(labels, "<i8").tobytes(), extra]
        if not writer.is_closing():
            writer.write(b"".join(parts))


class Link(asyncio.BufferedProtocol):
    """The engine's end of one front end's connection. The socket is read into a staging buffer
    where requests are parsed; a large request's images come in the front end's shared memory, or
    past it are read by the socket straight into their own array (asyncio's streams copied each
    byte twice more, and were the engine's busiest code under 4096-image requests)."""
    STAGING = 1 << 18

    def __init__(self, engine):
        self.engine = engine
        self.staging = bytearray(self.STAGING)
        self.view = memoryview(self.staging)
        self.have = 0  # bytes in staging not parsed yet
        self.body = self.head = None  # a request whose images are being read straight in
        self.filled = 0  # bytes of self.body read
        self.transport = None
        self.shared = None  # the front end's shared memory, read-only (np.uint8), once attached

    def connection_made(self, transport):
        self.transport = transport
        self.engine.connections.add(self)
        hello = self.engine.hello
        transport.write(struct.pack("<I", len(hello)) + hello)

    def connection_lost(self, exc):
        self.engine.connections.discard(self)

    def attach(self, rid, path):
        """Map the front end's shared memory (its memfd, through /proc) and say whether it worked."""
        try:
            fd = os.open(path, os.O_RDONLY)
            try:
                self.shared = np.frombuffer(mmap.mmap(fd, 0, prot=mmap.PROT_READ), np.uint8)
            finally:
                os.close(fd)
            self.transport.write(ANSWER.pack(rid, ATTACHED, 0, 0))
        except (OSError, ValueError) as e:
            message = f"shared memory not mapped: {type(e).__name__}".encode()
            self.transport.write(ANSWER.pack(rid, FAILED, 0, len(message)) + message)

    def get_buffer(self, sizehint):
        return self.body[self.filled:] if self.body is not None else self.view[self.have:]

    def buffer_updated(self, nbytes):
        if self.body is not None:
            self.filled += nbytes
            if self.filled == len(self.body):
                body, head, self.body, self.head = self.body, self.head, None, None
                self.engine.request(self, head, body, body.obj)
            return
        self.have += nbytes
        at = 0
        while self.have - at >= REQUEST.size:
            head = REQUEST.unpack_from(self.staging, at)
            rid, code, flags, n, h, w, c, _, _ = head
            size = (n if code == ATTACH_CODE else 0 if code == STATS_CODE else
                    OFFSET.size if flags & SHARED else n * h * w * c * DTYPES[code].itemsize)
            start = at + REQUEST.size
            if code == ATTACH_CODE or flags & SHARED:  # a few bytes, all in the staging buffer
                if self.have - start < size:
                    break
                at = start + size
                if code == ATTACH_CODE:
                    self.attach(rid, bytes(self.view[start:at]).decode())
                else:
                    self.shared_request(head, OFFSET.unpack_from(self.staging, start)[0])
                continue
            at = start
            if size <= self.have - at:  # all here: a copy of its own (the staging is reused)
                self.engine.request(self, head, bytes(self.view[at:at + size]) if size else None)
                at += size
                continue
            # the rest is read straight into a buffer of its own; reused, as a new one's pages fault
            # in as the socket first writes them (13% of the engine's time under 4096-image requests)
            body = memoryview(self.engine.take(size))
            self.filled = self.have - at
            body[:self.filled] = self.view[at:self.have]
            self.body, self.head, at = body, head, self.have
            break
        rest = self.have - at
        if rest and at:
            self.staging[:rest] = self.staging[at:self.have]
        self.have = rest

    def shared_request(self, head, offset):
        rid, code, _, n, h, w, c, _, _ = head
        size = n * h * w * c * DTYPES[code].itemsize
        if self.shared is None or offset + size > len(self.shared):
            message = b"images outside the shared memory"
            self.transport.write(ANSWER.pack(rid, FAILED, 0, len(message)) + message)
            return
        self.engine.request(self, head, self.shared[offset:offset + size], shared=True)


class RemoteBatcher:
    """A front end's stand-in for Batcher: submit() hands the images to the engine and waits for its
    answer (Expired past the timeout, Draining once abandoned). Connects as the app starts.

    Requests of one image type and shape go to the engine together, as one request of all their
    images: while MAX_IN_FLIGHT of this front end's groups are in the engine, new ones wait in the
    outbox and leave with the next answer. A lone request leaves at once; under load the engine's
    work per request (its event loop is the server's narrowest point) is divided by the group's
    size. A group refused for one request's input is sent again request by request, so only
    that request fails.

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
        try:
            return await self._wait(lambda future: self.outbox.setdefault(key, []).append((x, future, timeout)),
                                    timeout)
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
                    outcome = _error(kind, (await self.reader.readexactly(size)).decode())
                else:
                    labels = np.frombuffer(await self.reader.readexactly(8 * n), "<i8")
                    kept = np.frombuffer(await self.reader.readexactly(size), "<f4").reshape(n, classes) if size else None
                    outcome = labels, kept
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


def _error(kind, message):
    if kind == INPUT:
        return InputError(message)
    if kind == BUSY:
        return Busy(message)
    if kind == EXPIRED:
        return Expired(message)
    if kind == DRAINING:
        return Draining()
    return RuntimeError(message)
