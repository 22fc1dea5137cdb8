"""The server's counters and histograms, written in Prometheus' text format (version 0.0.4).
Updated from the event loop's thread and the batch thread: one lock."""
import bisect
import gc
import threading
import time

REFUSALS = ("connections", "header_timeout", "header_size", "pipelined", "body_timeout", "body_size", "buffered",
            "pixels", "busy", "deadline", "draining")  # the reasons a bound refused or cut a connection or request
LATENCY_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
PAUSE_S = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)


def batch_buckets(max_batch):
    """Powers of two up to max_batch, then max_batch."""
    out, b = [], 1
    while b < max_batch:
        out.append(b)
        b *= 2
    return tuple(out + [max_batch])


class Histogram:
    def __init__(self, buckets):
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)  # the last: above every bound (+Inf only)
        self.sum = 0.0
        self.count = 0

    def observe(self, value):
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self, name, labels=""):
        out, running = [], 0
        sep = "," if labels else ""
        for bound, c in zip(self.buckets, self.counts):
            running += c
            out.append(f'{name}_bucket{{{labels}{sep}le="{bound:g}"}} {running}')
        out.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {self.count}')
        suffix = f"{{{labels}}}" if labels else ""
        out += [f"{name}_sum{suffix} {self.sum:.9g}", f"{name}_count{suffix} {self.count}"]
        return out


class Pauses:
    """This process's full garbage collections (the oldest generation) and how long each held it.
    Recorded from gc's callback without a lock: a collection can start inside Metrics' lock, and
    collections never overlap."""

    def __init__(self):
        self.histogram = Histogram(PAUSE_S)
        self.started = None

    def watch(self):
        if self.callback not in gc.callbacks:
            gc.callbacks.append(self.callback)

    def callback(self, phase, info):
        if info["generation"] != 2:
            return
        if phase == "start":
            self.started = time.perf_counter()
        elif self.started is not None:
            self.histogram.observe(time.perf_counter() - self.started)

    def families(self, process):
        """[(family, its HELP and TYPE lines, this process's samples)]."""
        return [("cnninfer_gc_pause_seconds",
                 ["# HELP cnninfer_gc_pause_seconds Full garbage collections of a process and how long each held it.",
                  "# TYPE cnninfer_gc_pause_seconds histogram"],
                 self.histogram.lines("cnninfer_gc_pause_seconds", f'process="{process}"')),
                ("cnninfer_gc_frozen_objects",
                 ["# HELP cnninfer_gc_frozen_objects Objects of a process's start-up frozen out of the collector's reach.",
                  "# TYPE cnninfer_gc_frozen_objects gauge"],
                 [f'cnninfer_gc_frozen_objects{{process="{process}"}} {gc.get_freeze_count()}'])]

    def lines(self, process):
        return [line for _, head, samples in self.families(process) for line in head + samples]

    def join(self, lines, process):
        """`lines` (the engine's) with this process's samples after the engine's of each family."""
        lines = list(lines)
        for family, _, samples in self.families(process):
            at = max((i for i, line in enumerate(lines) if line.startswith(family)), default=len(lines) - 1)
            lines[at + 1:at + 1] = samples
        return lines


PAUSES = Pauses()  # one a process: serve's settle_heap starts it


class Metrics:
    def __init__(self, max_batch, limits=None):
        """limits: the server's bounds by name (serve's flags), shown as gauges."""
        self.lock = threading.Lock()
        self.limits = dict(limits or {})
        self.refusals = dict.fromkeys(REFUSALS, 0)
        self.open_connections = lambda: 0  # the server's count, set once it runs
        self.buffered = lambda: {}  # bytes held now by request bodies, by protocol (the app sets it)
        self.decoding = 0  # bodies being decoded now
        self.decoded = {"loop": 0, "thread": 0}  # bodies decoded, where: only small .npy bodies on the event loop
        self.requests = {}  # status code -> requests answered
        self.images = {}  # status code -> images in them
        self.latency = Histogram(LATENCY_S)  # seconds from the request's arrival to its answer
        self.batches = Histogram(batch_buckets(max_batch))  # images per forward pass
        self.batch_requests = Histogram(batch_buckets(max_batch))  # requests merged per forward pass
        self.queued = 0  # images waiting for a forward pass
        self.pinned = 0  # bytes of the front ends' shared memory the engine pinned (at most 64 MiB each)

    def answered(self, status, images, seconds):
        with self.lock:
            self.requests[status] = self.requests.get(status, 0) + 1
            self.images[status] = self.images.get(status, 0) + images
            self.latency.observe(seconds)

    def refused(self, reason):
        with self.lock:
            self.refusals[reason] += 1

    def batch(self, images, requests):
        with self.lock:
            self.batches.observe(images)
            self.batch_requests.observe(requests)

    def text(self, engine=None):
        """The Prometheus text; `engine`: the batches' part from an engine process (a front end's
        own batches are none), in place of this process's."""
        with self.lock:
            lines = ["# HELP cnninfer_requests_total HTTP requests to /v1/predict answered, by status.",
                     "# TYPE cnninfer_requests_total counter"]
            lines += [f'cnninfer_requests_total{{status="{s}"}} {n}' for s, n in sorted(self.requests.items())]
            lines += ["# HELP cnninfer_images_total Images in the requests to /v1/predict, by status.",
                      "# TYPE cnninfer_images_total counter"]
            lines += [f'cnninfer_images_total{{status="{s}"}} {n}' for s, n in sorted(self.images.items())]
            lines += ["# HELP cnninfer_request_seconds Time from a request's arrival to its answer.",
                      "# TYPE cnninfer_request_seconds histogram"]
            lines += self.latency.lines("cnninfer_request_seconds")
            if engine is None:  # one process: batches and collections its own
                lines += self._batch_lines() + PAUSES.lines("server")
            else:  # the engine's, this front end's collections beside its own
                lines += PAUSES.join([line for line in engine.splitlines() if line], "front")
            lines += ["# HELP cnninfer_refused_total Connections and requests refused or cut short by a bound, by reason.",
                      "# TYPE cnninfer_refused_total counter"]
            lines += [f'cnninfer_refused_total{{reason="{r}"}} {n}' for r, n in self.refusals.items()]
            lines += ["# HELP cnninfer_limit The server's bounds (serve's options), by name.",
                      "# TYPE cnninfer_limit gauge"]
            lines += [f'cnninfer_limit{{name="{k}"}} {v:.15g}' for k, v in self.limits.items()]
            lines += ["# HELP cnninfer_open_connections HTTP connections open now.",
                      "# TYPE cnninfer_open_connections gauge", f"cnninfer_open_connections {self.open_connections()}",
                      "# HELP cnninfer_buffered_bytes Bytes held now (--max-buffered-mb) by HTTP bodies, and by gRPC "
                      "messages (a read holds the largest message's until its message has arrived).",
                      "# TYPE cnninfer_buffered_bytes gauge"]
            lines += [f'cnninfer_buffered_bytes{{protocol="{k}"}} {v}' for k, v in self.buffered().items()]
            lines += ["# HELP cnninfer_decoding Request bodies being decoded now.",
                      "# TYPE cnninfer_decoding gauge", f"cnninfer_decoding {self.decoding}",
                      "# HELP cnninfer_decoded_total Request bodies decoded, by where: the event loop (.npy bodies "
                      "up to 64 KiB) or a decoder thread.", "# TYPE cnninfer_decoded_total counter"]
            lines += [f'cnninfer_decoded_total{{where="{w}"}} {n}' for w, n in self.decoded.items()]
        return "\n".join(lines) + "\n"

    def batch_text(self):
        """The batches' part alone (what an engine process reports to its front ends)."""
        with self.lock:
            return "\n".join(self._batch_lines() + PAUSES.lines("engine")) + "\n"

    def _batch_lines(self):
        lines = ["# HELP cnninfer_batch_images Images per forward pass (requests merged).",
                 "# TYPE cnninfer_batch_images histogram"]
        lines += self.batches.lines("cnninfer_batch_images")
        lines += ["# HELP cnninfer_batch_requests Requests merged into one forward pass.",
                  "# TYPE cnninfer_batch_requests histogram"]
        lines += self.batch_requests.lines("cnninfer_batch_requests")
        lines += ["# HELP cnninfer_queued_images Images waiting for a forward pass.",
                  "# TYPE cnninfer_queued_images gauge", f"cnninfer_queued_images {self.queued}",
                  "# HELP cnninfer_pinned_bytes Front ends' shared memory the engine holds page-locked.",
                  "# TYPE cnninfer_pinned_bytes gauge", f"cnninfer_pinned_bytes {self.pinned}"]
        return lines
