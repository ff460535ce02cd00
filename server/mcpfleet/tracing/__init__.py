"""Traces: OpenTelemetry, turned on by the standard ``OTEL_*`` environment, off at no cost.

A process (the router, a replica) calls :func:`configure` once at start. It
reads the environment (:func:`wanted`, pure) and, only when tracing is asked
for, imports the OpenTelemetry SDK and its OTLP/HTTP exporter (the
``mcpfleet[tracing]`` extra, which the image carries), sets the global tracer
provider and adds :class:`TraceIdFilter` to the root logger's handlers. Until
then, and for good when tracing is off, mcpfleet imports nothing of the SDK's
tracing nor the exporter (redis-py imports the SDK's metrics module when the
SDK is installed, for its own metrics, off unless an app starts them), and
every helper here is one test of the module's :data:`ON` flag: the request
paths test it themselves before doing any work for a span.

Tracing is on when, and only when:

* ``OTEL_SDK_DISABLED`` is not ``true``, and
* ``OTEL_TRACES_EXPORTER`` is ``otlp``, or it is unset and
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT`` is
  set, and
* the OTLP protocol (``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL``, else
  ``OTEL_EXPORTER_OTLP_PROTOCOL``) is unset or ``http/protobuf``: the only
  exporter shipped.

Everything else the SDK reads itself, the standard way: the endpoint, headers,
timeout and compression of the exporter, the sampler
(``OTEL_TRACES_SAMPLER``, ``OTEL_TRACES_SAMPLER_ARG``), the batch processor's
delays, the resource (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``).
mcpfleet only supplies defaults for ``service.name`` (``mcpfleet-router``,
``mcpfleet-replica``) and ``service.instance.id`` (the replica's name, the
router's host name) where the environment names none.

Every span leaves through one redaction, as it is exported
(:func:`redacting_exporter`): what guards a session or a task
(:data:`REDACTED_ATTRIBUTES`) always leaves as a digest, and the attributes
naming who made a request (:data:`IDENTITY_ATTRIBUTES`) too when
``MCPFLEET_TRACES_IDENTITY=digest`` (:data:`IDENTITY_ENV`).

The helpers work on the span current in the caller's context (OpenTelemetry's
context variable): the router's and the replica's request spans
(``router.proxy``, ``replica.tracing``) make theirs current, and code deeper
on the path adds to it (:func:`note`) or opens a child (:func:`child`).

The package, by job (each module imports only those before it, and none
imports the SDK but inside the function that needs it): ``_redact``, the
redaction every exported span leaves through; ``_setup``, what the
environment asks for and the SDK set up when it asks; ``_spans``, mcpfleet's
tracer, the W3C context read and a task leg's linked span; ``_http``, the
SERVER span of an HTTP request and its status; ``_logs``, the log lines' trace
ids. :data:`ON`, :func:`configure` that sets it and the helpers that test it
on every request (:func:`note`, :func:`event`, :func:`child`,
:func:`traceparent`, :func:`exemplar`) live here, in the module every reader
imports (``from mcpfleet import tracing``), so that ``tracing.ON`` is the one
flag they all read. Every name is imported from here.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any, Final

from mcpfleet.tracing._http import end_http, http_route, server_span, status_recorder
from mcpfleet.tracing._logs import TRACE_IDS, TraceIdFilter, WithTraceIds
from mcpfleet.tracing._redact import (
    IDENTITY_ATTRIBUTES,
    PRINCIPAL_ATTRIBUTE,
    REDACTED_ATTRIBUTES,
    Principal,
    principal_noter,
    redact_span,
    redacted,
    redacting_exporter,
)
from mcpfleet.tracing._setup import (
    DIGEST,
    IDENTITY_ENV,
    KEEP,
    PROTOCOL,
    identity_mode,
    install_sdk,
    wanted,
)
from mcpfleet.tracing._spans import (
    SCOPE,
    SEMCONV_SCHEMA,
    extract,
    linked_span,
    span_context,
    tracer,
)

# ON is not in the list: it is read as ``tracing.ON``, never imported by name (a
# copy made at import would not see configure set it).
__all__: Sequence[str] = (
    "DIGEST",
    "IDENTITY_ATTRIBUTES",
    "IDENTITY_ENV",
    "KEEP",
    "PRINCIPAL_ATTRIBUTE",
    "PROTOCOL",
    "REDACTED_ATTRIBUTES",
    "SCOPE",
    "SEMCONV_SCHEMA",
    "TRACE_IDS",
    "Principal",
    "TraceIdFilter",
    "WithTraceIds",
    "child",
    "configure",
    "end_http",
    "event",
    "exemplar",
    "extract",
    "http_route",
    "identity_mode",
    "linked_span",
    "note",
    "principal_noter",
    "redact_span",
    "redacted",
    "redacting_exporter",
    "server_span",
    "span_context",
    "status_recorder",
    "traceparent",
    "tracer",
    "wanted",
)

log = logging.getLogger("mcpfleet.tracing")

#: Whether this process traces: set once by :func:`configure`, read on every request.
ON = False


def configure(
    service: str,
    instance: str,
    environ: Mapping[str, str] | None = None,
    principal: Principal | None = None,
) -> bool:
    """Trace this process if the environment asks for it; True if it now traces.

    ``service`` and ``instance`` are the defaults of ``service.name`` and
    ``service.instance.id`` (the environment's win). ``principal`` names the
    principal of the request running now (the replica's: it knows the app's
    auth), for :data:`IDENTITY_ENV` ``digest``. Called again, it does nothing
    more (one tracer provider per process).
    """
    global ON
    if ON:
        return True
    environ = os.environ if environ is None else environ
    on, why = wanted(environ)
    if not on:
        log.debug("tracing off: %s", why)
        return False
    identity = identity_mode(environ)
    try:
        install_sdk(service, instance, identity, principal)
    except ImportError as exc:
        log.warning(
            "tracing asked for (%s) but the OpenTelemetry SDK is missing (%s): "
            "install mcpfleet[tracing]; tracing stays off",
            why,
            exc.name,
        )
        return False
    ON = True
    for handler in logging.getLogger().handlers:
        handler.addFilter(TRACE_IDS)
        handler.setFormatter(WithTraceIds(handler.formatter or logging.Formatter()))
    log.info(
        "tracing on: %s, service %s, instance %s, identities %s",
        why,
        service,
        instance,
        "as digests" if identity == DIGEST else "as set",
    )
    return True


def note(key: str, value: str | int | bool) -> None:
    """Set attribute ``key`` on the current span (nothing when tracing is off)."""
    if ON:
        from opentelemetry import trace

        trace.get_current_span().set_attribute(key, value)


def event(name: str, attributes: Mapping[str, str | int | bool]) -> None:
    """Add event ``name`` to the current span (nothing when tracing is off)."""
    if ON:
        from opentelemetry import trace

        trace.get_current_span().add_event(name, dict(attributes))


def traceparent() -> bytes:
    """The current span's W3C ``traceparent`` value, or b"" (off, or no valid span)."""
    if not ON:
        return b""
    from opentelemetry import trace

    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return b""
    return b"00-%032x-%016x-%02x" % (ctx.trace_id, ctx.span_id, ctx.trace_flags)


def exemplar() -> dict[str, str] | None:
    """The exemplar labels of an observation made now: the current span's ``trace_id``
    and ``span_id`` (hex) when it is sampled, else None (off, no span, not sampled:
    an exemplar pointing at a trace no backend has would be a dead link)."""
    if not ON:
        return None
    from opentelemetry import trace

    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid or not ctx.trace_flags.sampled:
        return None
    return {"trace_id": f"{ctx.trace_id:032x}", "span_id": f"{ctx.span_id:016x}"}


#: What :func:`child` gives when tracing is off: one object, reused (no generator per call).
_NO_SPAN: Final = contextlib.nullcontext()


def child(name: str, **attributes: str | int | bool) -> contextlib.AbstractContextManager[Any]:
    """A span ``name`` (kind INTERNAL) around a ``with`` block, a child of the current
    one; when tracing is off, a shared context manager that does nothing. An
    exception leaving the block marks the span failed."""
    if not ON:
        return _NO_SPAN
    cm: contextlib.AbstractContextManager[Any] = tracer().start_as_current_span(
        name, attributes=attributes
    )
    return cm
