"""Traces through a real fleet: the router's and the replicas' spans, exported over
OTLP/HTTP to a receiver in this process, one trace from the client's traceparent.

The receiver (:class:`fleetkit.otlp.Receiver`) is a real OTLP/HTTP endpoint
(``POST /v1/traces``) that decodes each ``ExportTraceServiceRequest`` with
``opentelemetry-proto``: nothing of the SDK is mocked; the processes export as
they would to a collector.
"""

from __future__ import annotations

import asyncio
import re
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)

from fleetkit.apps.onceapp import EFFECTS_ENV
from fleetkit.clients.rawsession import RawSession
from fleetkit.clients.wire import accept, modern_call
from fleetkit.fleet import FleetOptions, ProcessFleet, local_fleet
from fleetkit.otlp import Got, Receiver
from mcpfleet.dev.wait import wait_for

from .conftest import shared

pytestmark = pytest.mark.fleet

APP = "fleetkit.apps.onceapp:app"


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with Receiver() as r:
        yield r


def _fleet_env(receiver: Receiver, tmp: Path, **extra: str) -> dict[str, str]:
    return {
        EFFECTS_ENV: str(tmp / "effects.log"),
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        # Exported within a fifth of a second, not the default five.
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        **extra,
    }


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory, receiver: Receiver) -> Iterator[ProcessFleet]:
    workdir = tmp_path_factory.mktemp("traced")
    options = FleetOptions(replicas=2, app=APP, env=_fleet_env(receiver, workdir))
    with local_fleet(workdir, options) as lf, shared(lf):
        yield lf


def _traceparent(trace_id: str) -> tuple[str, str]:
    """A client's ``traceparent`` in trace ``trace_id`` (sampled), and its span id."""
    span = secrets.token_hex(8)
    return f"00-{trace_id}-{span}-01", span


def _two_rounds(url: str, trace_id: str, states: list[str] | None = None) -> tuple[str, str]:
    """A modern once-flow's asking and final rounds, each sent with a traceparent of
    ``trace_id``: the client span ids of the two requests (the request state the
    asking round sealed added to ``states``)."""
    header, asking = _traceparent(trace_id)
    first = modern_call(url, "charge", {"order": "t-1"}, headers={"traceparent": header})
    assert first.result.get("resultType") == "input_required", first.body
    if states is not None:
        states.append(first.result["requestState"])
    header, final = _traceparent(trace_id)
    answer = modern_call(
        url,
        "charge",
        {"order": "t-1"},
        request_state=first.result["requestState"],
        input_responses={"ok": accept(True)},
        headers={"traceparent": header},
    )
    assert answer.status == 200 and answer.error is None, answer.body
    return asking, final


def _one_child(spans: list[Got], parent: str, service: str, name: str | None = None) -> Got:
    found = [
        s
        for s in spans
        if s.parent == parent and s.service == service and (name is None or s.name == name)
    ]
    assert len(found) == 1, (parent, service, name, spans)
    return found[0]


def _round(spans: list[Got], client_span: str) -> dict[str, Got]:
    """One request's spans under the client's span: router, replica, FastMCP's."""
    router = _one_child(spans, client_span, "mcpfleet-router")
    assert router.kind == PbSpan.SPAN_KIND_SERVER and router.name == "POST /mcp"
    replica = _one_child(spans, router.span_id, "mcpfleet-replica", "POST /mcp")
    assert replica.kind == PbSpan.SPAN_KIND_SERVER
    tool = _one_child(spans, replica.span_id, "mcpfleet-replica", "tools/call charge")
    return {"router": router, "replica": replica, "tool": tool}


def _attribute_values(spans: list[Got], key: str, request: dict[str, Got]) -> set[Any]:
    """The values of attribute ``key`` on the replica's spans of one request."""
    mine = {request["replica"].span_id, request["tool"].span_id}
    return {s.attributes[key] for s in spans if s.span_id in mine and key in s.attributes}


def _expected(spans: list[Got]) -> bool:
    """Whether every span of :func:`_two_rounds` arrived."""
    names = [(s.service, s.name) for s in spans]
    return (
        names.count(("mcpfleet-router", "POST /mcp")) == 2
        and names.count(("mcpfleet-replica", "POST /mcp")) == 2
        and names.count(("mcpfleet-replica", "tools/call charge")) == 2
        and ("mcpfleet-replica", "mcpfleet.once.claim") in names
        and ("mcpfleet-replica", "mcpfleet.once.confirm") in names
    )


def test_a_modern_flow_through_the_router_is_one_trace_under_the_clients_span(
    traced: ProcessFleet, receiver: Receiver
) -> None:
    trace_id = secrets.token_hex(16)
    states: list[str] = []
    asking, final = _two_rounds(traced.url, trace_id, states)
    # Two requests of three spans each, and the final round's claim and confirmation;
    # each process exports its own batches, so they arrive in any order.
    wait_for(lambda: _expected(receiver.of_trace(trace_id)), timeout=15, what="the trace's spans")
    spans = receiver.of_trace(trace_id)
    first, last = _round(spans, asking), _round(spans, final)
    for one in (first, last):
        router = one["router"].attributes
        assert router["http.request.method"] == "POST" and router["http.route"] == "/mcp"
        assert router["http.response.status_code"] == 200
        assert router["mcpfleet.route"] == "stateless" and router["mcpfleet.outcome"] == "ok"
        assert router["mcpfleet.era"] == "modern"
        assert router["mcpfleet.replica"] == one["replica"].attributes["mcpfleet.replica"]
        assert one["tool"].attributes["mcpfleet.round.era"] == "modern"
        assert one["tool"].attributes["gen_ai.tool.name"] == "charge"
    assert first["tool"].attributes["mcpfleet.round.kind"] == "asking"
    assert first["tool"].attributes["mcpfleet.round.questions"] == 1
    # The kid of the key that sealed the asking round's request state, and opened it.
    kid = first["tool"].attributes["mcpfleet.requeststate.seal_kid"]
    assert re.fullmatch("[0-9a-f]{8}", kid), kid
    assert kid in _attribute_values(spans, "mcpfleet.requeststate.unseal_kid", last)
    assert last["tool"].attributes["mcpfleet.round.kind"] == "final"
    assert last["tool"].attributes["mcpfleet.round.step"] == "continue"
    tool = last["tool"].span_id
    _one_child(spans, tool, "mcpfleet-replica", "mcpfleet.once.claim")
    confirm = _one_child(spans, tool, "mcpfleet-replica", "mcpfleet.once.confirm")
    assert confirm.attributes["mcpfleet.once.confirmed"] == "yes"
    # The sealed request state (a token) is on no span, event or link.
    assert [s for s in spans if states[0] in s.exported_text()] == []


def test_a_request_without_traceparent_starts_a_trace_at_the_router(
    traced: ProcessFleet, receiver: Receiver
) -> None:
    before = {s.trace_id for s in receiver.spans}
    first = modern_call(traced.url, "charge", {"order": "t-2"})
    assert first.status == 200, first.body

    def new_router_root() -> list[Got]:
        with receiver.lock:
            return [
                s
                for s in receiver.spans
                if s.trace_id not in before and s.service == "mcpfleet-router" and not s.parent
            ]

    wait_for(lambda: bool(new_router_root()), timeout=15, what="a router span without parent")
    (root,) = new_router_root()
    wait_for(
        lambda: any(s.parent == root.span_id for s in receiver.of_trace(root.trace_id)),
        timeout=15,
        what="the replica's span under the router's",
    )


def test_with_tracing_off_nothing_is_exported(
    tmp_path: Path, receiver: Receiver, traced: ProcessFleet
) -> None:
    # The endpoint is set, but the exporter is "none": tracing stays off.
    env = _fleet_env(receiver, tmp_path, OTEL_TRACES_EXPORTER="none")
    trace_id = secrets.token_hex(16)
    with local_fleet(tmp_path, FleetOptions(replicas=1, app=APP, env=env)) as lf:
        _two_rounds(lf.url, trace_id)
        # A probe through the traced fleet, after: its spans arrive after any the
        # untraced fleet would have exported (the same batch delay, started earlier).
        probe = secrets.token_hex(16)
        _two_rounds(traced.url, probe)
        wait_for(lambda: _expected(receiver.of_trace(probe)), timeout=15, what="the probe's spans")
        assert receiver.of_trace(trace_id) == []


OPENMETRICS = "application/openmetrics-text; version=1.0.0"


def _exemplar_traces(url: str, family: str, accept: str = OPENMETRICS) -> set[str]:
    """The trace ids of the exemplars of histogram ``family``'s buckets at ``url``."""
    resp = httpx.get(url, headers={"accept": accept}, timeout=10)
    assert resp.status_code == 200
    if not resp.headers["content-type"].startswith("application/openmetrics-text"):
        # Prometheus' text format carries no exemplar (and parses without them).
        assert " # {" not in resp.text
        return set()
    return {
        sample.exemplar.labels["trace_id"]
        for metrics in openmetrics_families(resp.text)
        if metrics.name == family
        for sample in metrics.samples
        if sample.name == f"{family}_bucket" and sample.exemplar is not None
    }


def test_the_latency_histograms_carry_the_traced_requests_trace_id_as_exemplar(
    traced: ProcessFleet, receiver: Receiver
) -> None:
    trace_id = secrets.token_hex(16)
    header, _ = _traceparent(trace_id)
    answer = modern_call(traced.url, "charge", {"order": "t-3"}, headers={"traceparent": header})
    assert answer.status == 200 and answer.replica in traced.members, answer
    replica = f"{traced.members[answer.replica].url}/metrics"
    router = f"{traced.url.removesuffix('/mcp')}/metrics"
    assert trace_id in _exemplar_traces(replica, "mcpfleet_round_duration_seconds")
    assert trace_id in _exemplar_traces(router, "mcpfleet_router_proxy_seconds")
    # Asked for Prometheus' text format (or nothing), the scrape is what it was.
    assert _exemplar_traces(replica, "mcpfleet_round_duration_seconds", "text/plain") == set()
    assert _exemplar_traces(router, "mcpfleet_router_proxy_seconds", "") == set()
    # A request whose trace is not sampled leaves no exemplar pointing at it.
    unsampled = secrets.token_hex(16)
    header = f"00-{unsampled}-{secrets.token_hex(8)}-00"
    answer = modern_call(traced.url, "charge", {"order": "t-4"}, headers={"traceparent": header})
    assert answer.status == 200
    assert unsampled not in _exemplar_traces(router, "mcpfleet_router_proxy_seconds")


async def _handshake_session(url: str, trace_id: str) -> dict[str, str]:
    """A handshake session through the router, each request with its own client span in
    trace ``trace_id``: initialize, initialized, a call that elicits, the answer. The
    client span id of each, by step."""
    spans: dict[str, str] = {}
    async with httpx.AsyncClient(timeout=15) as http:
        session = RawSession(url, http)

        def step(name: str) -> None:
            session.headers["traceparent"], spans[name] = _traceparent(trace_id)

        step("initialize")
        await session.open("traced-client")  # initialize, then notifications/initialized
        step("call")
        pending = await session.start_elicitation("charge", {"order": "t-5"})
        step("answer")
        answered = await session.answer(pending.request_id, {"ok": True})
        assert answered.status_code == 202, answered.text
        await asyncio.wait_for(asyncio.shield(pending.reader), 15)
        await pending.aclose()
    return spans


def test_a_handshake_sessions_requests_are_each_traced_through_the_sticky_route(
    traced: ProcessFleet, receiver: Receiver
) -> None:
    trace_id = secrets.token_hex(16)
    clients = asyncio.run(_handshake_session(traced.url, trace_id))

    def arrived() -> list[Got] | None:
        spans = receiver.of_trace(trace_id)
        routers = [s for s in spans if s.service == "mcpfleet-router"]
        tools = [
            s
            for s in spans
            if s.name == "tools/call charge" and "mcpfleet.round.kind" in s.attributes
        ]
        return spans if len(routers) == 4 and tools else None

    spans = wait_for(arrived, timeout=15, what="the session's spans")
    # initialize and notifications/initialized went with one client span; then one each.
    expected = {"initialize": ["initialize", "sticky"], "call": ["sticky"], "answer": ["sticky"]}
    owners = set()
    for step, client in clients.items():
        routers = [s for s in spans if s.parent == client and s.service == "mcpfleet-router"]
        assert sorted(s.attributes["mcpfleet.route"] for s in routers) == expected[step], routers
        for router in routers:
            attrs = router.attributes
            assert attrs["mcpfleet.era"] == "handshake", attrs
            if attrs["mcpfleet.route"] == "sticky":
                assert attrs["mcpfleet.session.lookup"] in ("cache", "redis"), attrs
            replica = _one_child(spans, router.span_id, "mcpfleet-replica", "POST /mcp")
            assert replica.attributes["mcpfleet.replica"] == attrs["mcpfleet.replica"]
            owners.add(attrs["mcpfleet.replica"])
    assert len(owners) == 1, "every request of the session reached its owner"
    (tool,) = [s for s in spans if s.name == "tools/call charge"]
    assert tool.attributes["mcpfleet.round.era"] == "handshake"
    assert tool.attributes["mcpfleet.round.kind"] == "final"


def test_a_round_refused_under_a_limit_says_so_on_the_router_and_the_replica(
    tmp_path: Path, receiver: Receiver
) -> None:
    env = _fleet_env(receiver, tmp_path)
    limits = ("--limit-rounds", "1", "--limit-burst", "1")
    options = FleetOptions(replicas=1, app=APP, env=env, replica_args=limits)
    trace_id = secrets.token_hex(16)
    with local_fleet(tmp_path, options) as lf:
        statuses = []
        by_replica = 0  # (the router refuses the next ones from memory: no replica span)
        for n in range(3):  # one allowed a second (a burst of one): the next ones refused
            header, _ = _traceparent(trace_id)
            answer = modern_call(
                lf.url, "charge", {"order": f"l-{n}"}, headers={"traceparent": header}
            )
            statuses.append(answer.status)
            by_replica += answer.status == 429 and answer.replica is not None
        assert 429 in statuses and by_replica, statuses

        def refused() -> list[tuple[Got, Got]] | None:
            spans = receiver.of_trace(trace_id)
            routers = [
                s
                for s in spans
                if s.service == "mcpfleet-router" and s.attributes.get("mcpfleet.limited")
            ]
            pairs = [(r, s) for r in routers for s in spans if s.parent == r.span_id]
            return pairs if len(pairs) == by_replica else None

        pairs = wait_for(refused, timeout=15, what="the refused requests' spans")
        for router, replica in pairs:
            assert router.attributes["http.response.status_code"] == 429
            assert replica.service == "mcpfleet-replica"
            assert replica.attributes["mcpfleet.limited"] == "rounds"
