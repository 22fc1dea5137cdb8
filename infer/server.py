"""`cnninfer serve`: the engine over HTTP (Starlette on uvicorn, `pip install 'cnninfer[serve]'`),
requests that arrive together merged into one forward pass (batcher.py).

    POST /v1/predict   .npy (N, H, W, C) images of any integer or float type, or one PNG / JPEG
                       -> {"labels": [...]} (?scores=1 adds "scores"); 400 bad body, 401 token,
                       413 too large, 415 other Content-Type, 503 queue full
    GET  /healthz      {"status": "ok"}
    GET  /v1/model     input shape, classes, backend, device, batching settings
    GET  /metrics      Prometheus text: requests and images by status, latency and batch histograms
    GET  /             a page: draw a digit, see its class and the ten scores
"""
import asyncio
import contextlib
import hmac
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import images
from .batcher import Batcher, Busy
from .errors import InputError
from .metrics import Metrics

PAGE = Path(__file__).with_name("page.html")
INLINE_BYTES = 1 << 20  # bodies decoded on the event loop's thread; larger ones on a worker thread
SWITCH_INTERVAL_S = 0.0002


@dataclass(frozen=True)
class Settings:
    max_batch: int = 256  # images merged into one forward pass at most
    max_delay_ms: float = 2.0  # how long a batch waits for more requests after its first arrived
    token: str = None  # bearer token required on /v1/* and /metrics
    max_body_bytes: int = 64 << 20


def require():
    """InputError unless the serve extra is installed."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise InputError(f"cnninfer serve needs Starlette and uvicorn ({e}): pip install 'cnninfer[serve]'") from None


class TooLarge(Exception):
    pass


class _Refused(Exception):
    def __init__(self, response):
        self.response = response


async def read_body(request, limit):
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise TooLarge()
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise TooLarge()
        chunks.append(chunk)
    return b"".join(chunks)


def make_app(session, settings, batcher):
    """The ASGI app over a Session whose forward passes the batcher runs; the caller closes the
    session once the app has shut down."""
    from starlette.applications import Starlette
    from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse
    from starlette.routing import Route

    metrics = Metrics(settings.max_batch)
    batcher.metrics = metrics
    h, w, c = images.image_shape(session.model)
    expected = f"Bearer {settings.token}".encode() if settings.token else None

    def error(status, message, headers=None):
        return JSONResponse({"error": message}, status_code=status, headers=headers)

    def authorized(request):
        if expected is None:
            return True
        return hmac.compare_digest(request.headers.get("authorization", "").encode(), expected)

    def unauthorized():
        return error(401, "a valid bearer token is required (Authorization: Bearer TOKEN)",
                     {"WWW-Authenticate": 'Bearer realm="cnninfer"'})

    async def predict(request):
        started = time.perf_counter()
        response, count = await _predict(request)
        metrics.answered(response.status_code, count, time.perf_counter() - started)
        return response

    async def _predict(request):
        if not authorized(request):
            return unauthorized(), 0
        batcher.expecting += 1  # a batch forming now may wait for this one
        try:
            x, want_scores = await _receive(request)
        except _Refused as e:
            return e.response, 0
        finally:
            batcher.expecting -= 1
        if len(x) == 0:
            answer = {"labels": []}
            if want_scores:
                answer["scores"] = []
            return JSONResponse(answer), 0
        try:
            labels, scores = await batcher.submit(x, want_scores)
        except Busy as e:
            return error(503, f"server busy: {e}; try again"), len(x)
        except InputError as e:
            return error(400, e.message), len(x)
        answer = {"labels": labels.tolist()}
        if want_scores:
            answer["scores"] = scores.tolist()
        return JSONResponse(answer), len(x)

    async def _receive(request):
        """(images, scores wanted) of a request, or _Refused with the response to give."""
        try:
            kind = images.readable(request.headers.get("content-type"))
        except images.UnsupportedType as e:
            raise _Refused(error(415, e.message)) from None
        try:
            body = await read_body(request, settings.max_body_bytes)
        except TooLarge:
            raise _Refused(error(413, f"body: larger than the server's limit of {settings.max_body_bytes} bytes"))
        try:
            if len(body) > INLINE_BYTES:
                x = await asyncio.get_running_loop().run_in_executor(None, images.decode, kind, body, session.model)
            else:
                x = images.decode(kind, body, session.model)
        except InputError as e:
            raise _Refused(error(400, e.message)) from None
        return x, request.query_params.get("scores", "0").lower() in ("1", "true", "yes")

    async def model(request):
        if not authorized(request):
            return unauthorized()
        return JSONResponse({
            "model": session.model.path, "input_shape": [h, w, c], "classes": session.classes,
            "backend": session.backend.name if session.backend else None, "device": session.device,
            "max_batch": settings.max_batch, "max_delay_ms": settings.max_delay_ms,
            "content_types": list(images.CONTENT_TYPES)})

    async def metrics_text(request):
        if not authorized(request):
            return unauthorized()
        return PlainTextResponse(metrics.text(), media_type="text/plain; version=0.0.4")

    async def healthz(request):
        return JSONResponse({"status": "ok"})

    page = PAGE.read_text()

    async def index(request):
        return HTMLResponse(page)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        batcher.start()
        try:
            yield
        finally:
            await batcher.stop()  # what was queued is answered
            batcher.close()

    return Starlette(routes=[
        Route("/", index), Route("/healthz", healthz), Route("/v1/model", model),
        Route("/v1/predict", predict, methods=["POST"]), Route("/metrics", metrics_text),
    ], lifespan=lifespan)


def bind(host, port):
    """A listening socket on host:port (0: a free port), or one InputError line."""
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
        raise InputError(f"--host {host} --port {port}: cannot listen there ({e.strerror})") from None
    return sock


def url_of(sock):
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


@dataclass(frozen=True)
class Spec:
    """What a worker process needs to make its own Session (picklable: the model travels loaded)."""
    model: object  # a loader.Model
    backend: str
    options: dict


def serve(spec, settings, host="127.0.0.1", port=8000, workers=1, announce=print):
    """Serve until SIGTERM or SIGINT: then stop accepting, answer what is in flight, return.
    workers > 1: that many processes (spawned) share the listening socket, each with its own
    Session and batcher: one event loop handles ~3,000-4,000 requests/s, the GPU far more."""
    require()
    from .session import Session

    sock = bind(host, port)
    try:
        if workers == 1:
            with Session(spec.model, spec.backend, **spec.options) as session:
                run_one(session, settings, sock, announce)
        else:
            supervise(spec, settings, sock, workers, announce)
    finally:
        sock.close()


def run_one(session, settings, sock, announce, quiet_signals=True):
    """One event loop serving on sock until SIGTERM or SIGINT."""
    import uvicorn

    # The GIL passes between the event loop and the batch thread several times a pass: at the
    # default 5 ms switch interval a busy loop held each pass up for milliseconds
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    # Passes run on the session's own thread where it has one (no hop from a batch thread to it)
    batcher = Batcher(session.classify, settings.max_batch, settings.max_delay_ms / 1e3, thread=session.executor)
    # The backend starts on the batch thread (for CUDA: its context is made current there), and a
    # first pass compiles or loads the kernels before the first request
    h, w, c = images.image_shape(session.model)
    try:
        batcher.thread.submit(session.classify, np.zeros((1, h, w, c), np.float32), True).result()
        if session.backend.name == "cuda":  # one batch size: see batcher.py
            batcher.pad_to = settings.max_batch
            batcher.thread.submit(session.classify, np.zeros((settings.max_batch, h, w, c), np.float32), True).result()
    except BaseException:
        batcher.close()
        raise
    app = make_app(session, settings, batcher)

    class Server(uvicorn.Server):
        async def startup(self, sockets=None):
            await super().startup(sockets)
            if self.started:
                announce(f"cnninfer serve: listening on {url_of(sock)} (backend {session.backend.name}: "
                         f"{session.device}; max batch {settings.max_batch}, max delay {settings.max_delay_ms:g} ms)")

    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                            timeout_graceful_shutdown=30, timeout_keep_alive=30)
    # uvicorn sends a captured signal on to the previous handler after its graceful shutdown; with
    # these, a drained server exits 0 rather than dying of that signal
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        server = Server(config)
        server.run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not server.started:
        raise InputError("cnninfer serve: the server did not start (see the lines above)")


def _worker(spec, settings, sock, ready):
    """A spawned worker: its own Session, serving on the parent's socket; tells `ready` its line."""
    from .session import Session

    try:
        with Session(spec.model, spec.backend, **spec.options) as session:
            run_one(session, settings, sock, ready.put)
    except InputError as e:
        ready.put(f"error: {e.message}")
        sys.exit(2)


def supervise(spec, settings, sock, workers, announce):
    """Spawn the workers; announce once the first accepts; on SIGTERM/SIGINT pass SIGTERM on to
    every worker (each drains what it has) and wait for them. A worker that fails stops them all."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")  # CUDA does not survive fork
    ready = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(spec, settings, sock, ready), name=f"cnninfer-worker{i}")
             for i in range(workers)]
    stop = []
    previous = {sig: signal.signal(sig, lambda sig, _: stop.append(sig)) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for p in procs:
            p.start()
        first = None
        while first is None and not stop:
            try:
                first = ready.get(timeout=0.2)
            except Exception:  # queue.Empty
                if any(p.exitcode not in (None, 0) for p in procs):
                    first = "error: a worker exited while starting"
        if first is not None and first.startswith("error: "):
            raise InputError(first[len("error: "):])
        if first is not None:
            announce(first.replace(" (backend", f" ({workers} workers; backend", 1))
        while not stop and all(p.is_alive() for p in procs):
            time.sleep(0.2)
        failed = [p for p in procs if p.exitcode not in (None, 0)]
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()  # SIGTERM: the worker drains
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
                p.join()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if failed and not stop:
        raise InputError(f"cnninfer serve: worker {failed[0].name} exited with code {failed[0].exitcode}")
