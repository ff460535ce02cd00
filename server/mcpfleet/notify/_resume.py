"""Priming events by the version a session was opened with, not by each request's header.

With an event store, mcp's streamable-HTTP transport opens each SSE stream of
a 2025-11-25 session with a priming event (an id, empty data, the ``retry``
field) and lets a tool end its stream early (``ctx.close_sse_stream()``,
SEP-1699): the client resumes with ``Last-Event-ID``. It decides by the
``MCP-Protocol-Version`` header of each request (older clients cannot parse
an event with empty data). A client that opened its session at 2025-11-25
can; when a later request names an older version in its header (the
conformance suite's SSE-polling scenario does), the SDK sends no priming
event and the stream cannot be resumed.

:class:`SessionPrimedTransport` decides by the later of the two: the request's
header and the version the session's ``initialize`` asked for (the transport's
first SSE stream is that of the ``initialize``: a session exists only after
it). A client that opened an older session is never primed; one that opened
a 2025-11-25 session always is. :func:`prime_by_session` makes every new
session of an app's transport one of these.
"""

from __future__ import annotations

import logging
from typing import Any

from mcp.server.streamable_http import StreamableHTTPServerTransport, StreamId
from mcp.shared.message import SessionMessage
from mcp_types import JSONRPCRequest
from starlette.requests import Request

log = logging.getLogger("mcpfleet.notify")


class SessionPrimedTransport(StreamableHTTPServerTransport):
    """mcp's transport, priming by the later of the request's and the session's version."""

    #: The version the session's ``initialize`` asked for (set on its first SSE stream).
    opened_with: str | None = None

    def _session_version(self, protocol_version: str) -> str:
        if self.opened_with is None:
            self.opened_with = protocol_version
        return max(protocol_version, self.opened_with)

    async def _mint_priming_event(self, stream_id: StreamId, protocol_version: str) -> Any:
        return await super()._mint_priming_event(stream_id, self._session_version(protocol_version))

    def _create_session_message(
        self,
        message: JSONRPCRequest,
        request: Request,
        request_id: Any,
        protocol_version: str,
    ) -> SessionMessage:
        return super()._create_session_message(
            message, request, request_id, self._session_version(protocol_version)
        )


def _session_manager(http_app: Any) -> Any:
    """The streamable-HTTP session manager of a FastMCP ``http_app`` (after its startup)."""
    for route in getattr(http_app, "routes", ()):
        found = getattr(route, "endpoint", None)
        for _ in range(4):  # the endpoint, under the auth's wrappers
            if found is None:
                break
            manager = getattr(found, "session_manager", None)
            if manager is not None:
                return manager
            found = getattr(found, "app", None)
    return None


def prime_by_session(http_app: Any) -> bool:
    """Make each new session of ``http_app``'s transport a :class:`SessionPrimedTransport`.

    Called once the app's lifespan started (its session manager exists).
    False, logged, when the manager is not where FastMCP 4.2 keeps it: priming
    then follows each request's header, as mcp's does.
    """
    manager = _session_manager(http_app)
    admit = getattr(manager, "_admit_session", None)
    if admit is None:
        log.warning("sse: no session manager found; priming follows each request's header")
        return False

    def admit_primed(requestor: Any) -> Any:
        transport = admit(requestor)
        if type(transport) is StreamableHTTPServerTransport:
            transport.__class__ = SessionPrimedTransport
        return transport

    manager._admit_session = admit_primed
    return True
