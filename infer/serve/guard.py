"""The server's connections, bounded: how many are open at once, and how long a client may take
to send a request's headers. uvicorn bounds neither (a thousand clients each sending half a
header held a thousand file descriptors until the process ran out), so its HTTP/1.1 protocol is
subclassed here; bodies are bounded by the app (server.read_body), which can answer.

A connection past the cap is closed as it is accepted (its file descriptor freed at once) and
counted; one whose headers are not complete within the header timeout is closed and counted.
"""
import resource

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

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


def connection_cap(asked):
    """The connection cap: `asked`, or less where the descriptors allow fewer (InputError-free)."""
    return max(1, min(asked, descriptor_limit() - FD_MARGIN))


def protocol(cap, header_timeout_s, metrics):
    """An H11Protocol class holding at most `cap` connections, each given header_timeout_s to
    send a request's headers (from its first byte, or from the connection's start)."""

    class Guarded(H11Protocol):
        def connection_made(self, transport):
            self._header_timer = None
            if len(self.connections) >= cap:
                metrics.refused("connections")
                transport.abort()
                return
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc):
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None
            if self.transport is not None:  # refused connections never joined
                super().connection_lost(exc)

        def data_received(self, data):
            super().data_received(data)
            if self.conn.their_state is h11.IDLE:
                self._arm()  # a request's headers begun (or a new one after a response)
            elif self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _arm(self):
            if self._header_timer is None and not self.transport.is_closing():
                self._header_timer = self.loop.call_later(header_timeout_s, self._headers_late)

        def _headers_late(self):
            self._header_timer = None
            if self.conn.their_state is h11.IDLE:  # still no whole request line and headers
                metrics.refused("header_timeout")
                self.transport.close()

    return Guarded
