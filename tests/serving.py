"""A real `cnninfer serve` process on 127.0.0.1 (a free port) for the tests, and request helpers."""
import io
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

from infer.bench.serve import npy  # noqa: F401  (the tests' .npy bodies, as the bench sends them)
from tests.conftest import REPO

STARTUP_S = 60
TOKEN = "t0ken"
# The bounds the hostile-client tests count on: 24 calls at once, 1 s for a header or a body, a token.
TIGHT = ("--backend", "cpu", "--max-connections", "24", "--header-timeout-s", "1", "--body-timeout-s", "1",
         "--token", TOKEN)


class Server:
    def __init__(self, model, *options):
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        grpc = [] if "--grpc-port" in options or "--no-grpc" in options else ["--grpc-port", "0"]
        self.proc = subprocess.Popen([sys.executable, "-m", "infer", "serve", str(model), "--port", "0", *grpc, *options],
                                     cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.stderr = []
        lines = queue.Queue()
        threading.Thread(target=self._pump, args=(self.proc.stdout, lines), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, self.stderr), daemon=True).start()
        self.first_line = self.url = None
        try:
            self.first_line = lines.get(timeout=STARTUP_S)
        except queue.Empty:
            pass
        if not self.first_line or "http://" not in self.first_line:
            self.stop()
            raise RuntimeError(f"the server did not start: {self.first_line!r} {''.join(self.stderr)}")
        self.url = self.first_line.split("listening on ")[1].split()[0]
        self.grpc = None  # host:port of the gRPC service, from the line under the HTTP one
        from infer.serve.server import grpc_available

        if "--no-grpc" not in options and grpc_available():
            try:
                second = lines.get(timeout=STARTUP_S)
            except queue.Empty:
                second = ""
            if "grpc://" in second:
                self.grpc = second.split("grpc://")[1].split()[0]
            self.second_line = second

    @staticmethod
    def _pump(stream, sink):
        for line in stream:
            sink.put(line) if isinstance(sink, queue.Queue) else sink.append(line)

    def signal(self, sig=signal.SIGTERM):
        self.proc.send_signal(sig)

    def stop(self, timeout=30):
        """SIGTERM, then the exit code (killed after timeout)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


NPY = {"Content-Type": "application/x-npy"}


def serving(model, *options):
    """A Server for a module's fixture (yield from it): stopped at the module's end, exiting 0."""
    s = Server(model, *options)
    yield s
    assert s.stop() == 0, "".join(s.stderr)


def png(gray_u8):
    from PIL import Image

    b = io.BytesIO()
    Image.fromarray(gray_u8).save(b, "PNG")
    return b.getvalue()


def answers_of_test100(ece408):
    """test100's images and the command line's predictions and scores for them (CPU backend)."""
    import h5py

    import infer

    with h5py.File(ece408 / "test100.hdf5") as f:
        x = f["x"][()]
    cli = infer.run(ece408 / "test100.hdf5", ece408 / "model.hdf5", backend="cpu", scores=True)
    return x, cli.predictions, cli.scores


def by_label(server, metric, label, token=TOKEN):
    """{label's value: count} of one labelled metric in /metrics (of whichever front end answers)."""
    import httpx

    text = httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {token}"}).text
    return {m[0]: int(m[1]) for m in re.findall(rf'^cnninfer_{metric}\{{{label}="(\w+)"\}} (\d+)$', text, re.M)}


def wait_for(predicate, timeout=10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.02)
    return False


class StalledCall:
    """A hostile gRPC client on a connection of its own, raw HTTP/2: one ModelInfer call whose
    message declares `declared` bytes, of which it sends all but the last as fast as the server's
    flow-control windows allow, and never the rest (declared None: the call ends with its headers,
    no message sent). pump() sends what the windows allow and reads what came back; `status` is the
    call's grpc-status once the server ended it (None before)."""

    PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

    def __init__(self, address, declared, token=None):
        import socket

        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=5)
        self.sock.setblocking(False)
        self.left, self.status, self.message, self.inbox = max(0, (declared or 0) - 1), None, None, b""
        self.conn_window = self.stream_window = 65535
        headers = [(":method", "POST"), (":scheme", "http"), (":path", "/inference.GRPCInferenceService/ModelInfer"),
                   (":authority", address), ("content-type", "application/grpc"), ("te", "trailers")]
        if token:
            headers.append(("authorization", f"Bearer {token}"))
        block = b"".join(b"\0" + self._string(k) + self._string(v) for k, v in headers)  # literals, not indexed
        if declared is None:  # END_HEADERS | END_STREAM
            self.out = self.PREFACE + self._frame(4, 0, 0, b"") + self._frame(1, 5, 1, block)
            return
        self.out = (self.PREFACE + self._frame(4, 0, 0, b"") + self._frame(1, 4, 1, block)
                    + self._frame(0, 0, 1, b"\0" + declared.to_bytes(4, "big")))
        self.stream_window -= 5
        self.conn_window -= 5

    @staticmethod
    def _string(s):
        b = s.encode()
        assert len(b) < 127
        return bytes([len(b)]) + b

    @staticmethod
    def _frame(kind, flags, stream, payload):
        return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload

    def pump(self):
        try:
            while True:
                data = self.sock.recv(1 << 16)
                if not data:
                    break
                self.inbox += data
        except (BlockingIOError, OSError):
            pass
        while len(self.inbox) >= 9 and len(self.inbox) >= 9 + int.from_bytes(self.inbox[:3], "big"):
            n = int.from_bytes(self.inbox[:3], "big")
            kind, flags, stream = self.inbox[3], self.inbox[4], int.from_bytes(self.inbox[5:9], "big") & 0x7FFFFFFF
            payload, self.inbox = self.inbox[9:9 + n], self.inbox[9 + n:]
            if kind == 4 and not flags & 1:  # SETTINGS: INITIAL_WINDOW_SIZE moves the stream's window
                for i in range(0, len(payload), 6):
                    if int.from_bytes(payload[i:i + 2], "big") == 4:
                        self.stream_window += int.from_bytes(payload[i + 2:i + 6], "big") - 65535
                self.out += self._frame(4, 1, 0, b"")
            elif kind == 6 and not flags & 1:  # PING
                self.out += self._frame(6, 1, 0, payload)
            elif kind == 8:  # WINDOW_UPDATE
                increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
                if stream == 0:
                    self.conn_window += increment
                else:
                    self.stream_window += increment
            elif kind == 1 and stream == 1:  # the answer's headers or trailers: grpc-status in literals
                found = re.search(rb"grpc-status.?(\d+)", payload)
                if found:
                    self.status = int(found.group(1))
                at = payload.find(b"grpc-message")
                if at >= 0 and payload[at + 12] < 127:  # a literal, not Huffman-coded
                    n = payload[at + 12]
                    self.message = payload[at + 13:at + 13 + n].decode()
            elif kind == 3 and stream == 1 and self.status is None:  # RST_STREAM without trailers
                self.status = -1
        if self.status is None:
            n = min(self.left, self.conn_window, self.stream_window, 1 << 20)
            for at in range(0, n, 16384):
                self.out += self._frame(0, 0, 1, bytes(min(16384, n - at)))
            self.left -= n
            self.conn_window -= n
            self.stream_window -= n
        try:
            sent = self.sock.send(self.out)
            self.out = self.out[sent:]
        except (BlockingIOError, OSError):
            pass

    def close(self):
        self.sock.close()


def pump(calls, seconds, until=lambda: False):
    """Pump every StalledCall for `seconds`, or until until() holds."""
    end = time.monotonic() + seconds
    while time.monotonic() < end and not until():
        for c in calls:
            c.pump()
        time.sleep(0.002)


class H2:
    """A raw HTTP/2 client on a connection of its own, to do what a gRPC library would not: small
    windows, chosen header blocks, resets, pings, bad frames. Each stream's answer is gathered in
    `streams[id]`: "headers" (each block, decoded), "data", "reset" (RST_STREAM's code); `goaway`
    holds (last stream, code) once the server sent it, `closed` whether it closed the connection.
    `auto_window`: every DATA frame's bytes given back at once, connection and stream."""

    PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

    def __init__(self, address, settings=(), auto_window=True):
        import socket

        from hpack import Decoder

        host, port = address.rsplit(":", 1)
        self.address, self.auto_window = address, auto_window
        self.sock = socket.create_connection((host, int(port)), timeout=5)
        self.decoder, self.inbox = Decoder(), b""
        self.streams, self.goaway, self.closed, self.pings = {}, None, False, []
        self.data_sizes = []  # (stream, bytes) of every DATA frame, in order
        self.conn_window, self.windows = 65535, {}  # what the server lets us send: the connection, each stream
        self.send(self.PREFACE + self.frame(4, 0, 0, b"".join(k.to_bytes(2, "big") + v.to_bytes(4, "big")
                                                               for k, v in settings)))

    @staticmethod
    def frame(kind, flags, stream, payload=b""):
        return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload

    @staticmethod
    def literal(name, value, indexed=False):
        """A header field as a literal, its name new: with incremental indexing (into the server's
        HPACK table) or without."""
        name, value = name.encode(), value.encode()
        assert len(name) < 127 and len(value) < 127
        return (b"\x40" if indexed else b"\0") + bytes([len(name)]) + name + bytes([len(value)]) + value

    def block(self, method, token=None):
        fields = [(":method", "POST"), (":scheme", "http"), (":path", f"/inference.GRPCInferenceService/{method}"),
                  (":authority", self.address), ("content-type", "application/grpc"), ("te", "trailers")]
        if token:
            fields.append(("authorization", f"Bearer {token}"))
        return b"".join(self.literal(k, v) for k, v in fields)

    def call(self, stream, block, message=b"", end=True, compressed=False, declared=None):
        """HEADERS (the block as given), then the message with its prefix (`declared` its length,
        else the message's) in DATA frames of 16 KiB, END_STREAM where `end`; within the server's
        first windows (64 KiB)."""
        body = bytes([compressed]) + (len(message) if declared is None else declared).to_bytes(4, "big") + message
        assert len(body) < 65535
        parts = [body[i:i + 16384] for i in range(0, len(body), 16384)]
        self.send(self.frame(1, 4, stream, block) + b"".join(
            self.frame(0, 1 if end and i == len(parts) - 1 else 0, stream, part) for i, part in enumerate(parts)))

    def send_message(self, stream, block, message, timeout=10.0):
        """HEADERS, then the message in DATA frames as the server's windows let them go (reading
        its WINDOW_UPDATEs between), END_STREAM on the last; stops once the call has a status."""
        body = b"\0" + len(message).to_bytes(4, "big") + message
        self.send(self.frame(1, 4, stream, block))
        sent, end = 0, time.monotonic() + timeout
        while sent < len(body) and self.status(stream) is None:
            room = min(self.conn_window, self.windows.get(stream, 65535), 16384, len(body) - sent)
            if room <= 0:
                before = (self.conn_window, self.windows.get(stream))
                assert self.read(lambda c: (c.conn_window, c.windows.get(stream)) != before
                                 or c.status(stream) is not None, end - time.monotonic()), "no window came"
                continue
            self.send(self.frame(0, 1 if sent + room == len(body) else 0, stream, body[sent:sent + room]))
            sent += room
            self.conn_window -= room
            self.windows[stream] = self.windows.get(stream, 65535) - room

    def send(self, data):
        self.sock.sendall(data)

    def read(self, until, timeout=5.0):
        """Read frames until until(self) holds (True) or `timeout` s pass (False)."""
        import socket

        end = time.monotonic() + timeout
        while not until(self):
            left = end - time.monotonic()
            if left <= 0 or self.closed:
                return until(self)
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(1 << 16)
            except socket.timeout:
                continue
            except OSError:
                data = b""
            if not data:
                self.closed = True
                continue
            self.inbox += data
            self._frames()
        return True

    def _frames(self):
        while len(self.inbox) >= 9 and len(self.inbox) >= 9 + int.from_bytes(self.inbox[:3], "big"):
            n = int.from_bytes(self.inbox[:3], "big")
            kind, flags, stream = self.inbox[3], self.inbox[4], int.from_bytes(self.inbox[5:9], "big") & 0x7FFFFFFF
            payload, self.inbox = self.inbox[9:9 + n], self.inbox[9 + n:]
            s = self.streams.setdefault(stream, {"headers": [], "data": b"", "reset": None}) if stream else None
            if kind == 1:
                s["headers"].append(dict((k.decode(), v.decode()) for k, v in self.decoder.decode(payload, raw=True)))
            elif kind == 0:
                s["data"] += payload
                self.data_sizes.append((stream, n))
                if self.auto_window and n:
                    self.send(self.frame(8, 0, 0, n.to_bytes(4, "big")) + self.frame(8, 0, stream, n.to_bytes(4, "big")))
            elif kind == 3:
                s["reset"] = int.from_bytes(payload, "big")
            elif kind == 8:
                step = int.from_bytes(payload, "big") & 0x7FFFFFFF
                if stream:
                    self.windows[stream] = self.windows.get(stream, 65535) + step
                else:
                    self.conn_window += step
            elif kind == 4 and not flags & 1:
                self.send(self.frame(4, 1, 0))
            elif kind == 6 and flags & 1:
                self.pings.append(payload)
            elif kind == 7:
                self.goaway = (int.from_bytes(payload[:4], "big") & 0x7FFFFFFF, int.from_bytes(payload[4:8], "big"))

    def status(self, stream):
        """The call's grpc-status (its trailers'), or None."""
        for block in self.streams.get(stream, {}).get("headers", ()):
            if "grpc-status" in block:
                return int(block["grpc-status"])
        return None

    def message(self, stream):
        """The answer's message: its DATA without the 5-byte prefix."""
        data = self.streams[stream]["data"]
        assert data[0] == 0 and int.from_bytes(data[1:5], "big") == len(data) - 5
        return data[5:]

    def close(self):
        self.sock.close()
