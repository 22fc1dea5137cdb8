"""The server's counters and histograms, written in Prometheus' text format (version 0.0.4).
Updated from the event loop's thread and the batch thread: one lock."""
import bisect
import threading

LATENCY_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


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


class Metrics:
    def __init__(self, max_batch):
        self.lock = threading.Lock()
        self.requests = {}  # status code -> requests answered
        self.images = {}  # status code -> images in them
        self.latency = Histogram(LATENCY_S)  # seconds from the request's arrival to its answer
        self.batches = Histogram(batch_buckets(max_batch))  # images per forward pass
        self.batch_requests = Histogram(batch_buckets(max_batch))  # requests merged per forward pass
        self.queued = 0  # images waiting for a forward pass

    def answered(self, status, images, seconds):
        with self.lock:
            self.requests[status] = self.requests.get(status, 0) + 1
            self.images[status] = self.images.get(status, 0) + images
            self.latency.observe(seconds)

    def batch(self, images, requests):
        with self.lock:
            self.batches.observe(images)
            self.batch_requests.observe(requests)

    def text(self):
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
            lines += ["# HELP cnninfer_batch_images Images per forward pass (requests merged).",
                      "# TYPE cnninfer_batch_images histogram"]
            lines += self.batches.lines("cnninfer_batch_images")
            lines += ["# HELP cnninfer_batch_requests Requests merged into one forward pass.",
                      "# TYPE cnninfer_batch_requests histogram"]
            lines += self.batch_requests.lines("cnninfer_batch_requests")
            lines += ["# HELP cnninfer_queued_images Images waiting for a forward pass.",
                      "# TYPE cnninfer_queued_images gauge", f"cnninfer_queued_images {self.queued}"]
        return "\n".join(lines) + "\n"
