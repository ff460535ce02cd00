"""The router's upstream side: one HTTP request to one replica, and its relay.

:class:`Upstream` only forwards. It opens the request (headers translated;
never sent twice: see :data:`UPSTREAM_IDLE_SECONDS`), and relays
the response body chunk by chunk until either side ends. Choosing the
replica, counting requests in flight, recording sessions and timing live
around it, in :class:`~mcpfleet.router.proxy.Router`.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from urllib.parse import urlsplit

from starlette.types import Message, Receive, Scope, Send

from mcpfleet.contract import (
    CLIENT_SESSION_HEADER,
    DRAINING_HEADER,
    PRINCIPAL_HEADER,
    REHOME_HEADER,
    REPLICA_HEADER,
    ROUTER_ERROR_HEADER,
    SESSION_ENDED_HEADER,
    SESSION_HEADER,
)
from mcpfleet.router.h1client import Broken, ConnectFailed, Pool, Response

log = logging.getLogger("mcpfleet.router")

#: Headers that describe one hop, never forwarded (RFC 9110 section 7.6.1), and
#: ``host``, which names the router; the upstream client sets the replica's own.
#: Headers only fleet components may set are in ``_CLIENT_MAY_NOT_SET``.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
    }
)
_CLIENT_MAY_NOT_SET = frozenset(
    {
        REPLICA_HEADER.lower(),
        DRAINING_HEADER.lower(),
        ROUTER_ERROR_HEADER.lower(),
        SESSION_ENDED_HEADER.lower(),
        PRINCIPAL_HEADER.lower(),
        REHOME_HEADER.lower(),
        CLIENT_SESSION_HEADER.lower(),
    }
)
#: Replica response headers meant for the router only, never relayed to a client.
_INTERNAL = frozenset(
    {SESSION_ENDED_HEADER.lower(), PRINCIPAL_HEADER.lower(), REHOME_HEADER.lower()}
)
_SESSION_RAW = SESSION_HEADER.lower().encode()
#: Replica response headers the router replaces with its own (uvicorn adds them
#: to every response): forwarding them too would repeat them.
_REPLACED_BY_ROUTER = frozenset({"date", "server"})
#: What :func:`response_headers` never relays (names as bytes, lower-case).
_DROP_RESPONSE = frozenset(n.encode() for n in HOP_BY_HOP | _REPLACED_BY_ROUTER | _INTERNAL)
#: A response body with a Content-Length up to this many bytes (every JSON answer
#: of a modern round) is read whole and sent in one message, without the pump's
#: two tasks per request: the largest share of the router's own per-request CPU
#: that is not a system call (``make bench`` measures both ways side by side).
#: Streams (SSE: no Content-Length) and larger bodies are always pumped.
WHOLE_BODY_LIMIT = 256 * 1024


class Failure(enum.StrEnum):
    """Why a forward produced no upstream status; the values are metric labels."""

    REFUSED = "refused"  # the replica refused the connection: it is not listening
    TIMEOUT = "timeout"  # no connection within connect_timeout: maybe overloaded
    DRAINING = "draining"  # the replica declined the request before any work
    DISCONNECTED = "disconnected"  # the client went away first
    UPSTREAM_BROKE = "upstream_broke"  # the replica's response broke off midway
    #: The connection broke after the request may have been written, before any
    #: response: the replica may have run it. Answered, never re-sent.
    DROPPED = "dropped"

    @property
    def nothing_processed(self) -> bool:
        """True if the replica certainly did no work: the request may go elsewhere."""
        return self in (Failure.REFUSED, Failure.TIMEOUT, Failure.DRAINING)


class Dropped(Exception):
    """The replica accepted the connection, then failed before answering.

    The request may or may not have been processed, so it is never resent.
    """


def forward_headers(raw: list[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    """The client's request headers as the replica should see them."""
    connection_listed: set[str] = set()
    for k, v in raw:
        if k.lower() == b"connection":
            connection_listed |= {t.strip().lower() for t in v.decode("latin-1").split(",")}
    out = []
    for k, v in raw:
        name = k.decode("latin-1").lower()
        if name in HOP_BY_HOP or name in connection_listed or name in _CLIENT_MAY_NOT_SET:
            continue
        out.append((name, v.decode("latin-1")))
    return out


_DROP_RAW = frozenset(n.encode() for n in HOP_BY_HOP | _CLIENT_MAY_NOT_SET | {"content-length"})
#: Dropped too when the router traces: it sends its own span's ``traceparent``.
_DROP_TRACED = _DROP_RAW | {b"traceparent"}


def forward_header_block(
    raw: list[tuple[bytes, bytes]], client: str | None, drop: frozenset[bytes] = _DROP_RAW
) -> bytes:
    """The client's request headers as the replica should see them, as an HTTP/1.1
    header block (``name: value\\r\\n`` lines, names lower-cased) without ``Host``
    and ``Content-Length`` (the upstream client sets both), with ``X-Forwarded-For``
    naming ``client``. The same headers as :func:`forward_headers`, without decoding.
    ``drop``: the names never forwarded (lower-case)."""
    parts: list[bytes] = []
    for k, v in raw:
        name = k.lower()
        if name not in drop:
            parts += (name, b": ", v, b"\r\n")
        elif name == b"connection":
            # The headers Connection lists may come before it: passes without them.
            for k2, v2 in raw:
                if k2.lower() == b"connection":
                    drop = drop | {t.strip().lower() for t in v2.split(b",")}
            parts = [b"%s: %s\r\n" % (k2.lower(), v2) for k2, v2 in raw if k2.lower() not in drop]
            break
    if client:
        parts += (b"x-forwarded-for: ", client.encode("latin-1"), b"\r\n")
    return b"".join(parts)


def response_headers(
    resp: Response, replica_base: str, alias: tuple[bytes, bytes] | None = None
) -> list[tuple[bytes, bytes]]:
    """The replica's response headers as the client should see them.

    Hop-by-hop headers are dropped, and so are ``date``/``server`` (the router
    sets its own). A ``location`` pointing at the replica's own address (the
    app's trailing-slash redirect) is made relative, so a client that follows
    it comes back through the router instead of going around it. ``alias``
    (the replica's session id, the client's) puts a re-homed session's own id
    back in ``Mcp-Session-Id``.
    """
    drop = _DROP_RESPONSE
    connection = resp.headers.get("connection")
    if connection:
        drop = drop | {t.strip().lower().encode("latin-1") for t in connection.split(",")}
    out = []
    for k, v in resp.raw_headers:
        name = k.lower()
        if name in drop:
            continue
        if name == b"location" and v.startswith(replica_base.encode("latin-1") + b"/"):
            v = v[len(replica_base) :]
        elif alias is not None and name == _SESSION_RAW and v == alias[0]:
            v = alias[1]
        out.append((k, v))
    return out


def session_ended(resp: Response) -> bool:
    """True if the replica answered that the request's session does not exist there.

    Only a replica's own mark counts: a 404 without it may be the answer to a
    request whose credential is not the session's (the session lives on).
    """
    return resp.status == 404 and resp.headers.get(SESSION_ENDED_HEADER) == "1"


#: How long an upstream keep-alive connection may sit idle in the pool before the
#: router closes it. A replica closes an idle connection after its own keep-alive
#: timeout (``replica.process.REPLICA_KEEPALIVE``, 75 s); retiring ours fifteen
#: times sooner means a request never meets a connection the replica is closing.
#: That matters because a connection that breaks after the request was written
#: is never re-sent: the router cannot tell a stale connection from a replica
#: that read the request and died running it (a SIGKILL mid-tool).
UPSTREAM_IDLE_SECONDS = 5.0


class Upstream:
    """The router's HTTP client to the replicas: open a request, relay its response."""

    def __init__(self, connect_timeout: float, own_traceparent: bool = False) -> None:
        self.connect_timeout = connect_timeout
        #: The client's headers never forwarded (with tracing: its ``traceparent``
        #: too, the router sending its own span's instead).
        self.drop = _DROP_TRACED if own_traceparent else _DROP_RAW
        # Idle upstream connections are dropped well before a replica would close
        # them: a request never races a closing connection.
        self.pool = Pool(connect_timeout, UPSTREAM_IDLE_SECONDS)

    async def start(self) -> None:
        self.pool.start()

    async def close(self) -> None:
        self.pool.close()

    async def open(
        self, scope: Scope, name: str, address: str, body: bytes, extra: bytes = b""
    ) -> Response | Failure:
        """Send the client's request to replica ``name`` at ``address``.

        Returns once the response headers arrived, or the :class:`Failure`
        that proves the replica did no work (refused, timed out connecting).
        Raises :class:`Dropped` when it failed once the request may have been
        written: then it is never sent again, to this replica or another.
        ``extra``: header lines the router adds (``name: value\\r\\n``).
        """
        target: bytes = scope["raw_path"]
        if scope.get("query_string"):
            target += b"?" + scope["query_string"]
        client = scope.get("client")
        peer = client[0] if client else None
        headers = forward_header_block(scope["headers"], peer, self.drop) + extra
        try:
            return await self.pool.request(
                address, scope["method"].encode("latin-1"), target, headers, body
            )
        except TimeoutError:
            log.warning(
                "replica %s did not accept a connection within %.1fs", name, self.connect_timeout
            )
            return Failure.TIMEOUT
        except ConnectFailed as exc:
            log.info("replica %s refused the connection at %s: %s", name, address, exc.os_error)
            return Failure.REFUSED
        except Broken as exc:
            log.warning("replica %s failed before answering: %s", name, exc)
            raise Dropped(f"Replica {name} dropped the connection: {exc}") from exc

    async def notify(self, scope: Scope, address: str, body: bytes) -> None:
        """POST a notification (``body``) to the replica at ``address``, on the same
        path and with the client's own headers as the request ``scope``; the
        answer (202) is read and dropped. Bounded by the connect timeout plus one
        second; a failure is logged only."""
        raw = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-type"]
        headers = forward_header_block(raw, None) + b"content-type: application/json\r\n"
        try:
            async with asyncio.timeout(self.connect_timeout + 1.0):
                resp = await self.pool.request(address, b"POST", scope["raw_path"], headers, body)
                try:
                    await resp.read()
                finally:
                    resp.release()
        except (ConnectFailed, Broken, TimeoutError) as exc:
            log.info("cancellation not delivered to %s: %s", address, type(exc).__name__)

    async def accepts(self, address: str) -> bool:
        """Whether the replica at ``address`` accepts a connection within the connect
        timeout: after a dropped request, tells a dead owner from a live one."""
        parts = urlsplit(address)
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, writer = await asyncio.open_connection(parts.hostname, parts.port)
        except (OSError, TimeoutError):
            return False
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True

    async def relay(
        self,
        upstream: Response,
        address: str,
        receive: Receive,
        send: Send,
        alias: tuple[bytes, bytes] | None = None,
    ) -> int | Failure:
        """Relay the opened response to the client, then release or close it.

        Returns the status relayed whole, :attr:`Failure.DISCONNECTED` if the
        client went away first (the upstream is then closed too), or
        :attr:`Failure.UPSTREAM_BROKE` if the replica's body broke off: then the
        client's response is left unfinished and the server aborts the
        connection, so the client sees a broken stream, never a normal end.
        """
        result: int | Failure = Failure.UPSTREAM_BROKE
        try:
            start = {
                "type": "http.response.start",
                "status": upstream.status,
                "headers": response_headers(upstream, address, alias),
            }
            length = upstream.content_length
            if length is not None and length <= WHOLE_BODY_LIMIT:
                ended = await _relay_whole(upstream, start, send)
            else:
                await send(start)
                ended = await _pump(upstream, receive, send)
            result = upstream.status if ended is None else ended
            return result
        finally:
            if isinstance(result, int):
                upstream.release()  # complete: back to the pool
            else:
                upstream.close()  # tear the upstream request down

    @staticmethod
    async def decline(upstream: Response) -> None:
        """Finish a response the router does not relay (a draining replica's 503)."""
        try:
            await upstream.read()
        except Broken:
            upstream.close()
        finally:
            upstream.release()


async def _relay_whole(upstream: Response, start: Message, send: Send) -> Failure | None:
    """Relay a body of known, bounded length, read whole before the response starts.

    The head (``start``) and the body then leave in one write, whether the
    replica's head and body arrived together or not (a replica writes them
    apart: sending the head at once cost a system call and an event-loop turn
    for a part the client cannot use without the body). The replica finished
    its work before it could state the length, so there is nothing to tear
    down if the client leaves meanwhile (uvicorn then drops the sends). A body
    that breaks off leaves the client's response unfinished, as the pump does:
    the head is sent, then the server aborts the connection.
    """
    try:
        body = await upstream.read()
    except Broken as exc:
        log.info("upstream body broke off: %s", exc)
        await send(start)
        return Failure.UPSTREAM_BROKE
    await send(start)
    await send({"type": "http.response.body", "body": body, "more_body": False})
    return None


async def _pump(upstream: Response, receive: Receive, send: Send) -> Failure | None:
    """Copy the upstream body to the client chunk by chunk until either side ends."""

    async def copy() -> bool:
        try:
            async for chunk in upstream.iter_chunks():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except Broken as exc:
            log.info("upstream stream broke off: %s", exc)
            return False
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return True

    async def client_gone() -> None:
        while True:
            message: Message = await receive()
            if message["type"] == "http.disconnect":
                return

    copier = asyncio.ensure_future(copy())
    watcher = asyncio.ensure_future(client_gone())
    try:
        await asyncio.wait({copier, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (copier, watcher):
            task.cancel()
        for task in (copier, watcher):
            with contextlib.suppress(asyncio.CancelledError, OSError, RuntimeError):
                await task
    if not copier.done() or copier.cancelled() or copier.exception() is not None:
        return Failure.DISCONNECTED
    return None if copier.result() else Failure.UPSTREAM_BROKE
