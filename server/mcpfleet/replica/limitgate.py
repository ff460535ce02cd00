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
  back the moment it ends (the client left, the stream was ended here);
* an ``initialize`` is a round as well (the principal's rate bounds how often
  it may try to open a session), checked before its place;
* refused under the principal's own rate, the ``429`` says until when in
  ``X-Mcpfleet-Refused`` (routers then refuse the same credential from memory,
  mcpfleet.limits._refusals), and a token so refused is remembered here:
  :class:`RefusedCredentials`, in front of the app's auth, refuses it again
  before its token is checked, until then.

With no limit set, requests pass through untouched.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from mcp.server.streamable_http_manager import DEFAULT_MAX_REQUEST_BODY_SIZE
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mcpfleet import tracing
from mcpfleet.answers import ErrorCode, jsonrpc_error, send_whole
from mcpfleet.contract import MCP_PATH, PROTOCOL_VERSION_HEADER, SESSION_HEADER
from mcpfleet.jsonbody import is_initialize, is_request, load, may_name, method_of
from mcpfleet.limits import (
    CURRENT_PRINCIPAL,
    FORWARDED_FOR,
    REFUSED_HEADER,
    Limiter,
    LimitObserver,
    Refusal,
    credential_key,
    format_refused,
    principal_of,
)
from mcpfleet.replica.respmode import BODY

__all__ = ["MAX_ADDRESS_PRINCIPALS", "MAX_TOOL_LABELS", "LimitGate", "RefusedCredentials"]

_AUTHORIZATION: Final = b"authorization"
_REFUSED: Final = REFUSED_HEADER.lower().encode()

_SESSION: Final = SESSION_HEADER.lower().encode()
_VERSION: Final = PROTOCOL_VERSION_HEADER.lower().encode()
_MODERN: Final = frozenset(v.encode() for v in MODERN_PROTOCOL_VERSIONS)
_PATHS: Final = frozenset({MCP_PATH, MCP_PATH + "/"})
#: Distinct tool names the ``tool`` label takes; past them, ``other``.
MAX_TOOL_LABELS: Final = 100
#: Unauthenticated principals a gate remembers (then it forgets them all and starts over).
MAX_ADDRESS_PRINCIPALS: Final = 10_000


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
        self._labels = _ToolLabels()
        #: Unauthenticated principals by (peer, ``X-Forwarded-For`` values).
        self._principals: dict[tuple[str, tuple[bytes, ...]], str] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.limiter.rules.any or scope["path"] not in _PATHS:
            await self.app(scope, receive, send)
            return
        method = scope["method"]
        if method not in ("POST", "DELETE"):
            await self.app(scope, receive, send)
            return
        session, modern, forwarded = _read_headers(scope)
        principal = self._principal(scope, forwarded)
        token = CURRENT_PRINCIPAL.set(principal)
        try:
            if method == "DELETE":
                await self._delete(scope, receive, send, session)
                return
            # Read once: the response-mode choice in front left it in the scope.
            body, replay = scope.get(BODY), receive
            if body is None:
                body, replay = await _read_body(receive)
            if body is None:  # too large to hold here: the transport refuses it
                await self.app(scope, replay, send)
            elif session is None and not modern and is_initialize(body):
                await self._initialize(scope, replay, send, principal, body)
            elif is_request(body):
                if not self.limiter.round_from_lease(principal):
                    refusal = await self.limiter.round(principal, self._tool(body))
                    if refusal is not None:
                        await self._refuse(scope, send, refusal, body)
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
            await self._refuse(scope, send, refusal, body)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            if place is not None:
                await self.limiter.release_listen(place)

    def _principal(self, scope: Scope, forwarded: tuple[bytes, ...]) -> str:
        """:func:`principal_of` the request; an unauthenticated one's remembered by its
        peer and ``X-Forwarded-For`` values, which are all it is made of."""
        if self.anonymous != "address" or getattr(scope.get("user"), "access_token", None):
            return principal_of(scope, self.trusted_hops, self.anonymous)
        client = scope.get("client")
        key = (client[0] if client else "", forwarded)
        principal = self._principals.get(key)
        if principal is None:
            if len(self._principals) >= MAX_ADDRESS_PRINCIPALS:
                self._principals.clear()
            principal = principal_of(scope, self.trusted_hops, self.anonymous)
            self._principals[key] = principal
        return principal

    def _tool(self, body: bytes) -> str | None:
        """The tool a ``tools/call`` names, when a tool has a rate of its own."""
        if not self.limiter.rules.tools or not may_name(body, b"tools/call"):
            return None
        return _tool_name(body)

    async def _initialize(
        self, scope: Scope, receive: Receive, send: Send, principal: str, body: bytes
    ) -> None:
        limiter = self.limiter
        # A round first: the principal's rate bounds its tries, refused from memory.
        refusal, pending = await limiter.round(principal), None
        if refusal is None:
            refusal, pending = await limiter.admit_session(principal)
        if refusal is not None:
            await self._refuse(scope, send, refusal, body)
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

    async def _refuse(self, scope: Scope, send: Send, refusal: Refusal, body: bytes) -> None:
        """Count and answer ``refusal``; one under the principal's own rate is
        announced to routers, and its token remembered here until its time."""
        _count(self.observer, self._labels, refusal, body)
        extra: list[tuple[bytes, bytes]] = []
        if refusal.principal_wide:
            # Remembered until the Retry-After the client is told (whole seconds).
            seconds = refusal.retry_seconds
            token = getattr(scope.get("user"), "access_token", None) is not None
            authorization = _header(scope, _AUTHORIZATION) if token else None
            if authorization is not None:
                self.limiter.credentials.remember(
                    credential_key(authorization), seconds, refusal.limit
                )
            by = "token" if authorization is not None else "address"
            extra.append((_REFUSED, format_refused(seconds, refusal.limit, by)))
        await _answer_refusal(send, refusal, body, extra)

    def tool_label(self, tool: str | None) -> str:
        """A bounded label for ``tool`` (``""`` for a request that names none)."""
        return self._labels(tool)


class RefusedCredentials:
    """In front of the app's auth: a token refused under a rate is refused again at once.

    :class:`LimitGate` remembers each token it refused under the principal's own
    rate (``Limiter.credentials``, by a digest of the ``Authorization`` value),
    until the refusal's time. A request carrying one of them is answered here,
    before FastMCP verifies the token: the same ``429``, ``Retry-After`` and
    JSON-RPC error, at the cost of a digest and a dictionary lookup. Requests
    that are not requests (notifications, a client's answers to the server)
    pass, as they do at :class:`LimitGate`; a token never refused pays one
    lookup while the memory holds anything, nothing when it is empty.
    """

    def __init__(
        self, app: ASGIApp, limiter: Limiter, *, observer: LimitObserver | None = None
    ) -> None:
        self.app = app
        self.limiter = limiter
        self.observer = observer
        self._labels = _ToolLabels()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        memory = self.limiter.credentials
        if (
            not len(memory)
            or scope["type"] != "http"
            or scope["method"] != "POST"
            or scope["path"] not in _PATHS
        ):
            await self.app(scope, receive, send)
            return
        authorization = _header(scope, _AUTHORIZATION)
        held = memory.held(credential_key(authorization)) if authorization else None
        if held is None:
            await self.app(scope, receive, send)
            return
        body, replay = await _read_body(receive)
        if body is None or not is_request(body):
            await self.app(scope, replay, send)
            return
        refusal = Refusal(
            held.limit,
            held.seconds,
            f"Rate limited: {held.limit} over this principal's rate; retry after"
            f" {held.retry_seconds} s",
            principal_wide=True,
        )
        _count(self.observer, self._labels, refusal, body)
        extra = [(_REFUSED, format_refused(held.seconds, held.limit, "token"))]
        await _answer_refusal(send, refusal, body, extra)


class _ToolLabels:
    """Bounded ``tool`` label values: the first :data:`MAX_TOOL_LABELS` names, then
    ``other`` (``""`` for a request that names none)."""

    def __init__(self) -> None:
        self._tools: set[str] = set()

    def __call__(self, tool: str | None) -> str:
        if not tool:
            return ""
        if tool in self._tools:
            return tool
        if len(self._tools) < MAX_TOOL_LABELS:
            self._tools.add(tool)
            return tool
        return "other"


def _count(
    observer: LimitObserver | None, labels: _ToolLabels, refusal: Refusal, body: bytes | None
) -> None:
    tracing.note("mcpfleet.limited", refusal.limit)
    if observer is not None:
        tool = _tool_name(body) if body is not None and may_name(body, b"tools/call") else None
        observer.limited(refusal.limit, labels(tool))


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


def _read_headers(scope: Scope) -> tuple[str | None, bool, tuple[bytes, ...]]:
    """The session id, whether the request is modern, and the ``X-Forwarded-For`` values,
    in one pass over the headers."""
    session: str | None = None
    modern = False
    forwarded: tuple[bytes, ...] = ()
    for key, value in scope["headers"]:
        if key == _SESSION:
            session = value.decode("latin-1")
        elif key == _VERSION:
            modern = value in _MODERN
        elif key == FORWARDED_FOR:
            forwarded += (bytes(value),)
    return session, modern, forwarded


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


async def _answer_refusal(
    send: Send, refusal: Refusal, body: bytes | None, extra: list[tuple[bytes, bytes]]
) -> None:
    """``429`` + ``Retry-After``, a JSON-RPC error naming the limit."""
    seconds = refusal.retry_seconds
    payload = jsonrpc_error(
        ErrorCode.SERVER_ERROR,
        refusal.message,
        data={"limit": refusal.limit, "retryAfter": seconds},
        request_id=_request_id(body),
    )
    headers = [(b"retry-after", str(seconds).encode()), *extra]
    await send_whole(send, 429, payload, headers=headers)
