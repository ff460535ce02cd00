"""The router's HTTP/1.1 client to the replicas: a keep-alive pool on httptools.

Why not aiohttp: its client was the largest single share of the router's CPU
(27.5% of it in a profile of modern rounds), for features a hop to a replica on
a private network never uses (redirects, cookies, proxies, TLS, decompression, trace hooks). This
client does what the router needs and nothing else: one request per
connection at a time, a pool of idle connections per replica, the response's
headers as soon as they arrive, its body whole or chunk by chunk (SSE).

The fault semantics the router relies on are the client's to keep:

* Connecting either fails (refused: :class:`ConnectFailed`; not within the
  deadline: ``TimeoutError``), and then nothing was sent; or it succeeds, and
  from the moment the request is written any failure before the response's
  headers is :class:`Broken`: the replica may have read the request.
* A pooled connection is reused only while it has been idle less than
  ``idle_seconds`` (the replica's own keep-alive is 15 times longer), and never
  once the replica closed it; idle connections past that age are closed by a
  sweep, so none is kept for the replica to close under a request.
* Response headers are bounded (:data:`MAX_RESPONSE_HEADER_BYTES`, interim
  answers' included, counted as bytes arrive up to the end of the head): past
  the bound the connection is closed and the request is :class:`Broken`. Body
  bytes read with the head never count: a replica writes a head and a large
  body at once, and how the kernel splits them into reads is chance.
* Nothing bounds a body: it is read whole only below the caller's bound
  (``upstream.WHOLE_BODY_LIMIT``), else streamed with back-pressure.
* Bytes after a complete response, in the same read, are not parsed (they
  would mix with its headers): the response stands, its connection closes.
* Closing a :class:`Response` before it is complete closes its connection, so
  the replica sees its client leave (and cancels the request); so does
  cancelling the task that waits for its headers.
* A streamed body is read with back-pressure: past :data:`STREAM_HIGH_WATER`
  unread bytes the connection stops reading until the router sends them on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httptools

#: The most response header bytes (status line included) the router reads from a
#: replica before it gives up on the response: a replica's headers are a few
#: hundred bytes; aiohttp, used before, allowed 8190 per line.
MAX_RESPONSE_HEADER_BYTES = 64 * 1024
#: Unread bytes of a streamed body past which the connection stops reading.
STREAM_HIGH_WATER = 256 * 1024
#: How often idle connections are checked for their age.
SWEEP_SECONDS = 1.0
_FRAMING = frozenset({"content-length", "transfer-encoding"})


class ConnectFailed(Exception):
    """No connection to the replica: nothing was sent. ``os_error`` says why."""

    def __init__(self, os_error: OSError) -> None:
        super().__init__(str(os_error))
        self.os_error = os_error


class Broken(Exception):
    """The connection failed after the request was written, before the response
    was complete (or its headers were unreadable): the replica may have read it."""


class _Unsolicited(Exception):
    """Stops the parser at bytes that follow a complete response."""


class Headers(dict[str, str]):
    """Response headers by lower-case name (the first value of a repeated one, as
    aiohttp's ``get`` gave it); :meth:`get` takes any case."""

    def get(self, key: str, default: str | None = None) -> str | None:  # type: ignore[override]
        return super().get(key.lower(), default)


class _Conn(asyncio.Protocol):
    """One connection to a replica, parsing one response at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.idle_since = 0.0
        self._reset(None)

    def _reset(self, method: bytes | None) -> None:
        if method is None:
            # A new connection. A pooled one is reused only after a complete
            # response, so its parser is at a message boundary and goes on.
            self.parser = httptools.HttpResponseParser(self)
        self.method = method
        self.status = 0
        self.raw_headers: list[tuple[bytes, bytes]] = []
        #: By lower-case name, the first value of each, decoded as they arrive.
        self.headers = Headers()
        #: Whether a Content-Length or Transfer-Encoding frames the body.
        self.framed = False
        self.head_bytes = 0
        self.headers_done: asyncio.Future[None] | None = None
        self.chunks: list[bytes] = []
        self.buffered = 0
        self.complete = False
        self.until_eof = False
        self.reusable = True
        self.error: Exception | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.paused = False
        #: Read whole (bounded by the caller): never paused.
        self.whole = False

    # --- the request ---------------------------------------------------------------

    def send(self, method: bytes, head: bytes, body: bytes) -> asyncio.Future[None]:
        """Write one request; the future resolves when its response's headers arrived."""
        self._reset(method)
        self.headers_done = self.loop.create_future()
        assert self.transport is not None
        self.transport.write(head + body if len(body) < 65536 else head)
        if len(body) >= 65536:
            self.transport.write(body)
        return self.headers_done

    # --- asyncio.Protocol ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.complete or self.headers_done is None:
            # Bytes no request asked for: the connection is not to be trusted again.
            self.reusable = False
            self._close()
            return
        if not self.headers_done.done():
            room = MAX_RESPONSE_HEADER_BYTES - self.head_bytes
            if len(data) > room:
                self._over_room(data, room)
                return
            # The whole read fits the room: whatever part of it is body, the head
            # (interim answers' included) cannot have passed the bound.
            self.head_bytes += len(data)
        self._feed(data)

    def _over_room(self, data: bytes, room: int) -> None:
        """A read longer than the room left for the head: the parser sees the room's
        bytes first, and the rest only if the head ended within them (the rest is
        body: a replica writes its head and a large body at once)."""
        view = memoryview(data)
        if not self._feed(view[:room]):
            return
        assert self.headers_done is not None
        if not self.headers_done.done():
            self._fail(Broken("response headers too large"))
            return
        self.head_bytes = MAX_RESPONSE_HEADER_BYTES
        self._feed(view[room:])

    def _feed(self, data: bytes | memoryview) -> bool:
        """The parser fed ``data``; False if the response failed (then closed)."""
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if self.complete:
                # Bytes past the end of the response, read with it (see
                # on_message_begin): the response stands, the connection is
                # not trusted again.
                self.reusable = False
                self._close()
            else:
                self._fail(Broken(f"unreadable response: {exc}"))
            return False
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.reusable = False
        if self.headers_done is None or self.complete:
            return
        if self.until_eof and self.headers_done.done():
            # A body delimited by the connection's close ends here.
            self.complete = True
            self._wake()
            return
        self.error = Broken("connection closed before the response was complete")
        if not self.headers_done.done():
            self.headers_done.set_exception(self.error)
        self._wake()

    # --- httptools callbacks -------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.complete:
            # A second message in the read that ended the response: stop here
            # (the exception stops the parser), before its headers mix with
            # this response's.
            raise _Unsolicited

    def on_header(self, name: bytes, value: bytes) -> None:
        self.raw_headers.append((name, value))
        key = name.decode("latin-1").lower()
        if key not in self.headers:
            self.headers[key] = value.decode("latin-1")
            if key in _FRAMING:
                self.framed = True

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:
            # An interim answer (100 Continue, 103 Early Hints): the real one follows.
            self.raw_headers, self.headers, self.framed = [], Headers(), False
            return
        self.status = status
        if not self.parser.should_keep_alive():
            self.reusable = False
        if self.method == b"HEAD" or status in (204, 304):
            # No body follows, whatever Content-Length says; the parser cannot know
            # the request was a HEAD, so this connection is not parsed again.
            self.complete, self.reusable = True, False
        elif not self.framed:
            self.until_eof, self.reusable = True, False
        assert self.headers_done is not None
        if not self.headers_done.done():
            self.headers_done.set_result(None)

    def on_body(self, body: bytes) -> None:
        if self.complete:
            return
        self.chunks.append(body)
        self.buffered += len(body)
        if (
            self.buffered > STREAM_HIGH_WATER
            and not (self.paused or self.whole)
            and self.transport is not None
        ):
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self.status == 0:  # the end of an interim answer
            return
        self.complete = True
        self._wake()

    # --- the reader's side ---------------------------------------------------------

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def _fail(self, error: Exception) -> None:
        self.error = error
        self.reusable = False
        if self.headers_done is not None and not self.headers_done.done():
            self.headers_done.set_exception(error)
        self._wake()
        self._close()

    def _close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def take(self) -> bytes:
        out = b"".join(self.chunks) if len(self.chunks) != 1 else self.chunks[0]
        self.chunks, self.buffered = [], 0
        self.take_paused()
        return out

    def take_paused(self) -> None:
        """Reading again, if back-pressure had stopped it."""
        if self.paused and self.transport is not None and not self.lost:
            self.paused = False
            self.transport.resume_reading()

    async def wait(self, for_more: bool = True) -> None:
        """Until more body (``for_more``), the end, or an error."""
        if (for_more and self.chunks) or self.complete or self.error is not None:
            return
        self.waiter = self.loop.create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None


class Response:
    """A replica's response: status and headers at once, the body when read.

    End it with :meth:`release` once the body was read whole (the connection
    goes back to the pool), or :meth:`close` (the connection is closed: a
    request still running on the replica sees its client leave).
    """

    def __init__(self, conn: _Conn, pool: Pool, address: str) -> None:
        self._conn = conn
        self._pool = pool
        self._address = address
        self.status = conn.status
        self.raw_headers = conn.raw_headers
        self.headers = conn.headers
        length = self.headers.get("content-length")
        self.content_length = int(length) if length is not None and length.isdigit() else None
        self._done = False

    async def read(self) -> bytes:
        """The whole body. Raises :class:`Broken` if it broke off."""
        conn = self._conn
        conn.whole = True
        if conn.paused:
            conn.take_paused()
        while not conn.complete:
            if conn.error is not None:
                raise conn.error
            await conn.wait(for_more=False)
        return conn.take()

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives. Raises :class:`Broken` if it broke off."""
        conn = self._conn
        while True:
            if conn.chunks:
                yield conn.take()
                continue
            if conn.complete:
                return
            if conn.error is not None:
                raise conn.error
            await conn.wait()

    def release(self) -> None:
        """Done with a response read whole: its connection back to the pool."""
        if self._done:
            return
        self._done = True
        conn = self._conn
        if conn.complete and conn.reusable and not conn.lost and not conn.chunks:
            self._pool.put(self._address, conn)
        else:
            conn._close()

    def close(self) -> None:
        """Done, whatever is left: the connection is closed."""
        if self._done:
            return
        self._done = True
        self._conn.reusable = False
        self._conn._close()


class Pool:
    """Keep-alive connections per replica address (``http://host:port``)."""

    def __init__(self, connect_timeout: float, idle_seconds: float) -> None:
        self.connect_timeout = connect_timeout
        self.idle_seconds = idle_seconds
        self._idle: dict[str, list[_Conn]] = {}
        self._hosts: dict[str, tuple[str, int, bytes]] = {}
        self._sweeper: asyncio.TimerHandle | None = None
        self._closed = False

    def start(self) -> None:
        self._sweeper = asyncio.get_running_loop().call_later(SWEEP_SECONDS, self._sweep)

    def close(self) -> None:
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
        for conns in self._idle.values():
            for conn in conns:
                conn._close()
        self._idle.clear()

    def _sweep(self) -> None:
        now = time.monotonic()
        for address, conns in list(self._idle.items()):
            keep = [c for c in conns if not c.lost and now - c.idle_since < self.idle_seconds]
            for c in conns:
                if c not in keep:
                    c._close()
            if keep:
                conns[:] = keep
            else:  # replicas come and go (new addresses): the tables do not grow
                del self._idle[address]
                self._hosts.pop(address, None)
        if not self._closed:
            self._sweeper = asyncio.get_running_loop().call_later(SWEEP_SECONDS, self._sweep)

    def put(self, address: str, conn: _Conn) -> None:
        if self._closed:
            conn._close()
            return
        conn.idle_since = time.monotonic()
        self._idle.setdefault(address, []).append(conn)

    def _pooled(self, address: str) -> _Conn | None:
        conns = self._idle.get(address)
        now = time.monotonic()
        while conns:
            conn = conns.pop()
            transport = conn.transport
            if (
                not conn.lost
                and transport is not None
                and not transport.is_closing()
                and now - conn.idle_since < self.idle_seconds
            ):
                return conn
            conn._close()
        return None

    def _host(self, address: str) -> tuple[str, int, bytes]:
        known = self._hosts.get(address)
        if known is None:
            parts = urlsplit(address)
            host, port = parts.hostname or "", parts.port or 80
            known = self._hosts[address] = (host, port, parts.netloc.encode("latin-1"))
        return known

    async def request(
        self, address: str, method: bytes, target: bytes, headers: bytes, body: bytes
    ) -> Response:
        """Send one request; the :class:`Response` once its headers arrived.

        ``headers`` is the header block (``name: value\\r\\n`` lines) without
        ``Host`` and ``Content-Length``, which are added here. Raises
        :class:`ConnectFailed` or ``TimeoutError`` when no connection could be
        made (nothing was sent), :class:`Broken` after it was written.
        """
        host, port, netloc = self._host(address)
        conn = self._pooled(address)
        if conn is None:
            loop = asyncio.get_running_loop()
            try:
                async with asyncio.timeout(self.connect_timeout):
                    _, proto = await loop.create_connection(lambda: _Conn(loop), host, port)
            except TimeoutError:
                raise  # (an OSError too, but not a refusal: the replica may be overloaded)
            except OSError as exc:
                raise ConnectFailed(exc) from exc
            conn = proto
        head = b"%s %s HTTP/1.1\r\nhost: %s\r\n%s" % (method, target, netloc, headers)
        if body or method in (b"POST", b"PUT", b"PATCH"):
            head += b"content-length: %d\r\n" % len(body)
        headers_done = conn.send(method, head + b"\r\n", body)
        try:
            await headers_done
        except BaseException:
            # Broken, or the waiting task was cancelled (its client left): the
            # replica sees the connection close.
            conn.reusable = False
            conn._close()
            raise
        return Response(conn, self, address)
