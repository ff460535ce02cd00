"""The router's HTTP server: uvicorn, with a deadline on reading request headers,
a bound on their size as they arrive, and a bound on open connections.

uvicorn bounds the idle time between keep-alive requests but not how long a
client may take to send a request's headers: a client trickling one header
byte at a time (or connecting and saying nothing) would hold a connection,
and its memory, forever. :func:`bounded_protocol` returns uvicorn's own
httptools protocol with one addition: from the moment a connection opens, or
a new request on it begins, its headers must be complete within
``header_timeout`` seconds, else the router answers ``408`` and closes it.
Header bytes are counted as they arrive, before the parser sees them: past
``max_header_bytes`` (plus :data:`HEADER_FRAMING_ALLOWANCE` for the request
line and framing) the router answers a JSON-RPC ``431`` and closes, having
read no more (the exact per-header sum is checked again in admission). Only
head bytes count, from a request's first byte to its blank line: a read that
holds the end of one request's body and the start of the next (pipelined) is
fed to the parser up to that body's end (its ``Content-Length``, or for a
chunked body each blank line until the parser ends the message), and the
rest is counted as the next head.
Each response's status line and headers go out in one write with the start of
its body when the body follows in the same event-loop turn (a whole answer:
every modern round), else at the end of that turn (:class:`_CoalescedWrites`):
one system call per answer instead of two.
A connection past ``max_connections`` is answered at once with a JSON-RPC
``503`` (``Retry-After: 1``) and closed, before anything is read from it.
(uvicorn's own ``limit_concurrency`` answers plain text, and only once a
request's headers arrived, so a flood of idle connections still counts.)
Bodies are bounded by the router itself (``RouterConfig.body_timeout``), and
nothing bounds a response: streams live as long as they need.

uvicorn accepts any protocol class as ``http=``; this one subclasses its
``HttpToolsProtocol`` and overrides only connection and parser callbacks,
each calling the original first or last (``on_headers_complete`` also puts
:data:`WATCH_DISCONNECT` in the scope and hands the new response cycle the
coalescing writer in place of the transport); :func:`body_arrived` reads
uvicorn's response cycle behind a request's ``receive``.
``tests/fleet/test_router_hardening`` proves it against the installed uvicorn.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from mcpfleet.answers import ErrorCode, jsonrpc_error, raw_response
from mcpfleet.contract import ROUTER_ERROR_HEADER

_MARK = (ROUTER_ERROR_HEADER.lower().encode(), b"1")

#: The key, in a request scope's ``extensions``, of a function that sets (or, given
#: None, clears) the one callback to run when the client's connection closes: a
#: waiter learns that its client left without a task reading ``http.disconnect``.
WATCH_DISCONNECT = "mcpfleet.watch_disconnect"


def _answer(status: int, message: str, code: ErrorCode = ErrorCode.INVALID_REQUEST) -> bytes:
    """A whole JSON-RPC error response, marked as the router's, closing the connection."""
    return raw_response(status, jsonrpc_error(code, message), [_MARK])


_TIMEOUT_RESPONSE = _answer(408, "Request headers not received in time")
_TOO_LARGE_RESPONSE = _answer(431, "Request headers too large")
_FRAMING_RESPONSE = _answer(400, "Bad Request: malformed HTTP request")
_BUSY_RESPONSE = raw_response(
    503,
    jsonrpc_error(ErrorCode.SERVER_ERROR, "Router at its connection limit; retry"),
    [_MARK, (b"retry-after", b"1")],
)
#: Bytes of request line and header framing allowed beyond ``max_header_bytes``
#: (which counts header names and values only) before the raw count refuses.
HEADER_FRAMING_ALLOWANCE = 8 * 1024
#: Seconds a refused connection stays open, not read, after its 431: the client
#: reads the answer before the close (with its unread bytes) resets the connection.
REFUSAL_LINGER = 0.5


class _CoalescedWrites:
    """A connection's transport as its response cycles see it: a write that starts a
    response (``HTTP/``, uvicorn's status line and headers) is held until the next
    write, which carries it along, or until the end of the event-loop turn.

    uvicorn writes a response's head at ``http.response.start`` and its body at
    each ``http.response.body``: two system calls for every answer (on loopback
    each also runs the receiver's TCP work). Held for at most one turn, a head
    is never late; everything else passes through to the transport.
    """

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held + data)
        elif data[:5] == b"HTTP/":
            self._held = data
            self._loop.call_soon(self.flush)
        else:
            self._transport.write(data)

    def flush(self) -> None:
        held = self._held
        if held is not None:
            self._held = None
            if not self._transport.is_closing():
                self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The length of a request's body as its headers frame it: None when chunked
    (or unreadable: the parser refuses it), 0 when nothing frames one."""
    length = 0
    for name, value in headers:
        if name == b"transfer-encoding":
            return None
        if name == b"content-length":
            try:
                length = int(value)
            except ValueError:
                return None
    return length if length >= 0 else None


class _BoundedHeaders(HttpToolsProtocol):
    header_timeout: float = 10.0
    max_connections: int | None = None
    max_header_bytes: int = 16 * 1024
    _header_timer: asyncio.TimerHandle | None = None
    #: Header bytes of the current request received so far, counted before the
    #: parser sees them (it may be quadratic in a value's length); and whether
    #: the current request's headers are still arriving.
    _header_bytes = 0
    _counting = True
    _tail = b""
    #: Once the current request's headers are complete: the bytes of its
    #: Content-Length body still to come, or None for a chunked body. A read may
    #: hold a body's end and the next request's head (pipelined): the parser is
    #: fed up to the body's end, and what follows is counted as a head.
    _body_left: int | None = None
    _refused = False
    _writes: _CoalescedWrites | None = None
    _lost = False
    _on_lost: Callable[[], None] | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._writes = _CoalescedWrites(transport, self.loop)
        # ``connections`` is the server's set of open connections, this one included.
        if self.max_connections is not None and len(self.connections) > self.max_connections:
            transport.write(_BUSY_RESPONSE)
            transport.close()
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        size = len(data)
        pos = 0
        while pos < size:
            if self._counting:
                end = self._blank_line(data, pos)
                cut = size if end < 0 else end
                self._header_bytes += cut - pos
                if self._header_bytes > self.max_header_bytes + HEADER_FRAMING_ALLOWANCE:
                    self._refuse_too_large()
                    return
                if end >= 0:
                    self._counting, self._tail = False, b""
            elif self._body_left:
                # A Content-Length body: its end is known, and what follows it
                # in this read is the next request's head, counted.
                cut = min(size, pos + self._body_left)
                self._body_left -= cut - pos
            elif self._body_left == 0:
                cut = size  # (the parser did not end the message where its length said)
            else:
                # A chunked body ends with a blank line (its last chunk and
                # trailers): fed up to each one, the parser says which ends it.
                end = self._blank_line(data, pos)
                cut = size if end < 0 else end
            if pos == 0 and cut == size:
                super().data_received(data)
            else:  # (httptools reads any buffer: a part of the read, not copied)
                super().data_received(memoryview(data)[pos:cut])  # type: ignore[arg-type]
            if self._refused or self.transport.is_closing():
                return
            pos = cut

    def _blank_line(self, data: bytes, pos: int) -> int:
        """The offset in ``data`` just past the first ``\r\n\r\n`` that ends at or
        after ``pos`` (the bytes before ``pos`` of this message in ``_tail``), or -1,
        keeping in ``_tail`` the last bytes seen for a blank line split across reads."""
        tail = self._tail
        if tail:
            found = (tail + data[pos : pos + 3]).find(b"\r\n\r\n")
            if found >= 0:
                end = pos + found + 4 - len(tail)
                self._tail = (tail + data[pos:end])[-3:]
                return end
        found = data.find(b"\r\n\r\n", pos)
        if found >= 0:
            end = found + 4
            self._tail = data[end - 3 : end]
            return end
        self._tail = data[-3:] if len(data) - pos >= 3 else (tail + data[pos:])[-3:]
        return -1

    def send_400_response(self, msg: str) -> None:
        """A request the parser cannot read: the JSON-RPC shape, not uvicorn's plain text."""
        if not self.transport.is_closing():
            self.transport.write(_FRAMING_RESPONSE)
            self.transport.close()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._header_bytes, self._counting, self._tail, self._body_left = 0, True, b"", None

    def _refuse_too_large(self) -> None:
        """431 and close, whatever the parser has seen: nothing more is read."""
        self._refused = True
        self._disarm()
        if self.transport.is_closing():
            return
        self.transport.pause_reading()
        self.transport.write(_TOO_LARGE_RESPONSE)
        self.loop.call_later(REFUSAL_LINGER, self.transport.close)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        self._body_left = _content_length(self.headers)
        extensions: dict[str, Any] = self.scope.setdefault("extensions", {})
        extensions[WATCH_DISCONNECT] = self.watch_disconnect
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.transport is self.transport and self._writes is not None:
            cycle.transport = self._writes  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._lost = True
        super().connection_lost(exc)
        callback, self._on_lost = self._on_lost, None
        if callback is not None:
            callback()

    def watch_disconnect(self, callback: Callable[[], None] | None) -> None:
        """Run ``callback`` when the connection closes (at once, soon, if it has);
        None clears it. One at a time: a connection runs one request at a time."""
        if callback is not None and self._lost:
            self.loop.call_soon(callback)
            return
        self._on_lost = callback

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
    header_timeout: float,
    max_connections: int | None = None,
    max_header_bytes: int = 16 * 1024,
) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol, closing connections whose headers take too long
    or grow too large, and refusing those past ``max_connections``."""
    return type(
        "BoundedHeadersProtocol",
        (_BoundedHeaders,),
        {
            "header_timeout": header_timeout,
            "max_connections": max_connections,
            "max_header_bytes": max_header_bytes,
        },
    )


def body_arrived(receive: Callable[..., Any]) -> bool:
    """Whether the request behind ``receive`` (uvicorn's ``RequestResponseCycle.receive``)
    has its body whole already: reading it then cannot wait. False when unknown (another
    server, an ASGI test client), or while the body is still coming."""
    return getattr(getattr(receive, "__self__", None), "more_body", True) is False
