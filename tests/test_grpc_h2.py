"""The server's own HTTP/2 for gRPC (infer/serve/grpc_h2.py), met by a raw client (tests.serving.H2)
where tritonclient would not go: a small window, the HPACK table moving under the same bytes, the
calls' bounds, a message past the limit, resets, pings, unknown and broken frames. A real server
process on 127.0.0.1 (CPU backend)."""
import socket

import numpy as np
import pytest

from tests.serving import H2, TIGHT, TOKEN, Server, by_label, answers_of_test100, serving, wait_for

pytest.importorskip("starlette")
pytest.importorskip("hpack")
pb = pytest.importorskip("tritonclient.grpc.service_pb2")

from infer.serve.grpc_h2 import MAX_STREAMS  # noqa: E402  (after the serve extra's check)

@pytest.fixture(scope="module")
def data(ece408):
    return answers_of_test100(ece408)


@pytest.fixture(scope="module")
def server(ece408):
    """Tight bounds: at most 24 calls at once (--max-connections), 1 s for a message, a token."""
    yield from serving(ece408 / "model.hdf5", *TIGHT)


@pytest.fixture(scope="module")
def roomy(ece408):
    """The default bounds, no token."""
    yield from serving(ece408 / "model.hdf5", "--backend", "cpu", "--body-timeout-s", "2")


def infer_request(x, outputs=()):
    r = pb.ModelInferRequest(model_name="cnninfer")
    given = r.inputs.add()
    given.name, given.datatype = "x", "UINT8" if x.dtype == np.uint8 else "FP32"
    given.shape.extend(x.shape)
    r.raw_input_contents.append(x.tobytes() if x.dtype == np.uint8 else np.ascontiguousarray(x, "<f4").tobytes())
    for name in outputs:
        r.outputs.add().name = name
    return r.SerializeToString()


def outputs(raw):
    r = pb.ModelInferResponse.FromString(raw)
    dtypes = {"labels": "<i8", "scores": "<f4"}
    return {o.name: np.frombuffer(r.raw_output_contents[i], dtypes[o.name]).reshape(o.shape)
            for i, o in enumerate(r.outputs)}


def refused(server):
    return by_label(server, "refused_total", "reason", TOKEN)


def grpc_buffered(server):
    return by_label(server, "buffered_bytes", "protocol", TOKEN).get("grpc")


def test_an_answer_larger_than_the_client_s_window_waits_for_it(server, data):
    """A client whose streams' window is 200 bytes: 20 images' answer (~1 KB) comes 200 bytes at
    a time as it gives the window back, never more, and equals the command line's."""
    x, expected, scores = data
    c = H2(server.grpc, settings=[(4, 200)], auto_window=False)  # SETTINGS_INITIAL_WINDOW_SIZE
    try:
        c.call(1, c.block("ModelInfer", TOKEN), infer_request(x[:20]))
        assert c.read(lambda c: sum(n for _, n in c.data_sizes) >= 200)
        c.read(lambda c: False, 0.3)
        assert sum(n for _, n in c.data_sizes) == 200, "nothing past the window"
        rounds = 0
        while c.status(1) is None:
            got = len(c.streams[1]["data"])
            c.send(H2.frame(8, 0, 0, (200).to_bytes(4, "big")) + H2.frame(8, 0, 1, (200).to_bytes(4, "big")))
            assert c.read(lambda c: len(c.streams[1]["data"]) > got or c.status(1) is not None)
            rounds += 1
        assert c.status(1) == 0 and rounds >= 4
        assert max(n for _, n in c.data_sizes) <= 200
        out = outputs(c.message(1))
        assert out["labels"].tolist() == expected[:20].tolist()
        np.testing.assert_allclose(out["scores"], scores[:20], rtol=1e-5, atol=1e-6)
    finally:
        c.close()


def test_a_header_block_means_what_the_table_says_when_it_arrives(server):
    """The same bytes, "the HPACK table's newest entry", sent before and after that entry changed
    (a wrong token, then the right one): the second is decoded afresh, not taken from the blocks
    the connection keeps, and is let in."""
    c = H2(server.grpc)
    try:
        base = c.block("ServerLive")
        wrong = c.literal("authorization", "Bearer wr0ng", indexed=True)
        right = c.literal("authorization", f"Bearer {TOKEN}", indexed=True)
        newest = b"\xbe"  # indexed field 62: the dynamic table's newest entry
        for stream, auth in ((1, wrong), (3, newest), (5, right), (7, newest)):
            c.call(stream, base + auth)
        assert c.read(lambda c: all(c.status(s) is not None for s in (1, 3, 5, 7)))
        assert [c.status(s) for s in (1, 3, 5, 7)] == [16, 16, 0, 0]  # UNAUTHENTICATED, OK
        assert pb.ServerLiveResponse.FromString(c.message(7)).live
    finally:
        c.close()


def test_calls_past_the_process_s_bound_are_refused_at_once(server):
    """30 calls whose messages never come, against at most 24 at once: 6 refused
    RESOURCE_EXHAUSTED as they open (counted "busy"), the 24 ended at the 1 s body timeout."""
    before = refused(server)
    c = H2(server.grpc)
    streams = [1 + 2 * i for i in range(30)]
    try:
        block = c.block("ModelInfer", TOKEN)
        for s in streams:
            c.call(s, block, end=False, declared=1000)  # the prefix, then nothing
        assert c.read(lambda c: sum(c.status(s) == 8 for s in streams) == 6, 0.8)
        assert c.read(lambda c: all(c.status(s) is not None for s in streams), 5)
        assert sorted(c.status(s) for s in streams) == [4] * 24 + [8] * 6  # DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED
    finally:
        c.close()
    after = refused(server)
    assert after["busy"] - before["busy"] == 6 and after["body_timeout"] - before["body_timeout"] == 24


def test_streams_past_a_connection_s_limit_are_refused(roomy, data):
    """One connection opening MAX_STREAMS + 4 calls at once: the 4 past the limit it was told are
    reset REFUSED_STREAM; the rest end at the body timeout; then a call is answered."""
    x, expected, _ = data
    c = H2(roomy.grpc)
    streams = [1 + 2 * i for i in range(MAX_STREAMS + 4)]
    try:
        block = c.block("ModelInfer")
        c.send(b"".join(H2.frame(1, 4, s, block) + H2.frame(0, 0, s, b"\0" + (1000).to_bytes(4, "big"))
                        for s in streams))
        assert c.read(lambda c: sum(c.streams.get(s, {}).get("reset") == 7 for s in streams) == 4, 1.5)
        assert [s for s in streams if c.streams.get(s, {}).get("reset") == 7] == streams[-4:]
        assert c.read(lambda c: all(c.status(s) is not None for s in streams[:-4]), 6)
        c.call(streams[-1] + 2, block, infer_request(x[:3]))
        assert c.read(lambda c: c.status(streams[-1] + 2) is not None)
        assert outputs(c.message(streams[-1] + 2))["labels"].tolist() == expected[:3].tolist()
    finally:
        c.close()


def test_a_message_past_the_limit_or_compressed_is_refused_from_its_prefix(roomy):
    """A message declaring 100 MB (the limit: 64 MiB and its framing) is refused
    RESOURCE_EXHAUSTED from its 5-byte prefix, nothing of it read; a compressed one UNIMPLEMENTED."""
    c = H2(roomy.grpc)
    try:
        block = c.block("ModelInfer")
        c.call(1, block, end=False, declared=100 << 20)
        c.call(3, block, b"\x78\x9c", compressed=True)
        assert c.read(lambda c: c.status(1) is not None and c.status(3) is not None, 3)
        assert c.status(1) == 8 and "larger than the server's limit" in c.streams[1]["headers"][-1]["grpc-message"]
        assert c.status(3) == 12 and "compressed" in c.streams[3]["headers"][-1]["grpc-message"]
    finally:
        c.close()
    assert grpc_buffered(roomy) == 0


def test_resets_pings_unknown_frames_and_vanished_clients(roomy, data):
    """A call reset while its message is awaited, a PING (answered with its payload), a frame of
    an unknown type (ignored), then a call on the same connection answered; a client gone in
    the middle of a call: nothing stays held."""
    x, expected, _ = data
    c = H2(roomy.grpc)
    try:
        block = c.block("ModelInfer")
        c.call(1, block, end=False, declared=5000)
        c.send(H2.frame(6, 0, 0, b"12345678") + H2.frame(0xFA, 0, 0, b"xyz") + H2.frame(3, 0, 1, (8).to_bytes(4, "big")))
        assert c.read(lambda c: c.pings == [b"12345678"])
        c.call(3, block, infer_request(x[:5]))
        assert c.read(lambda c: c.status(3) is not None)
        assert c.status(3) == 0 and outputs(c.message(3))["labels"].tolist() == expected[:5].tolist()
        assert c.status(1) is None, "a reset call is not answered"
    finally:
        c.close()
    gone = H2(roomy.grpc)
    gone.call(1, gone.block("ModelInfer"), end=False, declared=5000)
    assert wait_for(lambda: grpc_buffered(roomy) == 5000, 1)
    gone.close()
    assert wait_for(lambda: grpc_buffered(roomy) == 0, 1), "let go at once, not at the 2 s body timeout"


def test_a_broken_connection_gets_goaway_and_is_closed(roomy, data):
    """DATA on stream 0 (PROTOCOL_ERROR), a frame past 16 KiB (FRAME_SIZE_ERROR), and HTTP/1.1
    where the preface should be: each connection closed (the first two after GOAWAY with the
    code); the next client is served."""
    x, expected, _ = data
    for bad, code in ((H2.frame(0, 0, 0, b"x"), 1), ((20000).to_bytes(3, "big") + bytes(6) + bytes(20000), 6)):
        c = H2(roomy.grpc)
        try:
            c.send(bad)
            assert c.read(lambda c: c.closed, 3)
            assert c.goaway is not None and c.goaway[1] == code
        finally:
            c.close()
    host, port = roomy.grpc.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=3) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert s.recv(1 << 16) is not None
        s.settimeout(3)
        while s.recv(1 << 16):
            pass
    c = H2(roomy.grpc)
    try:
        c.call(1, c.block("ModelInfer"), infer_request(x[:2]))
        assert c.read(lambda c: c.status(1) is not None)
        assert outputs(c.message(1))["labels"].tolist() == expected[:2].tolist()
    finally:
        c.close()


def test_answers_waiting_for_the_client_s_window_hold_the_budget(ece408, data):
    """A client that opens no window for answers (SETTINGS_INITIAL_WINDOW_SIZE 0) sends calls of
    340 uint8 images (267 KB), one after another, against a 1 MiB budget: each answer (16 KB) waits
    in the server holding its own size of the budget, not its message's; once they fill it, the
    next message is not let in (UNAVAILABLE at the 1 s body timeout). Given a window, every answer
    arrives whole and equal to the command line's, and the budget empties."""
    from infer.data import loader
    from infer.session import Session

    x = np.tile(data[0][:100], (4, 1, 1, 1))[:340]
    u8 = np.round(x * 255).astype(np.uint8)
    with Session(loader.load_model(ece408 / "model.hdf5"), "cpu") as session:
        expected = session.predict(u8)
    s = Server(ece408 / "model.hdf5", "--backend", "cpu", "--max-buffered-mb", "1", "--body-timeout-s", "1")
    try:
        c = H2(s.grpc, settings=[(4, 0)], auto_window=False)
        try:
            block, request = c.block("ModelInfer"), infer_request(u8, ("labels", "scores"))
            streams = []
            for i in range(80):
                stream = 1 + 2 * i
                c.send_message(stream, block, request)
                assert c.read(lambda c: c.streams.get(stream, {}).get("headers"), 5)  # answered or refused
                if c.status(stream) is not None:
                    break
                streams.append(stream)
            assert c.status(stream) == 14, "a message past the budget's room is refused"  # UNAVAILABLE
            held = grpc_buffered(s)
            assert 40 <= len(streams) <= 60, len(streams)  # (1 MiB + 64 KiB - 267 KB) / 16 KB answers
            assert (len(streams) - 1) * 16000 < held <= len(streams) * 17000, (held, len(streams))
            c.send(H2.frame(8, 0, 0, (1 << 30).to_bytes(4, "big"))
                   + b"".join(H2.frame(8, 0, st, (1 << 20).to_bytes(4, "big")) for st in streams))
            assert c.read(lambda c: all(c.status(st) is not None for st in streams), 10)
            assert all(c.status(st) == 0 for st in streams)
            for st in streams:
                assert outputs(c.message(st))["labels"].tolist() == expected.tolist()
        finally:
            c.close()
        assert wait_for(lambda: grpc_buffered(s) == 0, 3)
    finally:
        assert s.stop() == 0, "".join(s.stderr)
