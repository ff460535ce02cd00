"""A real MCP client for a fleet that records where each round lands, in either era.

:func:`connect` returns a FastMCP ``Client`` whose HTTP responses are recorded
with the replica that served them (the ``X-Mcpfleet-Replica`` header), and whose
elicitation handler answers like a decisive user. ``mcpfleet selftest`` (the
chart's ``helm test``) and ``mcpfleet demo`` use it, and so do the tests.
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx2
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport

from mcpfleet.contract import REPLICA_HEADER, SESSION_HEADER

Era = Literal["modern", "handshake"]


@dataclass
class Round:
    """One HTTP exchange of a client with the fleet."""

    method: str
    rpc: str
    status: int
    replica: str | None
    session: str | None = None
    at: float = 0.0


@dataclass
class Trace:
    rounds: list[Round] = field(default_factory=list)

    def calls(self, rpc: str = "tools/call") -> list[Round]:
        return [r for r in self.rounds if r.rpc == rpc]

    def replicas(self, rpc: str | None = None) -> set[str]:
        return {r.replica for r in self.rounds if r.replica and (rpc is None or r.rpc == rpc)}


def _rpc_method(request: httpx2.Request) -> str:
    try:
        body = json.loads(request.content or b"{}")
    except (ValueError, httpx2.RequestNotRead):
        return ""
    if isinstance(body, dict):
        return str(body.get("method") or ("response" if "result" in body else ""))
    return "batch"


Answerer = Callable[[str, dict[str, Any]], Any]


def default_answer(message: str, schema: dict[str, Any]) -> Any:
    """Answer an elicitation as a decisive user would: first choice, yes, a date, defaults."""
    props: dict[str, Any] = schema.get("properties", {})
    if set(props) == {"value"}:
        value = props["value"]
        kind = value.get("type")
        if kind == "boolean":
            return True
        if kind == "integer":
            return 45
        if kind == "array":
            items = value.get("items", {})
            options = items.get("enum") or [o["const"] for o in items.get("anyOf", [])]
            return options[:2]
        options = value.get("enum") or [o["const"] for o in value.get("oneOf", [])]
        if options:
            return options[0]
        return "2026-12-24"
    return {
        name: (p.get("default") if "default" in p else "Demo task") for name, p in props.items()
    }


def connect(
    url: str,
    era: Era,
    trace: Trace | None = None,
    answer: Answerer = default_answer,
    timeout: float = 30.0,
    request_hook: Callable[[httpx2.Request], Awaitable[None]] | None = None,
) -> Client[Any]:
    """A FastMCP client for ``url`` in ``era``, recording rounds into ``trace``.

    ``request_hook`` sees (and may rewrite) every outgoing HTTP request.
    """
    default_timeout = timeout
    trace = trace if trace is not None else Trace()

    async def on_response(response: httpx2.Response) -> None:
        trace.rounds.append(
            Round(
                method=response.request.method,
                rpc=_rpc_method(response.request),
                status=response.status_code,
                replica=response.headers.get(REPLICA_HEADER),
                session=response.request.headers.get(SESSION_HEADER)
                or response.headers.get(SESSION_HEADER),
                at=time.monotonic(),
            )
        )

    def factory(
        headers: dict[str, str] | None = None,
        timeout: httpx2.Timeout | None = None,
        auth: httpx2.Auth | None = None,
        **kwargs: Any,
    ) -> httpx2.AsyncClient:
        return httpx2.AsyncClient(
            headers=headers,
            auth=auth,
            timeout=timeout or httpx2.Timeout(default_timeout, read=300.0),
            event_hooks={
                "request": [request_hook] if request_hook is not None else [],
                "response": [on_response],
            },
            **kwargs,
        )

    async def handler(message: str, response_type: Any, params: Any, context: Any) -> Any:
        value = answer(message, params.requested_schema)
        if inspect.isawaitable(value):  # an answerer may take its time, like a person
            value = await value
        if response_type is None:
            return value
        props = params.requested_schema.get("properties", {})
        return response_type(value=value) if set(props) == {"value"} else response_type(**value)

    transport = StreamableHttpTransport(url, httpx_client_factory=factory)
    mode = "auto" if era == "modern" else "legacy"
    return Client(transport, mode=mode, elicitation_handler=handler, timeout=timeout)
