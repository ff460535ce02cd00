"""The replica's span of each request: the caller's trace continued around the app.

FastMCP opens its own spans when an OpenTelemetry SDK is configured, but it
reads a parent only from a request's ``_meta``, never from the HTTP
``traceparent`` header the router forwards. :class:`TracedRequests`, an ASGI
layer in front of the app (installed only when :mod:`mcpfleet.tracing` is
on: no layer, no cost, when off), opens the replica's SERVER span under the
incoming context and makes it current, so FastMCP's spans, the rounds
middleware's attributes and the once-ledger's spans join the caller's trace.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from mcpfleet import tracing
from mcpfleet.contract import MCP_PATH
from mcpfleet.limits import principal_digest

_ROUTES = frozenset({MCP_PATH})


class TracedRequests:
    """Each HTTP request of ``app`` in a SERVER span continuing its ``traceparent``.

    ``replica``: the replica's name (``mcpfleet.replica``); ``era`` is
    told by the rounds middleware once the request is a round.
    """

    def __init__(self, app: ASGIApp, replica: str) -> None:
        self.app = app
        self.replica = replica

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = tracing.http_route(scope["path"], _ROUTES)
        with tracing.server_span(scope, route, **{"mcpfleet.replica": self.replica}) as span:
            recording, status = tracing.status_recorder(send)
            try:
                await self.app(scope, receive, recording)
            finally:
                tracing.end_http(span, status[0] if status else None)


#: The span attribute of each request-state event the codec reports (by kid).
_CODEC_ATTRIBUTES = {
    "seal": "mcpfleet.requeststate.seal_kid",
    "unseal": "mcpfleet.requeststate.unseal_kid",
}


def traced_codec_events(observe: Callable[[str, str], None]) -> Callable[[str, str], None]:
    """The codec's observer ``observe`` that also notes, on the current span, the kid of
    the key that sealed or opened the round's request state (never the token); ``observe``
    itself when tracing is off (the codec's path pays nothing)."""
    if not tracing.ON:
        return observe

    def observed(event: str, value: str) -> None:
        observe(event, value)
        attribute = _CODEC_ATTRIBUTES.get(event)
        if attribute is not None:
            tracing.note(attribute, value)

    return observed


def request_principal() -> str | None:
    """The digest of the principal the running request was authenticated as (the one
    the limits count it under: :func:`mcpfleet.limits.principal_digest`), or None
    without auth. Read as FastMCP reads the token it names in ``enduser.id``."""
    from fastmcp.server.dependencies import get_access_token

    token = get_access_token()
    if token is None:
        return None
    return principal_digest({"user": _Authenticated(token)})


class _Authenticated:
    """What an ASGI scope's ``user`` holds once the app's auth verified a token."""

    __slots__ = ("access_token",)

    def __init__(self, access_token: object) -> None:
        self.access_token = access_token
