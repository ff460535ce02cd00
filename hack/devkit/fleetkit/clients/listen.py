"""``subscriptions/listen`` on the 2026-07-28 wire, read frame by frame, for the
notification scenarios: each frame with the time it arrived, SSE comments too."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from fleetkit.clients.wire import MODERN, MODERN_META

SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"


@dataclass
class Frame:
    """One SSE event of a listen stream (``message`` None for a comment)."""

    at: float
    message: dict[str, Any] | None
    comment: str = ""

    @property
    def method(self) -> str | None:
        return None if self.message is None else self.message.get("method")


@dataclass
class Listener:
    """One open listen stream: its frames as they arrive, and whether it ended."""

    request_id: int
    replica: str | None = None
    status: int = 0
    frames: asyncio.Queue[Frame] = field(default_factory=asyncio.Queue)
    seen: list[Frame] = field(default_factory=list)
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    async def next(self, timeout: float) -> Frame:
        """The next frame within ``timeout`` seconds (TimeoutError otherwise)."""
        async with asyncio.timeout(timeout):
            frame = await self.frames.get()
        self.seen.append(frame)
        return frame

    async def next_event(self, timeout: float) -> Frame:
        """The next frame that is a message (comments skipped), within ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            frame = await self.next(max(0.0, deadline - time.monotonic()))
            if frame.message is not None:
                return frame

    def pending_events(self) -> list[Frame]:
        """The message frames already arrived and not read, read now."""
        out = []
        while not self.frames.empty():
            frame = self.frames.get_nowait()
            self.seen.append(frame)
            if frame.message is not None:
                out.append(frame)
        return out


def listen_body(
    request_id: int, meta: dict[str, Any] | None = None, **notifications: Any
) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "subscriptions/listen",
        "params": {"notifications": notifications, "_meta": meta or MODERN_META},
    }


HEADERS = {
    "content-type": "application/json",
    "accept": "application/json, text/event-stream",
    "mcp-protocol-version": MODERN,
    "mcp-method": "subscriptions/listen",
}


async def _read(resp: httpx.Response, listener: Listener) -> None:
    data: list[str] = []
    async for line in resp.aiter_lines():
        if line.startswith(":"):
            listener.frames.put_nowait(Frame(time.monotonic(), None, line))
        elif line.startswith("data:"):
            data.append(line[5:].strip())
        elif not line and data:
            listener.frames.put_nowait(Frame(time.monotonic(), json.loads("".join(data))))
            data = []


@contextlib.asynccontextmanager
async def listening(
    http: httpx.AsyncClient,
    url: str,
    request_id: int,
    *,
    token: str | None = None,
    meta: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
    **notifications: Any,
) -> AsyncIterator[Listener]:
    """Open a listen stream at ``url`` (as the bearer of ``token``, with ``meta`` as the
    request's ``_meta``); it is read in the background until the block ends."""
    listener = Listener(request_id)
    body = json.dumps(listen_body(request_id, meta, **notifications))
    headers = {**HEADERS, **(headers or {})}
    if token:
        headers["authorization"] = f"Bearer {token}"
    ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def run() -> None:
        try:
            async with http.stream("POST", url, content=body, headers=headers) as resp:
                listener.status = resp.status_code
                listener.replica = resp.headers.get("x-mcpfleet-replica")
                ready.set_result(None)
                await _read(resp, listener)
        except (httpx.HTTPError, asyncio.CancelledError):
            pass
        finally:
            if not ready.done():
                ready.set_result(None)
            listener.ended.set()

    reader = asyncio.create_task(run())
    try:
        async with asyncio.timeout(10):
            await ready
        yield listener
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
