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


def png(gray_u8):
    from PIL import Image

    b = io.BytesIO()
    Image.fromarray(gray_u8).save(b, "PNG")
    return b.getvalue()


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
