"""The router's HTTP server: uvicorn, with a deadline on reading request headers
and a bound on open connections.

uvicorn bounds the idle time between keep-alive requests but not how long a
client may take to send a request's headers: a client trickling one header
byte at a time (or connecting and saying nothing) would hold a connection,
and its memory, forever. :func:`bounded_protocol` returns uvicorn's own
httptools protocol with one addition: from the moment a connection opens, or
a new request on it begins, its headers must be complete within
``header_timeout`` seconds, else the router answers ``408`` and closes it.
A connection past ``max_connections`` is answered at once with a JSON-RPC
``503`` (``Retry-After: 1``) and closed, before anything is read from it.
(uvicorn's own ``limit_concurrency`` answers plain text, and only once a
request's headers arrived, so a flood of idle connections still counts.)
Bodies are bounded by the router itself (``RouterConfig.body_timeout``), and
nothing bounds a response: streams live as long as they need.

uvicorn accepts any protocol class as ``http=``; this one subclasses its
``HttpToolsProtocol`` and overrides only connection and parser callbacks,
each calling the original first or last. ``tests/fleet/test_router_hardening``
proves it against the installed uvicorn.
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from mcpfleet.contract import ROUTER_ERROR_HEADER
from mcpfleet.httpio import jsonrpc_error


def _raw_response(status: bytes, content_type: bytes, body: bytes, extra: bytes = b"") -> bytes:
    """A whole response written straight to the socket, marked as the router's, closing."""
    return (
        b"HTTP/1.1 " + status + b"\r\n"
        b"content-type: "
        + content_type
        + b"\r\n"
        + extra
        + b"connection: close\r\n"
        + ROUTER_ERROR_HEADER.lower().encode()
        + b": 1\r\n"
        + b"content-length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


_TIMEOUT_RESPONSE = _raw_response(
    b"408 Request Timeout",
    b"text/plain; charset=utf-8",
    b"Request headers not received in time.\n",
)
_BUSY_RESPONSE = _raw_response(
    b"503 Service Unavailable",
    b"application/json",
    jsonrpc_error(-32000, "Router at its connection limit; retry"),
    extra=b"retry-after: 1\r\n",
)


class _BoundedHeaders(HttpToolsProtocol):
    header_timeout: float = 10.0
    max_connections: int | None = None
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # ``connections`` is the server's set of open connections, this one included.
        if self.max_connections is not None and len(self.connections) > self.max_connections:
            transport.write(_BUSY_RESPONSE)
            transport.close()
            return
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout, self._too_slow)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _too_slow(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.transport.write(_TIMEOUT_RESPONSE)
            self.transport.close()


def bounded_protocol(
    header_timeout: float, max_connections: int | None = None
) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol, closing connections whose headers take too long
    and refusing those past ``max_connections``."""
    return type(
        "BoundedHeadersProtocol",
        (_BoundedHeaders,),
        {"header_timeout": header_timeout, "max_connections": max_connections},
    )
