"""Admission: read one client request and judge whether the router will route it.

Everything the router refuses before choosing a replica is decided here, from
the request alone: header size, the DNS-rebinding policy on ``Host`` and
``Origin``, body size and read time, and duplicate ``Mcp-Session-Id``
headers. The router answers a :class:`Rejection` itself; it never reaches a
replica.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from starlette.types import Receive, Scope

from mcpfleet.config import RouterConfig
from mcpfleet.router.decisions import OriginPolicy, refused_origin, session_ids


@dataclass(frozen=True)
class Rejection:
    """A request the router answers itself: an HTTP status and a JSON-RPC error."""

    status: int
    code: int
    message: str


@dataclass(frozen=True)
class Admitted:
    """A request to route: its headers (lower-cased names) and its whole body."""

    headers: dict[str, str]
    body: bytes


class ClientGone(Exception):
    """The client went away while sending its request."""


class _TooLarge(Exception):
    pass


async def admit(
    scope: Scope, receive: Receive, config: RouterConfig, policy: OriginPolicy
) -> Admitted | Rejection:
    """Read and judge one request. Raises :class:`ClientGone` if the client left."""
    raw_headers: list[tuple[bytes, bytes]] = scope["headers"]
    if sum(len(k) + len(v) for k, v in raw_headers) > config.max_header_bytes:
        return Rejection(431, -32600, "Request headers too large")
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in raw_headers}
    refusal = refused_origin(headers.get("host"), headers.get("origin"), policy)
    if refusal is not None:
        return Rejection(403, -32600, f"Forbidden: {refusal}")
    declared = headers.get("content-length", "")
    if declared.isdigit() and int(declared) > config.max_body_bytes:
        return Rejection(413, -32600, "Request body too large")
    try:
        async with asyncio.timeout(config.body_timeout):
            body = await _read_body(receive, config.max_body_bytes)
    except _TooLarge:
        return Rejection(413, -32600, "Request body too large")
    except TimeoutError:
        return Rejection(408, -32600, "Request body not received in time")
    if len(session_ids(raw_headers)) > 1:
        # The router would route by one and the replica read another: refused
        # before any lookup, so no session is ever dropped on another's behalf.
        return Rejection(400, -32600, "Bad Request: more than one Mcp-Session-Id")
    return Admitted(headers, body)


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
