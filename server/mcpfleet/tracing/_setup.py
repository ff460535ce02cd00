"""Whether the environment asks for traces (pure), and the SDK set up when it does.

:func:`wanted` and :func:`identity_mode` read the ``OTEL_*`` environment and
:data:`IDENTITY_ENV`; :func:`install_sdk` imports the OpenTelemetry SDK and its
OTLP/HTTP exporter (only then: the package's ``configure`` calls it once
tracing is asked for) and sets the global tracer provider, every span behind
the redaction of :mod:`mcpfleet.tracing._redact`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from mcpfleet.tracing._redact import Principal, principal_noter, redacting_exporter

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


#: The environment variable that says how :data:`IDENTITY_ATTRIBUTES` leave the
#: process: ``keep`` (the default: as set) or ``digest``.
IDENTITY_ENV: Final = "MCPFLEET_TRACES_IDENTITY"
KEEP: Final = "keep"
DIGEST: Final = "digest"


def identity_mode(environ: Mapping[str, str]) -> str:
    """:data:`KEEP` or :data:`DIGEST`, from :data:`IDENTITY_ENV` (pure). Any other
    value is taken as :data:`DIGEST`: a typo never lets identities out."""
    value = environ.get(IDENTITY_ENV, "").strip().lower()
    return KEEP if value in ("", KEEP) else DIGEST


def install_sdk(service: str, instance: str, identity: str, principal: Principal | None) -> None:
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
