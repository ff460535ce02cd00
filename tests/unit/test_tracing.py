"""Traces: which environment turns them on, nothing of the SDK loaded when off, the
forwarded traceparent, the log lines' trace ids, the replica's spans in process.

What sets a tracer provider runs in a subprocess: the provider is process-wide,
and the other tests expect none (appload.quiet_telemetry).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from mcp.server.auth.provider import AccessToken

from mcpfleet import tracing
from mcpfleet.limits import principal_digest
from mcpfleet.router.upstream import Upstream, forward_header_block

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
ENDPOINT = "http://127.0.0.1:4318"


@pytest.mark.parametrize(
    ("environ", "on"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": ENDPOINT + "/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT}, False),
        ({"OTEL_TRACES_EXPORTER": "console"}, False),
        ({"OTEL_TRACES_EXPORTER": "console,otlp"}, True),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, False),
        (
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT,
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            },
            True,
        ),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_SDK_DISABLED": "false"}, True),
    ],
)
def test_only_the_otel_environment_turns_tracing_on(environ: dict[str, str], on: bool) -> None:
    assert tracing.wanted(environ)[0] is on


def _run(script: str, **env: str) -> str:
    """``script`` in a fresh interpreter with no OTEL_* variable but ``env``; its stdout."""
    return _run_args(script, **env)


def _run_args(script: str, *args: str, **env: str) -> str:
    """``script`` run with ``args`` (its ``sys.argv[1:]``), as :func:`_run`."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


#: What tracing loads: the SDK's tracing and the OTLP exporter. (redis-py imports the
#: SDK's metrics module when the SDK is installed, for its own optional metrics,
#: which stay off unless an app turns them on: not mcpfleet's, and not per request.)
TRACING_MODULES = ("opentelemetry.sdk.trace", "opentelemetry.exporter", "opentelemetry.proto")


def test_with_tracing_off_the_processes_never_import_the_sdks_tracing() -> None:
    out = _run(
        f"""
        import sys
        from mcpfleet import tracing
        import mcpfleet.router.proxy, mcpfleet.router.process, mcpfleet.replica.process
        assert tracing.configure("mcpfleet-replica", "r-1") is False
        print(tracing.ON, sorted(m for m in sys.modules if m.startswith({TRACING_MODULES!r})))
        """
    )
    assert out.split() == ["False", "[]"]


def test_configured_the_sdk_names_the_service_unless_the_environment_does() -> None:
    script = """
        from opentelemetry import trace
        from mcpfleet import tracing
        assert tracing.configure("mcpfleet-router", "host-1") is True
        attrs = trace.get_tracer_provider().resource.attributes
        print(attrs["service.name"], attrs["service.instance.id"], tracing.ON)
        """
    assert _run(script, OTEL_EXPORTER_OTLP_ENDPOINT=ENDPOINT).split() == [
        "mcpfleet-router",
        "host-1",
        "True",
    ]
    mine = _run(
        script,
        OTEL_TRACES_EXPORTER="otlp",
        OTEL_SERVICE_NAME="shop",
        OTEL_RESOURCE_ATTRIBUTES="service.instance.id=pod-7",
    )
    assert mine.split() == ["shop", "pod-7", "True"]


def test_the_router_sends_its_own_traceparent_only_when_tracing() -> None:
    raw = [
        (b"traceparent", b"00-" + b"a" * 32 + b"-" + b"b" * 16 + b"-01"),
        (b"tracestate", b"k=v"),
        (b"content-type", b"application/json"),
    ]
    plain = forward_header_block(raw, None, Upstream(1.0).drop)
    assert b"traceparent: 00-aaaa" in plain and b"tracestate: k=v" in plain
    traced = forward_header_block(raw, None, Upstream(1.0, own_traceparent=True).drop)
    assert b"traceparent" not in traced
    assert b"tracestate: k=v\r\n" in traced and b"content-type" in traced


def test_off_the_helpers_do_nothing() -> None:
    assert not tracing.ON
    assert tracing.traceparent() == b""
    tracing.note("mcpfleet.route", "stateless")
    with tracing.child("mcpfleet.once.claim"):
        pass


def test_log_lines_carry_the_trace_ids_of_the_current_span() -> None:
    record = logging.LogRecord("mcpfleet", logging.INFO, __file__, 1, "forwarded", None, None)
    formatter = tracing.WithTraceIds(logging.Formatter("%(message)s"))
    assert tracing.TRACE_IDS.filter(record)
    assert formatter.format(record) == "forwarded"  # no span: the line as it was
    record.trace_id, record.span_id = "a" * 32, "b" * 16
    assert formatter.format(record) == f"forwarded trace_id={'a' * 32} span_id={'b' * 16}"


REPLICA_SCRIPT = """
    import tempfile
    from pathlib import Path
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from starlette.testclient import TestClient

    from fleetkit.clients.wire import modern_call
    from mcpfleet import tracing
    from mcpfleet.keys.files import write_ring
    from mcpfleet.keys.ring import KeyRing
    from mcpfleet.replica.process import build_asgi
    from mcpfleet.replica.runtime import Replica, ReplicaConfig

    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    trace.set_tracer_provider(provider)
    tracing.ON = True
    work = tempfile.TemporaryDirectory(prefix="mcpfleet-tracing-test-")  # removed at exit
    keys = Path(work.name) / "keys"
    write_ring(keys, KeyRing.generate())
    replica = Replica(ReplicaConfig(keys_dir=keys, name="replica-t"), KeyRing.generate())
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with TestClient(build_asgi(replica)) as http:
        answer = modern_call(
            "http://testserver/mcp", "book_flight", {"destination": "Oslo"},
            client=http, headers={"traceparent": parent},
        )
        assert answer.result["resultType"] == "input_required", answer.body
    for s in exported.get_finished_spans():
        print(
            s.name, f"{s.context.trace_id:032x}", f"{s.context.span_id:016x}",
            f"{s.parent.span_id:016x}", s.attributes.get("mcpfleet.round.kind", "-"),
        )
"""


def test_the_replica_continues_the_incoming_context_into_fastmcps_spans() -> None:
    out = _run(REPLICA_SCRIPT, PYTHONPATH=str(ROOT / "hack" / "devkit"))
    spans = {" ".join(line.split()[:2]): line.split()[2:] for line in out.splitlines()}
    http, tool = spans["POST /mcp"], spans["tools/call book_flight"]
    assert http[0] == tool[0] == "0af7651916cd43dd8448eb211c80319c"
    assert http[2] == "b7ad6b7169203331"  # the caller's span
    assert tool[2] == http[1]  # FastMCP's span is the replica's span's child
    assert tool[3] == "asking"


@pytest.mark.parametrize(
    ("kind", "headers", "era"),
    [
        ("stateless", {"mcp-protocol-version": "2026-07-28"}, "modern"),
        ("stateless", {"mcp-protocol-version": "2025-11-25"}, "handshake"),
        ("sticky", {"mcp-session-id": "a" * 32}, "handshake"),
        ("initialize", {}, "handshake"),
        ("stateless", {}, None),
    ],
)
def test_the_routers_span_names_the_requests_era(
    kind: str, headers: dict[str, str], era: str | None
) -> None:
    from mcpfleet.router.decisions import RouteKind, era_of

    assert era_of(RouteKind(kind), headers) == era


def test_the_codecs_kids_go_on_the_span_only_when_tracing_is_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mcpfleet.replica import tracing as replica_tracing

    counted: list[tuple[str, str]] = []
    noted: list[tuple[str, object]] = []
    monkeypatch.setattr(tracing, "note", lambda key, value: noted.append((key, value)))
    observe = counted.append
    off = replica_tracing.traced_codec_events(lambda e, v: observe((e, v)))
    off("seal", "0a1b2c3d")
    assert noted == []
    monkeypatch.setattr(tracing, "ON", True)
    on = replica_tracing.traced_codec_events(lambda e, v: observe((e, v)))
    on("seal", "0a1b2c3d")
    on("unseal", "0a1b2c3d")
    on("reject", "expired")
    assert noted == [
        ("mcpfleet.requeststate.seal_kid", "0a1b2c3d"),
        ("mcpfleet.requeststate.unseal_kid", "0a1b2c3d"),
    ]
    assert len(counted) == 4, "every event still reaches the metrics"


SPANS_SCRIPT = """
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from mcpfleet import tracing

    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(tracing.redacting_exporter(exported)))
    trace.set_tracer_provider(provider)
    tracing.ON = True
    creator = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    key = "anon:SECRET-TASK-ID:tool:double"
    docket = trace.get_tracer("docket")
    with docket.start_as_current_span("docket.add", attributes={"docket.key": key}):
        pass
    # Set after the start, on an event and on a link: what on_start never sees.
    later = trace.get_tracer("later")
    with later.start_as_current_span("set-later") as span:
        span.set_attributes({"mcp.session.id": "SECRET-SESSION-ID", "mcp.method.name": "x"})
        span.add_event("retry", {"docket.key": key, "n": 1})
        span.add_link(tracing.span_context(creator), {"mcp.session.id": "SECRET-SESSION-ID"})
    with tracing.linked_span("leg-alone", creator, a=1):
        current = trace.get_current_span().get_span_context().trace_id
        print("exemplar", tracing.exemplar()["trace_id"] == f"{current:032x}")
    with tracing.tracer().start_as_current_span("execution"):
        with tracing.linked_span("leg-under", None):
            pass
    # A provider with limits: the copy keeps the dropped counts the exporter reports.
    from opentelemetry.sdk.trace import SpanLimits
    bounded = InMemorySpanExporter()
    limited = TracerProvider(span_limits=SpanLimits(max_attributes=2, max_events=1))
    limited.add_span_processor(SimpleSpanProcessor(tracing.redacting_exporter(bounded)))
    with limited.get_tracer("limited").start_as_current_span("limited") as span:
        span.set_attributes({"a": 1, "b": 2, "mcp.session.id": "SECRET-SESSION-ID"})
        span.add_event("two")
        span.add_event("one", {"docket.key": key})
    (copy,) = bounded.get_finished_spans()
    print(
        "limited", copy.dropped_attributes, copy.dropped_events, dict(copy.attributes),
        [dict(e.attributes) for e in copy.events],
    )
    unsampled = tracing.extract("00-" + "1" * 32 + "-" + "2" * 16 + "-00")
    with tracing.tracer().start_as_current_span("unsampled", context=unsampled):
        print("unsampled", tracing.exemplar())
    for s in exported.get_finished_spans():
        links = [f"{l.context.trace_id:032x}-{l.context.span_id:016x}" for l in s.links]
        parent = f"{s.parent.span_id:016x}" if s.parent else "-"
        extra = [dict(e.attributes) for e in s.events] + [dict(l.attributes) for l in s.links]
        print(s.name, s.kind.name, parent, links or "-", dict(s.attributes), extra)
"""


def test_leg_links_sampled_exemplars_and_task_keys_and_session_ids_redacted() -> None:
    out = _run(SPANS_SCRIPT).splitlines()
    assert "exemplar True" in out and "unsampled None" in out
    (limited,) = [line for line in out if line.startswith("limited ")]
    assert limited.startswith("limited 1 1 ") and "SECRET" not in limited, limited
    assert "'mcp.session.id': 'sha256:" in limited and "'docket.key': 'sha256:" in limited
    spans = {
        line.split()[0]: line
        for line in out
        if not line.startswith(("exemplar", "unsampled", "limited "))
    }
    assert "SECRET-TASK-ID" not in spans["docket.add"]
    assert "'docket.key': 'sha256:" in spans["docket.add"]
    later = spans["set-later"]
    assert "SECRET" not in later, later
    assert "'mcp.session.id': 'sha256:" in later and "'docket.key': 'sha256:" in later
    assert "'mcp.method.name': 'x'" in later and "'n': 1" in later
    alone = spans["leg-alone"].split(maxsplit=4)
    assert alone[1:4] == [
        "CONSUMER",
        "-",
        "['0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331']",
    ]
    under = spans["leg-under"].split(maxsplit=4)
    assert under[1] == "INTERNAL" and under[2] != "-" and under[3] == "-"


#: A real FastMCP app (with a static token) served over HTTP in process, its spans
#: exported through the redaction: a handshake session's initialize and tools/call.
FASTMCP_SCRIPT = """
    import json, sys
    from fastmcp import FastMCP
    from fastmcp.server.auth.providers.jwt import StaticTokenVerifier
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from starlette.testclient import TestClient

    from fleetkit.clients.wire import initialize_body, response_body
    from mcpfleet import tracing
    from mcpfleet.replica.tracing import request_principal

    digest = sys.argv[1] == "digest"
    exported = InMemorySpanExporter()
    provider = TracerProvider()
    if digest:
        provider.add_span_processor(tracing.principal_noter(request_principal))
    exporter = tracing.redacting_exporter(exported, digest_identity=digest)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    verifier = StaticTokenVerifier({"SECRET-TOKEN": {"client_id": "alice-app", "sub": "alice"}})
    app = FastMCP("t", auth=verifier)

    @app.tool
    def add(a: int, b: int) -> int:
        return a + b

    headers = {
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
        "authorization": "Bearer SECRET-TOKEN",
    }
    with TestClient(app.http_app()) as http:
        opened = http.post("/mcp", content=initialize_body("t"), headers=headers)
        assert opened.status_code == 200, opened.text
        session = opened.headers["mcp-session-id"]
        headers |= {"mcp-session-id": session, "mcp-protocol-version": "2025-11-25"}
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        assert http.post("/mcp", json=note, headers=headers).status_code == 202
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                "params": {"name": "add", "arguments": {"a": 1, "b": 2}}}
        answer = http.post("/mcp", json=call, headers=headers)
        assert response_body(answer)["result"]["structuredContent"] == {"result": 3}, answer.text
    spans = []
    for s in exported.get_finished_spans():
        spans.append({
            "name": s.name,
            "attributes": dict(s.attributes),
            "events": [[e.name, dict(e.attributes)] for e in s.events],
            "links": [dict(l.attributes) for l in s.links],
        })
    print(json.dumps({"session": session, "spans": spans}))
"""


def _fastmcp_spans(identity: str) -> tuple[str, list[dict[str, Any]]]:
    """FASTMCP_SCRIPT's session id and exported spans."""
    out = _run_args(FASTMCP_SCRIPT, identity, PYTHONPATH=str(ROOT / "hack" / "devkit"))
    got = json.loads(out)
    return got["session"], got["spans"]


@pytest.mark.parametrize("identity", ["keep", "digest"])
def test_fastmcps_real_spans_of_a_handshake_session_leave_without_its_id_or_token(
    identity: str,
) -> None:
    session, spans = _fastmcp_spans(identity)
    (call,) = [s for s in spans if s["name"] == "tools/call add"]
    # FastMCP sets the session's id on its request span after it started.
    assert call["attributes"]["mcp.session.id"] == tracing.redacted(session)
    text = json.dumps(spans)
    assert session not in text and "SECRET-TOKEN" not in text
    if identity == "keep":
        # The token's subject (FastMCP 4.2.3), or its client id (the tasks engine's).
        assert call["attributes"]["enduser.id"] in ("alice", "alice-app")
        return
    token = AccessToken(token="-", client_id="alice-app", scopes=[], subject="alice")
    principal = principal_digest({"user": SimpleNamespace(access_token=token)})
    assert call["attributes"]["enduser.id"] == principal
    assert call["attributes"][tracing.PRINCIPAL_ATTRIBUTE] == principal
    assert '"alice' not in text


@pytest.mark.parametrize(
    ("value", "mode"),
    [("", "keep"), ("keep", "keep"), ("digest", "digest"), ("Digest ", "digest"), ("x", "digest")],
)
def test_identity_attributes_stay_as_set_unless_the_environment_asks_for_digests(
    value: str, mode: str
) -> None:
    assert tracing.identity_mode({tracing.IDENTITY_ENV: value}) == mode
    assert tracing.identity_mode({}) == "keep"
