"""What leaves the process: every exported span through one redaction.

What guards a session or a task (:data:`REDACTED_ATTRIBUTES`) always leaves
as a digest, and the attributes naming who made a request
(:data:`IDENTITY_ATTRIBUTES`) too when ``MCPFLEET_TRACES_IDENTITY=digest``:
:func:`redacting_exporter` wraps the exporter, :func:`principal_noter` notes
the request's principal on each span for it. The SDK is imported only inside
these functions, called once tracing is on.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

log = logging.getLogger("mcpfleet.tracing")


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

#: The attribute that carries, with ``digest``, the principal's digest of the request a
#: span was started in (the digest the limits count it under); the identity
#: attributes of that span are exported as it.
PRINCIPAL_ATTRIBUTE: Final = "mcpfleet.principal"

#: What names the principal of the request running now (its digest), or None.
Principal = Callable[[], "str | None"]


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
