"""Helpers of the router's fault tests: a fleet of the fault app, its effects, raw rounds."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from fleetkit.clients.wire import MODERN, MODERN_META, accept, initialize_body, response_body
from mcpfleet.contract import ROUTER_ERROR_HEADER

JSON_HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
HANDSHAKE = "2025-11-25"


class Effects:
    """The fault app's effects file (``<order> <event> pid=<pid> at=<time>`` per line)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def lines(self) -> list[tuple[str, str, int]]:
        return [(order, event, pid) for order, event, pid, _ in self.timed()]

    def timed(self) -> list[tuple[str, str, int, float]]:
        """Every line: order, event, pid, and when (``time.time()``) it was recorded."""
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text().splitlines():
            order, event, pid, at = line.split()
            out.append((order, event, int(pid.removeprefix("pid=")), float(at[3:])))
        return out

    def when(self, order: str, event: str) -> float | None:
        return next((at for o, e, _, at in self.timed() if (o, e) == (order, event)), None)

    def count(self, event: str) -> Counter[str]:
        return Counter(order for order, ev, _ in self.lines() if ev == event)

    def pids(self, event: str) -> dict[str, int]:
        """The pid that recorded ``event`` for each order (the last one)."""
        return {order: pid for order, ev, pid in self.lines() if ev == event}


@dataclass
class Reply:
    """What a client got: a status and body, or the transport error instead."""

    status: int | None
    body: dict[str, Any]
    router_error: bool
    error: str = ""

    @property
    def completed(self) -> bool:
        """A replica's complete answer (the tool finished)."""
        return self.status == 200 and "result" in self.body


def _reply(resp: httpx.Response) -> Reply:
    return Reply(
        resp.status_code, response_body(resp), resp.headers.get(ROUTER_ERROR_HEADER) == "1"
    )


def post(http: httpx.Client, url: str, body: dict[str, Any], headers: dict[str, str]) -> Reply:
    try:
        return _reply(http.post(url, content=json.dumps(body), headers=headers))
    except httpx.HTTPError as exc:
        return Reply(None, {}, False, type(exc).__name__)


def modern_body(
    tool: str, arguments: dict[str, Any], state: str | None = None, ok: bool | None = None
) -> dict[str, Any]:
    params: dict[str, Any] = {"name": tool, "arguments": arguments, "_meta": MODERN_META}
    if state is not None:
        params["requestState"] = state
        params["inputResponses"] = {"ok": accept(ok)}
    return {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}


def modern_headers(tool: str) -> dict[str, str]:
    return {
        **JSON_HEADERS,
        "mcp-protocol-version": MODERN,
        "mcp-method": "tools/call",
        "mcp-name": tool,
    }


def once_state(http: httpx.Client, url: str, order: str, seconds: float) -> str:
    """The asking round of a ``slow_charge`` flow: the sealed state of its final round."""
    args = {"order": order, "seconds": seconds}
    first = post(http, url, modern_body("slow_charge", args), modern_headers("slow_charge"))
    assert first.completed, first
    return str(first.body["result"]["requestState"])


def open_session(http: httpx.Client, url: str, name: str) -> tuple[str, str]:
    """A handshake-era session: its id and the replica that owns it."""
    init = http.post(url, content=initialize_body(name), headers=JSON_HEADERS)
    assert init.status_code == 200, init.text
    session = init.headers["mcp-session-id"]
    http.post(
        url,
        content=json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        headers=session_headers(session),
    )
    return session, init.headers["x-mcpfleet-replica"]


def session_headers(session: str) -> dict[str, str]:
    return {**JSON_HEADERS, "mcp-session-id": session, "mcp-protocol-version": HANDSHAKE}


def session_call(tool: str, arguments: dict[str, Any], id_: int = 2) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": id_,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments},
    }
