"""`cnninfer serve` against hostile clients, as they would meet it: a real server process on
127.0.0.1 (CPU backend), raw sockets where a well-behaved client library would not misbehave.
Each bound refuses what passes it, in bounded time, while other clients keep being served, the
server's memory stays under 1 GB, and nothing wrong is answered."""
import io
import json
import re
import signal
import socket
import time

import numpy as np
import pytest

from tests.serving import NPY, TIGHT, Server, by_label, npy, png, answers_of_test100, serving, wait_for

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
Image = pytest.importorskip("PIL.Image")

RSS_LIMIT = 1 << 30


@pytest.fixture(scope="module")
def data(ece408):
    return answers_of_test100(ece408)


@pytest.fixture(scope="module")
def server(ece408):
    yield from serving(ece408 / "model.hdf5", *TIGHT, "--max-pixels", "4000000")


AUTH = {"Authorization": "Bearer t0ken"}
GAUTH = {"authorization": "Bearer t0ken"}


def post(server, body, headers=NPY, query="", **kw):
    return httpx.post(f"{server.url}/v1/predict{query}", content=body, headers=dict(headers, **AUTH), timeout=30, **kw)


def served_correctly(server, data):
    x, expected, _ = data
    r = post(server, npy(x[:7]))
    return r.status_code == 200 and r.json()["labels"] == expected[:7].tolist()


def memory(server, field="VmHWM"):
    """The server process's bytes of /proc status `field`: VmHWM its peak, VmRSS now."""
    status = open(f"/proc/{server.proc.pid}/status").read()
    return int(re.search(field + r":\s+(\d+) kB", status).group(1)) * 1024


def peak_rss(server):
    return memory(server)


def refusals(server):
    return by_label(server, "refused_total", "reason")


def buffered(server):
    return by_label(server, "buffered_bytes", "protocol")


def grpc_served_correctly(server, data, headers=None):
    """tritonclient.grpc's answer for 5 images equals the command line's."""
    grpcclient = pytest.importorskip("tritonclient.grpc")
    x, expected, _ = data
    inp = grpcclient.InferInput("x", [5, 28, 28, 1], "FP32")
    inp.set_data_from_numpy(x[:5])
    r = grpcclient.InferenceServerClient(server.grpc).infer("cnninfer", [inp], headers=headers)
    return r.as_numpy("labels").tolist() == expected[:5].tolist()


def address(server):
    host, port = server.url.split("//")[1].rsplit(":", 1)
    return host, int(port)


def picture(gray, fmt, **save):
    b = io.BytesIO()
    Image.fromarray(gray).save(b, fmt, **save)
    return b.getvalue()


def test_a_picture_past_the_pixel_limit_is_refused_from_its_header(server, data):
    """A 194 KB PNG of 13000 x 13000 pixels: 413 at once, undecoded; /healthz answers meanwhile."""
    body = picture(np.zeros((13000, 13000), np.uint8), "PNG", optimize=True)
    assert len(body) < 1 << 20
    before = refusals(server)["pixels"]
    t = time.monotonic()
    r = post(server, body, {"Content-Type": "image/png"})
    assert r.status_code == 413 and "169000000 pixels" in r.json()["error"] and "4000000" in r.json()["error"]
    assert time.monotonic() - t < 2
    assert refusals(server)["pixels"] == before + 1
    assert httpx.get(server.url + "/healthz", timeout=2).status_code == 200
    assert served_correctly(server, data)
    assert peak_rss(server) < RSS_LIMIT


def test_the_pixel_limit_is_the_limit(server):
    """Just past the limit (4,000,000 here) refused, just within it decoded."""
    over = post(server, picture(np.zeros((2000, 2001), np.uint8), "PNG"), {"Content-Type": "image/png"})
    assert over.status_code == 413 and "2001x2000 = 4002000 pixels" in over.json()["error"]
    within = post(server, picture(np.zeros((2000, 1999), np.uint8), "PNG"), {"Content-Type": "image/png"})
    assert within.status_code == 200 and len(within.json()["labels"]) == 1


def decoded(server):
    text = httpx.get(server.url + "/metrics", headers=AUTH).text
    return {m[0]: int(m[1]) for m in re.findall(r'^cnninfer_decoded_total\{where="(\w+)"\} (\d+)$', text, re.M)}


def test_pictures_and_large_bodies_are_decoded_on_a_decoder_thread(server, data):
    """A PNG and a .npy past 64 KiB are decoded on a decoder thread, never the event loop, where a
    slow picture would hold up every other client; a small .npy is parsed on the loop."""
    x, expected, _ = data
    digit = picture(np.round(x[0, :, :, 0] * 255).astype(np.uint8), "PNG")
    before = decoded(server)
    r = post(server, digit, {"Content-Type": "image/png"})
    assert r.status_code == 200 and r.json()["labels"] == expected[:1].tolist()
    assert len(npy(x[:30])) > 64 << 10 and post(server, npy(x[:30])).json()["labels"] == expected[:30].tolist()
    after = decoded(server)
    assert after == {"loop": before["loop"], "thread": before["thread"] + 2}
    assert post(server, npy(x[:1])).status_code == 200
    assert decoded(server) == {"loop": before["loop"] + 1, "thread": before["thread"] + 2}


@pytest.mark.parametrize("fmt", ["GIF", "BMP", "TIFF", "WEBP", "JPEG"])
def test_only_the_declared_format_is_decoded(server, data, fmt):
    """GIF, BMP, TIFF, WebP and JPEG bytes sent as image/png: 400, no other decoder runs."""
    body = picture(np.round(data[0][0, :, :, 0] * 255).astype(np.uint8), fmt)
    r = post(server, body, {"Content-Type": "image/png"})
    assert r.status_code == 400 and r.json()["error"] == "body: not a readable PNG picture (its Content-Type is image/png)"
    if fmt == "JPEG":
        assert post(server, body, {"Content-Type": "image/jpeg"}).status_code == 200


def test_exif_orientation_is_applied(server, data):
    """A photo stored rotated with EXIF orientation 6 (shown turned 90 degrees clockwise) gets the
    upright picture's answer."""
    x, expected, _ = data
    from PIL import Image as PIL

    for i in range(100):
        digit = np.round(x[i, :, :, 0] * 255).astype(np.uint8)
        paper = PIL.new("L", (280, 280), 240)
        paper.paste(PIL.fromarray(255 - digit).resize((200, 200), PIL.BILINEAR), (40, 40))
        upright = post(server, picture(np.asarray(paper), "JPEG", quality=95), {"Content-Type": "image/jpeg"}).json()
        stored = paper.transpose(PIL.Transpose.ROTATE_90)  # orientation 6 turns this back upright
        sideways = post(server, picture(np.asarray(stored), "JPEG", quality=95), {"Content-Type": "image/jpeg"}).json()
        if upright == {"labels": [int(expected[i])]} and sideways != upright:
            break
    else:
        pytest.fail("no digit of test100 whose sideways picture changes its answer")
    exif = PIL.Exif()
    exif[0x0112] = 6
    b = io.BytesIO()
    stored.save(b, "JPEG", quality=95, exif=exif)
    assert post(server, b.getvalue(), {"Content-Type": "image/jpeg"}).json() == upright


def closing_times(socks, limit_s):
    """Seconds from now until the server closed each socket (within limit_s), by index."""
    closed_at = {}
    t = time.monotonic()
    while len(closed_at) < len(socks) and time.monotonic() - t < limit_s:
        for i, s in enumerate(socks):
            if i not in closed_at:
                s.settimeout(0.05)
                try:
                    if s.recv(1024) == b"":
                        closed_at[i] = time.monotonic() - t
                except socket.timeout:
                    pass
                except OSError:
                    closed_at[i] = time.monotonic() - t
    return {i: at for i, at in closed_at.items() if at < limit_s}  # a pass over the sockets can outlast limit_s


def all_closed_within_4_s(socks, wait_s, what):
    """Every socket closed by the server, each within 4 s (watched for wait_s)."""
    closed_at = closing_times(socks, wait_s)
    assert len(closed_at) == len(socks), f"every {what} connection is closed"
    assert max(closed_at.values()) < 4


def test_half_headers_are_cut_and_connections_are_capped(server, data):
    """40 connections sending half a request line against a cap of 24: those past the cap are
    closed at once, the rest after the 1 s header timeout; the server keeps answering."""
    before = refusals(server)
    socks = []
    try:
        for _ in range(40):
            s = socket.create_connection(address(server), timeout=5)
            s.sendall(b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-")
            socks.append(s)
        all_closed_within_4_s(socks, 8, "half-header")
    finally:
        for s in socks:
            s.close()
    after = refusals(server)
    assert after["connections"] - before["connections"] >= 16
    assert after["header_timeout"] - before["header_timeout"] >= 1
    assert (after["connections"] - before["connections"]) + (after["header_timeout"] - before["header_timeout"]) == 40
    assert served_correctly(server, data)


def test_grpc_connections_are_capped_and_silent_ones_cut(server, data):
    """The gRPC port keeps HTTP's bounds: 40 connections that send nothing against a cap of 24,
    those past it closed at once, the rest at the 1 s header timeout (no HTTP/2 preface sent);
    then a gRPC call and an HTTP request are answered as before."""
    pytest.importorskip("tritonclient.grpc")
    assert server.grpc
    host, port = server.grpc.rsplit(":", 1)
    socks = [socket.create_connection((host, int(port)), timeout=5) for _ in range(40)]
    try:
        early = closing_times(socks, 0.5)
        assert len(early) >= 16, "the connections past the cap are closed as they are accepted"
        all_closed_within_4_s(socks, 6, "silent")
    finally:
        for s in socks:
            s.close()
    assert grpc_served_correctly(server, data, GAUTH)
    assert served_correctly(server, data)


def test_grpc_messages_still_arriving_hold_at_most_the_budget(ece408, data):
    """12 gRPC calls each declaring a 15 MB message, sent as fast as the server's windows allow
    and never finished: they hold at most --max-buffered-mb (48 MiB: two reads of the largest
    message, 16 MiB, at once; gRPC alone granted each its whole window: 180 MB), each read is cut
    at the 2 s body timeout (DEADLINE_EXCEEDED) or, waiting for room, refused (UNAVAILABLE) in
    bounded time, HTTP is served throughout, and gRPC again once they have ended."""
    pytest.importorskip("tritonclient.grpc")
    from tests.serving import StalledCall, pump

    s = Server(ece408 / "model.hdf5", "--backend", "cpu", "--max-buffered-mb", "48", "--max-body-mb", "16",
               "--body-timeout-s", "2")
    try:
        assert s.grpc
        before = memory(s, "VmRSS")
        calls = [StalledCall(s.grpc, 15 << 20) for _ in range(12)]
        try:
            pump(calls, 1.5)
            held = memory(s, "VmRSS") - before
            sent = sum((15 << 20) - 1 - c.left for c in calls)
            assert sent > 25 << 20, "two calls sent their messages but for a byte"
            assert held < 60 << 20, f"the stalled calls hold {held >> 20} MB"
            assert served_correctly(s, data)
            pump(calls, 12, until=lambda: all(c.status is not None for c in calls))
            statuses = sorted(c.status for c in calls)
            assert set(statuses) <= {4, 14} and statuses.count(4) >= 2, statuses  # DEADLINE_EXCEEDED, UNAVAILABLE
            assert memory(s, "VmRSS") - before < 120 << 20
        finally:
            for c in calls:
                c.close()
        assert grpc_served_correctly(s, data)
        counted = refusals(s)
        assert counted["body_timeout"] == statuses.count(4) and counted["buffered"] == statuses.count(14)
    finally:
        assert s.stop() == 0, "".join(s.stderr)


def test_a_grpc_message_holds_its_own_size_once_read_and_nothing_once_answered(server, data):
    """While a 20,000-image uint8 call (15.7 MB) is in its pass on the CPU, the gRPC budget holds
    its message's bytes, not the largest message's (64 MiB) that its read took; after, nothing."""
    grpcclient = pytest.importorskip("tritonclient.grpc")
    import threading

    x = np.tile(data[0][:100], (200, 1, 1, 1))
    raw = (x * 255).round().astype(np.uint8)
    inp = grpcclient.InferInput("x", list(raw.shape), "UINT8")
    inp.set_data_from_numpy(raw)
    client = grpcclient.InferenceServerClient(server.grpc)
    answer = {}
    call = threading.Thread(target=lambda: answer.update(r=client.infer("cnninfer", [inp], headers=GAUTH)))
    call.start()
    seen = set()
    while call.is_alive():
        held = buffered(server)["grpc"]
        if held:
            seen.add(held)
        time.sleep(0.01)
    call.join()
    assert answer["r"].as_numpy("labels").shape == (20000,)
    assert seen and max(seen) < raw.nbytes + (1 << 16), seen  # the message and its protobuf framing
    assert buffered(server) == {"http": 0, "grpc": 0}


def test_the_front_ends_share_one_bodies_budget(ece408, data):
    """Two front ends, --max-buffered-mb 8: 24 uploads of 1 MiB, each a MiB short of its
    Content-Length. Wherever the kernel puts each connection, at most 8 MiB are held by the server
    and at least 16 uploads are refused (503, closed) at once; both front ends' gauges show that one
    total (each counting its own, the one holding the uploads shows 8 MiB and the other 0, or each
    up to 8 where they are spread); the rest end at the body timeout, then HTTP is served."""
    s = Server(ece408 / "model.hdf5", "--backend", "cpu", "--workers", "2", "--max-buffered-mb", "8",
               "--body-timeout-s", "3", "--no-grpc")
    try:
        head = (b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-npy\r\n"
                b"Content-Length: %d\r\n\r\n" % (2 << 20))
        socks = [socket.create_connection(address(s), timeout=10) for _ in range(24)]
        try:
            for c in socks:
                c.sendall(head + bytes(1 << 20))
                c.setblocking(False)
            # a refused upload is answered 503 and closed (reset, where its unread bytes were
            # still arriving); a held one waits for the rest of its body
            answers, closed, end = [b""] * 24, set(), time.monotonic() + 2.5  # within the 3 s body timeout
            while time.monotonic() < end and len(closed) < 16:
                for i, c in enumerate(socks):
                    try:
                        chunk = c.recv(4096)
                        answers[i] += chunk
                        if not chunk:
                            closed.add(i)
                    except BlockingIOError:
                        pass
                    except OSError:
                        closed.add(i)
                time.sleep(0.05)
            held = {buffered(s)["http"] for _ in range(8)}  # each on a connection of its own: both front ends
            assert len(held) == 1 and 0 < min(held) <= 8 << 20, held  # one count, whichever front end tells it
            assert len(closed) >= 16, (closed, answers)
            assert all(a.startswith(b"HTTP/1.1 503") for a in answers if a), answers
        finally:
            for c in socks:
                c.close()
        assert wait_for(lambda: buffered(s)["http"] == 0, 8)
        assert served_correctly(s, data)
    finally:
        assert s.stop() == 0, "".join(s.stderr)


def test_a_grpc_call_without_a_message_is_refused_as_invalid(server, data):
    """A call that ends with its headers, sending no message: INVALID_ARGUMENT, nothing on stderr."""
    from tests.serving import StalledCall, pump

    call = StalledCall(server.grpc, None, token="t0ken")
    try:
        pump([call], 5, until=lambda: call.status is not None)
    finally:
        call.close()
    assert call.status == 3  # INVALID_ARGUMENT
    assert not any("failed" in line for line in server.stderr), server.stderr
    assert served_correctly(server, data)


def test_a_body_shorter_than_its_length_is_answered_408(server, data):
    with socket.create_connection(address(server), timeout=10) as s:
        s.sendall(b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t0ken\r\n"
                  b"Content-Type: application/x-npy\r\nContent-Length: 5000\r\n\r\n" + npy(data[0][:1])[:100])
        t = time.monotonic()
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = s.recv(4096)
            if not chunk:
                break
            answer += chunk
        assert time.monotonic() - t < 5
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408") and b"connection: close" in head.lower()
    assert json.loads(body)["error"] == "body: no data for 1 s (the server's --body-timeout-s)"
    assert served_correctly(server, data)


@pytest.mark.parametrize("body,words", [
    (npy(np.zeros((2, 28, 28, 1), np.float32)) + b"garbage", "bytes of data where the header's float32 array"),
    (npy(np.zeros((2, 28, 28, 1), np.float32))[:-8], "fewer bytes than the array"),
    (b"\x93NUMPY\x01\x00\x10\x00{'descr': <f4", "body: not an .npy array (its header cannot be read)"),
    (npy(np.zeros((1, 27, 28, 1), np.float32)), "body: images of 27x28 flatten to"),
])
def test_error_bodies_are_one_line_about_the_request(server, body, words):
    r = post(server, body)
    message = r.json()["error"]
    assert r.status_code == 400 and words in message
    for leak in ("<", "0x", "/", "dataset", ".hdf5", "Traceback"):
        assert leak not in message.replace("--", ""), (leak, message)


def test_the_scheme_of_a_bearer_token_is_case_insensitive(server, data):
    body = npy(data[0][:2])
    for scheme in ("bearer", "BEARER", "Bearer"):
        r = httpx.post(server.url + "/v1/predict", content=body, headers=dict(NPY, Authorization=f"{scheme} t0ken"))
        assert r.status_code == 200 and r.json()["labels"] == data[1][:2].tolist()
    assert httpx.post(server.url + "/v1/predict", content=body,
                      headers=dict(NPY, Authorization="Basic t0ken")).status_code == 401


def test_scores_equal_the_command_line_s(server, data):
    """Scores, not only labels (a bias-free network keeps its labels under any rescaling): the
    .npy path within float32's tolerance, a uint8 PNG of a data file's image bit for bit with
    its float32 array."""
    x, expected, scores = data
    r = post(server, npy(x[:20]), query="?scores=1").json()
    np.testing.assert_allclose(np.array(r["scores"], np.float32), scores[:20], rtol=1e-5, atol=1e-5)
    for i in (0, 13):
        as_png = post(server, png(np.round(x[i, :, :, 0] * 255).astype(np.uint8)), {"Content-Type": "image/png"},
                      query="?scores=1").json()
        as_npy = post(server, npy(x[i:i + 1]), query="?scores=1").json()
        assert as_png == as_npy


def test_limits_and_refusals_are_in_metrics(server):
    text = httpx.get(server.url + "/metrics", headers=AUTH).text
    for name, value in (("max_connections", 24), ("header_timeout_s", 1), ("body_timeout_s", 1),
                        ("max_pixels", 4000000), ("decoders", 2), ("request_timeout_s", 30), ("drain_s", 5),
                        ("max_head_bytes", 16384), ("max_headers", 100), ("max_pipelined", 16)):
        assert f'cnninfer_limit{{name="{name}"}} {value}\n' in text, name
    assert re.search(r"^cnninfer_open_connections [1-9]\d*$", text, re.M)


def test_a_request_queued_past_its_deadline_gets_504(ece408, data):
    x, expected, _ = data
    s = Server(ece408 / "model.hdf5", "--backend", "cpu", "--request-timeout-s", "0.01", "--max-batch", "64")
    try:
        big = np.tile(x, (100, 1, 1, 1))  # 10,000 images: far more than 10 ms on a CPU
        r = httpx.post(s.url + "/v1/predict", content=npy(big), headers=NPY, timeout=60)
        assert r.status_code == 504 and "not answered within 0.01 s" in r.json()["error"]
        assert refusals(s)["deadline"] == 1
        text = httpx.get(s.url + "/metrics").text
        assert 'cnninfer_requests_total{status="504"} 1' in text
    finally:
        assert s.stop() == 0, "".join(s.stderr)


def test_sigterm_with_a_stalled_upload_answers_json_503_and_exits_0_within_the_drain(ece408, data):
    """An HTTP upload and a gRPC message both stalled: the drain ends them (503, UNAVAILABLE)."""
    from tests.serving import StalledCall, pump

    s = Server(ece408 / "model.hdf5", "--backend", "cpu", "--drain-s", "2", "--body-timeout-s", "60")
    stalled = socket.create_connection(address(s), timeout=20)
    call = StalledCall(s.grpc, 1 << 20)
    try:
        stalled.sendall(b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-npy\r\n"
                        b"Content-Length: 100000\r\n\r\n" + b"\x93NUMPY")
        assert wait_for(lambda: served_correctly_plain(s, data))
        pump([call], 0.5)
        assert call.status is None and call.left < 1 << 20  # its message arriving, then stalled
        t = time.monotonic()
        s.signal(signal.SIGTERM)
        answer = b""
        while True:
            chunk = stalled.recv(4096)
            if not chunk:
                break
            answer += chunk
        pump([call], 4 - (time.monotonic() - t), until=lambda: call.status is not None)
        assert s.proc.wait(20) == 0
        assert time.monotonic() - t < 4
        assert (call.status, call.message) == (14, "the server is shutting down; try again")  # UNAVAILABLE
    finally:
        stalled.close()
        call.close()
        s.stop()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503") and b"application/json" in head
    assert json.loads(body) == {"error": "the server is shutting down; try again"}
    assert "".join(s.stderr) == ""


def served_correctly_plain(s, data):
    r = httpx.post(s.url + "/v1/predict", content=npy(data[0][:3]), headers=NPY, timeout=30)
    return r.status_code == 200 and r.json()["labels"] == data[1][:3].tolist()


def test_the_model_is_pinned_by_its_sha256(ece408, data):
    from tests.conftest import invoke

    r = invoke("serve", ece408 / "model.hdf5", "--backend", "cpu", "--model-sha256", "00" * 32)
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "--model-sha256" in r.stderr
    import hashlib

    digest = hashlib.sha256((ece408 / "model.hdf5").read_bytes()).hexdigest()
    s = Server(ece408 / "model.hdf5", "--backend", "cpu", "--model-sha256", digest.upper())
    try:
        m = httpx.get(s.url + "/v1/model").json()
        assert m["sha256"] == digest and m["model"] == "model.hdf5"
    finally:
        assert s.stop() == 0


def test_a_declared_length_past_the_limit_is_refused_before_any_body_is_read(server, data):
    """Content-Length of 1 GB and no body: 413 at once (the body is not awaited: no 408 after the
    1 s body timeout), and the connection closed."""
    with socket.create_connection(address(server), timeout=10) as s:
        s.sendall(b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t0ken\r\n"
                  b"Content-Type: application/x-npy\r\nContent-Length: 1000000000\r\n\r\n")
        t = time.monotonic()
        answer = s.recv(65536)
        took = time.monotonic() - t
    assert answer.startswith(b"HTTP/1.1 413") and took < 0.9, (answer[:80], took)
    assert served_correctly(server, data)


def test_bodies_held_at_once_are_bounded(ece408, data):
    """--max-buffered-mb 1: a first upload holds 0.9 MB (stalled mid-body); a second body of 0.3 MB
    would pass the limit: 503 at once; the first, completed, is answered."""
    x, expected, _ = data
    s = Server(ece408 / "model.hdf5", "--backend", "cpu", "--max-buffered-mb", "1", "--body-timeout-s", "30")
    try:
        big = npy(np.tile(x, (3, 1, 1, 1))[:290])  # 290 images: 909 KB
        with socket.create_connection(address(s), timeout=20) as first:
            first.sendall(b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-npy\r\n"
                          + f"Content-Length: {len(big)}\r\n\r\n".encode() + big[:-100])
            assert wait_for(lambda: 'cnninfer_limit{name="max_buffered_bytes"}' in httpx.get(s.url + "/metrics").text)
            second = None
            for _ in range(50):  # until the first's bytes are counted as held (the server reads them)
                second = httpx.post(s.url + "/v1/predict", content=npy(x[:97]), headers=NPY, timeout=20)
                if second.status_code == 503:
                    break
            assert second.status_code == 503 and "request bodies fill" in second.json()["error"]
            first.sendall(big[-100:])
            answer = b""
            while b'"labels"' not in answer or not answer.endswith(b"}"):
                chunk = first.recv(65536)
                if not chunk:
                    break
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 200")
        labels = json.loads(answer.split(b"\r\n\r\n", 1)[1])["labels"]
        assert labels == np.tile(expected, 3)[:290].tolist()
        assert refusals(s)["buffered"] >= 1
    finally:
        assert s.stop() == 0


def test_half_a_header_after_a_kept_alive_request_is_cut_too(server, data):
    """The header timeout holds for every request of a kept-alive connection, not only its first."""
    with socket.create_connection(address(server), timeout=10) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while b'"ok"' not in answer:
            answer += s.recv(4096)
        assert answer.startswith(b"HTTP/1.1 200")
        s.sendall(b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-")
        t = time.monotonic()
        assert s.recv(4096) == b"" and time.monotonic() - t < 5, "closed after the 1 s header timeout"
    assert served_correctly(server, data)


def test_a_request_line_or_headers_past_16_kib_or_100_headers_are_refused(server, data):
    """A request line that never ends, a header block past 16 KiB, or one of 3,000 empty headers
    (sent a piece at a time, as fast as the server reads), is answered 400 and the connection
    closed, counted as header_size; 15 KiB of headers are served. (The 400 may be lost to the reset of a close with unread bytes.)"""
    before = refusals(server)
    heads = [b"GET /" + b"a" * 40000,  # a request line alone, no end in sight
             b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: %s\r\n" % (i, b"b" * 1000) for i in range(20)),
             b"GET /healthz HTTP/1.1\r\n" + b"a:\r\n" * 3000]  # 12 KB of headers, each ~130 bytes of memory
    for head in heads:
        with socket.create_connection(address(server), timeout=10) as s:
            try:
                for i in range(0, len(head), 4096):
                    s.sendall(head[i:i + 4096])
            except OSError:  # closed by the server mid-send
                pass
            answer = b""
            try:
                while chunk := s.recv(4096):
                    answer += chunk
            except ConnectionResetError:
                pass
        assert answer == b"" or answer.startswith(b"HTTP/1.1 400"), answer[:80]
    assert refusals(server)["header_size"] - before["header_size"] == 3
    fits = b"".join(b"X-%d: %s\r\n" % (i, b"b" * 1000) for i in range(15))
    with socket.create_connection(address(server), timeout=10) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + fits + b"Connection: close\r\n\r\n")
        answer = b""
        while chunk := s.recv(4096):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200") and b'"ok"' in answer
    assert served_correctly(server, data)


def test_a_connection_pipelining_past_16_waiting_requests_is_closed(server, data):
    """Requests pipelined without reading their answers (4 MB of GETs on each of 20 connections once
    took a server to 1.3 GB: every one parsed was queued): past 16 waiting behind the one being
    answered, the connection is closed (its 400 may be lost to the reset), counted as pipelined;
    the server's memory stays bounded and other clients are served."""
    from infer.serve.guard import MAX_PIPELINED

    before = refusals(server)
    pipelined = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" * 30000  # 1 MB
    for _ in range(6):
        with socket.create_connection(address(server), timeout=10) as s:
            try:
                s.sendall(pipelined)
            except OSError:  # closed by the server mid-send
                pass
            answer = b""
            t = time.monotonic()
            try:
                while chunk := s.recv(1 << 16):
                    answer += chunk
            except ConnectionResetError:
                pass
            assert time.monotonic() - t < 5
        assert answer.count(b"HTTP/1.1 200") <= MAX_PIPELINED + 1
    assert refusals(server)["pipelined"] - before["pipelined"] == 6
    assert peak_rss(server) < RSS_LIMIT
    assert served_correctly(server, data)
