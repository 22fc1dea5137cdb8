"""`cnninfer serve` as a user meets it: a real server process on 127.0.0.1 (CPU backend), real HTTP
requests. Answers equal the command line's; bad bodies get their status and one line; the server
stays up; token auth; SIGTERM drains; metrics."""
import asyncio
import re
import signal
import threading
import time

import h5py
import numpy as np
import pytest

import infer
from tests.serving import NPY, Server, npy, png, wait_for

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("PIL")


@pytest.fixture(scope="module")
def data(ece408):
    with h5py.File(ece408 / "test100.hdf5") as f:
        x = f["x"][()]
    cli = infer.run(ece408 / "test100.hdf5", ece408 / "model.hdf5", backend="cpu", scores=True)
    return x, cli.predictions, cli


@pytest.fixture(scope="module")
def server(ece408):
    s = Server(ece408 / "model.hdf5", "--backend", "cpu", "--max-delay-ms", "20", "--max-batch", "64",
               "--max-body-mb", "2")
    yield s
    assert s.stop() == 0, "".join(s.stderr)


def post(server, body, headers=NPY, query="", **kw):
    return httpx.post(f"{server.url}/v1/predict{query}", content=body, headers=headers, timeout=60, **kw)


def test_it_prints_one_line_with_its_url(server):
    assert re.search(r"http://127\.0\.0\.1:\d+ ", server.first_line)
    assert httpx.get(server.url + "/healthz").json() == {"status": "ok"}


def test_npy_requests_equal_the_command_line(server, data):
    x, expected, cli = data
    r = post(server, npy(x), query="?scores=1")
    assert r.status_code == 200
    assert r.json()["labels"] == expected.tolist()
    scores = np.array(r.json()["scores"], np.float32)
    assert scores.shape == (100, 10) and (np.argmax(scores, axis=1) == expected).all()
    # Any integer or float type, converted as the command line converts files
    u8 = np.round(x * 255).astype(np.uint8)
    assert post(server, npy(u8)).json()["labels"] == infer.run(
        cli.data_paths, cli.model_path, backend="cpu").predictions.tolist()
    assert post(server, npy(x.astype(np.float64)[:17])).json()["labels"] == expected[:17].tolist()
    assert post(server, npy(x[:0])).json() == {"labels": []}


def test_png_requests_equal_the_command_line(server, data):
    """An MNIST digit saved as a PNG (its uint8 pixels) gives the array's answer."""
    x, expected, _ = data
    for i in range(0, 100, 7):
        r = post(server, png(np.round(x[i, :, :, 0] * 255).astype(np.uint8)), {"Content-Type": "image/png"})
        assert r.status_code == 200 and r.json() == {"labels": [int(expected[i])]}, i


@pytest.mark.parametrize("shade", [235, 180], ids=["white paper", "grey paper"])
def test_a_photo_like_picture_is_brought_to_mnist_form(server, data, shade):
    """Dark ink on light paper (white, or a grey one of 180/255), larger and off-centre, as JPEG
    and PNG: the digit's class."""
    import io

    from PIL import Image

    x, expected, _ = data
    for i in (0, 1, 2, 3):  # digits the model gets right
        ink = np.round(x[i, :, :, 0] * 255).astype(np.uint8)
        paper = Image.new("L", (300, 220), shade)
        digit = Image.fromarray(np.minimum(255 - ink, shade).astype(np.uint8)).resize((150, 150), Image.BILINEAR)
        paper.paste(digit, (120, 40))
        for fmt, kind in (("PNG", "image/png"), ("JPEG", "image/jpeg")):
            b = io.BytesIO()
            paper.convert("RGB").save(b, fmt)
            r = post(server, b.getvalue(), {"Content-Type": kind})
            assert r.json() == {"labels": [int(expected[i])]}, (i, fmt)


def test_concurrent_single_image_requests_are_batched_and_all_correct(server, data):
    x, expected, _ = data
    before = _metric(server, "cnninfer_batch_requests_count")

    async def main():
        limits = httpx.Limits(max_connections=128)
        async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as client:
            async def one(i):
                r = await client.post("/v1/predict", content=npy(x[i % 100][None]), headers=NPY)
                return r.status_code, r.json()["labels"]
            return await asyncio.gather(*(one(i) for i in range(160)))

    answers = asyncio.run(main())
    assert all(code == 200 for code, _ in answers)
    assert [labels[0] for _, labels in answers] == [int(expected[i % 100]) for i in range(160)]
    passes = _metric(server, "cnninfer_batch_requests_count") - before
    assert passes < 160, "requests arriving together are merged into fewer forward passes"


@pytest.mark.parametrize("body,headers,status,words", [
    (b"hello", NPY, 400, "body: not an .npy array"),
    (npy(np.zeros((2, 28, 28), np.float32)), NPY, 400, "body: shape (2, 28, 28), expected (N, H, W, C) images"),
    (npy(np.zeros((2, 27, 28, 1), np.float32)), NPY, 400, "images of 27x28 flatten to"),
    (npy(np.zeros((2, 28, 28, 3), np.float32)), NPY, 400, "images have 3 channels but the model's conv1 takes 1"),
    (npy(np.full((2, 28, 28, 1), np.inf, np.float32)), NPY, 400, "is inf, not a finite float32 number"),
    (npy(np.array(["a", "b"])), NPY, 400, "is not a number type"),
    (npy(np.zeros((1, 28, 28, 1), np.complex64)), NPY, 400, "is not a number type"),
    (npy(np.zeros((1, 28, 28, 1), np.float64) + 1e300), NPY, 400, "not a finite float32 number"),
    (b"\x89PNG\r\n\x1a\n broken", {"Content-Type": "image/png"}, 400, "body: not a readable PNG picture"),
    (b"{}", {"Content-Type": "application/json"}, 415, "Content-Type 'application/json' is not one of"),
    (b"x" * (3 << 20), NPY, 413, "larger than the server's limit"),
])
def test_bad_bodies_get_their_status_and_one_line_and_the_server_stays_up(server, data, body, headers, status, words):
    r = post(server, body, headers)
    assert r.status_code == status, r.text
    message = r.json()["error"]
    assert words in message and "\n" not in message and "Traceback" not in message
    assert message.startswith("body: "), "refused by the body's checks, about the body"
    assert post(server, npy(data[0][:3])).json()["labels"] == data[1][:3].tolist()


def test_a_bad_request_in_a_batch_does_not_affect_the_others(server, data):
    """Requests merged with one whose scores overflow float32: only that one fails."""
    x, expected, _ = data
    huge = np.full((1, 28, 28, 1), 3e38, np.float32)

    async def main():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            bodies = [npy(huge) if i == 5 else npy(x[i][None]) for i in range(12)]
            return await asyncio.gather(*(client.post("/v1/predict", content=b, headers=NPY) for b in bodies))

    for i, r in enumerate(asyncio.run(main())):
        if i == 5:
            assert r.status_code == 400 and "not finite" in r.json()["error"]
        else:
            assert r.status_code == 200 and r.json()["labels"] == [int(expected[i])]


def test_a_client_that_goes_away_does_not_disturb_the_others(server, data):
    x, expected, _ = data

    async def main():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            gone = [asyncio.create_task(client.post("/v1/predict", content=npy(x), headers=NPY)) for _ in range(4)]
            await asyncio.sleep(0.005)
            for t in gone:
                t.cancel()
            return await asyncio.gather(*(client.post("/v1/predict", content=npy(x[i][None]), headers=NPY)
                                          for i in range(20)))

    answers = asyncio.run(main())
    assert [r.json()["labels"][0] for r in answers] == expected[:20].tolist()


def test_model_and_metrics(server, data):
    m = httpx.get(server.url + "/v1/model").json()
    assert m["input_shape"] == [28, 28, 1] and m["classes"] == 10 and m["backend"] == "cpu"
    assert m["device"].startswith("CPU") and m["max_batch"] == 64
    post(server, b"nope")
    post(server, npy(data[0][:2]))
    text = httpx.get(server.url + "/metrics").text
    assert re.search(r'^cnninfer_requests_total\{status="200"\} [1-9]\d*$', text, re.M)
    assert re.search(r'^cnninfer_requests_total\{status="400"\} [1-9]\d*$', text, re.M)
    assert re.search(r'^cnninfer_images_total\{status="200"\} [1-9]\d*$', text, re.M)
    assert re.search(r'^cnninfer_request_seconds_bucket\{le="\+Inf"\} \d+$', text, re.M)
    assert re.search(r'^cnninfer_batch_images_bucket\{le="64"\} \d+$', text, re.M)
    assert "# TYPE cnninfer_request_seconds histogram" in text
    # start-up's objects frozen out of the collector's reach (a full collection scanned them all)
    assert int(re.search(r'^cnninfer_gc_frozen_objects\{process="server"\} (\d+)$', text, re.M).group(1)) > 10_000
    assert re.search(r'^cnninfer_gc_pause_seconds_count\{process="server"\} \d+$', text, re.M)


def _metric(server, name):
    text = httpx.get(server.url + "/metrics").text
    return int(re.search(rf"^{name} (\d+)$", text, re.M).group(1))


def test_the_page_is_served(server):
    r = httpx.get(server.url + "/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert '<canvas id="pad"' in r.text and "/v1/predict?scores=1" in r.text


def test_token_auth(ece408, data):
    s = Server(ece408 / "model.hdf5", "--backend", "cpu", "--token", "s3cret")
    try:
        body = npy(data[0][:2])
        assert post(s, body).status_code == 401
        r = post(s, body, dict(NPY, Authorization="Bearer wrong"))
        assert r.status_code == 401 and "bearer token" in r.json()["error"]
        assert r.headers["www-authenticate"].startswith("Bearer")
        assert httpx.get(s.url + "/metrics").status_code == 401
        assert httpx.get(s.url + "/v1/model").status_code == 401
        assert httpx.get(s.url + "/healthz").status_code == 200
        r = post(s, body, dict(NPY, Authorization="Bearer s3cret"))
        assert r.status_code == 200 and r.json()["labels"] == data[1][:2].tolist()
    finally:
        assert s.stop() == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_drains_what_is_in_flight_then_exits_0(ece408, data, sig):
    x, expected, _ = data
    s = Server(ece408 / "model.hdf5", "--backend", "cpu", "--max-batch", "100")
    big = np.tile(x, (30, 1, 1, 1))  # 3,000 images: each pass takes a while on the CPU
    answers = []

    def call():
        answers.append(post(s, npy(big)))

    threads = [threading.Thread(target=call) for _ in range(3)]
    for t in threads:
        t.start()

    assert wait_for(lambda: _metric(s, "cnninfer_queued_images") > 0 or
                    _metric(s, "cnninfer_batch_images_count") > 1)
    s.signal(sig)
    for t in threads:
        t.join()
    assert s.proc.wait(60) == 0, "".join(s.stderr)
    assert len(answers) == 3
    for r in answers:
        assert r.status_code == 200 and r.json()["labels"] == np.tile(expected, 30).tolist()
    assert "Traceback" not in "".join(s.stderr)


def test_bad_options_and_a_busy_port_are_one_line_exit_2(ece408, server):
    from tests.conftest import invoke

    port = server.url.rsplit(":", 1)[1]
    r = invoke("serve", ece408 / "model.hdf5", "--backend", "cpu", "--port", port)
    assert r.exit_code == 2 and "cannot listen there" in r.stderr and r.stderr.count("\n") == 1
    r = invoke("serve", ece408 / "model.hdf5", "--backend", "cpu", "--port", "0", "--grpc-port", port)
    assert r.exit_code == 2 and "--grpc-port" in r.stderr and "cannot listen there" in r.stderr \
        and r.stderr.count("\n") == 1
    r = invoke("serve", ece408 / "nothing.hdf5", "--backend", "cpu")
    assert r.exit_code == 2 and "no such file" in r.stderr


@pytest.mark.parametrize("backend", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_several_workers_share_the_port_answer_alike_and_drain(ece408, data, backend):
    """On the GPU the engine's loop runs on the session's thread, and a large uint8 request is read
    where the front end wrote it (its shared memory, pinned): both answer as the command line."""
    x, expected, _ = data
    s = Server(ece408 / "model.hdf5", "--backend", backend, "--workers", "2")
    try:
        assert "2 front ends, one engine" in s.first_line
        u8 = np.round(np.tile(x, (41, 1, 1, 1)) * 255).astype(np.uint8)  # 4,100 images, 3.2 MB
        # both front ends' memory pinned as they attached, at start (the second may attach just after
        # the first is announced): large requests read in place on the GPU
        def pinned():
            return int(re.search(r"^cnninfer_pinned_bytes (\d+)$", httpx.get(s.url + "/metrics").text, re.M).group(1))

        if backend == "cuda":
            wait_for(lambda: pinned() >= 128 << 20)
        assert pinned() == (128 << 20 if backend == "cuda" else 0)
        for _ in range(2):
            assert post(s, npy(u8)).json()["labels"] == np.tile(expected, 41).tolist()

        async def main():
            async with httpx.AsyncClient(base_url=s.url, timeout=60) as client:
                return await asyncio.gather(*(client.post("/v1/predict", content=npy(x[i][None]), headers=NPY)
                                              for i in range(100)))

        answers = asyncio.run(main())
        assert [r.json()["labels"][0] for r in answers] == expected.tolist()
        assert post(s, npy(x)).json()["labels"] == expected.tolist()
        # The engine's batches, in either front end's /metrics: the 100 requests of two front ends
        # went through fewer passes than requests
        text = httpx.get(s.url + "/metrics").text
        merged = int(float(re.search(r"^cnninfer_batch_requests_sum (\S+)$", text, re.M).group(1)))
        passes = int(re.search(r"^cnninfer_batch_requests_count (\d+)$", text, re.M).group(1))
        assert merged >= 101 and passes < merged and text.count("# TYPE cnninfer_batch_images histogram") == 1
        # both processes' start-ups frozen, each family once, the front end's samples beside the engine's
        for process in ("engine", "front"):
            frozen = re.search(rf'^cnninfer_gc_frozen_objects\{{process="{process}"\}} (\d+)$', text, re.M)
            assert int(frozen.group(1)) > 10_000
        assert text.count("# TYPE cnninfer_gc_pause_seconds histogram") == 1
        families = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
        assert len(families) == len(set(families))
        samples = [max((f for f in families if line.startswith(f)), key=len) for line in text.splitlines()
                   if not line.startswith("#")]
        runs = [name for i, name in enumerate(samples) if i == 0 or samples[i - 1] != name]
        assert len(runs) == len(set(runs)), "a family's samples are not together"
        # Scores come back from the engine too: the command line's, within float32's tolerance
        scored = post(s, npy(x[:20]), query="?scores=1").json()
        np.testing.assert_allclose(np.array(scored["scores"], np.float32), data[2].scores[:20], rtol=1e-4, atol=1e-4)
    finally:
        started = time.perf_counter()
        assert s.stop() == 0, "".join(s.stderr)
    # every process stopped on SIGTERM, none killed (the supervisor kills after drain_s + 10 s)
    assert time.perf_counter() - started < 10


def test_a_process_that_does_not_stop_on_sigterm_is_killed_and_said(ece408, data):
    """The engine frozen (SIGSTOP) when the server gets SIGTERM: the front ends drain and exit, the
    engine is killed drain_s + 10 s later, and the server says so in one line and exits 2, not 0."""
    import os

    from infer.bench.serve import tree

    x, expected, _ = data
    s = Server(ece408 / "model.hdf5", "--backend", "cpu", "--workers", "2", "--drain-s", "0.5")
    try:
        assert post(s, npy(x[:3])).json()["labels"] == expected[:3].tolist()
        procs = {p: open(f"/proc/{p}/comm").read().strip() for p in tree(s.proc.pid)[1:]}
        (engine,) = [p for p, name in procs.items() if name == "cnninfer-engine"]

        def attached(pid):  # a front end past its start-up: it holds its shared memory for the engine
            def target(fd):
                try:
                    return os.readlink(f"/proc/{pid}/fd/{fd}")
                except FileNotFoundError:  # closed since it was listed
                    return ""

            return any("cnninfer-images" in target(fd) for fd in os.listdir(f"/proc/{pid}/fd"))

        assert wait_for(lambda: all(attached(p) for p, name in procs.items() if name == "cnninfer-front"))
        os.kill(engine, signal.SIGSTOP)
        started = time.perf_counter()
        code = s.stop(timeout=40)
    finally:
        s.stop()
    assert code == 2 and 10 < time.perf_counter() - started < 30
    said = [line for line in s.stderr if line.strip()]
    assert said[-1].strip() == "Error: cnninfer serve: cnninfer-engine did not stop within 10.5 s of SIGTERM and was killed"
    assert "Traceback" not in "".join(s.stderr)


def test_front_ends_answer_at_once_when_the_engine_dies_and_the_server_stops(ece408, data):
    """The engine process killed under a waiting request: the request gets a JSON 500 at once (no
    hang), and the supervisor stops the front ends and exits non-zero with one line."""
    import os
    import time

    from infer.bench.serve import tree

    x, expected, _ = data
    s = Server(ece408 / "model.hdf5", "--backend", "cpu", "--workers", "2")
    try:
        assert post(s, npy(x[:3])).json()["labels"] == expected[:3].tolist()
        engine = [p for p in tree(s.proc.pid)[1:] if open(f"/proc/{p}/comm").read().strip() == "cnninfer-engine"]
        assert len(engine) == 1, tree(s.proc.pid)

        def cpu_ticks():
            return sum(map(int, open(f"/proc/{engine[0]}/stat").read().rsplit(")", 1)[1].split()[11:13]))

        # A large request in flight in the engine's pass (its CPU time rising) when the engine dies
        in_flight = []
        big = np.tile(np.round(x * 255).astype(np.uint8), (300, 1, 1, 1))  # 30,000 images
        sender = threading.Thread(target=lambda: in_flight.append(post(s, npy(big))))
        ticks = cpu_ticks()
        sender.start()
        for _ in range(500):
            if cpu_ticks() - ticks >= 30:  # 0.3 s of the engine's CPU: the pass is running
                break
            time.sleep(0.01)
        os.kill(engine[0], signal.SIGKILL)
        t = time.monotonic()
        sender.join(10)
        assert in_flight and in_flight[0].status_code == 500 and time.monotonic() - t < 2.5, "answered, not held"
        t = time.monotonic()
        try:
            r = post(s, npy(x[:3]))
            # 500 from the front end that saw the engine go; 503 where the supervisor's stop came first
            assert (r.status_code, r.json()) in ((500, {"error": "the forward pass failed on the server"}),
                                                 (503, {"error": "the server is shutting down; try again"}))
        except (httpx.RemoteProtocolError, httpx.ConnectError):
            pass  # every front end had stopped: the connection, never accepted, is closed with the socket
        # At once, whichever: a request must not wait for the drain's end (4.5 s) or its deadline (30 s)
        assert time.monotonic() - t < 2.5
        assert s.proc.wait(30) != 0
        assert "exited with code" in "".join(s.stderr)
    finally:
        s.stop()


def test_npy_headers_seen_before_are_reused_never_confused():
    """The parsed-header cache: the same header with other data gives that data; another shape,
    type or order is parsed afresh; a bad header is refused every time; bytes after the array are
    still refused on a cached header."""
    import io

    from infer.serve import images
    from infer.errors import InputError
    from infer.data.loader import Model

    model = Model(None, np.zeros((5, 5, 1, 2), np.float32), np.zeros((5, 5, 2, 3), np.float32),
                  np.zeros((4 * 4 * 3, 6), np.float32), np.zeros((6, 10), np.float32))

    def body(x):
        b = io.BytesIO()
        np.save(b, x)
        return b.getvalue()

    rng = np.random.default_rng(7)
    images.HEADERS.clear()
    first, second = rng.random((3, 28, 28, 1), np.float32), rng.random((3, 28, 28, 1), np.float32)
    assert (images.from_npy(body(first), model) == first).all()
    assert len(images.HEADERS) == 1
    assert (images.from_npy(body(second), model) == second).all()
    assert len(images.HEADERS) == 1
    u8 = rng.integers(0, 255, (2, 28, 28, 1), np.uint8)
    assert (images.from_npy(body(u8), model) == u8).all() and images.from_npy(body(u8), model).dtype == np.uint8
    fortran = np.asfortranarray(first)
    assert (images.from_npy(body(fortran), model) == first).all()
    assert len(images.HEADERS) == 3
    with pytest.raises(InputError, match="more bytes than the array"):
        images.from_npy(body(first) + b"\0" * 4, model)
    bad = body(first).replace(b"'descr'", b"'dxscr'")
    for _ in range(2):
        with pytest.raises(InputError, match="header cannot be read"):
            images.from_npy(bad, model)


def test_a_front_end_told_to_stop_while_its_engine_is_silent_exits_at_once(tmp_path, ece408):
    """A front end whose engine accepts its connection but never sends its hello (frozen) stops on
    SIGTERM within a second, exit 0, nothing said: it waited for the hello through the signal (the
    supervisor killed it drain_s + 10 s later)."""
    import signal
    import subprocess
    import sys

    from tests.conftest import REPO

    path = str(tmp_path / "engine.sock")
    script = f"""
import socket, threading, types
from infer.data import loader
from infer.serve import server
fake = socket.socket(socket.AF_UNIX)
fake.bind({path!r})
fake.listen()
held = []
def accept():
    held.append(fake.accept()[0])
    print("accepted", flush=True)
threading.Thread(target=accept, daemon=True).start()
sock = socket.socket()
sock.bind(("127.0.0.1", 0))
sock.listen()
spec = types.SimpleNamespace(model=loader.load_model({str(ece408 / "model.hdf5")!r}), sha256=None)
server._front(spec, server.Settings(), sock, {path!r}, types.SimpleNamespace(put=print))
"""
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline() == "accepted\n"
        time.sleep(0.5)  # the front end waiting for the hello
        proc.send_signal(signal.SIGTERM)
        started = time.perf_counter()
        assert proc.wait(10) == 0
        assert time.perf_counter() - started < 2
        assert proc.stderr.read() == "" and proc.stdout.read() == ""
    finally:
        proc.kill()
        proc.wait()


def test_a_front_end_whose_engine_goes_during_its_start_up_says_so_in_one_line(tmp_path, ece408):
    """A front end (as `serve --workers` spawns it) whose engine accepts its connection and closes it
    before the hello: one line, exit 2, no traceback (uvicorn printed the lifespan's)."""
    import subprocess
    import sys

    from tests.conftest import REPO

    path = str(tmp_path / "engine.sock")
    script = f"""
import socket, threading, types
from infer.data import loader
from infer.serve import server
fake = socket.socket(socket.AF_UNIX)
fake.bind({path!r})
fake.listen()
threading.Thread(target=lambda: fake.accept()[0].close(), daemon=True).start()
sock = socket.socket()
sock.bind(("127.0.0.1", 0))
sock.listen()
spec = types.SimpleNamespace(model=loader.load_model({str(ece408 / "model.hdf5")!r}), sha256=None)
server._front(spec, server.Settings(), sock, {path!r}, types.SimpleNamespace(put=print))
"""
    r = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        "cnninfer serve: a front end lost the engine during its start-up (IncompleteReadError)"], r.stderr
