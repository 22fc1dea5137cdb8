"""gRPC's unary calls served over HTTP/2 by a front end's own event loop (an asyncio Protocol),
in place of grpc.aio, whose C core and the Python around it took 75-80% of a front end's busy
time per call (py-spy on the 16-core H200 host) and held gRPC under 30k calls/s at 256 in flight.

Spoken: HTTP/2 (RFC 9113) in cleartext with prior knowledge, as gRPC clients speak it; gRPC's
unary calls: a request's headers and one length-prefixed message, answered with headers, one
message and trailers (grpc-status, grpc-message), or trailers alone for an error. Not spoken:
TLS, compressed messages (UNIMPLEMENTED), server push; priorities are read and ignored.

Bounds (each a serve option's, or HTTP's own):
- connections: at most `cap` open, those past it closed as accepted (counted); the preface
  within the header timeout; closed with GOAWAY after `idle_s` without a call;
- a header block: MAX_HEADER_BYTES (SETTINGS_MAX_HEADER_LIST_SIZE), its HPACK table 4 KiB;
- calls: MAX_STREAMS on a connection (SETTINGS_MAX_CONCURRENT_STREAMS, past it REFUSED_STREAM),
  `max_calls` in the process (past it RESOURCE_EXHAUSTED);
- a message's bytes: a call's stream window stays HTTP/2's first 64 KiB, and the bytes it has
  sent stay outside its connection's window (256 KiB), until its handler accepts the message
  (server.Message, once the message's size has room in the budget); then both open for it alone;
- answers waiting for the client's window: each keeps its own size of its message's bytes held in
  the budget (Call.keep) until it is sent;
- answers a client does not read: past the transport's high-water mark its connection stops being
  read until they drain.
"""
import asyncio
import struct

from hpack import Decoder
from hpack.exceptions import HPACKError, InvalidTableIndex, OversizedHeaderListError

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITIZED = 0x4, 0x8, 0x20
NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = (
    0, 1, 3, 6, 7, 8, 9)
MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = 3, 4, 5, 6  # SETTINGS ids

WINDOW = 65535  # HTTP/2's first window, of a stream and of a connection
CONNECTION_WINDOW = 256 << 10  # bytes a connection may have in flight to us
MIN_UPDATE = 32 << 10  # the connection's window is topped up by at least this much a time
MAX_FRAME = 16384  # the largest frame we read (HTTP/2's first SETTINGS_MAX_FRAME_SIZE, left as is)
MAX_STREAMS = 256
MAX_HEADER_BYTES = 16 << 10
CODES = {"OK": 0, "CANCELLED": 1, "UNKNOWN": 2, "INVALID_ARGUMENT": 3, "DEADLINE_EXCEEDED": 4, "NOT_FOUND": 5,
         "RESOURCE_EXHAUSTED": 8, "UNIMPLEMENTED": 12, "INTERNAL": 13, "UNAVAILABLE": 14, "UNAUTHENTICATED": 16}

_HEAD = struct.Struct(">IBI")  # a frame's 9-byte header: (length << 8 | type), flags, stream
_PREFIX = struct.Struct(">BI")  # a gRPC message's: compressed flag, length
_SETTING = struct.Struct(">HI")
_WORD = struct.Struct(">I")


def frame(kind, flags, stream, payload=b""):
    return _HEAD.pack(len(payload) << 8 | kind, flags, stream) + payload


def _integer(n, bits, high=0):
    """HPACK's integer with a `bits`-bit prefix (RFC 7541 5.1), `high` the first byte's other bits."""
    top = (1 << bits) - 1
    if n < top:
        return bytes([high | n])
    out, n = [high | top], n - top
    while n >= 128:
        out.append(n & 127 | 128)
        n >>= 7
    return bytes(out + [n])


def _literal(name, value):
    """A header field as a literal not indexed, its name and value plain (RFC 7541 6.2.2)."""
    return b"\0" + _integer(len(name), 7) + name + _integer(len(value), 7) + value


# The header blocks we send use no dynamic table: fixed bytes, whatever the client's table holds
RESPONSE = b"\x88" + b"\x0f\x10" + _integer(16, 7) + b"application/grpc"  # :status 200 (static 8); content-type (31)
OK_TRAILERS = _literal(b"grpc-status", b"0")


def trailers(code, message):
    """grpc-status and grpc-message (percent-encoded, as gRPC's wire spec says)."""
    text = "".join(c if " " <= c <= "~" and c != "%" else "".join(f"%{b:02X}" for b in c.encode())
                   for c in message).encode()
    return _literal(b"grpc-status", str(code).encode()) + _literal(b"grpc-message", text)


class Abort(Exception):
    """Raised by a handler (Call.abort): the call ends with this gRPC status and message."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code, self.message = code, message


class Call:
    """One call: its path and metadata, its message as it arrives, its answer's flow control.
    The handler reads `size` (the message's length once its prefix arrived, else None), `ended`
    (the client sent all it will), complete(), message(), and awaits changed() between them;
    accept() lets the rest of the message come."""
    __slots__ = ("conn", "id", "path", "metadata", "parts", "received", "size", "window", "held", "accepted",
                 "ended", "waiter", "task", "send_window", "pending", "headed", "compressed",
                 "kept", "gone")

    def __init__(self, conn, stream, path, metadata):
        self.conn, self.id, self.path, self.metadata = conn, stream, path, metadata
        self.parts, self.received, self.size = [], 0, None
        self.window = WINDOW  # what the client may still send on this stream
        self.held = 0  # bytes it sent that its connection's window has not been given back yet
        self.accepted = self.ended = self.headed = self.compressed = False
        self.waiter = self.task = None
        self.send_window = conn.peer_window
        self.pending = None  # the answer's bytes its window has not let go yet
        self.kept = None  # (budget, bytes) held until the call ends
        self.gone = False  # ended and forgotten

    def header(self, name):
        """The value of metadata `name` (lower case), or None."""
        return self.metadata.get(name)

    def complete(self):
        return self.size is not None and self.received >= self.size + 5

    def message(self):
        """The message's bytes (complete() first)."""
        data = self.parts[0] if len(self.parts) == 1 else b"".join(self.parts)
        return data[5:5 + self.size]

    def changed(self):
        """A future done when more of the message arrives, the client ends its side, or resets."""
        self.waiter = self.conn.loop.create_future()
        return self.waiter

    def accept(self):
        """The message is let in: its stream's window opened for all of it, its bytes so far given
        back to the connection's window."""
        self.accepted = True
        want = (self.size + 5 if self.size is not None else WINDOW) - self.received - self.window
        if want > 0:
            self.window += want
            self.conn.write(frame(WINDOW_UPDATE, 0, self.id, _WORD.pack(want)))
        self.conn.give_back(self)

    def abort(self, name, message):
        raise Abort(CODES[name], message)

    def keep(self, budget, n):
        """n bytes of `budget` (its message's) stay held until the call ends: an answer waiting for
        the client's window holds up to that much (as much as its own size)."""
        if self.gone:
            budget.give(n)
        else:
            self.kept = (budget, n)

    def _release(self, down_to=0):
        if self.kept is not None and self.kept[1] > down_to:
            budget, n = self.kept
            budget.give(n - down_to)
            self.kept = (budget, down_to) if down_to else None

    def _wake(self):
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


class Server:
    """The gRPC listener of one front end: `handlers` {path: async fn(call) -> bytes of the answer
    message}; a handler's Abort ends the call with its status; `failed(what, error)` is told of any
    other exception (answered INTERNAL). `refused(reason)` counts a bound's refusal."""

    def __init__(self, handlers, cap, max_calls, handshake_s, idle_s, refused, failed):
        self.handlers, self.cap, self.max_calls = handlers, cap, max_calls
        self.handshake_s, self.idle_s = handshake_s, idle_s
        self.refused, self.failed = refused, failed
        self.connections, self.calls = set(), 0
        self.listener = None
        self.stopping = None  # the future the stop waits on, once stopping

    async def start(self, host, port, reuse_port):
        loop = asyncio.get_running_loop()
        self.listener = await loop.create_server(lambda: Connection(self), host or None, port, backlog=2048,
                                                 reuse_address=True, reuse_port=reuse_port)
        return self.listener.sockets[0].getsockname()[1]

    async def stop(self, grace):
        """GOAWAY on every connection; calls in progress may finish within `grace` s, then those
        left end UNAVAILABLE and every connection closes."""
        loop = asyncio.get_running_loop()
        if self.stopping is None:
            self.stopping = loop.create_future()
            self.listener.close()
            for conn in list(self.connections):
                conn.goaway(NO_ERROR)
            self._check_stopped()
        try:
            await asyncio.wait_for(asyncio.shield(self.stopping), grace)
        except TimeoutError:
            for conn in list(self.connections):
                conn.close_calls(CODES["UNAVAILABLE"], "the server is shutting down; try again")
            await asyncio.sleep(0)  # the answers written, the connections closing
        for conn in list(self.connections):
            conn.transport.close()

    def _check_stopped(self):
        if self.stopping is not None and not self.stopping.done() and self.calls == 0:
            self.stopping.set_result(None)

    async def run(self, call, handler):
        """A call's handler, its answer or status written back."""
        conn = call.conn
        try:
            answer = await handler(call)
        except Abort as e:
            conn.end(call, trailers(e.code, e.message))
        except asyncio.CancelledError:  # the client reset the call or went away, or a stop ended it
            conn.end(call, None)
        except Exception as e:  # a defect: one line on stderr (the handler's `failed`), INTERNAL
            self.failed("a gRPC call", e)
            conn.end(call, trailers(CODES["INTERNAL"], "the server failed to answer this call"))
        else:
            conn.answer(call, answer)


class Connection(asyncio.Protocol):
    """One client connection: HTTP/2 frames in, calls dispatched to the server's handlers."""

    def __init__(self, server):
        self.server = server
        self.loop = asyncio.get_event_loop()
        self.transport = None
        self.buf = b""
        self.preface = False
        self.decoder = None
        self.blocks = {}  # header block bytes -> its calls' (method, path, content-type, metadata)
        self.table = None  # the HPACK table's state the cached blocks were decoded against
        self.streams = {}  # id -> Call
        self.last = 0  # the highest stream a client opened
        self.fragments = None  # (stream, flags, [bytes]) of a header block awaiting CONTINUATION
        self.recv_window = WINDOW  # what the client may still send on the connection
        self.to_give = 0  # bytes received on the connection that its window has not been given back yet
        self.send_window, self.peer_window, self.peer_frame = WINDOW, WINDOW, MAX_FRAME
        self.blocked = []  # calls whose answers wait for a window
        self.out, self.flushing = [], False
        self.going = False  # GOAWAY sent
        self.timer = None
        self.quiet_since = 0.0

    # --- the connection ---

    def connection_made(self, transport):
        server = self.server
        if len(server.connections) >= server.cap or server.stopping is not None:
            server.refused("connections")
            transport.abort()
            return
        self.transport = transport
        server.connections.add(self)
        self.decoder = Decoder()
        self.decoder.max_header_list_size = MAX_HEADER_BYTES
        self.write(frame(SETTINGS, 0, 0, _SETTING.pack(MAX_CONCURRENT_STREAMS, MAX_STREAMS)
                         + _SETTING.pack(MAX_HEADER_LIST_SIZE, MAX_HEADER_BYTES))
                   + frame(WINDOW_UPDATE, 0, 0, _WORD.pack(CONNECTION_WINDOW - WINDOW)))
        self.recv_window = CONNECTION_WINDOW
        self.timer = self.loop.call_later(server.handshake_s, self._handshake_late)

    def connection_lost(self, exc):
        if self.transport is None:
            return
        self.server.connections.discard(self)
        if self.timer is not None:
            self.timer.cancel()
        for call in list(self.streams.values()):
            if call.task is not None and not call.task.done():
                call.task.cancel()  # the client is gone: its handler ends
            else:
                self._forget(call)

    def pause_writing(self):  # answers not read: read no more calls until they drain
        self.transport.pause_reading()

    def resume_writing(self):
        if not self.transport.is_closing():
            self.transport.resume_reading()

    def _handshake_late(self):
        if not self.preface:
            self.server.refused("header_timeout")
            self.transport.close()

    def _idle(self):
        """Closed after idle_s without a call (checked from the last call's end)."""
        if self.streams or self.transport.is_closing():
            self.timer = self.loop.call_later(self.server.idle_s, self._idle)
            return
        left = self.quiet_since + self.server.idle_s - self.loop.time()
        if left > 0:
            self.timer = self.loop.call_later(left, self._idle)
        else:
            self.goaway(NO_ERROR)

    def goaway(self, code):
        """GOAWAY: no new calls; the connection closes once its calls end (at once for an error)."""
        if not self.going:
            self.going = True
            self.write(frame(GOAWAY, 0, 0, _WORD.pack(self.last) + _WORD.pack(code)))
        if code != NO_ERROR or not self.streams:
            self.flush()
            self.transport.close()

    def write(self, data):
        self.out.append(data)
        if not self.flushing:
            self.flushing = True
            self.loop.call_soon(self.flush)

    def flush(self):
        self.flushing = False
        if self.out:
            if not self.transport.is_closing():
                self.transport.write(self.out[0] if len(self.out) == 1 else b"".join(self.out))
            self.out.clear()

    # --- frames in ---

    def data_received(self, data):
        self.flushing = True  # what frames write is sent once, at the end
        try:
            self._received(data)
        finally:
            self.flush()

    def _received(self, data):
        if self.buf:
            data = self.buf + data
        i = 0
        if not self.preface:
            if len(data) < len(PREFACE):
                if not PREFACE.startswith(data):
                    self.transport.close()
                self.buf = data
                return
            if not data.startswith(PREFACE):
                self.transport.close()
                return
            self.preface = True
            self.timer.cancel()
            self.quiet_since = self.loop.time()
            self.timer = self.loop.call_later(self.server.idle_s, self._idle)
            i = len(PREFACE)
        n = len(data)
        try:
            while n - i >= 9:
                word, flags, stream = _HEAD.unpack_from(data, i)
                length, kind = word >> 8, word & 0xFF
                if length > MAX_FRAME:
                    raise Broken(FRAME_SIZE_ERROR)
                if n - i - 9 < length:
                    break
                payload = data[i + 9:i + 9 + length]
                i += 9 + length
                stream &= 0x7FFFFFFF
                if self.fragments is not None and kind != CONTINUATION:
                    raise Broken(PROTOCOL_ERROR)
                if kind == DATA:
                    self._data(stream, flags, payload)
                elif kind == HEADERS:
                    self._headers(stream, flags, payload)
                elif kind == CONTINUATION:
                    self._continuation(stream, flags, payload)
                elif kind == SETTINGS:
                    self._settings(flags, payload)
                elif kind == WINDOW_UPDATE:
                    self._window_update(stream, payload)
                elif kind == PING:
                    if not flags & ACK:
                        self.write(frame(PING, ACK, 0, payload))
                elif kind == RST_STREAM:
                    self._reset(stream)
                elif kind == GOAWAY:
                    self.goaway(NO_ERROR)
                elif kind == PUSH_PROMISE:
                    raise Broken(PROTOCOL_ERROR)
                # PRIORITY and frames of unknown types: ignored
        except Broken as e:
            self.goaway(e.code)
            return
        self.buf = data[i:]
        self._top_up()

    def _data(self, stream, flags, payload):
        size = len(payload)
        self.recv_window -= size
        if self.recv_window < 0:
            raise Broken(FLOW_CONTROL_ERROR)
        if flags & PADDED:
            payload = payload[1:size - payload[0]] if size and payload[0] < size else b""
        call = self.streams.get(stream)
        if call is None or call.ended:  # a call already answered (or never opened): dropped
            if call is None and (stream == 0 or stream > self.last):
                raise Broken(PROTOCOL_ERROR)
            self.to_give += size
            return
        call.window -= size
        if call.window < 0:
            raise Broken(FLOW_CONTROL_ERROR)
        if call.accepted:
            self.to_give += size
        else:
            call.held += size
        if flags & END_STREAM:
            call.ended = True
        if payload and (call.size is None or call.received < call.size + 5):
            call.parts.append(payload)
            call.received += len(payload)
            if call.size is None and call.received >= 5:
                head = call.parts[0] if len(call.parts[0]) >= 5 else b"".join(call.parts)
                call.compressed, call.size = _PREFIX.unpack_from(head)
        call._wake()

    def _headers(self, stream, flags, payload):
        if flags & PADDED:
            pad = payload[0] if payload else 0
            payload = payload[1:len(payload) - pad]
        if flags & PRIORITIZED:
            payload = payload[5:]
        if flags & END_HEADERS:
            self._opened(stream, flags, payload)
        else:
            self.fragments = (stream, flags, [payload], len(payload))

    def _continuation(self, stream, flags, payload):
        if self.fragments is None or self.fragments[0] != stream:
            raise Broken(PROTOCOL_ERROR)
        first, first_flags, parts, size = self.fragments
        parts.append(payload)
        size += len(payload)
        if size > MAX_HEADER_BYTES:
            self.server.refused("header_size")
            raise Broken(PROTOCOL_ERROR)
        self.fragments = (first, first_flags, parts, size)
        if flags & END_HEADERS:
            self.fragments = None
            self._opened(stream, first_flags, b"".join(parts))

    def _decoded(self, block):
        """(method, path, content type, metadata) of a header block. A block that did not change
        the HPACK table is kept: clients send the same indexed bytes call after call, and decoding
        them (hpack, in Python) costs tens of microseconds."""
        known = self.blocks.get(block)
        if known is not None:
            return known
        before = self._table()
        try:
            fields = self.decoder.decode(block, raw=True)
        except OversizedHeaderListError:
            self.server.refused("header_size")
            raise Broken(COMPRESSION_ERROR) from None
        except (HPACKError, InvalidTableIndex, IndexError, ValueError):
            raise Broken(COMPRESSION_ERROR) from None
        headers = {}
        for name, value in fields:
            headers[name.decode("latin-1")] = value.decode("latin-1")
        method, path, kind = headers.pop(":method", None), headers.pop(":path", None), headers.get("content-type", "")
        metadata = {k: v for k, v in headers.items() if not k.startswith(":")}
        known = (method, path, kind, metadata)
        if self._table() != before:
            self.blocks.clear()  # indices into the table moved: what was kept may decode differently now
        elif len(self.blocks) < 64:
            self.blocks[block] = known
        return known

    def _table(self):
        """What the HPACK table holds, as far as indices into it go: its length, newest entry, size."""
        table = self.decoder.header_table
        return len(table.dynamic_entries), table.dynamic_entries[0] if table.dynamic_entries else None, table.maxsize

    def _opened(self, stream, flags, block):
        method, path, kind, metadata = self._decoded(block)  # decoded whatever follows: the table moves on
        if stream in self.streams:  # trailers from the client: a unary call has none
            raise Broken(PROTOCOL_ERROR)
        if stream % 2 == 0 or stream <= self.last:
            raise Broken(PROTOCOL_ERROR)
        self.last = stream
        server = self.server
        if self.going:
            self.write(frame(RST_STREAM, 0, stream, _WORD.pack(REFUSED_STREAM)))
            return
        if len(self.streams) >= MAX_STREAMS:
            self.write(frame(RST_STREAM, 0, stream, _WORD.pack(REFUSED_STREAM)))
            return
        call = Call(self, stream, path, metadata)
        call.ended = bool(flags & END_STREAM)
        self.streams[stream] = call
        server.calls += 1
        if method != "POST" or not kind.startswith("application/grpc"):
            status = b"405" if method != "POST" else b"415"
            self.write(frame(HEADERS, END_HEADERS | END_STREAM, stream, b"\x08" + _integer(3, 7) + status))
            self._close_stream(call)
            return
        handler = server.handlers.get(path)
        if handler is None:
            self.end(call, trailers(CODES["UNIMPLEMENTED"], f"method {path!r} is not served here"))
        elif server.calls > server.max_calls:
            server.refused("busy")
            self.end(call, trailers(CODES["RESOURCE_EXHAUSTED"], f"server busy: {server.max_calls} calls in "
                                                                  f"progress; try again"))
        else:
            call.task = self.loop.create_task(server.run(call, handler))

    def _settings(self, flags, payload):
        if flags & ACK:
            return
        if len(payload) % 6:
            raise Broken(FRAME_SIZE_ERROR)
        for k in range(0, len(payload), 6):
            key, value = _SETTING.unpack_from(payload, k)
            if key == INITIAL_WINDOW_SIZE:
                if value > 0x7FFFFFFF:
                    raise Broken(FLOW_CONTROL_ERROR)
                for call in self.streams.values():
                    call.send_window += value - self.peer_window
                self.peer_window = value
            elif key == MAX_FRAME_SIZE:
                if not MAX_FRAME <= value <= 0xFFFFFF:
                    raise Broken(PROTOCOL_ERROR)
                self.peer_frame = value
        self.write(frame(SETTINGS, ACK, 0))
        if self.blocked:
            self._push()

    def _window_update(self, stream, payload):
        if len(payload) != 4:
            raise Broken(FRAME_SIZE_ERROR)
        step = _WORD.unpack(payload)[0] & 0x7FFFFFFF
        if stream == 0:
            self.send_window += step
        else:
            call = self.streams.get(stream)
            if call is None:
                return
            call.send_window += step
        if self.blocked:
            self._push()

    def _reset(self, stream):
        call = self.streams.get(stream)
        if call is None:
            return
        call.ended = True
        if call.task is not None and not call.task.done():
            call.task.cancel()  # its run() forgets it
        else:
            self._close_stream(call)

    # --- answers out ---

    def answer(self, call, message):
        """The call's answer: headers, its message, trailers OK (as the windows let them go)."""
        if self.streams.get(call.id) is not call:  # reset meanwhile
            return
        body = _PREFIX.pack(0, len(message)) + message
        if len(body) <= self.send_window and len(body) <= call.send_window and len(body) <= self.peer_frame:
            self.send_window -= len(body)
            self.write(frame(HEADERS, END_HEADERS, call.id, RESPONSE) + frame(DATA, 0, call.id, body)
                       + frame(HEADERS, END_HEADERS | END_STREAM, call.id, OK_TRAILERS))
            self._close_stream(call)
            return
        call.pending = memoryview(body)
        call._release(len(body))
        self.blocked.append(call)
        self._push()

    def end(self, call, block):
        """The call ended by trailers `block` alone (an error), or, None, with nothing more sent
        (reset: the client reset it, went away, or a stop ended it)."""
        if self.streams.get(call.id) is not call:  # already ended
            return
        if block is not None:
            self.write(frame(HEADERS, END_HEADERS | END_STREAM, call.id, (b"" if call.headed else RESPONSE) + block))
        else:
            if not call.ended:
                self.write(frame(RST_STREAM, 0, call.id, _WORD.pack(CANCEL)))
            call.ended = True
        self._close_stream(call)

    def _push(self):
        """Send what the windows let go of the answers waiting, in order."""
        for call in list(self.blocked):
            if self.send_window <= 0:
                return
            if not call.headed:
                call.headed = True
                self.write(frame(HEADERS, END_HEADERS, call.id, RESPONSE))
            while call.pending and self.send_window > 0 and call.send_window > 0:
                step = min(len(call.pending), self.send_window, call.send_window, self.peer_frame)
                self.write(frame(DATA, 0, call.id, bytes(call.pending[:step])))
                call.pending = call.pending[step:]
                self.send_window -= step
                call.send_window -= step
            if not call.pending:
                self.blocked.remove(call)
                self.write(frame(HEADERS, END_HEADERS | END_STREAM, call.id, OK_TRAILERS))
                self._close_stream(call)

    def close_calls(self, code, message):
        """Every call still open ends with this status (a stop's grace is over), counted `draining`."""
        for call in list(self.streams.values()):
            self.server.refused("draining")
            if call.task is not None and not call.task.done():
                call.task.cancel()
            if call in self.blocked:
                self.blocked.remove(call)
            self.end(call, trailers(code, message))
        self.flush()

    def give_back(self, call):
        """The bytes a call sent before it was accepted (or that ended it) count in the connection's
        window again."""
        if call.held:
            self.to_give += call.held
            call.held = 0
            self._top_up()

    def _top_up(self):
        """The bytes received that count in the connection's window again, given back to the client
        once there are MIN_UPDATE of them or its window is half spent."""
        if self.to_give >= MIN_UPDATE or (self.to_give and self.recv_window < CONNECTION_WINDOW // 2):
            self.write(frame(WINDOW_UPDATE, 0, 0, _WORD.pack(self.to_give)))
            self.recv_window += self.to_give
            self.to_give = 0

    def _close_stream(self, call):
        """The call's answer is written: if the client is still sending, it is told to stop."""
        if not call.ended:
            call.ended = True
            self.write(frame(RST_STREAM, 0, call.id, _WORD.pack(NO_ERROR)))
        self._forget(call)

    def _forget(self, call):
        if self.streams.pop(call.id, None) is None:
            return
        self.give_back(call)
        call.parts, call.gone = None, True
        call._release()
        server = self.server
        server.calls -= 1
        if not self.streams:
            self.quiet_since = self.loop.time()
            if self.going:
                self.flush()
                self.transport.close()
        if server.stopping is not None:
            server._check_stopped()


class Broken(Exception):
    """A connection error (RFC 9113 5.4.1): GOAWAY with this code, then closed."""

    def __init__(self, code):
        super().__init__(code)
        self.code = code

