"""Raw HTTP exchanges with a fleet, for what a well-behaved client never sends.

The FastMCP client hides ``request_state``; tests that replay, tamper with or
cross-audience a token speak the 2026-07-28 wire directly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx

MODERN = "2026-07-28"
MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}},
    "io.modelcontextprotocol/clientInfo": {"name": "mcpfleet-tests", "version": "1"},
}


@dataclass
class Answer:
    status: int
    body: dict[str, Any]
    replica: str | None

    @property
    def result(self) -> dict[str, Any]:
        return dict(self.body.get("result") or {})

    @property
    def error(self) -> dict[str, Any] | None:
        err = self.body.get("error")
        return dict(err) if err else None


def modern_call(
    url: str,
    tool: str,
    arguments: dict[str, Any],
    *,
    request_state: str | None = None,
    input_responses: dict[str, Any] | None = None,
    client: httpx.Client | None = None,
    headers: dict[str, str] | None = None,
) -> Answer:
    params: dict[str, Any] = {"name": tool, "arguments": arguments, "_meta": MODERN_META}
    if request_state is not None:
        params["requestState"] = request_state
    if input_responses is not None:
        params["inputResponses"] = input_responses
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
    headers = {
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": MODERN,
        "mcp-method": "tools/call",
        "mcp-name": tool,
        **(headers or {}),
    }
    own = client is None
    http = client or httpx.Client(timeout=10)
    try:
        resp = http.post(url, content=json.dumps(body), headers=headers)
    finally:
        if own:
            http.close()
    return Answer(resp.status_code, response_body(resp), resp.headers.get("x-mcpfleet-replica"))


def response_body(resp: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC message of an answer, in either response mode (the last SSE
    ``data:`` line of a stream); a body that is not JSON as ``{"text": ...}``."""
    text = resp.text
    if resp.headers.get("content-type", "").startswith("text/event-stream"):
        data = [ln[5:].strip() for ln in text.splitlines() if ln.startswith("data:")]
        text = data[-1] if data else "{}"
    try:
        body: dict[str, Any] = json.loads(text or "{}")
    except ValueError:
        body = {"text": text}
    return body


def initialize_body(client_name: str) -> str:
    """A handshake-era ``initialize`` request, as a JSON body."""
    return json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": client_name, "version": "1"},
            },
        }
    )


def accept(value: Any) -> dict[str, Any]:
    return {"action": "accept", "content": {"value": value}}
