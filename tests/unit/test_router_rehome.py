"""The re-home helpers of the router (mcpfleet.router.route, .gone, .reinit), without I/O."""

from __future__ import annotations

import json

from mcpfleet.router.gone import answers_gone_work
from mcpfleet.router.reinit import INIT_LIMIT, InitRecord, initialize_params
from mcpfleet.router.route import SessionRoute, swap_session


def init_body(**params: object) -> bytes:
    return json.dumps(
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params}
    ).encode()


def test_initialize_params_keep_only_what_reopens_a_session() -> None:
    body = init_body(
        protocolVersion="2025-11-25",
        capabilities={"elicitation": {"form": {}}},
        clientInfo={"name": "c", "version": "1"},
        _meta={"secret": "not kept"},
    )
    assert initialize_params(body) == {
        "protocolVersion": "2025-11-25",
        "capabilities": {"elicitation": {"form": {}}},
        "clientInfo": {"name": "c", "version": "1"},
    }


def test_garbage_batches_and_oversized_parameters_are_not_kept() -> None:
    assert initialize_params(b"not json") is None
    assert initialize_params(b"[" + init_body(protocolVersion="2025-11-25") + b"]") is None
    assert initialize_params(init_body(capabilities={})) is None, "no protocol version"
    huge = init_body(protocolVersion="2025-11-25", clientInfo={"name": "x" * INIT_LIMIT})
    assert initialize_params(huge) is None


def test_a_stored_record_round_trips_and_garbage_reads_as_absent() -> None:
    record = InitRecord({"protocolVersion": "2025-11-25"}, "abc")
    assert InitRecord.from_json(record.to_json()) == record
    assert InitRecord.from_json(record.to_json().encode()) == record
    for raw in (None, "", "[]", "{}", '{"params": [], "principal": ""}', "x" * (INIT_LIMIT * 2)):
        assert InitRecord.from_json(raw) is None, raw


def test_a_route_names_the_owner_and_for_a_rehomed_session_its_own_id() -> None:
    assert SessionRoute.from_redis(SessionRoute("replica-0").to_redis()) == SessionRoute(
        "replica-0"
    )
    assert SessionRoute.from_redis(SessionRoute("r1", "abc123").to_redis()) == SessionRoute(
        "r1", "abc123"
    )


def test_a_route_is_stored_as_every_router_of_the_fleet_reads_and_writes_it() -> None:
    """The stored form is shared with routers of other versions (a rolling upgrade):
    the owner alone, or the owner, one space and the owner's own id."""
    assert SessionRoute("replica-0").to_redis() == "replica-0"
    assert SessionRoute("r1", "abc123").to_redis() == "r1 abc123"
    assert SessionRoute.from_redis(b"replica-0") == SessionRoute("replica-0", None)
    assert SessionRoute.from_redis("r1 abc123") == SessionRoute("r1", "abc123")
    assert SessionRoute.from_redis(b"r1 abc123") == SessionRoute("r1", "abc123")


def test_answers_and_cancellations_mark_work_of_the_gone_owner() -> None:
    answer = {"jsonrpc": "2.0", "id": 3, "result": {"action": "accept"}}
    error = {"jsonrpc": "2.0", "id": 3, "error": {"code": -1, "message": "no"}}
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}}
    ping = {"jsonrpc": "2.0", "id": 4, "method": "ping"}
    for body in (answer, error, cancel, [ping, answer]):
        assert answers_gone_work(json.dumps(body).encode()), body
    assert not answers_gone_work(json.dumps(ping).encode())
    assert not answers_gone_work(b"garbage")


def test_the_session_header_is_swapped_and_nothing_else() -> None:
    raw = [(b"Mcp-Session-Id", b"old"), (b"authorization", b"Bearer t"), (b"x-other", b"old")]
    assert swap_session(raw, "old", "new") == [
        (b"Mcp-Session-Id", b"new"),
        (b"authorization", b"Bearer t"),
        (b"x-other", b"old"),
    ]
