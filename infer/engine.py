"""One engine process behind several HTTP front ends (`cnninfer serve --workers N`, N > 1).

A front end (a process running the HTTP and gRPC app) reads, checks and decodes requests, then
hands each one's images to the engine over a Unix socket; the engine (one process, one Session, so
one CUDA context per GPU) merges the requests of every front end into its batches and sends each
its rows back. Front ends scale the Python that parses requests (~270 us a request, one event loop
each) across cores; the engine keeps the GPU's batches as large as the waiting requests make them.

Frames on a front end's connection, little-endian:
    engine -> front end, once:  u32 length, then JSON {classes, backend, device, max_batch}
    front end -> engine:        REQUEST (id, dtype code, scores wanted, N, H, W, C, timeout s),
                                then the images' bytes (C order); dtype code STATS (no images):
                                the engine's batch metrics, answered with kind STATS and the text
    engine -> front end:        ANSWER (id, kind, N, bytes after the labels), then the labels
                                (int64, N) and the scores where asked (float32, N x classes); or,
                                for a failure, its one-line message
"""
import asyncio
import itertools
import json
import struct

import numpy as np

from .batcher import Batcher, Busy, Draining, Expired
from .errors import InputError, about_request

REQUEST = struct.Struct("<QBBIIIId")
ANSWER = struct.Struct("<QBII")
DTYPES = tuple(np.dtype(t).newbyteorder("<") for t in ("u1", "i1", "u2", "i2", "u4", "i4", "u8", "i8", "f2", "f4", "f8"))
CODES = {d: i for i, d in enumerate(DTYPES)}
STATS_CODE = 255
OK, INPUT, BUSY, EXPIRED, DRAINING, FAILED, STATS = range(7)


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

    async def start(self, path):
        self.batcher.start()
        self.server = await asyncio.start_unix_server(self._serve, path=path)

    async def stop(self):
        """Stop taking connections, answer what is queued, close."""
        if self.server is not None:
            self.server.close()
        await self.batcher.stop()
        for w in list(self.connections):
            w.close()
        self.batcher.close()

    async def _serve(self, reader, writer):
        self.connections.add(writer)
        writer.write(struct.pack("<I", len(self.hello)) + self.hello)
        try:
            while True:
                try:
                    head = await reader.readexactly(REQUEST.size)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                rid, code, scores, n, h, w, c, timeout = REQUEST.unpack(head)
                if code == STATS_CODE:
                    text = self.metrics.batch_text().encode()
                    writer.write(ANSWER.pack(rid, STATS, 0, len(text)) + text)
                    continue
                dtype = DTYPES[code]
                body = await reader.readexactly(n * h * w * c * dtype.itemsize)
                x = np.frombuffer(body, dtype).reshape(n, h, w, c)
                asyncio.get_running_loop().create_task(self._answer(writer, rid, x, bool(scores), timeout or None))
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            self.connections.discard(writer)

    async def _answer(self, writer, rid, x, scores, timeout):
        try:
            labels, kept = await self.batcher.submit(x, scores, timeout)
        except Exception as e:
            kind = (INPUT if isinstance(e, InputError) else BUSY if isinstance(e, Busy) else
                    EXPIRED if isinstance(e, Expired) else DRAINING if isinstance(e, Draining) else FAILED)
            message = (about_request(e) if isinstance(e, InputError) else
                       " ".join(f"{type(e).__name__}: {e}".split())).encode()
            writer.write(ANSWER.pack(rid, kind, 0, len(message)) + message)
            return
        extra = np.ascontiguousarray(kept, "<f4").tobytes() if scores else b""
        parts = [ANSWER.pack(rid, OK, len(labels), len(extra)), np.ascontiguousarray(labels, "<i8").tobytes(), extra]
        if not writer.is_closing():
            writer.write(b"".join(parts))


class RemoteBatcher:
    """A front end's stand-in for Batcher: submit() sends the images to the engine and waits for its
    answer (Expired past the timeout, Draining once abandoned). Connects as the app starts."""

    def __init__(self, path):
        self.path = path
        self.expecting = 0  # the app counts requests being received; the engine batches by its queue
        self.metrics = None
        self.hello = None
        self.reader = self.writer = self.task = None
        self.pending = {}
        self.ids = itertools.count()
        self.gone = None  # the error every request gets once the engine's connection has ended

    async def start(self):
        self.reader, self.writer = await asyncio.open_unix_connection(self.path)
        (size,) = struct.unpack("<I", await self.reader.readexactly(4))
        self.hello = json.loads(await self.reader.readexactly(size))
        self.task = asyncio.get_running_loop().create_task(self._read())

    async def submit(self, x, scores=False, timeout=None):
        x = np.ascontiguousarray(x, np.dtype(x.dtype).newbyteorder("<"))
        try:
            return await self._ask(CODES[x.dtype], x.shape, scores, timeout, memoryview(x).cast("B"))
        except TimeoutError:
            raise Expired(f"not answered within {timeout:g} s") from None

    async def stats(self):
        """The engine's batch metrics, as Prometheus text."""
        return await self._ask(STATS_CODE, timeout=10)

    async def _ask(self, code, shape=(0, 0, 0, 0), scores=False, timeout=None, payload=None):
        """Send one request (its images after it) and wait for its answer (TimeoutError past timeout)."""
        if self.gone is not None:
            raise self.gone
        rid = next(self.ids)
        future = self.pending[rid] = asyncio.get_running_loop().create_future()
        self.writer.write(REQUEST.pack(rid, code, int(scores), *shape, timeout or 0.0))
        if payload is not None:
            self.writer.write(payload)
        try:
            async with asyncio.timeout(timeout):
                return await future
        finally:
            self.pending.pop(rid, None)

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
                future = self.pending.get(rid)  # None where its caller stopped waiting
                if future is not None and not future.done():
                    (future.set_exception if isinstance(outcome, Exception) else future.set_result)(outcome)
        except (asyncio.IncompleteReadError, ConnectionError):
            self.gone = RuntimeError("the engine process went away")
            self.abandon(self.gone)

    def abandon(self, error=None):
        """Fail every request waiting for the engine (Draining: the server is shutting down)."""
        for future in list(self.pending.values()):
            if not future.done():
                future.set_exception(error or Draining())

    async def stop(self):
        if self.writer is not None:
            self.writer.close()
        if self.task is not None:
            self.task.cancel()

    def close(self):
        pass


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
