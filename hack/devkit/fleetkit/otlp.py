"""An OTLP/HTTP trace receiver for tests and benchmarks: every span sent to it, decoded.

:class:`Receiver` is a real OTLP/HTTP endpoint on 127.0.0.1 (``POST /v1/traces``)
that decodes each ``ExportTraceServiceRequest`` with ``opentelemetry-proto``:
the processes pointed at it (``OTEL_EXPORTER_OTLP_ENDPOINT``) export as they
would to a collector, nothing of the SDK mocked. ``keep=False`` counts spans
without keeping them (a benchmark's sink).
"""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass(frozen=True)
class Got:
    """One span as received: its service, and the span's fields that matter here."""

    service: str
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent: str
    attributes: dict[str, Any]
    #: The spans this one links to: (trace id, span id), hex.
    links: tuple[tuple[str, str], ...] = ()
    #: Each link's attributes, in the order of :attr:`links`.
    link_attributes: tuple[dict[str, Any], ...] = ()
    #: The span's events: (name, attributes).
    events: tuple[tuple[str, dict[str, Any]], ...] = ()

    def exported_text(self) -> str:
        """Every name, key and value the span was exported with (its own, its events',
        its links'), as one text to search."""
        parts: list[object] = [self.service, self.name, self.attributes, *self.link_attributes]
        parts += [part for event in self.events for part in event]
        return repr(parts)


class Receiver:
    """An OTLP/HTTP trace receiver on 127.0.0.1: every span it was sent, decoded."""

    def __init__(self, keep: bool = True) -> None:
        self.spans: list[Got] = []
        #: Export requests received (kept or not).
        self.exports = 0
        self.keep = keep
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                with receiver.lock:
                    receiver.exports += 1
                if receiver.keep:
                    receiver.take(ExportTraceServiceRequest.FromString(body))
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def take(self, request: ExportTraceServiceRequest) -> None:
        got = []
        for rs in request.resource_spans:
            resource = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    got.append(
                        Got(
                            service=str(resource.get("service.name")),
                            name=s.name,
                            kind=s.kind,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent=s.parent_span_id.hex(),
                            attributes=_attributes(s.attributes),
                            links=tuple(
                                (link.trace_id.hex(), link.span_id.hex()) for link in s.links
                            ),
                            link_attributes=tuple(_attributes(link.attributes) for link in s.links),
                            events=tuple((e.name, _attributes(e.attributes)) for e in s.events),
                        )
                    )
        with self.lock:
            self.spans += got

    def of_trace(self, trace_id: str) -> list[Got]:
        with self.lock:
            return [s for s in self.spans if s.trace_id == trace_id]


def _attributes(attributes: Any) -> dict[str, Any]:
    """OTLP ``KeyValue``s as a dict."""
    return {a.key: _value(a.value) for a in attributes}


def _value(v: Any) -> Any:
    """An OTLP ``AnyValue`` as a Python value."""
    which = v.WhichOneof("value")
    return getattr(v, which) if which else None
