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
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final

log = logging.getLogger("mcpfleet.tracing")

#: Whether this process traces: set once by :func:`configure`, read on every request.
ON = False

#: The instrumentation scope of every mcpfleet span.
SCOPE: Final = "mcpfleet"

#: The semantic conventions the spans follow (HTTP server spans: stable attributes).
SEMCONV_SCHEMA: Final = "https://opentelemetry.io/schemas/1.26.0"

#: The one OTLP protocol mcpfleet ships an exporter for.
PROTOCOL: Final = "http/protobuf"

_TRUE = frozenset({"true", "1", "yes"})


def wanted(environ: Mapping[str, str]) -> tuple[bool, str]:
    """Whether ``environ`` asks for traces, and why (for the log line at start)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() in _TRUE:
        return False, "OTEL_SDK_DISABLED is set"
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    if exporter:
        names = {n.strip() for n in exporter.split(",")}
        if "otlp" not in names:
            return False, f"OTEL_TRACES_EXPORTER={exporter} (only otlp is shipped)"
    elif not endpoint:
        return False, "no OTEL_TRACES_EXPORTER nor OTLP endpoint set"
    protocol = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or PROTOCOL
    ).strip()
    if protocol != PROTOCOL:
        return False, f"OTLP protocol {protocol} (only {PROTOCOL} is shipped)"
    return True, f"OTLP/HTTP to {endpoint or 'the default endpoint'}"


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
        _install_sdk(service, instance, identity, principal)
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


def _install_sdk(service: str, instance: str, identity: str, principal: Principal | None) -> None:
    """The SDK's tracer provider, batch processor and OTLP/HTTP exporter (behind the
    redaction: :func:`redacting_exporter`), set globally."""
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import OTELResourceDetector, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # What the environment names (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES) wins;
    # the SDK's own defaults (unknown_service, a random instance id) do not.
    named = OTELResourceDetector().detect().attributes
    defaults = {"service.name": service, "service.instance.id": instance}
    resource = Resource.create({k: v for k, v in defaults.items() if k not in named})
    provider = TracerProvider(resource=resource)
    if identity == DIGEST and principal is not None:
        provider.add_span_processor(principal_noter(principal))
    exporter = redacting_exporter(OTLPSpanExporter(), digest_identity=identity == DIGEST)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)


#: Span attributes other libraries set that carry what guards a resource (a task's
#: execution key holds its task id, FastMCP's ``mcp.session.id`` a handshake session's
#: id: all that guards a task or a session without auth). Each leaves the process as a
#: digest that still tells spans of one key apart, wherever it is set: on a span (at its
#: start or later), on a span's event, on a link.
REDACTED_ATTRIBUTES: Final = frozenset({"docket.key", "mcp.session.id"})

#: Span attributes that name who made a request: FastMCP's ``enduser.id`` (the access
#: token's subject, or its client id), the other user attributes of the semantic
#: conventions, and ``client.address`` (the peer's address, on the router and replica
#: spans). Exported as they are, unless :data:`IDENTITY_ENV` says ``digest``.
IDENTITY_ATTRIBUTES: Final = frozenset(
    {
        "enduser.id",
        "enduser.pseudo.id",
        "user.id",
        "user.name",
        "user.full_name",
        "user.email",
        "client.address",
    }
)

#: The environment variable that says how :data:`IDENTITY_ATTRIBUTES` leave the
#: process: ``keep`` (the default: as set) or ``digest``.
IDENTITY_ENV: Final = "MCPFLEET_TRACES_IDENTITY"
KEEP: Final = "keep"
DIGEST: Final = "digest"

#: The attribute that carries, with ``digest``, the principal's digest of the request a
#: span was started in (the digest the limits count it under); the identity
#: attributes of that span are exported as it.
PRINCIPAL_ATTRIBUTE: Final = "mcpfleet.principal"

#: What names the principal of the request running now (its digest), or None.
Principal = Callable[[], "str | None"]


def identity_mode(environ: Mapping[str, str]) -> str:
    """:data:`KEEP` or :data:`DIGEST`, from :data:`IDENTITY_ENV` (pure). Any other
    value is taken as :data:`DIGEST`: a typo never lets identities out."""
    value = environ.get(IDENTITY_ENV, "").strip().lower()
    return KEEP if value in ("", KEEP) else DIGEST


def redacted(value: str) -> str:
    """What a :data:`REDACTED_ATTRIBUTES` value is exported as."""
    return "sha256:" + hashlib.sha256(value.encode()).hexdigest()[:16]


def principal_noter(principal: Principal) -> Any:
    """A span processor that notes :data:`PRINCIPAL_ATTRIBUTE` on each span started
    while ``principal`` names the request's principal (FastMCP's spans start in the
    request's context; their ``enduser.id`` is read from the same token)."""
    from opentelemetry.sdk.trace import SpanProcessor

    class NotePrincipal(SpanProcessor):
        def on_start(self, span: Any, parent_context: Any = None) -> None:
            try:
                digest = principal()
            except Exception:  # a span's start never fails a request
                log.debug("no principal for span %s", span.name, exc_info=True)
                return
            if digest is not None:
                span.set_attribute(PRINCIPAL_ATTRIBUTE, digest)

    return NotePrincipal()


def _rewritten(
    attributes: Mapping[str, Any] | None, keys: frozenset[str], principal: str | None
) -> dict[str, Any] | None:
    """``attributes`` with the value of each of ``keys`` as its digest (an identity as
    the ``principal``'s digest when it is known); None when none of ``keys`` is there."""
    if not attributes:
        return None
    hits = keys.intersection(attributes)
    if not hits:
        return None
    out = dict(attributes)
    for key in hits:
        if principal is not None and key in IDENTITY_ATTRIBUTES:
            out[key] = principal
        else:
            out[key] = redacted(str(out[key]))
    return out


def _bounded(attributes: dict[str, Any], dropped: int) -> Any:
    """``attributes`` as the SDK holds them (immutable), with ``dropped`` kept for the
    exporter's dropped counts."""
    from opentelemetry.attributes import BoundedAttributes

    bounded = BoundedAttributes(maxlen=None, attributes=attributes, immutable=True)
    bounded.dropped = dropped
    return bounded


_ALL_KEYS: Final = REDACTED_ATTRIBUTES | IDENTITY_ATTRIBUTES


def redact_span(span: Any, digest_identity: bool = False) -> Any:
    """``span`` (a finished ``ReadableSpan``) as it may leave the process: itself when
    it carries nothing to redact, else a copy whose attributes, events' attributes and
    links' attributes carry :func:`redacted` values (see :data:`REDACTED_ATTRIBUTES`,
    :data:`IDENTITY_ATTRIBUTES`). A finished span's attributes are immutable, and
    libraries set attributes after a span started (FastMCP sets ``mcp.session.id``
    again as it enriches its request span): so the redaction runs on what is
    exported, whenever each attribute was set."""
    keys = _ALL_KEYS if digest_identity else REDACTED_ATTRIBUTES
    attrs = span.attributes or {}
    principal = attrs.get(PRINCIPAL_ATTRIBUTE) if digest_identity else None
    principal = principal if isinstance(principal, str) else None
    own = _rewritten(attrs, keys, principal)
    events = [(e, _rewritten(e.attributes, keys, principal)) for e in span.events]
    links = [(link, _rewritten(link.attributes, keys, principal)) for link in span.links]
    if own is None and all(new is None for _, new in events + links):
        return span
    return _copy(span, own, events, links)


def _copy(
    span: Any,
    attributes: dict[str, Any] | None,
    events: list[tuple[Any, dict[str, Any] | None]],
    links: list[tuple[Any, dict[str, Any] | None]],
) -> Any:
    """A copy of ``span`` with the ``attributes`` given (None: its own), and each event
    and link with the attributes paired with it (None: its own)."""
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.sdk.util import BoundedList
    from opentelemetry.trace import Link

    kept_events = BoundedList.from_seq(
        None,
        [
            e if new is None else Event(e.name, _bounded(new, e.dropped_attributes), e.timestamp)
            for e, new in events
        ],
    )
    kept_events.dropped = span.dropped_events
    kept_links = BoundedList.from_seq(
        None,
        [
            link if new is None else Link(link.context, _bounded(new, link.dropped_attributes))
            for link, new in links
        ],
    )
    kept_links.dropped = span.dropped_links
    own = attributes if attributes is not None else dict(span.attributes or {})
    return ReadableSpan(
        name=span.name,
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes=_bounded(own, span.dropped_attributes),
        events=kept_events,
        links=kept_links,
        kind=span.kind,
        status=span.status,
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


def redacting_exporter(inner: Any, digest_identity: bool = False) -> Any:
    """A span exporter (the SDK's ``SpanExporter``) that hands ``inner`` each span as
    :func:`redact_span` makes it: every span leaves through the redaction, whatever
    set its attributes and when."""
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class RedactingExporter(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            result: SpanExportResult = inner.export(
                [redact_span(s, digest_identity) for s in spans]
            )
            return result

        def shutdown(self) -> None:
            inner.shutdown()

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return bool(inner.force_flush(timeout_millis))

    return RedactingExporter()


_TRACER: Any = None


def tracer() -> Any:
    """mcpfleet's tracer (only once tracing is on: it imports the API's trace module),
    made once: the SDK makes a new tracer, and its scope, on each ``get_tracer``."""
    global _TRACER
    if _TRACER is None:
        from opentelemetry import trace

        _TRACER = trace.get_tracer(SCOPE, schema_url=SEMCONV_SCHEMA)
    return _TRACER


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


class TraceIdFilter(logging.Filter):
    """Adds ``trace_id`` and ``span_id`` (hex, or "" with no span) to every record,
    so a format may show them (``%(trace_id)s``) and a JSON formatter finds them.

    Installed on the root logger's handlers by :func:`configure`, only when
    tracing is on: otherwise records are left as they are.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        from opentelemetry import trace

        ctx = trace.get_current_span().get_span_context()
        if ctx.is_valid:
            record.trace_id = f"{ctx.trace_id:032x}"
            record.span_id = f"{ctx.span_id:016x}"
        else:
            record.trace_id = record.span_id = ""
        return True


TRACE_IDS: Final = TraceIdFilter()


class WithTraceIds(logging.Formatter):
    """A handler's formatter, with `` trace_id=... span_id=...`` after each line
    logged while a span is current (set by :func:`configure` when tracing is on)."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        text = self.inner.format(record)
        trace_id = getattr(record, "trace_id", "")
        if not trace_id:
            return text
        return f"{text} trace_id={trace_id} span_id={getattr(record, 'span_id', '')}"
