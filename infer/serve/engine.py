"""One engine process behind several HTTP front ends (`cnninfer serve --workers N`, N > 1).

A front end (a process running the HTTP and gRPC app, front.py) reads, checks and decodes
requests, then hands each one's images to the engine (wire.py's frames on a Unix socket, large
ones' images in shared memory); the engine (one process, one Session, so one CUDA context per GPU)
merges the requests of every front end into its batches and sends each its rows back. Front ends
scale the Python that parses requests across cores; the engine keeps the GPU's batches as large
as the waiting requests make them.
"""
import asyncio
import json
import mmap
import os
import struct

import numpy as np

from .batcher import Batcher
from .wire import (ANSWER, ATTACH_CODE, ATTACHED, DTYPES, FAILED, INPUT, OFFSET, OK, REQUEST, SCORES, SHARED,
                   STATS, STATS_CODE, kind_of)
from ..errors import about_request

SPARE_BYTES = 256 << 20  # buffers of large requests sent on the socket, kept for the next ones


class Engine:
    """The engine's side: a Batcher over the session, served on a Unix socket."""

    def __init__(self, session, settings, pad_to=None, inline=False):
        """inline: the caller runs the engine's loop on the session's own thread (a GPU session's
        executor): passes, and pinning the front ends' memory, run on the loop, with no hop."""
        self.session, self.settings, self.inline = session, settings, inline
        self.classes = session.classes
        from .metrics import Metrics

        self.metrics = Metrics(settings.max_batch)  # the batches', reported to the front ends' /metrics
        self.batcher = Batcher(session.classify, settings.max_batch, settings.max_delay_ms / 1e3,
                               metrics=self.metrics, thread=session.executor, pad_to=pad_to, inline=inline)
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

    def pin(self, link):
        """Have the session register link's shared memory page-locked (inline: on the session's
        thread; without, a CPU session, there is nothing to pin): the passes upload large requests
        from there directly, with no copy into the session's own page-locked buffer. Done as the
        front end attaches, at start: registering 64 MiB takes the driver 40-50 ms on this thread,
        which at a front end's first large request under load every request in flight waited for."""
        if self.inline and self.session.pin(link.shared):
            link.pinned_bytes = link.shared.nbytes
            self.metrics.pinned += link.pinned_bytes

    def unpin(self, link):
        """Unregister link's shared memory where it was pinned (the front end is gone): a request
        of it still queued is copied out as any other."""
        if link.pinned_bytes:
            self.session.unpin(link.shared)
            self.metrics.pinned -= link.pinned_bytes
            link.pinned_bytes = 0

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
        scores = bool(flags & SCORES)
        try:  # the batcher idle (inline): the pass now, answered in this same turn of the loop
            out = self.batcher.now(x, scores, requests)
        except Exception as e:  # the pass is over: nothing reads x any more
            self._failed(link.transport, rid, e)
            return
        if out is not None:
            if taken is not None:
                self.give(taken)
            self._answered(link.transport, rid, *out, scores)
            return
        asyncio.get_running_loop().create_task(self._answer(link.transport, rid, x, scores,
                                                            timeout or None, requests, taken, shared))

    async def _answer(self, writer, rid, x, scores, timeout, requests, taken=None, shared=False):
        try:
            labels, kept = await self.batcher.submit(x, scores, timeout, requests)
            if taken is not None:  # answered: its pass has read the images (not so when it failed
                self.give(taken)   # or expired: a pass may still be reading them)
        except Exception as e:
            if shared:  # the front end reuses the memory once answered: not while a pass reads it
                await self.batcher.released(x)
            self._failed(writer, rid, e)
            return
        self._answered(writer, rid, labels, kept, scores)

    @staticmethod
    def _failed(writer, rid, e):
        kind = kind_of(e)
        message = (about_request(e) if kind == INPUT else " ".join(f"{type(e).__name__}: {e}".split())).encode()
        writer.write(ANSWER.pack(rid, kind, 0, len(message)) + message)

    @staticmethod
    def _answered(writer, rid, labels, kept, scores):
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
        self.pinned_bytes = 0  # how much of it the session did register

    def connection_made(self, transport):
        self.transport = transport
        self.engine.connections.add(self)
        hello = self.engine.hello
        transport.write(struct.pack("<I", len(hello)) + hello)

    def connection_lost(self, exc):
        self.engine.connections.discard(self)
        self.engine.unpin(self)

    def attach(self, rid, path):
        """Map the front end's shared memory (its memfd, through /proc) and say whether it worked."""
        try:
            fd = os.open(path, os.O_RDONLY)
            try:
                self.shared = np.frombuffer(mmap.mmap(fd, 0, prot=mmap.PROT_READ), np.uint8)
            finally:
                os.close(fd)
            self.engine.pin(self)
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
