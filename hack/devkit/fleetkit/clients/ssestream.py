"""A handshake session's GET stream read event by event: ids, ``retry``, priming events.

For the resumable-stream scenarios: each SSE event with its id, its data and
its ``retry`` field as the client saw them, and the last id seen, which is
what a client sends as ``Last-Event-ID`` when it opens the stream again.
Leaving :func:`get_stream`'s block drops the connection (a cut stream).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from fleetkit.clients.rawsession import HANDSHAKE, RawSession


@dataclass
class Event:
    """One SSE event (``message`` None for a priming event: an id, empty data)."""

    at: float
    id: str | None
    message: dict[str, Any] | None
    retry: int | None = None

    @property
    def method(self) -> str | None:
        return None if self.message is None else self.message.get("method")


@dataclass
class GetStream:
    """One open GET stream of a session: its events as they arrive."""

    status: int = 0
    replica: str | None = None
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    seen: list[Event] = field(default_factory=list)
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def last_id(self) -> str | None:
        """The id a client resumes from: the last non-empty one it was sent."""
        ids = [e.id for e in self.seen if e.id]
        return ids[-1] if ids else None

    async def next(self, timeout: float) -> Event:
        async with asyncio.timeout(timeout):
            event = await self.events.get()
        self.seen.append(event)
        return event

    async def next_message(self, timeout: float) -> Event:
        """The next event that carries a message (priming events skipped), within ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            event = await self.next(max(0.0, deadline - time.monotonic()))
            if event.message is not None:
                return event

    def pending_messages(self) -> list[Event]:
        """The events with a message already arrived and not read, read now."""
        out = []
        while not self.events.empty():
            event = self.events.get_nowait()
            self.seen.append(event)
            if event.message is not None:
                out.append(event)
        return out


def parse_event(lines: list[str], at: float) -> Event | None:
    """One SSE event from its lines (None for comments only)."""
    event_id: str | None = None
    data: list[str] = []
    retry: int | None = None
    for line in lines:
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "id":
            event_id = value
        elif name == "data":
            data.append(value)
        elif name == "retry":
            retry = int(value)
    if event_id is None and not data and retry is None:
        return None
    body = "\n".join(data)
    return Event(at, event_id, json.loads(body) if body.strip() else None, retry)


async def _read(resp: httpx.Response, stream: GetStream) -> None:
    lines: list[str] = []
    async for line in resp.aiter_lines():
        if line:
            lines.append(line)
            continue
        event = parse_event(lines, time.monotonic())
        lines = []
        if event is not None:
            stream.events.put_nowait(event)


@contextlib.asynccontextmanager
async def get_stream(
    http: httpx.AsyncClient, session: RawSession, last_event_id: str | None = None
) -> AsyncIterator[GetStream]:
    """Open ``session``'s GET stream (resuming after ``last_event_id`` if given); it is
    read in the background until the block ends, which drops the connection."""
    stream = GetStream()
    headers = {
        "accept": "text/event-stream",
        "mcp-session-id": session.session,
        "mcp-protocol-version": HANDSHAKE,
        **session.headers,
    }
    if last_event_id is not None:
        headers["last-event-id"] = last_event_id
    ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def run() -> None:
        try:
            async with http.stream("GET", session.url, headers=headers) as resp:
                stream.status = resp.status_code
                stream.replica = resp.headers.get("x-mcpfleet-replica")
                ready.set_result(None)
                await _read(resp, stream)
        except (httpx.HTTPError, asyncio.CancelledError):
            pass
        finally:
            if not ready.done():
                ready.set_result(None)
            stream.ended.set()

    reader = asyncio.create_task(run())
    try:
        async with asyncio.timeout(10):
            await ready
        yield stream
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
