"""A real `cnninfer serve` process on 127.0.0.1 (a free port) for the tests, and request helpers."""
import io
import os
import queue
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
