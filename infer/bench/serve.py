"""`cnninfer bench --serve`: wrk (not ours; Debian: apt-get install wrk) against real servers on
127.0.0.1, bounded in time: requests/s and p50/p99 latency for single-image uint8 .npy requests at
1..256 concurrent connections, for large uint8 .npy requests, and KServe v2 gRPC calls at the
most connections (grpc_h2load where nghttp2's h2load is on the PATH, else grpc_load, a Python
client that saturates first), for `cnninfer serve`, the same
with --max-batch 1 (no batching), and the endpoint a user would write without us (Starlette
calling PyTorch per request; where torch and a GPU are). Answers are checked against a local
Session before any timing. `--soak S` instead holds about half the peak rate of 256 connections for
S seconds and reports errors, answers, and p50/p99 and the server's RSS window by window.

`python -m infer.bench.serve peer MODEL` runs that plain PyTorch endpoint alone."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import numpy as np

from ..errors import InputError

WRK_SCRIPT = r"""
local f = assert(io.open(os.getenv("CNNINFER_BENCH_BODY"), "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
local kind = os.getenv("CNNINFER_BENCH_TYPE") or ""
wrk.headers["Content-Type"] = kind ~= "" and kind or "application/x-npy"
local pause = tonumber(os.getenv("CNNINFER_BENCH_DELAY_MS") or "0")
if pause > 0 then function delay() return pause end end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('CNNINFER {"requests": %d, "duration_us": %d, "non2xx": %d, "socket_errors": %d, ' ..
    '"p50_ms": %.3f, "p99_ms": %.3f, "max_ms": %.3f}\n', summary.requests, summary.duration, e.status,
    e.connect + e.read + e.write + e.timeout, latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    latency.max / 1000))
end
"""


def wrk():
    found = shutil.which("wrk")
    if not found:
        raise InputError("bench --serve needs wrk on the PATH (Debian: apt-get install wrk)")
    return found


def start(argv, grpc=False):
    """A server process printing 'listening on URL' on its first line: (process, URL); grpc: its
    second line names its gRPC address, kept as process.grpc ("host:port")."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"), start_new_session=True)
    line = proc.stdout.readline()  # the server's first line, or '' once it has exited
    if "listening on " not in line:
        proc.kill()
        raise InputError(f"the server did not start: {line.strip()} {proc.stderr.read().strip()[-400:]}")
    proc.grpc = proc.stdout.readline().split("grpc://")[-1].split()[0] if grpc else None
    return proc, line.split("listening on ")[1].split()[0]


def stop(proc):
    """SIGTERM to the server (it drains), then whatever of its process group is left is killed:
    LitServe's workers outlive their parent otherwise, and would load the next rows' machine."""
    import signal

    proc.terminate()
    try:
        code = proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:  # nothing left
        pass
    return code


def post(url, body, timeout=120):
    req = urllib.request.Request(url + "/v1/predict", data=body, headers={"Content-Type": "application/x-npy"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def npy(x):
    import io

    b = io.BytesIO()
    np.save(b, x)
    return b.getvalue()


def tree(pid):
    """pid and its descendants (the workers of `serve --workers`), as /proc lists them."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            children = [int(c) for c in f.read().split()]
    except OSError:
        children = []
    return [pid] + [p for c in children for p in tree(c)]


def rss_mb(pid):
    """(resident MB of the process and its descendants, processes counted)."""
    pids = tree(pid)
    total = 0.0
    for p in pids:
        with open(f"/proc/{p}/status") as f:
            total += int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1)) / 1024
    return total, len(pids)


def metric_sum(url, name):
    with urllib.request.urlopen(url + "/metrics") as r:
        text = r.read().decode()
    s = re.search(rf"^{name}_sum (\S+)$", text, re.M)
    c = re.search(rf"^{name}_count (\S+)$", text, re.M)
    return (float(s.group(1)) if s else 0.0), (int(c.group(1)) if c else 0)


def load(url, body, connections, seconds, delay_ms=0, threads=None, path="/v1/predict", content_type=None):
    """wrk's figures for `connections` connections posting `body` (to url + path) for `seconds`."""
    with tempfile.TemporaryDirectory() as d:
        script, data = Path(d) / "post.lua", Path(d) / "body.npy"
        script.write_text(WRK_SCRIPT)
        data.write_bytes(body)
        threads = threads or max(1, min(connections, 4))
        out = subprocess.run([wrk(), "-t", str(threads), "-c", str(connections), "-d", f"{max(1, round(seconds))}s", "--timeout", "30s",
                              "-s", str(script), url + path], capture_output=True, text=True,
                             env=dict(os.environ, CNNINFER_BENCH_BODY=str(data), CNNINFER_BENCH_DELAY_MS=str(delay_ms),
                                      CNNINFER_BENCH_TYPE=content_type or ""))
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("CNNINFER ")), None)
    if line is None:
        raise InputError(f"wrk failed: {out.stdout.strip()[-300:]} {out.stderr.strip()[-300:]}")
    r = json.loads(line[len("CNNINFER "):])
    r["rps"] = (r["requests"] - r["non2xx"]) / (r["duration_us"] / 1e6)  # answered with 200
    return r


def infer_request(x):
    """A KServe v2 ModelInferRequest for images x (input `x`, its bytes in raw_input_contents),
    serialized: what the gRPC rows send, each call alike."""
    from tritonclient.grpc import service_pb2 as pb

    request = pb.ModelInferRequest(model_name="cnninfer")
    given = request.inputs.add()
    given.name, given.datatype = "x", "UINT8" if x.dtype == np.uint8 else "FP32"
    given.shape.extend(x.shape)
    request.raw_input_contents.append(np.ascontiguousarray(x).tobytes())
    return request.SerializeToString()


def _grpc_client(job):
    """One client process of grpc_load: `channels` HTTP/2 connections, `per_channel` calls in flight
    on each, ModelInfer with the tensor in raw_input_contents, until `seconds` have passed."""
    import asyncio
    import time

    import grpc
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as rpc

    target, message, channels, per_channel, seconds = job
    request = pb.ModelInferRequest.FromString(message)

    async def main():
        # a channel of its own per connection (else grpc shares one subchannel among them)
        chans = [grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
                 for _ in range(channels)]
        latencies, errors = [], 0
        end = time.perf_counter() + seconds

        async def loop(stub):
            nonlocal errors
            while (t := time.perf_counter()) < end:
                try:
                    await stub.ModelInfer(request)
                except grpc.aio.AioRpcError:
                    errors += 1
                    continue
                latencies.append(time.perf_counter() - t)

        stubs = [rpc.GRPCInferenceServiceStub(c) for c in chans]
        await asyncio.gather(*(loop(s) for s in stubs for _ in range(per_channel)))
        for c in chans:
            await c.close()
        return latencies, errors

    return asyncio.run(main())


def grpc_load(target, x, concurrency, seconds, processes=4, channels=4):
    """KServe v2 gRPC ModelInfer calls (tritonclient's service definitions, grpc.aio) from
    `processes` client processes, `concurrency` calls in flight in all: requests/s (answered),
    p50/p99 ms, errors. perf_analyzer has no pip package (PyPI's perf-analyzer is an empty
    placeholder), so the client is Python's: where it saturates, the figure is the client's."""
    import multiprocessing

    procs = max(1, min(processes, concurrency))
    chans = max(1, min(channels, concurrency // procs))
    per = max(1, concurrency // (procs * chans))
    job = (target, infer_request(x), chans, per, seconds)
    with multiprocessing.get_context("spawn").Pool(procs) as pool:
        parts = pool.map(_grpc_client, [job] * procs)
    latencies = np.sort(np.concatenate([np.asarray(p[0]) for p in parts])) if parts else np.empty(0)
    errors = sum(p[1] for p in parts)
    if not len(latencies):
        raise InputError(f"grpc://{target}: no call was answered ({errors} errors)")
    return dict(requests=len(latencies), rps=len(latencies) / seconds, errors=errors,
                p50_ms=float(latencies[len(latencies) // 2] * 1e3),
                p99_ms=float(latencies[int(len(latencies) * 0.99)] * 1e3),
                connections=procs * chans, concurrency=procs * chans * per)


def grpc_h2load(target, x, connections, streams, seconds, threads=4):
    """KServe v2 gRPC ModelInfer calls from h2load (nghttp2's HTTP/2 load generator, in C; not ours:
    Debian's nghttp2-client), `connections` x `streams` calls in flight, each the same request:
    answered calls/s, p50/p99 ms (from its per-request log), errors. A gRPC error is an HTTP 200
    with trailers alone, so each answer is checked by its size: the body of the ModelInferResponse
    the server gives this request (asked once first with grpcio); answers of another size are
    errors, and where any is, the requests/s counts only the full-size ones' share."""
    import struct

    import grpc
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as rpc

    found = shutil.which("h2load")
    if not found:
        raise InputError("the gRPC rows with h2load need it on the PATH (Debian: apt-get install nghttp2-client)")
    message = infer_request(x)
    with grpc.insecure_channel(target) as channel:
        try:
            size = 5 + rpc.GRPCInferenceServiceStub(channel).ModelInfer(pb.ModelInferRequest.FromString(message),
                                                                          timeout=30).ByteSize()
        except grpc.RpcError as e:
            raise InputError(f"grpc://{target}: no call was answered ({e.code().name})") from None
    with tempfile.TemporaryDirectory() as d:
        body, log = Path(d) / "request.bin", Path(d) / "log.tsv"
        body.write_bytes(b"\0" + struct.pack(">I", len(message)) + message)  # gRPC's frame: uncompressed, length
        out = subprocess.run([found, "-D", str(max(1, round(seconds))), "-c", str(connections), "-m", str(streams),
                              "-t", str(max(1, min(threads, connections))), "-d", str(body), "--log-file", str(log),
                              "-H", "content-type: application/grpc", "-H", "te: trailers",
                              f"http://{target}/inference.GRPCInferenceService/ModelInfer"],
                             capture_output=True, text=True)
        times = np.loadtxt(log, usecols=2, ndmin=1) if log.stat().st_size else np.empty(0)
    full, errors, duration = h2load_answers(out.stdout + out.stderr, size, target)
    times = np.sort(times) / 1e3
    return dict(requests=full, rps=full / duration, errors=errors, p50_ms=float(times[len(times) // 2]),
                p99_ms=float(times[int(len(times) * 0.99)]), connections=connections,
                concurrency=connections * streams, client="h2load")


def h2load_answers(text, size, target):
    """(calls answered in full, the others, seconds) from h2load's summary `text`, each full answer
    `size` bytes of DATA: where the DATA is not that, some answers were errors (trailers alone)
    and which cannot be told, so none counts."""
    done = re.search(r"finished in ([\d.]+)s", text)
    counts = re.search(r"requests: (\d+) total, \d+ started, \d+ done, (\d+) succeeded", text)
    data = re.search(r"traffic: .*?\((\d+)\) data", text)
    if not (done and counts and data):
        raise InputError(f"h2load failed: {text.strip()[-400:]}")
    total, answered, nbytes = int(counts.group(1)), int(counts.group(2)), int(data.group(1))
    if not answered or nbytes != answered * size:
        raise InputError(f"grpc://{target}: no call was answered in full ({answered} HTTP answers, {nbytes} bytes "
                         f"of data; {size} bytes each expected)")
    return answered, total - answered, float(done.group(1))


def check_answers(url, x, expected):
    """The server's answers for 64 single-image requests and one large one equal `expected`."""
    for i in range(64):
        if post(url, npy(x[i:i + 1]))["labels"] != [int(expected[i])]:
            raise InputError(f"{url}: image {i} answered differently from the local Session")
    if post(url, npy(x))["labels"] != expected.tolist():
        raise InputError(f"{url}: a {len(x)}-image request answered differently from the local Session")


def servers(model, backend, peer, workers=1, max_batch=None):
    """(name, argv) of the servers compared."""
    me = [sys.executable, "-m", "infer", "serve", str(model), "--backend", backend, "--port", "0", "--grpc-port", "0"]
    batch = ["--max-batch", str(max_batch)] if max_batch else []
    name = "cnninfer serve" + (f" --max-batch {max_batch}" if max_batch else "")
    out = [(name, me + batch)]
    if workers > 1:
        out.append((f"{name} --workers {workers}", me + batch + ["--workers", str(workers)]))
    out.append(("cnninfer serve --max-batch 1", me + ["--max-batch", "1"]))
    if peer:
        out.append(("Starlette + PyTorch per request", [sys.executable, "-m", "infer.bench.serve", "peer", str(model)]))
        if litserve_available():
            from ..serve.server import free_port

            for workers_per_device, api_servers, batch in LITSERVE:
                out.append((f"LitServe {workers_per_device} worker, {api_servers} API servers, batch {batch}",
                            [sys.executable, "-m", "infer.bench.litserve", str(model), str(free_port("127.0.0.1")),
                             str(workers_per_device), str(api_servers), str(batch)]))
    return out


# LitServe's configurations measured: (inference workers on the GPU, HTTP processes, max batch)
LITSERVE = ((1, 4, 64), (2, 8, 256))


def litserve_available():
    try:
        import litserve  # noqa: F401
    except ImportError:
        return False
    return True


def peer_available():
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def serve_bench(data, model, backend="auto", clients=(1, 16, 64, 256), seconds=5.0, big=4096, peer=None, workers=1,
                max_batch=None):
    """The table's rows: for each server, each client count of single-image requests, then
    `big`-image uint8 requests on 16 connections."""
    from ..data import loader
    from .gpu import read_all
    from ..session import Session

    wrk()
    m = loader.load_model(model)
    x = read_all(data, m)
    x = np.tile(x, (-(-big // len(x)), 1, 1, 1))[:big]
    u8 = np.round(x * 255).astype(np.uint8)  # MNIST's own pixels: the float32 file is u8 * (1/255)
    with Session(m, backend) as s:
        expected, expected_u8 = s.predict(x), s.predict(u8)
        device = s.device
    peer = peer_available() if peer is None else peer
    rows = []
    from ..serve.server import grpc_available

    for name, argv in servers(model, backend, peer, workers, max_batch):
        proc, url = start(argv, grpc=name.startswith("cnninfer serve") and grpc_available())
        lit = name.startswith("LitServe")
        if lit:  # its own protocol: JSON with a base64 .npy, on /predict
            from .litserve import body

            encode, where = body, dict(path="/predict", content_type="application/json")
        else:
            encode, where = npy, {}
        try:
            if lit:
                answers = [json.loads(urllib.request.urlopen(urllib.request.Request(
                    url + "/predict", data=body(x[i:i + 1]), headers={"Content-Type": "application/json"})).read())
                    for i in range(64)]
                if [a["labels"] for a in answers] != [[int(e)] for e in expected[:64]]:
                    raise InputError(f"{name}: answers differ from the local Session's")
            else:
                check_answers(url, x, expected)
                if post(url, npy(u8))["labels"] != expected_u8.tolist():
                    raise InputError(f"{name}: uint8 answers differ from the local Session's")
            single = encode(u8[:1])  # the targets' single image: a byte a pixel
            for c in clients:
                # (with several workers each counts its own: no mean batch)
                before = metric_sum(url, "cnninfer_batch_images") if name.startswith("cnninfer serve") \
                    and "--workers" not in name else None
                r = load(url, single, c, seconds, **where)
                r.update(server=name, request_images=1, connections=c)
                if before is not None:
                    after = metric_sum(url, "cnninfer_batch_images")
                    if after[1] > before[1]:  # a single process's passes (front ends count none)
                        r["mean_batch"] = (after[0] - before[0]) / (after[1] - before[1])
                rows.append(r)
            if not name.endswith("--max-batch 1"):  # one image a pass: no figure worth a row
                r = load(url, encode(u8), 16, seconds, **where)
                r.update(server=name, request_images=big, connections=16)
                rows.append(r)
                if proc.grpc:  # KServe v2 gRPC at the most clients
                    most = max(clients)
                    r = (grpc_h2load(proc.grpc, u8[:1], min(16, most), max(1, most // 16), seconds)
                         if shutil.which("h2load") else grpc_load(proc.grpc, u8[:1], most, seconds))
                    r.update(server=f"{name} (gRPC, {r.get('client', 'grpc.aio')})", request_images=1,
                             connections=r["concurrency"], non2xx=0, socket_errors=r["errors"])
                    rows.append(r)
        finally:
            stop(proc)
    return dict(device=device, backend=backend, seconds=seconds, rows=rows)


def soak(data, model, backend="auto", seconds=600.0, connections=256, workers=1, max_batch=None, window=60.0,
         probe_s=5.0, warm_s=10.0):
    """About half the peak single-image rate of `connections` for `seconds`, in windows of `window` seconds (each
    its own wrk run: p50/p99 and the server's RSS after it, so a drift shows): errors, answers before
    and after. probe_s: the peak's measurement; warm_s: the load before RSS is first read."""
    from ..data import loader
    from .gpu import read_all
    from ..session import Session

    m = loader.load_model(model)
    x = read_all(data, m)[:4096]
    with Session(m, backend) as s:
        expected = s.predict(x)
    proc, url = start(servers(model, backend, False, workers, max_batch)[1 if workers > 1 else 0][1])
    try:
        check_answers(url, x, expected)
        single = npy(np.round(x[:1] * 255).astype(np.uint8))  # as bench --serve's rows
        peak = load(url, single, connections, probe_s)
        # Each connection waits between requests so the rate is about half the peak
        pause_ms = max(0.0, 2 * connections / peak["rps"] * 1e3 - peak["p50_ms"])
        load(url, single, connections, warm_s, delay_ms=pause_ms)  # warm: RSS measured from here
        rss0, counted = rss_mb(proc.pid)
        windows, left = [], seconds
        while left > 0.5:
            r = load(url, single, connections, min(window, left), delay_ms=pause_ms)
            r["rss_mb"] = rss_mb(proc.pid)[0]
            windows.append(r)
            left -= r["duration_us"] / 1e6
        check_answers(url, x, expected)
    finally:
        code = stop(proc)
    total = {k: sum(w[k] for w in windows) for k in ("requests", "non2xx", "socket_errors", "duration_us")}
    total["rps"] = (total["requests"] - total["non2xx"]) / (total["duration_us"] / 1e6)
    rss1 = windows[-1]["rss_mb"]
    return dict(peak_rps=peak["rps"], pause_ms=pause_ms, soak=total, windows=windows, rss_start_mb=rss0, rss_end_mb=rss1,
                workers=workers, processes=counted, rss_growth=rss1 / rss0 - 1, exit_code=code, seconds=seconds,
                connections=connections)


def table(result):
    if "soak" in result:
        r, ws = result["soak"], result["windows"]
        lines = [f"soak: {r['duration_us'] / 1e6:.0f} s at {r['rps']:.0f} requests/s on {result['connections']} connections "
                 f"(peak {result['peak_rps']:.0f}/s): {r['requests']} requests, {r['non2xx']} non-2xx, "
                 f"{r['socket_errors']} socket errors; p99 by window {min(w['p99_ms'] for w in ws):.2f}-"
                 f"{max(w['p99_ms'] for w in ws):.2f} ms; answers equal before and after; RSS {result['rss_start_mb']:.0f} -> "
                 f"{result['rss_end_mb']:.0f} MB ({result['processes']} processes, {100 * result['rss_growth']:+.1f}%); "
                 f"exit {result['exit_code']}",
                 f"{'window':>6} {'seconds':>8} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'errors':>6} {'RSS MB':>7}"]
        for i, w in enumerate(ws):
            lines.append(f"{i + 1:>6} {w['duration_us'] / 1e6:>8.1f} {w['rps']:>9.0f} {w['p50_ms']:>8.2f} {w['p99_ms']:>8.2f} "
                         f"{w['max_ms']:>8.1f} {w['non2xx'] + w['socket_errors']:>6} {w['rss_mb']:>7.0f}")
        return lines
    lines = [f"device: {result['device']}; {result['seconds']:g} s per row; wrk on 127.0.0.1; uint8 images",
             f"{'server':<44} {'images/req':>10} {'clients':>7} {'req/s':>10} {'images/s':>12} "
             f"{'p50 ms':>8} {'p99 ms':>8} {'errors':>6} {'batch':>6}"]
    for r in result["rows"]:
        images = r["rps"] * r["request_images"]
        batch = f"{r['mean_batch']:.1f}" if "mean_batch" in r else "-"
        lines.append(f"{r['server']:<44} {r['request_images']:>10} {r['connections']:>7} {r['rps']:>10.0f} "
                     f"{images:>12.0f} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} "
                     f"{r['non2xx'] + r['socket_errors']:>6} {batch:>6}")
    return lines


def peer_app(model_path):
    """The endpoint a user would write without cnninfer: Starlette, the network in PyTorch (eager,
    cuDNN FP32, TF32 off) on the GPU, one forward per request."""
    import io

    import torch
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from .gpu import torch_network
    from ..data.loader import load_model

    dev = torch.device("cuda")
    net = torch.no_grad()(torch_network(load_model(model_path), dev))

    async def predict(request):
        x = np.load(io.BytesIO(await request.body()))
        labels = net(torch.from_numpy(x.astype(np.float32)).to(dev))
        return JSONResponse({"labels": labels.cpu().tolist()})

    return Starlette(routes=[Route("/v1/predict", predict, methods=["POST"])])


def run_peer(model_path):
    import uvicorn

    from ..serve.server import bind, url_of

    sock = bind("127.0.0.1", 0)
    app = peer_app(model_path)
    print(f"peer: listening on {url_of(sock)}", flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False)).run(sockets=[sock])


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "peer":
        sys.exit("usage: python -m infer.bench.serve peer MODEL (LitServe's: python -m infer.bench.litserve)")
    run_peer(sys.argv[2])
