"""The KServe v2 protocol as standard clients speak it: tritonclient.http and tritonclient.grpc
against a real `cnninfer serve` on 127.0.0.1 (CPU backend). Each input type's expected answer is
the command line's on a file of that type; scores are compared, not only labels."""
import hashlib
import shutil

import h5py
import numpy as np
import pytest

import infer
from tests.serving import Server

try:  # tritonclient without its http extra raises RuntimeError, not ImportError
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException
except (ImportError, RuntimeError) as e:
    pytest.skip(f"tritonclient[http,grpc] is needed: {e}", allow_module_level=True)

TOKEN = "k5erve"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
GAUTH = {"authorization": f"Bearer {TOKEN}"}  # gRPC metadata keys are lower case


@pytest.fixture(scope="module")
def expected(ece408, tmp_path_factory):
    """{dtype: (images, labels, scores)} from `run` on a float32 file and on a uint8 file."""
    with h5py.File(ece408 / "test100.hdf5") as f:
        x, y = f["x"][:37], f["y"][:37]
    u8 = np.round(x * 255).astype(np.uint8)
    path = tmp_path_factory.mktemp("kserve") / "u8.h5"
    with h5py.File(path, "w") as f:
        f["x"], f["y"] = u8, y
    out = {}
    for dtype, data in ((np.float32, ece408 / "test100.hdf5"), (np.uint8, path)):
        r = infer.run(data, ece408 / "model.hdf5", 37, backend="cpu", scores=True)
        out[np.dtype(dtype).name] = (x if dtype == np.float32 else u8, r.predictions, r.scores)
    return out


@pytest.fixture(scope="module")
def server(ece408):
    s = Server(ece408 / "model.hdf5", "--backend", "cpu", "--token", TOKEN)
    assert s.grpc and s.second_line.startswith("cnninfer serve: gRPC (KServe v2) on grpc://127.0.0.1:")
    yield s
    assert s.stop() == 0, "".join(s.stderr)


def http_client(server):
    return httpclient.InferenceServerClient(server.url.split("//")[1])


def grpc_client(server):
    return grpcclient.InferenceServerClient(server.grpc)


def test_health_and_metadata(server, ece408):
    digest = hashlib.sha256((ece408 / "model.hdf5").read_bytes()).hexdigest()
    h, g = http_client(server), grpc_client(server)
    assert h.is_server_live(headers=AUTH) and h.is_server_ready(headers=AUTH) and h.is_model_ready("cnninfer", headers=AUTH)
    assert g.is_server_live(headers=GAUTH) and g.is_server_ready(headers=GAUTH)
    assert g.is_model_ready("cnninfer", headers=GAUTH)
    meta = h.get_model_metadata("cnninfer", headers=AUTH)
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 28, 28, 1]}]
    assert meta["outputs"] == [{"name": "labels", "datatype": "INT64", "shape": [-1]},
                               {"name": "scores", "datatype": "FP32", "shape": [-1, 10]}]
    assert meta["parameters"]["sha256"] == digest
    gmeta = g.get_model_metadata("cnninfer", headers=GAUTH, as_json=True)
    assert gmeta["inputs"][0]["name"] == "x" and gmeta["outputs"][1]["shape"] == ["-1", "10"]
    assert h.get_server_metadata(headers=AUTH)["extensions"] == ["binary_tensor_data"]


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("dtype", ["float32", "uint8"])
def test_http_infer_equals_the_command_line(server, expected, dtype, binary):
    x, labels, scores = expected[dtype]
    inp = httpclient.InferInput("x", list(x.shape), "FP32" if dtype == "float32" else "UINT8")
    inp.set_data_from_numpy(x, binary_data=binary)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("labels", "scores")]
    # tritonclient writes Inference-Header-Content-Length into the headers it is given: a copy each call
    r = http_client(server).infer("cnninfer", [inp], outputs=outputs, headers=dict(AUTH), request_id="r1")
    assert (r.as_numpy("labels") == labels).all() and r.as_numpy("labels").dtype == np.int64
    np.testing.assert_allclose(r.as_numpy("scores"), scores, rtol=1e-5, atol=1e-5)
    assert r.get_response()["id"] == "r1"


@pytest.mark.parametrize("dtype", ["float32", "uint8"])
def test_grpc_infer_equals_the_command_line(server, expected, dtype):
    x, labels, scores = expected[dtype]
    inp = grpcclient.InferInput("x", list(x.shape), "FP32" if dtype == "float32" else "UINT8")
    inp.set_data_from_numpy(x)
    r = grpc_client(server).infer("cnninfer", [inp], headers=GAUTH)
    assert (r.as_numpy("labels") == labels).all()
    np.testing.assert_allclose(r.as_numpy("scores"), scores, rtol=1e-5, atol=1e-5)
    only = grpc_client(server).infer("cnninfer", [inp], outputs=[grpcclient.InferRequestedOutput("labels")],
                                     headers=GAUTH)
    assert only.as_numpy("scores") is None and (only.as_numpy("labels") == labels).all()


def test_the_token_applies_to_both(server, expected):
    import httpx

    x = expected["float32"][0][:2]
    assert httpx.get(server.url + "/v2/health/live").status_code == 401
    assert httpx.get(server.url + "/v2/health/live", headers={"Authorization": "bearer " + TOKEN}).json() == {"live": True}
    inp = grpcclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException) as e:
        grpc_client(server).infer("cnninfer", [inp])
    assert "UNAUTHENTICATED" in str(e.value.status()) and "bearer token" in e.value.message()
    r = grpc_client(server).infer("cnninfer", [inp], headers={"authorization": f"bearer {TOKEN}"})
    assert (r.as_numpy("labels") == expected["float32"][1][:2]).all()


@pytest.mark.parametrize("client", ["http", "grpc"])
def test_bad_requests_are_one_line_and_the_server_stays_up(server, expected, client):
    module, make = (httpclient, http_client) if client == "http" else (grpcclient, grpc_client)
    auth = AUTH if client == "http" else GAUTH
    x = expected["float32"][0]
    bad = np.zeros((2, 27, 28, 1), np.float32)
    inp = module.InferInput("x", list(bad.shape), "FP32")
    inp.set_data_from_numpy(bad)
    with pytest.raises(InferenceServerException) as e:
        make(server).infer("cnninfer", [inp], headers=dict(auth))
    assert "images of 27x28 flatten to" in e.value.message() and "\n" not in e.value.message()
    assert "dataset" not in e.value.message() and "/" not in e.value.message()
    inp = module.InferInput("x", list(x[:3].shape), "FP32")
    inp.set_data_from_numpy(x[:3])
    with pytest.raises(InferenceServerException) as e:
        make(server).infer("mnist", [inp], headers=dict(auth))
    assert "this server serves 'cnninfer'" in e.value.message()
    assert (make(server).infer("cnninfer", [inp], headers=dict(auth)).as_numpy("labels") == expected["float32"][1][:3]).all()


@pytest.mark.parametrize("make,words", [
    (lambda x: (b'{"inputs":[{"name":"x","shape":[2,28,28,1],"datatype":"FP32","parameters":{"binary_data_size":6272}}]}',
                x[:2].tobytes() + b"extra"), "binary_data_size 6272, but 6277 bytes follow the header"),
    (lambda x: (b'{"inputs":[{"name":"x","shape":[2,28,28,1],"datatype":"BYTES","data":[1]}]}', b""),
     "datatype 'BYTES' is not a number type"),
    (lambda x: (b'{"inputs":[{"name":"y","shape":[2,28,28,1],"datatype":"FP32","data":[1]}]}', b""),
     "input 'y': the model's one input is 'x'"),
    (lambda x: (b'{"inputs":[{"name":"x","shape":[2,28,28,1],"datatype":"FP32","data":[1, 2]}]}', b""),
     "2 values for a tensor of shape [2, 28, 28, 1] (1568)"),
    (lambda x: (b'{"inputs":[{"name":"x","shape":[1,28,28,1],"datatype":"FP32","data":[1]}],'
                b'"outputs":[{"name":"probabilities"}]}', b""), "output 'probabilities': the model's outputs are"),
])
def test_bad_v2_bodies_are_400_with_one_line(server, expected, make, words):
    import httpx

    head, tail = make(expected["float32"][0])
    headers = dict(AUTH, **({"Inference-Header-Content-Length": str(len(head))} if tail else {}))
    r = httpx.post(server.url + "/v2/models/cnninfer/infer", content=head + tail, headers=headers)
    assert r.status_code == 400 and words in r.json()["error"], r.text
    text = httpx.get(server.url + "/metrics", headers=AUTH).text
    assert 'cnninfer_requests_total{status="400"}' in text


def test_grpc_messages_past_the_body_limit_are_refused(ece408, expected):
    """--max-body-mb bounds gRPC's messages too: a 1.2 MB tensor against 1 MB, RESOURCE_EXHAUSTED;
    the server goes on answering."""
    x = np.tile(expected["float32"][0], (10, 1, 1, 1))[:370]  # 370 float32 images: 1.16 MB
    s = Server(ece408 / "model.hdf5", "--backend", "cpu", "--max-body-mb", "1")
    try:
        client = grpcclient.InferenceServerClient(s.grpc)
        inp = grpcclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        with pytest.raises(InferenceServerException) as e:
            client.infer("cnninfer", [inp])
        assert "RESOURCE_EXHAUSTED" in str(e.value.status())
        small = grpcclient.InferInput("x", [3, 28, 28, 1], "FP32")
        small.set_data_from_numpy(x[:3])
        assert (client.infer("cnninfer", [small]).as_numpy("labels") == expected["float32"][1][:3]).all()
    finally:
        assert s.stop() == 0


def test_binary_data_output_asks_every_output_in_binary(server, expected):
    """No outputs named and parameters.binary_data_output: both outputs after the JSON header, in
    binary, their sizes in binary_data_size; the bytes are the labels and scores."""
    import json

    import httpx

    x, labels, scores = expected["float32"]
    head = json.dumps({"inputs": [{"name": "x", "shape": list(x[:4].shape), "datatype": "FP32",
                                   "parameters": {"binary_data_size": x[:4].nbytes}}],
                       "parameters": {"binary_data_output": True}}).encode()
    r = httpx.post(server.url + "/v2/models/cnninfer/infer", content=head + x[:4].tobytes(),
                   headers=dict(AUTH, **{"Inference-Header-Content-Length": str(len(head))}))
    assert r.status_code == 200 and r.headers["content-type"] == "application/octet-stream"
    n = int(r.headers["inference-header-content-length"])
    answer = json.loads(r.content[:n])
    sizes = [o["parameters"]["binary_data_size"] for o in answer["outputs"]]
    assert [o["name"] for o in answer["outputs"]] == ["labels", "scores"] and sizes == [4 * 8, 4 * 10 * 4]
    assert (np.frombuffer(r.content[n:n + 32], "<i8") == labels[:4]).all()
    np.testing.assert_allclose(np.frombuffer(r.content[n + 32:], "<f4").reshape(4, 10), scores[:4], rtol=1e-5, atol=1e-5)


def test_the_benchmarks_grpc_load_counts_answered_calls_only(ece408, server, expected):
    """bench_serve.grpc_load (the gRPC rows of `bench --serve`): calls answered against a server
    without a token; refused calls are errors, not requests (a server with a token: none answered)."""
    from infer.bench.serve import grpc_load
    from infer.errors import InputError

    x = expected["uint8"][0][:1]
    s = Server(ece408 / "model.hdf5", "--backend", "cpu")
    try:
        r = grpc_load(s.grpc, x, 4, 1.0, processes=1, channels=2)
        assert r["requests"] > 0 and r["errors"] == 0 and r["connections"] == 2 and r["concurrency"] == 4
        assert 0 < r["p50_ms"] <= r["p99_ms"]
    finally:
        assert s.stop() == 0
    with pytest.raises(InputError, match="no call was answered"):
        grpc_load(server.grpc, x, 2, 0.5, processes=1, channels=1)


@pytest.mark.skipif(not shutil.which("h2load"), reason="h2load (Debian's nghttp2-client) is not on the PATH")
def test_the_benchmarks_h2load_rows_count_full_answers_only(ece408, server, expected):
    """bench_serve.grpc_h2load: h2load's calls against a server without a token, every answer of
    the size of the one grpcio got, with latencies from its log; a server whose calls are all
    refused (a token not sent) is no figure at all, though each refusal is an HTTP 200."""
    from infer.bench.serve import grpc_h2load
    from infer.errors import InputError

    x = expected["uint8"][0][:1]
    s = Server(ece408 / "model.hdf5", "--backend", "cpu")
    try:
        r = grpc_h2load(s.grpc, x, 2, 3, 1.0, threads=1)
        assert r["requests"] > 0 and r["errors"] == 0 and r["concurrency"] == 6 and r["client"] == "h2load"
        assert 0 < r["p50_ms"] <= r["p99_ms"] and r["rps"] > 0
    finally:
        assert s.stop() == 0
    with pytest.raises(InputError, match="no call was answered"):
        grpc_h2load(server.grpc, x, 1, 2, 0.5, threads=1)


SUMMARY = """finished in 3.00s, 2425.00 req/s, 386.01KB/s
requests: 7275 total, 7531 started, 7275 done, 7275 succeeded, 0 failed, 0 errored, 0 timeout
status codes: 7275 2xx, 0 3xx, 0 4xx, 0 5xx
traffic: 1.13MB (1185810) total, 22.49KB (23025) headers (space savings 96.09%), 781.49KB (800250) data
"""


def test_h2load_s_summary_counts_answers_only_where_every_one_is_whole():
    """h2load's own summary (nghttp2 1.52, as above): 7275 answers of 110 bytes each are 7275 calls
    in 3 s; one byte short of that (an answer was a gRPC error, trailers alone, and which is not
    known), or no summary at all, is no figure."""
    from infer.bench.serve import h2load_answers
    from infer.errors import InputError

    assert h2load_answers(SUMMARY, 110, "t") == (7275, 0, 3.0)
    with pytest.raises(InputError, match="no call was answered in full"):
        h2load_answers(SUMMARY.replace("(800250) data", "(800140) data"), 110, "t")
    with pytest.raises(InputError, match="h2load failed"):
        h2load_answers("connect: Connection refused", 110, "t")


@pytest.mark.skipif(not shutil.which("wrk"), reason="wrk (Debian's) is not on the PATH")
def test_the_benchmarks_soak_reports_each_window(ece408):
    """bench_serve.soak (`bench --serve --soak S`): S seconds in windows, each its own wrk run with
    its p99 and the server's RSS after it, totals their sum; the server stopped cleanly after."""
    from infer.bench.serve import soak, table

    r = soak(ece408 / "test100.hdf5", ece408 / "model.hdf5", "cpu", seconds=4, connections=4, window=2, probe_s=1, warm_s=1)
    ws = r["windows"]
    assert len(ws) == 2 and all(w["requests"] > 0 and w["rss_mb"] > 30 for w in ws)
    assert r["soak"]["requests"] == sum(w["requests"] for w in ws) and r["soak"]["non2xx"] == 0
    assert r["rss_end_mb"] == ws[-1]["rss_mb"] and r["exit_code"] == 0 and r["connections"] == 4
    lines = table(r)
    assert len(lines) == 2 + 2 and "p99 by window" in lines[0] and "0 non-2xx" in lines[0]
