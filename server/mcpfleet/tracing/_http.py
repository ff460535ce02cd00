"""The SERVER span of one HTTP request (the router's, the replica's), named and
attributed per the stable HTTP semantic conventions, and its response's status.
Called only when the package's ``ON`` is set.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from mcpfleet.tracing._spans import extract, tracer


def http_route(path: str, routes: frozenset[str]) -> str | None:
    """The ``http.route`` of ``path``: itself when it is one of ``routes`` (the paths
    the component serves by name), else None (low cardinality: never a client's path)."""
    return path if path in routes else None


@contextlib.contextmanager
def server_span(
    scope: Mapping[str, Any], route: str | None, **attributes: str | int | bool
) -> Iterator[Any]:
    """The SERVER span of one HTTP request (``scope``: its ASGI scope), current in the
    block, continuing the W3C ``traceparent`` the request carries (or starting a
    trace). Named and attributed per the stable HTTP semantic conventions
    (``{method} {route}``, or ``{method}`` when the route is unknown); the block
    sets the response's status with :func:`end_http`. Only when :data:`ON`.
    """
    from opentelemetry.trace import SpanKind

    parent, state = None, None
    for name, value in scope["headers"]:
        if name == b"traceparent":
            parent = value.decode("latin-1")
        elif name == b"tracestate":
            state = value.decode("latin-1")
    method: str = scope["method"]
    attrs: dict[str, str | int | bool] = {
        "http.request.method": method,
        "url.path": scope["path"],
        "url.scheme": scope.get("scheme", "http"),
        "network.protocol.version": scope.get("http_version", "1.1"),
    }
    if route is not None:
        attrs["http.route"] = route
    client = scope.get("client")
    if client:
        attrs["client.address"] = client[0]
    attrs.update(attributes)
    with tracer().start_as_current_span(
        f"{method} {route}" if route else method,
        context=extract(parent, state),
        kind=SpanKind.SERVER,
        attributes=attrs,
        record_exception=True,
    ) as span:
        yield span


def end_http(span: Any, status: int | None, error: str | None = None) -> None:
    """Record the response's ``status`` on an HTTP server ``span`` (None: no response
    was sent), and ``error.type`` (the status, or ``error``) for a 5xx or no answer."""
    from opentelemetry.trace import StatusCode

    if status is not None:
        span.set_attribute("http.response.status_code", status)
    if status is None or status >= 500:
        span.set_attribute("error.type", error or (str(status) if status else "_OTHER"))
        span.set_status(StatusCode.ERROR)


def status_recorder(send: Any) -> tuple[Any, list[int]]:
    """``send`` that also keeps the response's status (in the list it returns with it)."""
    seen: list[int] = []

    async def recording(message: Any) -> None:
        if message["type"] == "http.response.start":
            seen.append(message["status"])
        await send(message)

    return recording, seen
