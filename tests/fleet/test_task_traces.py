"""A task's trace through a real fleet: each leg, on whichever replica's worker runs it,
is a span linked to the request that created the task.

Three replicas of ``fleetkit.apps.taskapp`` export over OTLP/HTTP to a receiver in
this process (:class:`fleetkit.otlp.Receiver`: the export decoded, nothing of the
SDK mocked), with ``--tasks-encrypt``: the creator's trace context travels in the
task's snapshot, sealed under the ring with it. Runs where the [tasks] extra is
installed (``make test-tasks``).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import httpx
import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

from fleetkit.clients.taskwire import FINAL, TASK_META, task
from fleetkit.clients.wire import MODERN, response_body
from fleetkit.fleet import FleetOptions, ProcessFleet, local_fleet
from fleetkit.otlp import Got, Receiver
from mcpfleet.dev.wait import wait_for

from .conftest import shared

pytest.importorskip("fastmcp_tasks", reason="the [tasks] extra: make venv-tasks, make test-tasks")

pytestmark = [pytest.mark.fleet, pytest.mark.tasks]

APP = "fleetkit.apps.taskapp:app"
LEG = "mcpfleet.task.leg"
#: Tasks created through one replica, at most, until one ran on another's worker.
TRIES = 20


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with Receiver() as r:
        yield r


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, receiver: Receiver) -> Iterator[ProcessFleet]:
    workdir = tmp_path_factory.mktemp("task-traces")
    env = {
        "MCPFLEET_TEST_EFFECTS": str(workdir / "effects"),
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "200",
    }
    options = FleetOptions(app=APP, env=env, replica_args=("--tasks-encrypt",))
    with local_fleet(workdir, options) as lf, shared(lf):
        yield lf


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=15) as client:
        yield client


def _traced_create(
    http: httpx.Client, url: str, tool: str, arguments: dict[str, object]
) -> tuple[str, str]:
    """``tools/call`` of task tool ``tool`` at ``url`` with a sampled ``traceparent`` of a
    new trace: the task's id and the trace's id."""
    trace_id = secrets.token_hex(16)
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments, "_meta": TASK_META},
    }
    resp = http.post(
        url,
        json=body,
        headers={
            "accept": "application/json, text/event-stream",
            "mcp-protocol-version": MODERN,
            "mcp-method": "tools/call",
            "mcp-name": tool,
            "traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01",
        },
    )
    answer = response_body(resp)
    assert resp.status_code == 200 and "result" in answer, answer
    return str(answer["result"]["taskId"]), trace_id


def _legs_linked_to(receiver: Receiver, trace_id: str) -> list[Got]:
    """The legs' spans with a link into trace ``trace_id``."""
    with receiver.lock:
        return [
            s for s in receiver.spans if s.name == LEG and any(t == trace_id for t, _ in s.links)
        ]


def _creator(receiver: Receiver, trace_id: str, span_id: str, replica: str) -> Got:
    """The span ``span_id`` of trace ``trace_id``, checked to be FastMCP's ``tools/call``
    under the replica's request span on ``replica`` (where the task was created)."""

    def both() -> tuple[Got, Got] | None:
        spans = {s.span_id: s for s in receiver.of_trace(trace_id)}
        call = spans.get(span_id)
        if call is None or call.parent not in spans:
            return None
        return call, spans[call.parent]

    call, request = wait_for(both, timeout=15, what="the creation's spans")
    assert call.name.startswith("tools/call") and call.service == "mcpfleet-replica", call
    assert call.attributes["mcp.method.name"] == "tools/call"
    assert request.name == "POST /mcp" and request.attributes["mcpfleet.replica"] == replica
    return call


def _final(http: httpx.Client, url: str, task_id: str) -> dict[str, object]:
    def ended() -> dict[str, object] | None:
        got = task(http, url, "tasks/get", task_id)
        assert got.error is None, got.body
        return got.result if got.result["status"] in FINAL else None

    result: dict[str, object] = wait_for(ended, timeout=30, what="the task to end", interval=0.2)
    return result


def test_a_task_created_through_one_replica_and_run_on_another_is_linked_to_its_creation(
    fleet: ProcessFleet, receiver: Receiver, http: httpx.Client
) -> None:
    creator = sorted(fleet.members)[0]
    url = f"{fleet.members[creator].url}/mcp"
    for n in range(TRIES):
        task_id, trace_id = _traced_create(http, url, "double", {"n": n})
        assert _final(http, url, task_id)["status"] == "completed"
        (leg,) = wait_for(
            lambda t=trace_id: _legs_linked_to(receiver, t), timeout=15, what="the leg's span"
        )
        if leg.attributes["mcpfleet.replica"] != creator:
            break
    else:
        pytest.fail(f"{TRIES} tasks created through {creator} all ran on its own worker")
    ((linked_trace, linked_span),) = leg.links
    assert linked_trace == trace_id
    _creator(receiver, trace_id, linked_span, creator)
    # A trace of its own (the creation's request ended long before, perhaps): under
    # the queue's span of the execution, when the queue traces too.
    assert leg.trace_id != trace_id
    assert leg.kind == (PbSpan.SPAN_KIND_INTERNAL if leg.parent else PbSpan.SPAN_KIND_CONSUMER)
    assert leg.attributes["gen_ai.tool.name"] == "double"
    assert leg.attributes["mcpfleet.task.leg"] == 1
    assert leg.attributes["mcpfleet.task.outcome"] == "completed"
    _no_span_names(receiver, task_id)


def _no_span_names(receiver: Receiver, task_id: str) -> None:
    """No span names task ``task_id`` (the queue's execution keys are exported as
    digests) in its name, attributes, events or links."""
    with receiver.lock:
        leaked = [s for s in receiver.spans if task_id in s.exported_text()]
    assert leaked == [], leaked


def test_each_leg_of_a_task_answered_through_another_replica_links_to_the_same_creation(
    fleet: ProcessFleet, receiver: Receiver, http: httpx.Client
) -> None:
    names = sorted(fleet.members)
    creator, answerer = names[0], names[1]
    task_id, trace_id = _traced_create(
        http, f"{fleet.members[creator].url}/mcp", "confirm", {"tag": "traced"}
    )
    answer_url = f"{fleet.members[answerer].url}/mcp"

    def asking() -> dict[str, object] | None:
        got = task(http, answer_url, "tasks/get", task_id)
        assert got.error is None, got.body
        return got.result if got.result["status"] == "input_required" else None

    asked = wait_for(asking, timeout=15, what="the task to ask")
    (key,) = asked["inputRequests"]  # type: ignore[misc]
    answer = {key: {"action": "accept", "content": {"ok": True}}}
    updated = task(http, answer_url, "tasks/update", task_id, inputResponses=answer)
    assert updated.error is None, updated.body
    assert _final(http, answer_url, task_id)["status"] == "completed"
    legs = wait_for(
        lambda: got if len(got := _legs_linked_to(receiver, trace_id)) == 2 else None,
        timeout=15,
        what="both legs' spans",
    )
    ((_, linked_span),) = legs[0].links
    created = _creator(receiver, trace_id, linked_span, creator)
    by_leg = {s.attributes["mcpfleet.task.leg"]: s for s in legs}
    assert sorted(by_leg) == [1, 2], legs
    assert by_leg[1].attributes["mcpfleet.task.outcome"] == "input_required"
    assert by_leg[2].attributes["mcpfleet.task.outcome"] == "completed"
    for leg in legs:
        assert leg.links == ((trace_id, created.span_id),)
        assert leg.attributes["mcpfleet.replica"] in names
    _no_span_names(receiver, task_id)
