"""A handshake-era client that never re-initializes: it keeps its ``Mcp-Session-Id``
whatever happens, as many hosted MCP clients do, and reports a 404 as it comes.

Raw HTTP (httpx), so a test sees exactly what such a client sees: the status
of each request on its session, and the session id the answers carry. Used by
the session re-homing scenarios (docs/rehome.md) in the fleet and e2e tiers.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
from prometheus_client.parser import text_string_to_metric_families

HANDSHAKE = "2025-11-25"
_ACCEPT = "application/json, text/event-stream"
_T = TypeVar("_T")


def _message(resp: httpx.Response) -> dict[str, Any]:
    text = resp.text
    if resp.headers.get("content-type", "").startswith("text/event-stream"):
        data = [ln[5:].strip() for ln in text.splitlines() if ln.startswith("data:")]
        text = data[-1] if data else "{}"
    try:
        doc = json.loads(text or "{}")
    except ValueError:
        return {"text": text}
    return doc if isinstance(doc, dict) else {"batch": doc}


@dataclass
class RawSession:
    """One session of a client that never re-initializes."""

    url: str
    http: httpx.AsyncClient
    #: Extra headers of every request (a bearer token).
    headers: dict[str, str] = field(default_factory=dict)
    session: str = ""
    #: The replica that answered the ``initialize``.
    replica: str = ""
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def _headers(self, with_session: bool = True) -> dict[str, str]:
        out = {"content-type": "application/json", "accept": _ACCEPT, **self.headers}
        if with_session:
            out["mcp-session-id"] = self.session
            out["mcp-protocol-version"] = HANDSHAKE
        return out

    async def open(self, name: str = "rehome-client") -> None:
        """``initialize`` (with the elicitation capability), then ``notifications/initialized``."""
        body = {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": HANDSHAKE,
                "capabilities": {"elicitation": {"form": {}}},
                "clientInfo": {"name": name, "version": "1"},
            },
        }
        resp = await self.http.post(
            self.url, content=json.dumps(body), headers=self._headers(False)
        )
        resp.raise_for_status()
        self.session = resp.headers["mcp-session-id"]
        self.replica = resp.headers.get("x-mcpfleet-replica", "")
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        ack = await self.http.post(self.url, content=json.dumps(note), headers=self._headers())
        ack.raise_for_status()

    async def request(self, method: str, params: dict[str, Any] | None = None) -> httpx.Response:
        """One request on the session, as it is; its answer read whole."""
        body: dict[str, Any] = {"jsonrpc": "2.0", "id": next(self._ids), "method": method}
        if params is not None:
            body["params"] = params
        return await self.http.post(self.url, content=json.dumps(body), headers=self._headers())

    async def ping(self) -> httpx.Response:
        return await self.request("ping")

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        resp = await self.request("tools/call", {"name": name, "arguments": arguments})
        resp.raise_for_status()
        return _message(resp)

    async def start_elicitation(self, tool: str, arguments: dict[str, Any]) -> PendingCall:
        """Call ``tool`` and read its stream until the server's ``elicitation/create``
        arrives; the stream stays open and keeps being read (a client that stopped
        reading would close it, which cancels the call), the tool waiting for its
        answer. Close it with :meth:`PendingCall.aclose`."""
        body = {
            "jsonrpc": "2.0",
            "id": next(self._ids),
            "method": "tools/call",
            "params": {"name": tool, "arguments": arguments},
        }
        req = self.http.build_request(
            "POST", self.url, content=json.dumps(body), headers=self._headers()
        )
        resp = await self.http.send(req, stream=True)
        asked: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        received: list[dict[str, Any]] = []
        call = PendingCall(resp, asyncio.ensure_future(_read_call(resp, asked, received)), received)
        try:
            resp.raise_for_status()
            call.request_id = await asyncio.wait_for(asyncio.shield(asked), 30)
        except BaseException:
            await call.aclose()
            raise
        return call

    async def answer(self, request_id: Any, content: dict[str, Any]) -> httpx.Response:
        """The client's answer to an elicitation (a JSON-RPC response on the session)."""
        body = {
            "jsonrpc": "2.0",
            "id": request_id,
            "result": {"action": "accept", "content": content},
        }
        return await self.http.post(self.url, content=json.dumps(body), headers=self._headers())


@dataclass
class PendingCall:
    """A tool call whose elicitation is waiting for the client's answer."""

    response: httpx.Response
    #: Reads the call's stream to its end (or until closed).
    reader: asyncio.Future[None]
    #: Every JSON-RPC message the call's stream carried, in order.
    received: list[dict[str, Any]] = field(default_factory=list)
    #: The id of the server's ``elicitation/create``.
    request_id: Any = None

    def results(self) -> list[dict[str, Any]]:
        """The answers to the call itself (a JSON-RPC result or error) the stream carried."""
        return [m for m in self.received if "result" in m or "error" in m]

    async def finished(self, timeout: float) -> list[dict[str, Any]]:
        """:meth:`results` once the stream ended (within ``timeout`` seconds)."""
        await asyncio.wait_for(asyncio.shield(self.reader), timeout)
        return self.results()

    async def aclose(self) -> None:
        self.reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
            await self.reader
        await self.response.aclose()


async def _read_call(
    resp: httpx.Response, asked: asyncio.Future[Any], received: list[dict[str, Any]]
) -> None:
    """Read a call's SSE stream to its end into ``received``; ``asked`` gets the
    elicitation's id."""
    try:
        async for line in resp.aiter_lines():
            # A priming event (an id, empty data: a replica with an event store) says nothing.
            if not line.startswith("data:") or not line[5:].strip():
                continue
            msg = json.loads(line[5:])
            if isinstance(msg, dict):
                received.append(msg)
            if asked.done():
                continue
            if isinstance(msg, dict) and msg.get("method") == "elicitation/create":
                asked.set_result(msg["id"])
    except httpx.HTTPError:
        pass  # the stream broke (its replica went): what the test looks at next
    finally:
        if not asked.done():
            asked.set_exception(AssertionError("the call's stream ended without asking"))


async def bounded(
    items: Iterable[_T], work: Callable[[_T], Awaitable[Any]], concurrency: int = 20
) -> list[Any]:
    """``work`` over ``items``, at most ``concurrency`` at once; results in order."""
    gate = asyncio.Semaphore(concurrency)

    async def one(item: _T) -> Any:
        async with gate:
            return await work(item)

    return list(await asyncio.gather(*(one(i) for i in items)))


async def open_sessions(
    url: str, http: httpx.AsyncClient, count: int, headers: dict[str, str] | None = None
) -> list[RawSession]:
    sessions = [RawSession(url, http, dict(headers or {})) for _ in range(count)]
    await bounded(sessions, lambda s: s.open())
    return sessions


def metric_sum(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` in a Prometheus text exposition whose
    labels include ``labels``."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name != name:
                continue
            if all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total
