"""`cnninfer serve`: the engine over HTTP (Starlette on uvicorn, `pip install 'cnninfer[serve]'`),
requests that arrive together merged into one forward pass (batcher.py).

    POST /v1/predict   .npy (N, H, W, C) images of any integer or float type, or one PNG / JPEG
                       -> {"labels": [...]} (?scores=1 adds "scores"); 400 bad body, 401 token,
                       408 body too slow, 413 too large, 415 other Content-Type, 500 failed,
                       503 busy or shutting down, 504 not answered within --request-timeout-s
    GET  /healthz      {"status": "ok"}
    GET  /v1/model     input shape, classes, the model file's name and sha256, backend, device, batching
    GET  /metrics      Prometheus text: requests and images by status, latency and batch histograms,
                       refusals by bound, the bounds
    GET  /             a page: draw a digit, see its class and the ten scores

Every resource a client can make the server spend is bounded (Settings): connections and the
time to send headers (guard.py), body size, time between body bytes and all bodies held at once,
picture pixels (read from the header, before decoding), decoders at once (never on the event
loop, but for .npy bodies of up to INLINE_BYTES), images queued, a request's time in the queue,
and the drain on SIGTERM.
"""
import asyncio
import contextlib
import gc
import hmac
import os
import signal
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from .. import __version__, network
from . import images, kserve
from .batcher import Batcher, Busy, Draining, Expired, ladder
from .budget import Budget, SharedBytes
from ..errors import InputError, about_request
from .metrics import Metrics

PAGE = Path(__file__).with_name("page.html")
INLINE_BYTES = 64 << 10  # .npy bodies up to this size are parsed on the event loop (microseconds)
SWITCH_INTERVAL_S = 0.0002
GIVE_UP_MARGIN_S = 0.5  # stalled uploads are answered 503 this long before the drain's end
STARTUP_POLL_S = 0.1  # a front end waiting for the engine's hello looks this often for a SIGTERM
GRPC_FRAMING = 1 << 16  # a gRPC message's bytes beyond its body's limit: the protobuf around the tensor
KEEP_ALIVE_S = 30  # a connection without a request (HTTP) or call (gRPC) this long is closed


@dataclass(frozen=True)
class Settings:
    """The server's settings: batching, the token, and its bounds (each a `serve` option)."""
    max_batch: int = 256  # images merged into one forward pass at most
    max_delay_ms: float = 2.0  # how long a batch waits for more requests after its first arrived
    token: str = None  # bearer token required on /v1/* and /metrics
    max_body_bytes: int = 64 << 20
    max_buffered_bytes: int = 512 << 20  # request bodies held at once, all connections together
    max_pixels: int = images.MAX_PIXELS
    decoders: int = 2  # bodies decoded at once, on threads of their own
    max_connections: int = 2048
    header_timeout_s: float = 10.0  # to send a request's line and headers
    body_timeout_s: float = 10.0  # between two parts of a body
    request_timeout_s: float = 30.0  # from a request's images queued to its answer
    drain_s: float = 5.0  # SIGTERM: in-flight requests answered within this, the rest 503
    grpc: str = None  # "host:port" of the KServe v2 gRPC service (port 0: a free one), or None

    def limits(self):
        """The bounds, by name, for /metrics."""
        return {k: v for k, v in asdict(self).items() if k not in ("token", "max_delay_ms", "grpc")}


def require():
    """InputError unless the serve extra is installed (and Python has asyncio.timeout)."""
    if sys.version_info < (3, 11):
        raise InputError("cnninfer serve needs Python 3.11 or later")
    try:
        import httptools  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise InputError(f"cnninfer serve needs Starlette, uvicorn and httptools ({e}): "
                         f"pip install 'cnninfer[serve]'") from None


def auto_workers(backend):
    """serve --workers auto: one process on the CPU backend (its cores compute); on a GPU, front
    ends on three quarters of the cores (2 to 12) around one engine: the front ends' Python is
    what a single-image load spends (16 cores, 256 connections: 8 front ends 28k requests/s,
    12 front ends 39k)."""
    if backend == "cpu" or (backend == "auto" and not cuda_usable()):
        return 1
    return min(12, max(2, (os.cpu_count() or 2) * 3 // 4))


def auto_max_batch(backend):
    """serve's --max-batch by default: on a GPU 4096 (a pass of that many costs it ~0.2 ms, and
    passes are padded to a ladder of sizes, so a lone request still runs alone); on the CPU 256."""
    return 256 if backend == "cpu" or (backend == "auto" and not cuda_usable()) else 4096


def cuda_usable():
    """Whether a CUDA GPU is usable here (the driver started, no context made)."""
    try:
        from ..gpu.device import visible_devices

        return visible_devices() > 0
    except Exception:  # no PyCUDA, no driver, no device
        return False


def grpc_available():
    """Whether hpack and tritonclient's service definitions are installed (the serve extra)."""
    try:
        import hpack  # noqa: F401
        from tritonclient.grpc import service_pb2  # noqa: F401
    except ImportError:
        return False
    return True


class Refused(Exception):
    """A request answered with an error: its HTTP status, one line, and headers (gRPC maps the status)."""

    def __init__(self, status, message, headers=None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers


class Drain:
    """The app's state as SIGTERM drains it: bodies being read can be cut short."""

    def __init__(self):
        self.gave_up = False
        self.reading = set()  # the asyncio.timeout of every body read in progress

    def give_up(self):
        """Stalled uploads end now (answered 503)."""
        self.gave_up = True
        now = asyncio.get_running_loop().time()
        for deadline in list(self.reading):
            deadline.reschedule(now)


def failed(what, e):
    """A defect's one line on stderr (the client gets a JSON 500 without it)."""
    print(f"cnninfer serve: {what} failed: {type(e).__name__}: {' '.join(str(e).split())}", file=sys.stderr)


def make_app(session, settings, batcher, sha256=None, bodies=None, shared_port=False):
    """The ASGI app over a Session whose forward passes the batcher runs; the caller closes the
    session once the app has shut down. Its `state.drain` is the Drain the server's shutdown uses.
    `bodies`: the SharedBytes HTTP bodies count in (front ends share one), else the app's own;
    `shared_port`: the gRPC port is bound by every front end (SO_REUSEPORT)."""
    from starlette.applications import Starlette
    from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
    from starlette.routing import Route

    from . import guard

    metrics = Metrics(settings.max_batch, dict(settings.limits(), max_head_bytes=guard.MAX_HEAD_BYTES,
                                                   max_headers=guard.MAX_HEADERS, max_pipelined=guard.MAX_PIPELINED))
    batcher.metrics = metrics
    h, w, c = network.image_shape(session.model)
    token = settings.token.encode() if settings.token else None
    drain = Drain()
    bodies = bodies or SharedBytes()
    decode_pool = ThreadPoolExecutor(settings.decoders, thread_name_prefix="cnninfer-decode")
    decode_slots = asyncio.Semaphore(settings.decoders)

    def error(status, message, headers=None):
        return JSONResponse({"error": message}, status_code=status, headers=headers)

    def refused(reason, status, message, close=False):
        metrics.refused(reason)
        return Refused(status, message, {"Connection": "close"} if close else None)

    def authorized(request):
        return token is None or bearer(request.headers.get("authorization"))

    def bearer(value):
        """Authorization: Bearer TOKEN, the scheme in any case (RFC 7235); HTTP's and gRPC's."""
        if token is None:
            return True
        scheme, _, given = (value or "").strip().partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token)

    def unauthorized():
        return error(401, "a valid bearer token is required (Authorization: Bearer TOKEN)",
                     {"WWW-Authenticate": 'Bearer realm="cnninfer"'})

    def counted(handle):
        """An endpoint answering through handle(request) -> (response, images): counted in /metrics
        whatever it answers, a defect a JSON 500 and one line on stderr."""
        async def endpoint(request):
            started = time.perf_counter()
            try:
                response, count = await handle(request)
            except Exception as e:
                failed("a request", e)
                response, count = error(500, "the server failed to answer this request"), 0
            metrics.answered(response.status_code, count, time.perf_counter() - started)
            return response
        return endpoint

    async def infer(request, decode, inline, answer):
        """The path every inference request takes: the token, the body (read_body's bounds), its
        decoding (decode(body) -> (images, context), on the decoder threads unless inline(body)),
        one batch, then answer(labels, scores or None, context) -> response. (response, images)."""
        if not authorized(request):
            return unauthorized(), 0
        held = [0]  # bytes of this request's body counted in bodies
        batcher.expecting += 1  # a batch forming now may wait for this one
        try:
            try:
                body = await read_body(request, held)
                x, context = await decoded(decode, body, inline(body))
            except Refused as e:
                return error(e.status, e.message, e.headers), 0
            finally:
                batcher.expecting -= 1
            if len(x) == 0:
                return answer(np.empty(0, np.int64), np.empty((0, session.classes), np.float32), context), 0
            try:
                labels, scores = await batch(x, context["scores"])
            except Refused as e:
                return error(e.status, e.message, e.headers), len(x)
        finally:
            bodies.give(held[0])
        return answer(labels, scores, context), len(x)

    async def batch(x, want_scores):
        """(labels, scores or None) of images x from one batch, or Refused saying why not."""
        try:
            return await batcher.submit(x, want_scores, settings.request_timeout_s)
        except Busy as e:
            metrics.refused("busy")
            raise Refused(503, f"server busy: {e}; try again") from None
        except Expired as e:
            metrics.refused("deadline")
            raise Refused(504, f"{images.LABEL}: {e} (the server's --request-timeout-s)") from None
        except Draining:
            metrics.refused("draining")
            raise Refused(503, "the server is shutting down; try again", {"Connection": "close"}) from None
        except InputError as e:
            raise Refused(400, about_request(e, images.LABEL)) from None
        except Exception as e:  # the pass failed (the device): every request in it, once
            failed("a forward pass", e)
            raise Refused(500, "the forward pass failed on the server") from None

    async def decoded(decode, body, inline):
        """decode(body), at once or on a decoder thread; its InputErrors as responses."""
        try:
            if inline:
                metrics.decoded["loop"] += 1
                return decode(body)
            async with decode_slots:
                metrics.decoded["thread"] += 1
                metrics.decoding += 1
                try:
                    return await asyncio.get_running_loop().run_in_executor(decode_pool, decode, body)
                finally:
                    metrics.decoding -= 1
        except images.TooManyPixels as e:
            raise refused("pixels", 413, e.message) from None
        except InputError as e:
            raise Refused(400, e.message) from None

    async def v1_predict(request):
        if not authorized(request):
            return unauthorized(), 0
        try:
            kind = images.readable(request.headers.get("content-type"))
        except images.UnsupportedType as e:
            return error(415, e.message), 0
        context = {"scores": bool(request.scope["query_string"]) and
                   request.query_params.get("scores", "0").lower() in ("1", "true", "yes")}

        def decode(body):
            return images.decode(kind, body, session.model, settings.max_pixels), context

        def answer(labels, scores, context):
            out = {"labels": labels.tolist()}
            if context["scores"]:
                out["scores"] = scores.tolist()
            return JSONResponse(out)

        return await infer(request, decode, lambda body: kind == images.NPY and len(body) <= INLINE_BYTES, answer)

    async def v2_infer(request):
        if request.headers.get("content-encoding", "identity").lower() != "identity":
            return error(415, f"body: Content-Encoding {request.headers['content-encoding']!r} is not read "
                              "(send it uncompressed)"), 0
        header_length = request.headers.get(kserve.HEADER_LENGTH)

        def decode(body):
            req, given, raw, wanted = kserve.parse_rest(body, header_length)
            x = kserve.tensor(given.get("name"), given.get("datatype"), given.get("shape") or [], session.model,
                              raw, given.get("data"))
            return x, {"scores": "scores" in wanted, "wanted": wanted, "id": req.get("id")}

        def answer(labels, scores, context):
            body, headers = kserve.rest_answer(labels, scores, context["wanted"], context["id"])
            return Response(body, headers=headers)

        return await infer(request, decode, lambda body: len(body) <= INLINE_BYTES, answer)

    async def v2_get(request):
        if not authorized(request):
            return unauthorized()
        path = request.url.path.rstrip("/")
        if path in ("/v2/health/live", "/v2/health/ready"):
            return JSONResponse({path.rsplit("/", 1)[1]: True})
        if path == "/v2":
            return JSONResponse(kserve.server_metadata(__version__))
        unknown = kserve.unknown_model(request.path_params.get("model"), request.path_params.get("version", ""))
        if unknown:
            return error(404, unknown)
        if path.endswith("/ready"):
            return JSONResponse({"name": kserve.MODEL, "ready": True})
        return JSONResponse(kserve.model_metadata(session.model, sha256))

    async def v2_infer_route(request):
        unknown = kserve.unknown_model(request.path_params.get("model"), request.path_params.get("version", ""))
        if unknown:
            return error(404, unknown), 0
        return await v2_infer(request)

    async def read_body(request, held):
        """The whole body: at most max_body_bytes, no more than body_timeout_s between its parts,
        within the bytes all bodies may hold at once, cut short (503) as a drain gives up."""
        limit = settings.max_body_bytes
        length = request.headers.get("content-length")
        too_large = f"body: larger than the server's limit of {limit} bytes"
        if length is not None and length.isdigit() and int(length) > limit:
            raise refused("body_size", 413, too_large, close=True)
        chunks, size = [], 0
        while True:
            if drain.gave_up:
                raise refused("draining", 503, "the server is shutting down; try again", close=True)
            try:
                async with asyncio.timeout(settings.body_timeout_s) as deadline:
                    drain.reading.add(deadline)
                    try:
                        message = await request.receive()
                    finally:
                        drain.reading.discard(deadline)
            except TimeoutError:
                if drain.gave_up:
                    raise refused("draining", 503, "the server is shutting down; try again", close=True) from None
                raise refused("body_timeout", 408, f"body: no data for {settings.body_timeout_s:g} s (the server's "
                              f"--body-timeout-s)", close=True) from None
            if message["type"] == "http.disconnect":
                raise Refused(400, "body: the client went away")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise refused("body_size", 413, too_large, close=True)
            if not bodies.add(len(chunk), settings.max_buffered_bytes):
                raise refused("buffered", 503, f"server busy: request bodies fill its "
                              f"{settings.max_buffered_bytes} bytes (--max-buffered-mb); try again", close=True)
            held[0] += len(chunk)
            if chunk:
                chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def model(request):
        if not authorized(request):
            return unauthorized()
        return JSONResponse({
            "model": Path(session.model.path).name if session.model.path else None, "sha256": sha256,
            "input_shape": [h, w, c], "classes": session.classes,
            "backend": session.backend.name if session.backend else None, "device": session.device,
            "max_batch": settings.max_batch, "max_delay_ms": settings.max_delay_ms,
            "content_types": list(images.CONTENT_TYPES)})

    async def metrics_text(request):
        if not authorized(request):
            return unauthorized()
        stats = getattr(batcher, "stats", None)  # a front end: the batches are the engine's
        engine = None
        if stats is not None:
            try:
                engine = await stats()
            except Exception:  # the engine is gone or slow: its part left out, the rest still told
                engine = ""
        return PlainTextResponse(metrics.text(engine), media_type="text/plain; version=0.0.4")

    async def healthz(request):
        return JSONResponse({"status": "ok"})

    page = PAGE.read_text()

    async def index(request):
        return HTMLResponse(page)

    class Face:
        """What the gRPC service needs of the server (kserve.grpc_handlers)."""
        Refused = Refused
        model, version = session.model, __version__
        authorized = staticmethod(bearer)
        answered = staticmethod(metrics.answered)
        failed = staticmethod(failed)

        @staticmethod
        async def decode(fn, nbytes):
            return (await decoded(lambda body: (fn(), None), None, nbytes <= INLINE_BYTES))[0]

    # a gRPC message's most bytes: a body's, and the framing of the protobuf around it
    grpc_limit = min(settings.max_body_bytes, settings.max_buffered_bytes) + GRPC_FRAMING
    grpc_budget = Budget(max(settings.max_buffered_bytes, grpc_limit))
    metrics.buffered = lambda: {"http": bodies.held, "grpc": grpc_budget.held}

    class Message:
        """`async with Message(call) as raw`: a gRPC call's one message (bytes), read within the
        bounds: its size from its prefix, refused past the limit (413); room for that size in
        grpc_budget (waited for up to --body-timeout-s, else 503), then the rest of it let in and
        read; each wait within --body-timeout-s (else 408; a drain's end is grpc_h2's stop); its bytes
        counted until the call ends, an answer waiting for the client's window holding as many of
        them as its own size (an answer is smaller than its message). A message that came with its
        call's headers (a single image's) waits for nothing. A wait's deadline is one timer on the
        loop."""
        __slots__ = ("call", "held", "task", "timer", "expired")

        def __init__(self, call):
            self.call, self.held, self.expired = call, 0, False

        def expire(self):
            self.expired = True
            self.task.cancel()

        async def __aenter__(self):
            call = self.call
            if call.size is None:
                await self._until(lambda: call.size is not None, "the call sent no message")
            size = call.size
            if call.compressed:
                raise Refused(415, "message: compressed messages are not read (send it uncompressed)")
            if size > grpc_limit:
                raise refused("body_size", 413, f"message: {size} bytes, larger than the server's limit of "
                                                f"{grpc_limit} bytes")
            if not grpc_budget.take_now(size):
                try:
                    async with asyncio.timeout(settings.body_timeout_s):
                        await grpc_budget.take(size)
                except TimeoutError:
                    raise refused("buffered", 503, f"server busy: gRPC messages fill its {grpc_budget.total} "
                                  f"bytes (--max-buffered-mb); try again") from None
            self.held = size
            try:
                call.accept()
                if not call.complete():
                    await self._until(call.complete, "the call ended before its message did")
                return call.message()
            except BaseException:
                grpc_budget.give(size)
                self.held = 0
                raise

        async def _until(self, done, short):
            """Wait for done() as the call's bytes arrive, within --body-timeout-s."""
            call = self.call
            self.task = asyncio.current_task()
            self.timer = asyncio.get_running_loop().call_later(settings.body_timeout_s, self.expire)
            try:
                while not done():
                    if call.ended:
                        raise Refused(400, short)
                    await call.changed()
            except asyncio.CancelledError:
                if not self.expired:
                    raise
                self.task.uncancel()
                raise refused("body_timeout", 408, f"message: not received within {settings.body_timeout_s:g} "
                              f"s (the server's --body-timeout-s)") from None
            finally:
                self.timer.cancel()

        async def __aexit__(self, *exc):
            self.call.keep(grpc_budget, self.held)  # until the answer is sent (grpc_h2: as much as it needs)

    Face.sha256, Face.batch, Face.message = sha256, staticmethod(batch), Message

    async def start_grpc():
        """The gRPC service (grpc_h2) on settings.grpc ("host:port"), in this event loop; its port.
        HTTP's connection bounds hold on it too: the cap, the preface within the header timeout,
        closed after as long without a call as HTTP keeps a connection alive; at most
        --max-connections calls at once."""
        from . import grpc_h2

        host, _, port = settings.grpc.rpartition(":")
        server = grpc_h2.Server(kserve.grpc_handlers(Face), guard.connection_cap(settings.max_connections, 2),
                                settings.max_connections, settings.header_timeout_s, KEEP_ALIVE_S, metrics.refused,
                                failed)
        try:
            port = await server.start(host.strip("[]"), int(port), reuse_port=shared_port)
        except OSError as e:
            raise InputError(f"--grpc-port {port}: cannot listen on {host} ({e.strerror})") from None
        app.state.grpc, app.state.grpc_port = server, port

    @contextlib.asynccontextmanager
    async def lifespan(app):
        started = batcher.start()
        if started is not None:  # a front end's RemoteBatcher connects to the engine
            hello = asyncio.ensure_future(started)
            while not hello.done():  # SIGTERM before the engine's hello (a frozen engine) ends the wait
                await asyncio.wait({hello}, timeout=STARTUP_POLL_S)
                if not hello.done() and app.state.stopping():
                    os._exit(0)  # nothing served yet, nothing to drain
            try:
                hello.result()
            except (OSError, EOFError, ValueError) as e:  # the engine gone (or hung up) before its hello
                # one line and out: raised here, uvicorn would print the lifespan's traceback
                print(f"cnninfer serve: a front end lost the engine during its start-up ({type(e).__name__})",
                      file=sys.stderr, flush=True)
                os._exit(2)
        if settings.grpc:
            try:
                await start_grpc()
            except InputError as e:  # its port taken since serve() found it free: one line, as above
                print(f"cnninfer serve: {e.message}", file=sys.stderr, flush=True)
                os._exit(2)
        try:
            yield
        finally:
            if app.state.grpc is not None:
                await app.state.grpc.stop(GIVE_UP_MARGIN_S)  # its drain ran beside HTTP's (run_one)
            await batcher.stop()  # what was queued is answered (or was failed with Draining)
            batcher.close()
            decode_pool.shutdown()

    predict = counted(v1_predict)
    app = Starlette(routes=[
        Route("/", index), Route("/healthz", healthz), Route("/v1/model", model),
        Route("/v1/predict", predict, methods=["POST"]), Route("/metrics", metrics_text),
        Route("/v2", v2_get), Route("/v2/health/live", v2_get), Route("/v2/health/ready", v2_get),
        Route("/v2/models/{model}", v2_get), Route("/v2/models/{model}/ready", v2_get),
        Route("/v2/models/{model}/versions/{version}", v2_get),
        Route("/v2/models/{model}/versions/{version}/ready", v2_get),
        Route("/v2/models/{model}/infer", counted(v2_infer_route), methods=["POST"]),
        Route("/v2/models/{model}/versions/{version}/infer", counted(v2_infer_route), methods=["POST"]),
    ], lifespan=lifespan)
    app.state.drain, app.state.metrics = drain, metrics
    app.state.grpc, app.state.grpc_port = None, None
    app.state.stopping = lambda: False  # run_app's: whether the server was told to stop
    return Direct(app, {("POST", "/v1/predict"): predict})


class Direct:
    """An app with some endpoints reached without its routing and middleware: POST /v1/predict,
    the busiest, is ~15% of a front end's time per request quicker so (its `counted` endpoint
    answers its own errors). The rest, lifespan included, goes to the app."""

    def __init__(self, app, routes):
        from starlette.requests import Request

        self.app, self.routes, self.request = app, routes, Request
        self.state = app.state

    async def __call__(self, scope, receive, send):
        handle = self.routes.get((scope.get("method"), scope.get("path"))) if scope["type"] == "http" else None
        if handle is None:
            await self.app(scope, receive, send)
        else:
            response = await handle(self.request(scope, receive))
            await response(scope, receive, send)


def bind(host, port, option="--port"):
    """A listening socket on host:port (0: a free port), or one InputError line naming `option`."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise InputError(f"--host {host}: {e.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise InputError(f"--host {host} {option} {port}: cannot listen there ({e.strerror})") from None
    return sock


def free_port(host):
    """A port free on host now (the workers' shared gRPC port, bound by each with SO_REUSEPORT)."""
    probe = bind(host, 0)
    try:
        return probe.getsockname()[1]
    finally:
        probe.close()


def url_of(sock):
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


@dataclass(frozen=True)
class Spec:
    """What a worker process needs to make its own Session (picklable: the model travels loaded)."""
    model: object  # a loader.Model
    backend: str
    options: dict
    sha256: str = None  # of the model file, reported by /v1/model


def serve(spec, settings, host="127.0.0.1", port=8000, workers=1, announce=print):
    """Serve until SIGTERM or SIGINT: then stop accepting, answer what is in flight, return.
    workers > 1: that many processes (spawned) share the listening socket, each with its own
    Session and batcher: one event loop handles ~3,000-4,000 requests/s, the GPU far more."""
    require()
    from ..session import Session

    sock = bind(host, port)
    if settings.grpc and workers > 1 and settings.grpc.endswith(":0"):  # one port for every worker
        import dataclasses

        settings = dataclasses.replace(settings, grpc=f"{settings.grpc[:-2]}:{free_port(host)}")
    try:
        if settings.grpc and not settings.grpc.endswith(":0"):  # a busy gRPC port: one line now, not at start-up
            bind(host, int(settings.grpc.rsplit(":", 1)[1]), "--grpc-port").close()
        if workers == 1:
            with Session(spec.model, spec.backend, **spec.options) as session:
                run_one(session, settings, sock, announce, spec.sha256)
        else:
            supervise(spec, settings, sock, workers, announce)
    finally:
        sock.close()


def warm_up(session, settings):
    """Start the backend and run a first pass (for CUDA: the context made current on the session's
    thread, the kernels compiled or loaded) before the first request; the ladder of pass sizes
    passes are padded to (CUDA, see batcher.py), or None. CUDA: every size of the ladder run once
    for each image type a request may bring (its buffers and graphs made now, not in a request)."""
    h, w, c = network.image_shape(session.model)
    session.classify(np.zeros((1, h, w, c), np.float32), True)
    if session.backend.name != "cuda":
        return None
    sizes = ladder(settings.max_batch)
    for size in sizes:
        for dtype in (np.float32, np.uint8):
            for scores in (False, True):
                session.classify(np.zeros((size, h, w, c), dtype), scores)
    return sizes


def settle_heap():
    """Once started, before serving: the start-up's objects (~45k: the imports, the app, the
    session) frozen out of the collector's reach. Serving promotes in-flight requests' objects to
    the oldest generation, so full collections ran every few seconds per process, each scanning
    everything for 10-60 ms with the event loop (or the engine's passes) stopped: the p99 at load.
    Frozen, a full collection scans only what serving made. Each one's pause is in /metrics."""
    from .metrics import PAUSES

    gc.collect()
    gc.freeze()
    PAUSES.watch()


def run_loop(main):
    """asyncio.run(main) on uvloop's event loop where it is installed (the `serve` extra brings it;
    uvicorn's front ends take it on their own), else on asyncio's. uvloop's costs a request fewer
    microseconds of Python."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def run_one(session, settings, sock, announce, sha256=None):
    """One process serving on sock with its own Session until SIGTERM or SIGINT (run_app)."""
    pad_to = warm_up(session, settings)
    # Passes run on the session's own thread where it has one (no hop from a batch thread to it)
    batcher = Batcher(session.classify, settings.max_batch, settings.max_delay_ms / 1e3, thread=session.executor,
                      pad_to=pad_to)
    run_app(session, settings, sock, announce, batcher, sha256)


def run_app(session, settings, sock, announce, batcher, sha256=None, bodies=None, shared_port=False):
    """One event loop serving the app on sock until SIGTERM or SIGINT, then draining: in-flight
    requests are answered within settings.drain_s, stalled uploads and passes not done by then get
    a JSON 503. `session`: a Session, or a front end's EngineFace."""
    import warnings

    import uvicorn
    from PIL import Image

    from . import guard

    # Pillow warns of pictures past its own pixel limit; the server's (--max-pixels) refuses them
    warnings.simplefilter("ignore", Image.DecompressionBombWarning)
    # The GIL passes between the event loop and the batch thread several times a pass: at the
    # default 5 ms switch interval a busy loop held each pass up for milliseconds
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    app = make_app(session, settings, batcher, sha256, bodies, shared_port)
    drain = app.state.drain
    cap = guard.connection_cap(settings.max_connections, 2 if settings.grpc else 1)

    class Server(uvicorn.Server):
        async def startup(self, sockets=None):
            await super().startup(sockets)
            if self.started:
                settle_heap()
                app.state.metrics.open_connections = lambda: len(self.server_state.connections)
                announce(f"cnninfer serve: listening on {url_of(sock)} (backend {session.backend.name}: "
                         f"{session.device}; max batch {settings.max_batch}, max delay {settings.max_delay_ms:g} ms)")
                if app.state.grpc_port:
                    host = settings.grpc.rsplit(":", 1)[0]
                    announce(f"cnninfer serve: gRPC (KServe v2) on grpc://{host}:{app.state.grpc_port}")

        async def shutdown(self, sockets=None):
            def give_up():
                drain.give_up()
                batcher.abandon()

            asyncio.get_running_loop().call_later(max(settings.drain_s - GIVE_UP_MARGIN_S, 0), give_up)
            if app.state.grpc is not None:  # in-flight calls get the same drain; new ones are refused
                asyncio.get_running_loop().create_task(app.state.grpc.stop(max(settings.drain_s - GIVE_UP_MARGIN_S, 0)))
            await super().shutdown(sockets)

    config = uvicorn.Config(app, log_level="error", access_log=False, lifespan="on", interface="asgi3",
                            proxy_headers=False,  # nothing is proxied to 127.0.0.1: headers kept as sent
                            ws="none",  # nothing is served over WebSocket: an Upgrade stays HTTP, within the guard
                            http=guard.protocol(cap, settings.header_timeout_s, app.state.metrics),
                            timeout_graceful_shutdown=settings.drain_s, timeout_keep_alive=KEEP_ALIVE_S)
    # uvicorn sends a captured signal on to the previous handler after its graceful shutdown; with
    # these, a drained server exits 0 rather than dying of that signal
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        server = Server(config)
        app.state.stopping = lambda: server.should_exit  # uvicorn's signal handlers set it
        server.run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not server.started:
        raise InputError("cnninfer serve: the server did not start (see the lines above)")


def _engine(spec, settings, path, ready):
    """The spawned engine: the one Session, warmed up, serving its batcher on the Unix socket
    `path` (engine.py) until SIGTERM; tells `ready` when it listens."""
    from .engine import Engine
    from ..session import Session

    name_process("cnninfer-engine")

    signalled = []  # SIGTERM/SIGINT, caught on this (the main) thread, for the loop wherever it runs
    waiting = {}  # the loop and its stop event, once it runs

    def on_signal(*_):
        signalled.append(True)
        if waiting:
            with contextlib.suppress(RuntimeError):  # the loop already closed
                waiting["loop"].call_soon_threadsafe(waiting["stop"].set)

    async def main(session, pad_to, inline):
        engine = Engine(session, settings, pad_to, inline)
        await engine.start(path)
        stop = asyncio.Event()
        waiting.update(loop=asyncio.get_running_loop(), stop=stop)
        if signalled:
            stop.set()
        settle_heap()
        ready.put("engine ready")
        await stop.wait()
        await engine.stop()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        with Session(spec.model, spec.backend, **spec.options) as session:
            pad_to = warm_up(session, settings)
            home = session.executor
            if home is None:  # the CPU backend: passes on the batcher's thread
                run_loop(main(session, pad_to, False))
            else:  # the loop on the session's thread: a pass is a call, not a hop there and back
                home.call(run_loop, main(session, pad_to, True))
    except InputError as e:
        ready.put(f"error: {e.message}")
        sys.exit(2)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class EngineFace:
    """What the app reads of a Session, in a front end: the model here, the backend's name and
    device from the engine's hello."""
    executor = None

    def __init__(self, model, batcher):
        self.model, self.batcher = model, batcher

    @property
    def classes(self):
        return self.model.fc2.shape[1]

    @property
    def backend(self):
        hello = self.batcher.hello
        return None if hello is None else SimpleNamespace(name=hello["backend"])

    @property
    def device(self):
        return None if self.batcher.hello is None else self.batcher.hello["device"]


def _front(spec, settings, sock, path, ready, held=None):
    """A spawned front end: the app on the parent's socket, its batches the engine's, its bodies'
    bytes counted in `held` with the other front ends'."""
    from .front import RemoteBatcher

    name_process("cnninfer-front")
    try:
        batcher = RemoteBatcher(path)
        run_app(EngineFace(spec.model, batcher), settings, sock, ready.put, batcher, spec.sha256, SharedBytes(held),
                shared_port=True)
    except InputError as e:
        ready.put(f"error: {e.message}")
        sys.exit(2)


def supervise(spec, settings, sock, workers, announce):
    """The engine first (one Session), then `workers` front ends sharing the listening socket, each
    handing its requests' images to the engine; announce once the first front end accepts. On
    SIGTERM/SIGINT the front ends drain (SIGTERM each), then the engine stops. A process that fails
    stops them all."""
    import multiprocessing
    import tempfile

    ctx = multiprocessing.get_context("spawn")  # CUDA does not survive fork
    ready = ctx.Queue()
    folder = tempfile.mkdtemp(prefix="cnninfer-engine-")
    path = str(Path(folder) / "engine.sock")
    engine = ctx.Process(target=_engine, args=(spec, settings, path, ready), name="cnninfer-engine")
    held = ctx.Value("q", 0)  # bytes of HTTP bodies the front ends hold, all together
    fronts = [ctx.Process(target=_front, args=(spec, settings, sock, path, ready, held), name=f"cnninfer-front{i}")
              for i in range(workers)]
    stop = []
    previous = {sig: signal.signal(sig, lambda sig, _: stop.append(sig)) for sig in (signal.SIGTERM, signal.SIGINT)}
    failed, killed = [], []
    try:
        engine.start()
        if _wait_for(ready, [engine], ("engine ready",), stop) is None:
            return
        for p in fronts:
            p.start()
        wanted = ("listening on", "gRPC") if settings.grpc else ("listening on",)
        lines = _wait_for(ready, fronts + [engine], wanted, stop)
        if lines is not None:
            announce(lines["listening on"].replace(" (backend", f" ({workers} front ends, one engine; backend", 1))
            if settings.grpc:
                announce(lines["gRPC"])
        while not stop and all(p.is_alive() for p in fronts + [engine]):
            time.sleep(0.2)
        failed = [p for p in fronts + [engine] if p.exitcode not in (None, 0)]
    finally:
        for group in (fronts, [engine]):  # the front ends drain into a live engine, then it stops
            for p in group:
                if p.is_alive():
                    p.terminate()
            for p in group:
                if p.pid is None:
                    continue
                p.join(settings.drain_s + 10)
                if p.is_alive():
                    p.kill()
                    p.join()
                    killed.append(p.name)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        import shutil

        shutil.rmtree(folder, ignore_errors=True)
    if failed and not stop:
        raise InputError(f"cnninfer serve: {failed[0].name} exited with code {failed[0].exitcode}")
    if killed:  # a process that ignores SIGTERM is a defect, not a clean stop
        raise InputError(f"cnninfer serve: {killed[0]} did not stop within {settings.drain_s + 10:g} s of SIGTERM "
                         f"and was killed")


def name_process(name):
    """The name ps and top show for this process (Linux; 15 characters at most)."""
    try:
        with open("/proc/self/comm", "w") as f:
            f.write(name[:15])
    except OSError:
        pass


def _wait_for(ready, procs, wanted, stop):
    """{each of `wanted`: the first line from `ready` holding it}, or None when stopped first;
    InputError with a process's error line, or when one exits first."""
    lines = {}
    while len(lines) < len(wanted):
        if stop:
            return None
        try:
            line = ready.get(timeout=0.2)
        except Exception:  # queue.Empty
            if any(p.exitcode not in (None, 0) for p in procs):
                raise InputError("cnninfer serve: a process exited while starting") from None
            continue
        if line.startswith("error: "):
            raise InputError(line[len("error: "):])
        for w in wanted:
            if w in line:
                lines.setdefault(w, line)
    return lines
