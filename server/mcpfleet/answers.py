"""How mcpfleet's own ASGI code answers a request itself: one whole body, one error shape.

The router, the replica's gate and its ``/metrics`` each answer some requests
without the app (a refusal, a health check, a scrape). They all do it through
:func:`send_whole`, and every JSON-RPC error they make is :func:`jsonrpc_error`,
so the bytes a client sees from any of them have one shape.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable
from http import HTTPStatus

from starlette.types import Send

__all__ = ["JSON", "ErrorCode", "jsonrpc_error", "raw_response", "send_whole"]

JSON = b"application/json"


class ErrorCode(enum.IntEnum):
    """The JSON-RPC error codes mcpfleet's own answers use (JSON-RPC 2.0, section 5.1)."""

    PARSE_ERROR = -32700  # the body is not JSON
    INVALID_REQUEST = -32600  # the HTTP request itself is refused (framing, size, path...)
    INTERNAL_ERROR = -32603  # a replica failed to answer
    SERVER_ERROR = -32000  # unavailable now: retry (with Retry-After)


def jsonrpc_error(
    code: int,
    message: str,
    *,
    data: dict[str, object] | None = None,
    request_id: str | int | None = None,
) -> bytes:
    """A JSON-RPC error response: with no request id unless the request's is known
    (an answer refusing a request the app never saw)."""
    error: dict[str, object] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "error": error}).encode()


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


def raw_response(
    status: int, body: bytes, headers: Iterable[tuple[bytes, bytes]] = (), *, close: bool = True
) -> bytes:
    """A whole HTTP/1.1 response as bytes, for an answer written straight to a socket
    (before or instead of ASGI: a framing error, headers too large, too many
    connections). JSON unless ``headers`` says otherwise; ``Connection: close``."""
    phrase = HTTPStatus(status).phrase.encode()
    head = [b"HTTP/1.1 %d %s" % (status, phrase)]
    extra = list(headers)
    if not any(k.lower() == b"content-type" for k, _ in extra):
        head.append(b"content-type: " + JSON)
    head += [k + b": " + v for k, v in extra]
    if close:
        head.append(b"connection: close")
    head.append(b"content-length: %d" % len(body))
    return b"\r\n".join(head) + b"\r\n\r\n" + body
