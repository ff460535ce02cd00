"""The fleet's events on handshake-era sessions, and ``resources/subscribe``.

A handshake-era session (2025-11-25 and before) hears server events on its
GET stream: the session's own SSE stream for what no request asked for.
FastMCP sends a list change there only when the session's own request made
it, on its own replica, and serves no ``resources/subscribe`` at all (the
client is told ``-32601``). :func:`install_sessions` adds, for any FastMCP app:

* ``resources/subscribe`` and ``resources/unsubscribe`` handlers (mcp's
  low-level ``add_request_handler``, so ``initialize`` advertises
  ``resources.subscribe``): each session's URIs, bounded
  (:data:`MAX_SUBSCRIPTIONS`, :data:`mcpfleet.notify._bus.MAX_URI`);
* a listener on the fleet bus: every list change published on any replica
  goes to every handshake session of this replica, a ``resources/updated``
  only to the sessions subscribed to its URI, each on the session's
  standalone channel (its GET stream; stored in the event store first, so a
  cut GET stream resumes with it);
* a low-level middleware that notes each handshake session on its first
  request, and forgets it when the session closes (its ``Connection``'s exit
  stack).

Each session has its own queue and writer task: a session whose client reads
nothing cannot hold up another. A queue holds :data:`BUFFERED_EVENTS`; past it
the event is dropped for that session, counted ``slow``. Events are sent
through the ``Connection`` (mcp's standalone channel), never through a
request's ``ServerSession``: :class:`~mcpfleet.notify._listen.ChangesToBus`
publishes what a request's session sends, and what the bus delivers is never
published again.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import (
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated,
    ServerEvent,
    ToolsListChanged,
)
from mcp_types import (
    INVALID_PARAMS,
    EmptyResult,
    SubscribeRequestParams,
    UnsubscribeRequestParams,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from mcpfleet.notify._bus import MAX_URI, FleetBus, FleetEvent, kind_of, log
from mcpfleet.notify._taskstatus import TaskStatusChanged

#: Events one session may hold unsent; past it an event is dropped for it (``slow``).
BUFFERED_EVENTS: Final = 256
#: URIs one session may be subscribed to at once.
MAX_SUBSCRIPTIONS: Final = 1024
#: Seconds one event may take to reach a session's stream before it is dropped (``slow``).
SEND_WAIT: Final = 5.0

_OURS: Final = "_mcpfleet_sessions"


class SessionObserver(Protocol):
    """Who counts what reaches the sessions (the replica's metrics)."""

    def delivered(self, kind: str) -> None: ...

    def dropped(self, reason: str) -> None: ...


@dataclass
class _Session:
    """One handshake session of this replica: its URIs, its queue, its writer."""

    uris: set[str] = field(default_factory=set)
    queue: asyncio.Queue[ServerEvent | None] = field(
        default_factory=lambda: asyncio.Queue(BUFFERED_EVENTS)
    )
    writer: asyncio.Task[None] | None = None


def _connection_of(ctx: ServerRequestContext[Any, Any]) -> Any:
    """The request's ``Connection`` (mcp keeps it on the request's session, privately)."""
    return getattr(ctx.session, "_connection", None)


def _uri(params: SubscribeRequestParams | UnsubscribeRequestParams) -> str:
    uri = str(params.uri)
    if not uri or len(uri) > MAX_URI:
        raise MCPError(INVALID_PARAMS, f"a resource URI has 1 to {MAX_URI} characters")
    return uri


async def _send(connection: Any, event: ServerEvent) -> None:
    """Write ``event`` on the session's standalone channel (never raises for a closed one)."""
    if isinstance(event, ToolsListChanged):
        await connection.send_tool_list_changed()
    elif isinstance(event, PromptsListChanged):
        await connection.send_prompt_list_changed()
    elif isinstance(event, ResourcesListChanged):
        await connection.send_resource_list_changed()
    elif isinstance(event, ResourceUpdated):
        await connection.send_resource_updated(event.uri)


class HandshakeSessions:
    """This replica's handshake sessions and their subscriptions (module docstring)."""

    def __init__(self, observer: SessionObserver) -> None:
        self.observer = observer
        self._sessions: dict[Any, _Session] = {}
        setattr(self, _OURS, True)

    @property
    def open(self) -> int:
        return len(self._sessions)

    def subscribed(self, uri: str) -> int:
        """How many sessions here are subscribed to ``uri``."""
        return sum(1 for s in self._sessions.values() if uri in s.uris)

    # --- the middleware: sessions noted on their first request ----------------------------

    async def __call__(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            connection = _connection_of(ctx)
            if connection is not None and connection.has_standalone_channel:
                self._join(connection)
        return await call_next(ctx)

    def _join(self, connection: Any) -> _Session:
        session = self._sessions.get(connection)
        if session is None:
            session = self._sessions[connection] = _Session()
            session.writer = asyncio.create_task(
                self._write(connection, session), name="mcpfleet-session-events"
            )
            connection.exit_stack.callback(self._leave, connection)
        return session

    def _leave(self, connection: Any) -> None:
        session = self._sessions.pop(connection, None)
        if session is not None and session.writer is not None:
            session.writer.cancel()

    async def _write(self, connection: Any, session: _Session) -> None:
        while (event := await session.queue.get()) is not None:
            try:
                async with asyncio.timeout(SEND_WAIT):
                    await _send(connection, event)
            except TimeoutError:
                self.observer.dropped("slow")
                continue
            except Exception:  # the transport's boundary: one event lost, the session kept
                log.exception("notify: an event did not reach a session")
                continue
            self.observer.delivered(kind_of(event))

    # --- resources/subscribe, resources/unsubscribe ---------------------------------------

    async def subscribe(
        self, ctx: ServerRequestContext[Any, Any], params: SubscribeRequestParams
    ) -> EmptyResult:
        uri = _uri(params)
        connection = _connection_of(ctx)
        if connection is None or not connection.has_standalone_channel:
            raise MCPError(INVALID_PARAMS, "resources/subscribe needs a session")
        session = self._join(connection)
        if uri not in session.uris and len(session.uris) >= MAX_SUBSCRIPTIONS:
            raise MCPError(
                INVALID_PARAMS, f"a session may be subscribed to {MAX_SUBSCRIPTIONS} URIs at most"
            )
        session.uris.add(uri)
        return EmptyResult()

    async def unsubscribe(
        self, ctx: ServerRequestContext[Any, Any], params: UnsubscribeRequestParams
    ) -> EmptyResult:
        uri = _uri(params)
        session = self._sessions.get(_connection_of(ctx))
        if session is not None:
            session.uris.discard(uri)
        return EmptyResult()

    # --- the bus listener -----------------------------------------------------------------

    def deliver(self, event: FleetEvent) -> None:
        """Queue ``event`` for every session here that hears it (synchronous: the bus's).
        A task's status is for modern listen streams only: handshake sessions never
        hear it."""
        if isinstance(event, TaskStatusChanged):
            return
        uri = event.uri if isinstance(event, ResourceUpdated) else None
        for session in list(self._sessions.values()):
            if uri is not None and uri not in session.uris:
                continue
            try:
                session.queue.put_nowait(event)
            except asyncio.QueueFull:
                self.observer.dropped("slow")

    def close(self) -> None:
        """Stop every writer (the replica's shutdown); sessions end on their own."""
        for connection in list(self._sessions):
            self._leave(connection)


def install_sessions(app: Any, bus: FleetBus, observer: SessionObserver) -> HandshakeSessions:
    """Serve ``resources/subscribe`` and the fleet's events to the handshake sessions of
    the FastMCP ``app``. Installed again, it replaces its handlers and middleware."""
    lowlevel = app._mcp_server
    sessions = HandshakeSessions(observer)
    lowlevel.add_request_handler("resources/subscribe", SubscribeRequestParams, sessions.subscribe)
    lowlevel.add_request_handler(
        "resources/unsubscribe", UnsubscribeRequestParams, sessions.unsubscribe
    )
    lowlevel.middleware[:] = [mw for mw in lowlevel.middleware if not getattr(mw, _OURS, False)]
    lowlevel.middleware.append(sessions)
    bus.subscribe(sessions.deliver)
    return sessions
