"""How mcpfleet's own ASGI code answers a request itself: one whole body, one error shape.

The router, the replica's gate and its ``/metrics`` each answer some requests
without the app (a refusal, a health check, a scrape). They all do it through
:func:`send_whole`, and every JSON-RPC error they make is :func:`jsonrpc_error`,
so the bytes a client sees from any of them have one shape.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from starlette.types import Send

__all__ = ["JSON", "jsonrpc_error", "send_whole"]

JSON = b"application/json"


def jsonrpc_error(code: int, message: str) -> bytes:
    """A JSON-RPC error response with no request id (it answers no request the app saw)."""
    return json.dumps(
        {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}}
    ).encode()


async def send_whole(
    send: Send,
    status: int,
    body: bytes,
    *,
    content_type: bytes = JSON,
    headers: Iterable[tuple[bytes, bytes]] = (),
) -> None:
    """Answer with ``body`` in one message, its length stated."""
    head = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": [*head, *headers]})
    await send({"type": "http.response.body", "body": body})
