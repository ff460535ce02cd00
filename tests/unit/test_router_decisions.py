"""The router's pure decisions."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from mcpfleet.jsonbody import is_initialize, json_depth_exceeds, parses_as_json
from mcpfleet.router.decisions import (
    Candidate,
    OriginPolicy,
    RouteKind,
    cancellations,
    classify,
    forwardable_path,
    pick_stateless,
    place_session,
    refused_origin,
    session_ids,
    valid_session_id,
)

INIT = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}).encode()
CALL = json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {}}).encode()


@pytest.mark.parametrize(
    ("method", "headers", "body", "kind"),
    [
        ("POST", {"mcp-session-id": "abc"}, CALL, RouteKind.STICKY),
        ("GET", {"mcp-session-id": "abc"}, b"", RouteKind.STICKY),
        ("DELETE", {"mcp-session-id": "abc"}, b"", RouteKind.STICKY),
        ("POST", {}, INIT, RouteKind.INITIALIZE),
        ("POST", {}, b"[" + INIT + b"]", RouteKind.INITIALIZE),
        ("POST", {"mcp-protocol-version": "2026-07-28"}, CALL, RouteKind.STATELESS),
        ("POST", {"mcp-protocol-version": "2026-07-28"}, INIT, RouteKind.STATELESS),
        ("POST", {}, CALL, RouteKind.STATELESS),
        ("POST", {}, b"not json", RouteKind.STATELESS),
        ("GET", {}, b"", RouteKind.STATELESS),
    ],
)
def test_classify(method: str, headers: dict[str, str], body: bytes, kind: RouteKind) -> None:
    assert classify(method, headers, body) is kind


def test_is_initialize_ignores_garbage() -> None:
    assert not is_initialize(b"\xff\xfe")
    assert not is_initialize(b'"initialize"')
    assert not is_initialize(b'{"method": "tools/call"}')


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("7eaabf95e70c49f2a2edd12621ae1eba", True),
        ("a", True),
        ("x" * 128, True),
        ("x" * 129, False),
        ("", False),
        ("has space", False),
        ("tab\there", False),
        ("caf\u00e9", False),
        ("new\nline", False),
    ],
)
def test_session_id_validation(value: str, ok: bool) -> None:
    assert valid_session_id(value) is ok


def test_place_session_prefers_fewest_sessions_then_inflight_then_name() -> None:
    cands = [Candidate("b", 3, 0), Candidate("a", 3, 0), Candidate("c", 1, 9)]
    assert place_session(cands).name == "c"  # type: ignore[union-attr]
    cands = [Candidate("b", 2, 1), Candidate("a", 2, 1), Candidate("c", 2, 0)]
    assert place_session(cands).name == "c"  # type: ignore[union-attr]
    cands = [Candidate("b", 2, 1), Candidate("a", 2, 1)]
    assert place_session(cands).name == "a"  # type: ignore[union-attr]


def test_place_session_honours_the_cap() -> None:
    cands = [Candidate("a", 5, 0), Candidate("b", 4, 0)]
    assert place_session(cands, cap=5).name == "b"  # type: ignore[union-attr]
    assert place_session(cands, cap=4) is None
    assert place_session([]) is None


def test_pick_stateless_avoids_the_busiest_and_spreads() -> None:
    rng = random.Random(7)
    cands = [Candidate("idle", 0, 0), Candidate("busy", 0, 50), Candidate("mid", 0, 5)]
    picks = Counter(pick_stateless(cands, rng).name for _ in range(3000))  # type: ignore[union-attr]
    assert picks["busy"] == 0, "power of two choices never picks the worst of three"
    assert picks["idle"] > picks["mid"] > 0
    even = [Candidate(n, 0, 0) for n in "abc"]
    spread = Counter(pick_stateless(even, rng).name for _ in range(3000))  # type: ignore[union-attr]
    assert min(spread.values()) > 700
    assert pick_stateless([]) is None


def test_pick_stateless_shares_idle_replicas_evenly_whatever_their_sessions() -> None:
    """Sequential clients leave nothing in flight: session counts must not decide ties."""
    rng = random.Random(11)
    idle = [Candidate("few", 0, 0), Candidate("some", 40, 0), Candidate("many", 90, 0)]
    spread = Counter(pick_stateless(idle, rng).name for _ in range(3000))  # type: ignore[union-attr]
    assert min(spread.values()) > 850, spread


@pytest.mark.parametrize(
    ("body", "deep"),
    [
        (b"[" * 1100 + b"]" * 1100, True),
        (b"[" * 129 + b"]" * 129, True),
        (b"[" * 128 + b"]" * 128, False),
        (b'{"a": "' + b"[" * 5000 + b'"}', False),  # brackets inside a string do not nest
        (b'{"a": "\\"' + b"[" * 5000 + b'"}', False),  # nor after an escaped quote
        (INIT, False),
    ],
)
def test_json_depth_is_bounded_before_any_parse(body: bytes, deep: bool) -> None:
    assert json_depth_exceeds(body) is deep
    if deep:
        assert not parses_as_json(body)
        assert not is_initialize(body)
        assert classify("POST", {}, body) is RouteKind.STATELESS


def test_initialize_nested_just_under_the_bound_still_classifies() -> None:
    batch = b"[" + INIT + b"]"
    assert json_depth_exceeds(batch, limit=3) is False  # [ { "params": { } } ]
    assert json_depth_exceeds(batch, limit=2) is True
    assert is_initialize(batch)


@pytest.mark.parametrize("value", ["a,b", "7eaabf95e70c49f2a2edd12621ae1eba,deadbeef", ","])
def test_comma_joined_session_ids_are_refused(value: str) -> None:
    assert not valid_session_id(value)


def test_session_ids_lists_every_header_occurrence() -> None:
    raw = [(b"Mcp-Session-Id", b"A"), (b"accept", b"*/*"), (b"mcp-session-id", b"B")]
    assert session_ids(raw) == ["A", "B"]
    assert session_ids([(b"accept", b"*/*")]) == []


@pytest.mark.parametrize(
    ("bind", "host", "origin", "refused"),
    [
        ("127.0.0.1", "127.0.0.1:8000", None, None),
        ("127.0.0.1", "localhost:8000", "http://localhost:6274", None),
        ("127.0.0.1", "[::1]:8000", "http://[::1]:8000", None),
        ("127.0.0.1", "evil.example.com", None, "Host not allowed"),
        ("127.0.0.1", "127.0.0.1.evil.example.com:80", None, "Host not allowed"),
        ("127.0.0.1", "127.0.0.1:8000", "http://evil.example.com", "Origin not allowed"),
        ("127.0.0.1", None, None, "Host not allowed"),
        ("0.0.0.0", "mcpfleet-router.ns.svc:8000", None, None),
        ("0.0.0.0", "anything", "http://evil.example.com", "Origin not allowed"),
    ],
)
def test_origin_policy_refuses_rebinding(
    bind: str, host: str | None, origin: str | None, refused: str | None
) -> None:
    assert refused_origin(host, origin, OriginPolicy.for_bind(bind)) == refused


def test_configured_hosts_and_origins_replace_the_defaults() -> None:
    policy = OriginPolicy.for_bind(
        "0.0.0.0", hosts=["mcp.example.org", "router:*"], origins=["https://app.example.org"]
    )
    assert refused_origin("mcp.example.org", "https://app.example.org", policy) is None
    assert refused_origin("router:8000", None, policy) is None
    assert refused_origin("router:http", None, policy) == "Host not allowed"
    assert refused_origin("127.0.0.1:8000", None, policy) == "Host not allowed"


@pytest.mark.parametrize(
    "path",
    [
        b"/mcp",
        b"/mcp/",
        b"/.well-known/oauth-protected-resource/mcp",
        b"/.well-known/oauth-authorization-server",
    ],
)
def test_the_mcp_endpoint_and_oauth_metadata_are_forwarded(path: bytes) -> None:
    assert forwardable_path(path)


@pytest.mark.parametrize("endpoint", [b"metrics", b"readyz", b"healthz"])
@pytest.mark.parametrize(
    "form",
    [
        b"/%s",
        b"/./%s",
        b"/mcp/../%s",
        b"/mcp/./../%s",
        b"//%s",
        b"/%%2e/%s",
        b"/mcp/%%2e%%2e/%s",
        b"/mcp/%%2E%%2E/%s",
        b"/mcp%%2f..%%2f%s",
        b"/MCP/../%s",
        b"/.well-known/oauth-x/../../%s",
        b"/.well-known/oauth-x/%%2e%%2e/%s",
        b"/mcp/..;/%s",
        b"/mcp\\..\\%s",
    ],
)
def test_no_replica_endpoint_is_forwarded_in_any_spelling(form: bytes, endpoint: bytes) -> None:
    assert not forwardable_path(form % endpoint)


@pytest.mark.parametrize("path", [b"*", b"/mcp/x", b"/mcp?x", b"mcp", b"/mcp%20", b""])
def test_anything_else_is_not_forwarded(path: bytes) -> None:
    assert not forwardable_path(path)


def test_a_cancellation_is_sent_for_each_request_id_and_none_for_notifications() -> None:
    call = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {}}
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    one = json.loads(cancellations(json.dumps(call).encode()))
    assert one["method"] == "notifications/cancelled" and one["params"]["requestId"] == 7
    batch = json.loads(cancellations(json.dumps([call, note, {**call, "id": "x"}]).encode()))
    assert [n["params"]["requestId"] for n in batch] == [7, "x"]
    assert cancellations(json.dumps(note).encode()) == b""
    assert cancellations(b"not json") == b""
