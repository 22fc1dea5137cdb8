"""The server's connections, bounded: how many are open at once, how long a client may take to
send a request's line and headers, and how large they may be. uvicorn bounds none of these with
httptools's parser (a thousand clients each sending half a header held a thousand file descriptors
until the process ran out; its request line grows without limit), so its HTTP/1.1 protocol is
subclassed here; bodies are bounded by the app (server.read_body), which can answer.

A connection past the cap is closed as it is accepted (its file descriptor freed at once) and
counted; one whose headers are not complete within the header timeout is closed and counted; a
request line and headers past MAX_HEAD_BYTES or MAX_HEADERS are answered 400 and the connection
closed, and so is a connection with more than MAX_PIPELINED requests waiting behind the one being
answered (uvicorn queues every pipelined request it parses: 20 connections each sending 4 MB of
pipelined GETs without reading the answers took a server to 1.3 GB).

httptools (llhttp, in C) rather than h11: h11 parses in Python, and was ~20% of a front end's time
per single-image request and most of its time per large body (an event a 64 KiB read).
"""
import resource

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

FD_MARGIN = 64  # descriptors kept for the listening socket, files, pipes and the decoders


def descriptor_limit():
    """The soft limit on open files, raised to the hard limit (as servers such as nginx do)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        want = 1 << 16 if hard == resource.RLIM_INFINITY else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    return soft


def connection_cap(asked, listeners=1):
    """The connection cap of each of `listeners` (HTTP, and gRPC where served): `asked`, or less
    where the descriptors allow fewer (InputError-free)."""
    return max(1, min(asked, (descriptor_limit() - FD_MARGIN) // listeners))


MAX_HEAD_BYTES = 16 << 10  # a request's line and headers (h11's limit, which uvicorn kept before)
MAX_HEADERS = 100  # each a Python tuple of ~130 bytes, however short its line (Apache's limit too)
MAX_PIPELINED = 16  # requests of one connection parsed and waiting behind the one being answered


class Refuse(Exception):
    """Raised in a parser callback: httptools stops, and uvicorn answers 400 and closes."""


def protocol(cap, header_timeout_s, metrics):
    """An HttpToolsProtocol class holding at most `cap` connections, each given header_timeout_s to
    send a request's line and headers (from its first byte, or from the connection's start), of at
    most MAX_HEAD_BYTES and MAX_HEADERS headers, with at most MAX_PIPELINED requests waiting."""

    class Guarded(HttpToolsProtocol):
        def connection_made(self, transport):
            self._header_timer = None
            self._in_head, self._head_bytes = True, 0  # a request's line and headers not complete yet
            if len(self.connections) >= cap:
                metrics.refused("connections")
                transport.abort()
                return
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc):
            self._disarm()
            if self.transport is not None:  # refused connections never joined
                super().connection_lost(exc)

        def data_received(self, data):
            super().data_received(data)
            if self._in_head:
                self._arm()  # a request's headers begun (or a new one after a response)
            else:
                self._disarm()

        def on_message_begin(self):
            super().on_message_begin()
            self._in_head, self._head_bytes = True, 0  # each request of a kept-alive connection

        def on_url(self, url):
            self._count(len(url))
            super().on_url(url)

        def on_header(self, name, value):
            self._count(len(name) + len(value) + 4)  # with ": " and the line's end
            if len(self.headers) >= MAX_HEADERS:
                metrics.refused("header_size")
                raise Refuse()
            super().on_header(name, value)

        def on_headers_complete(self):
            self._in_head = False
            super().on_headers_complete()
            if len(self.pipeline) > MAX_PIPELINED:
                metrics.refused("pipelined")
                raise Refuse()

        def _count(self, size):
            self._head_bytes += size
            if self._head_bytes > MAX_HEAD_BYTES:
                metrics.refused("header_size")
                raise Refuse()

        def _arm(self):
            if self._header_timer is None and not self.transport.is_closing():
                self._header_timer = self.loop.call_later(header_timeout_s, self._headers_late)

        def _disarm(self):
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self):
            self._header_timer = None
            if self._in_head:  # still no whole request line and headers
                metrics.refused("header_timeout")
                self.transport.close()

    return Guarded
