"""MCP tasks (SEP-2663) on the 2026-07-28 wire, for the tests of tasks across replicas.

A client that declares the tasks extension on each request (``_meta``'s
client capabilities), creates a task with ``tools/call`` and sends
``tasks/get|update|cancel`` with or without ``Mcp-Name``, to the router or
to one replica (the tests force a request onto a replica of their choosing).
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from fleetkit.clients.wire import MODERN, MODERN_META, Answer, response_body

TASKS = "io.modelcontextprotocol/tasks"
TASK_META = {
    **MODERN_META,
    "io.modelcontextprotocol/clientCapabilities": {
        "elicitation": {"form": {}},
        "extensions": {TASKS: {}},
    },
}
#: JSON-RPC codes the engine answers with.
NOT_FOUND = -32602
HEADER_MISMATCH = -32020
FINAL = frozenset({"completed", "failed", "cancelled"})


def rpc(
    http: httpx.Client,
    url: str,
    method: str,
    params: dict[str, Any],
    *,
    name: str | None = None,
    token: str | None = None,
) -> Answer:
    """One request; ``name`` goes in ``Mcp-Name`` when given."""
    headers = {
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": MODERN,
        "mcp-method": method,
    }
    if name is not None:
        headers["mcp-name"] = name
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": TASK_META}}
    resp = http.post(url, content=json.dumps(body), headers=headers)
    return Answer(resp.status_code, response_body(resp), resp.headers.get("x-mcpfleet-replica"))


def create(
    http: httpx.Client, url: str, tool: str, arguments: dict[str, Any], token: str | None = None
) -> Answer:
    """``tools/call`` of a task tool: a ``CreateTaskResult`` in ``result``."""
    params = {"name": tool, "arguments": arguments}
    return rpc(http, url, "tools/call", params, name=tool, token=token)


def task(
    http: httpx.Client,
    url: str,
    method: str,
    task_id: str,
    *,
    with_name: bool = True,
    token: str | None = None,
    **params: Any,
) -> Answer:
    """``tasks/get``, ``tasks/update`` or ``tasks/cancel`` of ``task_id``."""
    name = task_id if with_name else None
    return rpc(http, url, method, {"taskId": task_id, **params}, name=name, token=token)
