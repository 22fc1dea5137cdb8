"""Serving: the HTTP front ends and KServe v2 (server, kserve, page.html), one engine process per
GPU batching every front end's requests (engine, batcher), request bodies to images (images), the
connection bounds (guard) and /metrics (metrics)."""
