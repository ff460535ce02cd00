"""The limits per principal at the replica's door, behind the app's auth (mcpfleet.limits).

An ASGI middleware the replica adds to the FastMCP app's own middleware, so it
runs after the app's authentication has named the caller (``scope["user"]``)
and before the MCP transport sees the request:

* every POST to the MCP path is attributed to its principal
  (:func:`mcpfleet.limits.principal_of`), which is set in
  :data:`~mcpfleet.limits.CURRENT_PRINCIPAL` for the code the request runs;
* an ``initialize`` (no session yet, not a modern request) must find a place
  in the principal's sessions; the session it opens keeps that place until it
  ends (DELETE, idle, its replica gone: mcpfleet.limits._limiter);
* any other POST carrying a request (a ``method`` and an ``id``; answers to the
  server's own requests and notifications are not rounds: refusing an
  elicitation's answer would strand the paused tool) is a round, checked
  against the principal's rate (and its tool's, when one is set);
* past a limit: ``429`` with ``Retry-After`` and a JSON-RPC error (code
  -32000) whose ``data`` names the limit and the seconds to wait, on both eras.
  Nothing of the request ran;
* a ``subscriptions/listen`` (a round too) must find a place in the principal's
  listen streams, held for as long as the stream's response lasts and given
  back the moment it ends (the client left, the stream was ended here).

With no limit set, requests pass through untouched.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from mcp.server.streamable_http_manager import DEFAULT_MAX_REQUEST_BODY_SIZE
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mcpfleet import tracing
from mcpfleet.contract import MCP_PATH, PROTOCOL_VERSION_HEADER, SESSION_HEADER
from mcpfleet.httpio import ErrorCode, jsonrpc_error, send_whole
from mcpfleet.jsonbody import is_initialize, is_request, load, may_name, method_of
from mcpfleet.limits import (
    CURRENT_PRINCIPAL,
    Limiter,
    LimitObserver,
    Refusal,
    principal_of,
)

__all__ = ["MAX_TOOL_LABELS", "LimitGate"]

_SESSION: Final = SESSION_HEADER.lower().encode()
_VERSION: Final = PROTOCOL_VERSION_HEADER.lower().encode()
_MODERN: Final = frozenset(v.encode() for v in MODERN_PROTOCOL_VERSIONS)
_PATHS: Final = frozenset({MCP_PATH, MCP_PATH + "/"})
#: Distinct tool names the ``tool`` label takes; past them, ``other``.
MAX_TOOL_LABELS: Final = 100


class LimitGate:
    """See the module docstring."""

    def __init__(
        self,
        app: ASGIApp,
        limiter: Limiter,
        *,
        trusted_hops: int = 1,
        anonymous: Literal["address", "shared"] = "address",
        observer: LimitObserver | None = None,
    ) -> None:
        self.app = app
        self.observer = observer
        self.limiter = limiter
        self.trusted_hops = trusted_hops
        self.anonymous: Literal["address", "shared"] = anonymous
        self._tools: set[str] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.limiter.rules.any or scope["path"] not in _PATHS:
            await self.app(scope, receive, send)
            return
        method = scope["method"]
        if method not in ("POST", "DELETE"):
            await self.app(scope, receive, send)
            return
        principal = principal_of(scope, self.trusted_hops, self.anonymous)
        token = CURRENT_PRINCIPAL.set(principal)
        try:
            session, modern = _session_and_era(scope)
            if method == "DELETE":
                await self._delete(scope, receive, send, session)
                return
            body, replay = await _read_body(receive)
            if body is None:  # too large to hold here: the transport refuses it
                await self.app(scope, replay, send)
            elif session is None and not modern and is_initialize(body):
                await self._initialize(scope, replay, send, principal)
            elif is_request(body):
                refusal = await self.limiter.round(principal, self._tool(body))
                if refusal is not None:
                    self._count(refusal, body)
                    await _refuse(send, refusal, body)
                    return
                if (
                    may_name(body, b"subscriptions/listen")
                    and method_of(body) == "subscriptions/listen"
                ):
                    await self._listen(scope, replay, send, principal, body)
                    return
                await self.app(scope, replay, send)
            else:
                await self.app(scope, replay, send)
        finally:
            CURRENT_PRINCIPAL.reset(token)

    async def _listen(
        self, scope: Scope, receive: Receive, send: Send, principal: str, body: bytes
    ) -> None:
        """A listen stream, in a place of the principal's for as long as it is open."""
        refusal, place = await self.limiter.admit_listen(principal)
        if refusal is not None:
            self._count(refusal, body)
            await _refuse(send, refusal, body)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            if place is not None:
                await self.limiter.release_listen(place)

    def _tool(self, body: bytes) -> str | None:
        """The tool a ``tools/call`` names, when a tool has a rate of its own."""
        if not self.limiter.rules.tools or not may_name(body, b"tools/call"):
            return None
        return _tool_name(body)

    async def _initialize(self, scope: Scope, receive: Receive, send: Send, principal: str) -> None:
        limiter = self.limiter
        refusal, pending = await limiter.admit_session(principal)
        if refusal is not None:
            self._count(refusal, None)
            await _refuse(send, refusal, None)
            return
        opened: str | None = None

        async def watched(message: Message) -> None:
            nonlocal opened
            if message["type"] == "http.response.start" and message["status"] == 200:
                for key, value in message.get("headers", []):
                    if key == _SESSION:
                        opened = value.decode("latin-1")
                if opened is not None:
                    limiter.session_opened(opened, principal)
            await send(message)

        try:
            await self.app(scope, receive, watched)
        finally:
            await limiter.settle(principal, pending, opened)

    async def _delete(
        self, scope: Scope, receive: Receive, send: Send, session: str | None
    ) -> None:
        async def watched(message: Message) -> None:
            if (
                session is not None
                and message["type"] == "http.response.start"
                and message["status"] < 300
            ):
                self.limiter.session_ended(session)
            await send(message)

        await self.app(scope, receive, watched)

    def _count(self, refusal: Refusal, body: bytes | None) -> None:
        tracing.note("mcpfleet.limited", refusal.limit)
        if self.observer is not None:
            tool = _tool_name(body) if body is not None and may_name(body, b"tools/call") else None
            self.observer.limited(refusal.limit, self.tool_label(tool))

    def tool_label(self, tool: str | None) -> str:
        """A bounded label for ``tool`` (``""`` for a request that names none)."""
        if not tool:
            return ""
        if tool in self._tools:
            return tool
        if len(self._tools) < MAX_TOOL_LABELS:
            self._tools.add(tool)
            return tool
        return "other"


def _session_and_era(scope: Scope) -> tuple[str | None, bool]:
    session: str | None = None
    modern = False
    for key, value in scope["headers"]:
        if key == _SESSION:
            session = value.decode("latin-1")
        elif key == _VERSION:
            modern = value in _MODERN
    return session, modern


async def _read_body(receive: Receive) -> tuple[bytes | None, Receive]:
    """The request's body and a ``receive`` that hands it on as it came.

    None for a body over mcp's own limit: it is handed on unread past what was
    read, and the transport refuses it.
    """
    chunks: list[bytes] = []
    size = 0
    first: list[Message] = []
    while True:
        message = await receive()
        first.append(message)
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        chunks.append(chunk)
        size += len(chunk)
        if not message.get("more_body", False) or size > DEFAULT_MAX_REQUEST_BODY_SIZE:
            break
    body = b"".join(chunks) if size <= DEFAULT_MAX_REQUEST_BODY_SIZE else None

    async def replay() -> Message:
        if first:
            return first.pop(0)
        return await receive()

    return body, replay


def _parsed(body: bytes) -> Any:
    try:
        return load(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None


def _tool_name(body: bytes) -> str | None:
    doc = _parsed(body)
    if isinstance(doc, dict) and doc.get("method") == "tools/call":
        params = doc.get("params")
        name = params.get("name") if isinstance(params, dict) else None
        return name if isinstance(name, str) else None
    return None


def _request_id(body: bytes | None) -> str | int | None:
    doc = _parsed(body) if body else None
    if isinstance(doc, dict):
        rid = doc.get("id")
        if isinstance(rid, str | int) and not isinstance(rid, bool):
            return rid
    return None


async def _refuse(send: Send, refusal: Refusal, body: bytes | None) -> None:
    """``429`` + ``Retry-After``, a JSON-RPC error naming the limit."""
    seconds = refusal.retry_seconds
    payload = jsonrpc_error(
        ErrorCode.SERVER_ERROR,
        refusal.message,
        data={"limit": refusal.limit, "retryAfter": seconds},
        request_id=_request_id(body),
    )
    await send_whole(send, 429, payload, headers=[(b"retry-after", str(seconds).encode())])
