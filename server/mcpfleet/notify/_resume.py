"""Resumed SSE streams that lose nothing, primed by the version a session was opened with.

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

It also closes a window of mcp's resume (a GET with ``Last-Event-ID``), which
reads the store, then registers the stream for live events: an event stored
in between went neither into the replay nor onto the resumed stream (the
SDK's comment calls the window known), and was lost to that client. Here the
stream is registered for live events first, the store is read again from the
last replayed event (what was stored in between), and a live event already
sent by the replay is skipped by its id (Redis entry ids grow): every event
once, in order of storage. And the session's GET stream is primed too (mcp
primes each POST's stream only): a GET stream cut before its first event
resumes from its priming event, rather than being opened afresh without what
was sent in between.
"""

from __future__ import annotations

import importlib.metadata
import logging
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectSendStream
from mcp.server.streamable_http import (
    CONTENT_TYPE_SSE,
    GET_STREAM_KEY,
    LAST_EVENT_ID_HEADER,
    MCP_SESSION_ID_HEADER,
    REQUEST_STREAM_BUFFER_SIZE,
    EventMessage,
    EventStore,
    SSEEvent,
    StreamableHTTPServerTransport,
    StreamId,
    check_accept_headers,
)
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp.shared.message import SessionMessage
from mcp_types import DEFAULT_NEGOTIATED_VERSION, JSONRPCRequest
from sse_starlette import EventSourceResponse
from starlette.requests import Request
from starlette.types import Send

from mcpfleet.notify._eventstore import parse_event_id

log = logging.getLogger("mcpfleet.notify")


#: ``mcp`` ``major.minor`` versions whose transport internals (every method replaced
#: below, and the session manager's ``_admit_session``) :func:`prime_by_session` was
#: tested on; on any other, mcp's own transport serves (no replacement).
TESTED_MCP = ("2.3",)

#: The first version whose clients parse a priming event (mcp's rule).
PRIMED_FROM = "2025-11-25"


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

    async def _handle_get_request(self, request: Request, send: Send) -> None:
        """The session's GET stream, primed: served as a resume from a priming event
        stored now. Anything mcp answers otherwise (a resume, a refusal) is mcp's.
        Without a store a ``Last-Event-ID`` is ignored (SSE lets a server do so): the
        stream is opened afresh, where mcp would answer nothing and the server 500."""
        store = self._event_store
        if store is None and request.headers.get(LAST_EVENT_ID_HEADER):
            return await super()._handle_get_request(_without_last_event_id(request), send)
        if (
            store is None
            or request.headers.get(LAST_EVENT_ID_HEADER)
            or GET_STREAM_KEY in self._request_streams
            or not check_accept_headers(request)[1]
        ):
            return await super()._handle_get_request(request, send)
        version = request.headers.get(MCP_PROTOCOL_VERSION_HEADER, DEFAULT_NEGOTIATED_VERSION)
        if self._session_version(version) < PRIMED_FROM:
            return await super()._handle_get_request(request, send)
        if not await self._validate_request_headers(request, send):
            return None
        primed = await store.store_event(GET_STREAM_KEY, None)
        if not primed:  # not stored (Redis away): mcp's unprimed stream
            return await super()._handle_get_request(request, send)
        await self._replay_events(primed, request, send)
        return None

    async def _replay_events(self, last_event_id: str, request: Request, send: Send) -> None:
        """A GET with ``Last-Event-ID``: what came after it, then the stream live."""
        store = self._event_store
        if store is None:
            return
        headers = {
            "Cache-Control": "no-cache, no-transform",
            "Connection": "keep-alive",
            "Content-Type": CONTENT_TYPE_SSE,
        }
        if self.mcp_session_id:
            headers[MCP_SESSION_ID_HEADER] = self.mcp_session_id
        version = request.headers.get(MCP_PROTOCOL_VERSION_HEADER, DEFAULT_NEGOTIATED_VERSION)
        writer, reader = anyio.create_memory_object_stream[SSEEvent](0)

        async def sender() -> None:
            try:
                async with writer:
                    await self._resume(store, last_event_id, version, writer)
            except anyio.ClosedResourceError:
                log.debug("sse: a resumed stream was closed")
            except Exception:  # the response's boundary, as mcp's own replay
                log.exception("sse: resuming a stream failed")

        response = EventSourceResponse(content=reader, data_sender_callable=sender, headers=headers)
        try:
            await response(request.scope, request.receive, send)
        finally:
            await writer.aclose()
            await reader.aclose()

    async def _resume(
        self,
        store: EventStore,
        last_event_id: str,
        version: str,
        writer: MemoryObjectSendStream[SSEEvent],
    ) -> None:
        replayed: list[EventMessage] = []

        async def keep(event: EventMessage) -> None:
            replayed.append(event)

        stream_id = await store.replay_events_after(last_event_id, keep)
        if not stream_id or stream_id in self._request_streams:
            # Unknown, or the stream is still being written elsewhere: the replay only.
            for event in replayed:
                await writer.send(self._create_event_data(event))
            return
        # Live events queue from now on; what was stored meanwhile is read again.
        self._sse_stream_writers[stream_id] = writer
        self._request_streams[stream_id] = anyio.create_memory_object_stream[EventMessage](
            REQUEST_STREAM_BUFFER_SIZE
        )
        try:
            after = replayed[-1].event_id if replayed else None
            await store.replay_events_after(after or last_event_id, keep)
            sent = last_event_id
            for event in replayed:
                await writer.send(self._create_event_data(event))
                sent = event.event_id or sent
            priming = await self._mint_priming_event(stream_id, version)
            if priming is not None:
                await writer.send(priming)
            async with self._request_streams[stream_id][1] as live:
                async for event in live:
                    if not _sent_already(event.event_id, sent):
                        await writer.send(self._create_event_data(event))
        finally:
            self._sse_stream_writers.pop(stream_id, None)
            await self._clean_up_memory_streams(stream_id)


def _sent_already(event_id: str | None, sent: str) -> bool:
    """Whether the live event ``event_id`` is at or before ``sent``, the last replayed (pure)."""
    this, last = parse_event_id(event_id or ""), parse_event_id(sent)
    if this is None or last is None or this[0] != last[0]:
        return False

    def order(entry: str) -> tuple[int, int]:
        ms, seq = entry.split("-")
        return int(ms), int(seq)

    return order(this[1]) <= order(last[1])


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


def _without_last_event_id(request: Request) -> Request:
    header = LAST_EVENT_ID_HEADER.encode()
    headers = [(k, v) for k, v in request.scope["headers"] if k.lower() != header]
    return Request({**request.scope, "headers": headers}, request.receive)


def prime_by_session(http_app: Any) -> bool:
    """Make each new session of ``http_app``'s transport a :class:`SessionPrimedTransport`.

    Called once the app's lifespan started (its session manager exists).
    False, logged, on an ``mcp`` not in :data:`TESTED_MCP` or when the manager is
    not where FastMCP 4.2 keeps it: mcp's own transport serves (priming by each
    request's header, and its resume with the window this module closes).
    """
    version = importlib.metadata.version("mcp")
    if ".".join(version.split(".")[:2]) not in TESTED_MCP:
        log.warning("sse: mcp %s is not a version mcpfleet's resume is tested on", version)
        return False
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
