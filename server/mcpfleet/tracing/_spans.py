"""mcpfleet's tracer and the spans it opens once tracing is on: a request's W3C
context read (:func:`extract`, :func:`span_context`) and a span linked to the
request a task's leg was created by (:func:`linked_span`). Each imports the
OpenTelemetry API only when called: the callers test the package's ``ON`` first.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Final

#: The instrumentation scope of every mcpfleet span.
SCOPE: Final = "mcpfleet"

#: The semantic conventions the spans follow (HTTP server spans: stable attributes).
SEMCONV_SCHEMA: Final = "https://opentelemetry.io/schemas/1.26.0"


_TRACER: Any = None


def tracer() -> Any:
    """mcpfleet's tracer (only once tracing is on: it imports the API's trace module),
    made once: the SDK makes a new tracer, and its scope, on each ``get_tracer``."""
    global _TRACER
    if _TRACER is None:
        from opentelemetry import trace

        _TRACER = trace.get_tracer(SCOPE, schema_url=SEMCONV_SCHEMA)
    return _TRACER


def extract(traceparent: str | None, tracestate: str | None = None) -> Any:
    """The OpenTelemetry context an incoming request's W3C headers carry (the
    current context when they carry none, or nothing valid)."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier = {}
    if traceparent:
        carrier["traceparent"] = traceparent
        if tracestate:
            carrier["tracestate"] = tracestate
    return TraceContextTextMapPropagator().extract(carrier)


def span_context(traceparent: str) -> Any:
    """The span context a W3C ``traceparent`` value names, or None if it names none."""
    from opentelemetry import trace

    ctx = trace.get_current_span(extract(traceparent)).get_span_context()
    return ctx if ctx.is_valid else None


@contextlib.contextmanager
def linked_span(name: str, links_to: str | None, **attributes: str | int | bool) -> Iterator[Any]:
    """A span ``name`` current in the block, with a link to the span the W3C
    ``traceparent`` value ``links_to`` names (no link when it names none): work done
    later, elsewhere, for a request that ended (a task's leg on a worker), as the
    OpenTelemetry messaging conventions model a message's processing. Under the
    current span (kind INTERNAL) when there is one (a queue's own span of the
    execution), else the root of a trace of its own (kind CONSUMER). Only when
    :data:`ON`; an exception leaving the block marks it failed."""
    from opentelemetry import trace
    from opentelemetry.trace import Link, SpanKind

    origin = span_context(links_to) if links_to else None
    links = [Link(origin)] if origin is not None else []
    under = trace.get_current_span().get_span_context().is_valid
    with tracer().start_as_current_span(
        name,
        kind=SpanKind.INTERNAL if under else SpanKind.CONSUMER,
        links=links,
        attributes=attributes,
    ) as span:
        yield span
