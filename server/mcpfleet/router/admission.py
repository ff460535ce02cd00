"""Admission: read one client request and judge whether the router will route it.

Everything the router refuses before choosing a replica is decided here, from
the request alone: header size, the path (only the MCP endpoint, in normal
form), a repeated ``Host``, the DNS-rebinding policy on ``Host`` and
``Origin``, body size and read time, and duplicate ``Mcp-Session-Id``
headers. The router answers a :class:`Rejection` itself; it never reaches a
replica. What it lets through it returns as the request's
:class:`~mcpfleet.router.exchange.Exchange`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from starlette.types import Receive, Scope, Send

from mcpfleet.answers import ErrorCode
from mcpfleet.config import RouterConfig
from mcpfleet.contract import MCP_PATH, SESSION_HEADER
from mcpfleet.router.decisions import OriginPolicy, forwardable_path, refused_origin
from mcpfleet.router.exchange import Exchange
from mcpfleet.router.h1server import body_arrived


@dataclass(frozen=True)
class Rejection:
    """A request the router answers itself: an HTTP status and a JSON-RPC error."""

    status: int
    code: int
    message: str


_SESSION = SESSION_HEADER.lower()


class ClientGone(Exception):
    """The client went away while sending its request."""


class _TooLarge(Exception):
    pass


async def admit(
    scope: Scope,
    receive: Receive,
    send: Send,
    started: float,
    config: RouterConfig,
    policy: OriginPolicy,
) -> Exchange | Rejection:
    """Read and judge one request that arrived at ``started``: the exchange to
    route, or the rejection to answer. Raises :class:`ClientGone` if the client left."""
    raw_headers: list[tuple[bytes, bytes]] = scope["headers"]
    # One pass over the headers: their size, the ones that may not repeat, and
    # the lookup table (the last value of a repeated name).
    size = hosts = session_ids = 0
    headers: dict[str, str] = {}
    for k, v in raw_headers:
        size += len(k) + len(v)
        name = k.decode("latin-1").lower()
        if name == "host":
            hosts += 1
        elif name == _SESSION:
            session_ids += 1
        headers[name] = v.decode("latin-1")
    if size > config.max_header_bytes:
        return Rejection(431, ErrorCode.INVALID_REQUEST, "Request headers too large")
    raw_path: bytes = scope.get("raw_path") or scope["path"].encode("latin-1")
    if raw_path == b"*":
        # The asterisk form names no resource (RFC 9112 section 3.2.4).
        return Rejection(400, ErrorCode.INVALID_REQUEST, "Bad Request: '*' names no resource")
    if not forwardable_path(raw_path):
        return Rejection(404, ErrorCode.INVALID_REQUEST, f"Not Found: the router serves {MCP_PATH}")
    if hosts > 1:
        # RFC 9112 section 3.2: a request with more than one Host is refused;
        # the router would check one and a replica could use another.
        return Rejection(400, ErrorCode.INVALID_REQUEST, "Bad Request: more than one Host")
    refusal = refused_origin(headers.get("host"), headers.get("origin"), policy)
    if refusal is not None:
        return Rejection(403, ErrorCode.INVALID_REQUEST, f"Forbidden: {refusal}")
    declared = headers.get("content-length", "")
    if declared.isdigit() and int(declared) > config.max_body_bytes:
        return Rejection(413, ErrorCode.INVALID_REQUEST, "Request body too large")
    try:
        if body_arrived(receive):
            # Whole already (every small POST): the read cannot wait, so no deadline
            # is armed (a timer and a cancel scope per request).
            body = await _read_body(receive, config.max_body_bytes)
        else:
            async with asyncio.timeout(config.body_timeout):
                body = await _read_body(receive, config.max_body_bytes)
    except _TooLarge:
        return Rejection(413, ErrorCode.INVALID_REQUEST, "Request body too large")
    except TimeoutError:
        return Rejection(408, ErrorCode.INVALID_REQUEST, "Request body not received in time")
    if session_ids > 1:
        # The router would route by one and the replica read another: refused
        # before any lookup, so no session is ever dropped on another's behalf.
        return Rejection(
            400, ErrorCode.INVALID_REQUEST, "Bad Request: more than one Mcp-Session-Id"
        )
    return Exchange(scope, receive, send, headers, body, started, headers.get(_SESSION))


async def _read_body(receive: Receive, limit: int) -> bytes:
    """The whole request body (routing needs it), within ``limit`` bytes."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)
