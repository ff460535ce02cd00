"""Limits per principal on a real fleet: one user cannot take the fleet from the others.

Two replicas of ``ownapp`` (FastMCP's JWT auth, deploy/own-app) behind a router,
Redis, and two users, alice and bob, with tokens signed by the tests. The
limits come from a limits file the replicas watch (mcpfleet.limits), so a test
changes them without a restart. A second fleet, without auth, shows the
principal per client address and which ``X-Forwarded-For`` entry is trusted.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from fleetkit.clients.jwtkit import TokenIssuer
from fleetkit.clients.wire import MODERN, MODERN_META, initialize_body, modern_call
from fleetkit.fleet import FleetOptions, ProcessFleet, local_fleet, own_app_fleet
from mcpfleet.dev.wait import wait_for

from .conftest import shared

pytestmark = pytest.mark.fleet

JSON_SSE = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
#: The limits every test starts from (each test that changes them puts them back).
ORDER = {"item": "tea", "quantity": 1}
#: bob's pace (an Event never set: a timed pause that is not a sleep-for-a-condition).
BOB_PACE = threading.Event()
BOB_START = time.perf_counter()
BASE = {"sessions": 4, "rounds": {"rate": 20, "burst": 20}}


@pytest.fixture(scope="module")
def issuer() -> TokenIssuer:
    return TokenIssuer()


@pytest.fixture(scope="module")
def limits_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("limits") / "limits.json"
    path.write_text(json.dumps(BASE))
    return path


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory, issuer: TokenIssuer, limits_file: Path
) -> Iterator[ProcessFleet]:
    workdir = tmp_path_factory.mktemp("limits-auth")
    replica_args = ("--limits-file", str(limits_file))
    with own_app_fleet(workdir, issuer, replica_args=replica_args) as lf, shared(lf):
        yield lf


def set_limits(fleet: ProcessFleet, path: Path, doc: dict[str, Any]) -> None:
    """Write the limits file and wait until every replica logged reading it."""

    def reads() -> dict[str, int]:
        return {
            n: m.proc.log.read_text().count("read; in force now") for n, m in fleet.members.items()
        }

    before = reads()
    path.write_text(json.dumps(doc))
    wait_for(
        lambda: all(reads()[n] > before.get(n, 0) for n in fleet.members),
        timeout=10,
        what="every replica to read the new limits",
    )


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def initialize(http: httpx.Client, url: str, headers: dict[str, str]) -> httpx.Response:
    return http.post(url, content=initialize_body("limits-test"), headers={**JSON_SSE, **headers})


def at_cap(http: httpx.Client, url: str, who: dict[str, str]) -> list[httpx.Response]:
    """``who`` opens as many sessions as the base limits allow: each answered 200."""
    opened = [initialize(http, url, who) for _ in range(BASE["sessions"])]
    assert all(r.status_code == 200 for r in opened), [r.status_code for r in opened]
    return opened


def close_session(http: httpx.Client, url: str, session: str, headers: dict[str, str]) -> None:
    resp = http.delete(url, headers={**headers, "mcp-session-id": session})
    assert resp.status_code in (200, 204), resp.text


def assert_limited(resp: httpx.Response, limit: str) -> None:
    assert resp.status_code == 429, resp.text
    retry = int(resp.headers["retry-after"])
    assert retry >= 1
    error = resp.json()["error"]
    assert error["code"] == -32000
    assert error["data"] == {"limit": limit, "retryAfter": retry}, error


def test_a_principal_at_its_session_cap_is_refused_while_another_still_initializes(
    fleet: ProcessFleet, issuer: TokenIssuer
) -> None:
    alice, bob = bearer(issuer.token("alice")), bearer(issuer.token("bob"))
    with httpx.Client(timeout=10) as http:
        opened = []
        for _ in range(BASE["sessions"]):
            resp = initialize(http, fleet.url, alice)
            assert resp.status_code == 200, resp.text
            opened.append(resp.headers["mcp-session-id"])
        # Spread over both replicas by load: the cap holds fleet-wide, not per replica.
        over = initialize(http, fleet.url, alice)
        assert_limited(over, "sessions")
        assert "sessions" in over.json()["error"]["message"]
        resp = initialize(http, fleet.url, bob)
        assert resp.status_code == 200, resp.text
        close_session(http, fleet.url, resp.headers["mcp-session-id"], bob)
        # A session that ends gives its place back (at the replica's next renewal).
        close_session(http, fleet.url, opened.pop(), alice)
        again: list[httpx.Response] = []

        def reopened() -> bool:
            resp = initialize(http, fleet.url, alice)
            again.append(resp)
            return resp.status_code == 200

        wait_for(reopened, timeout=20, interval=1.0, what="alice's place to come back")
        opened.append(again[-1].headers["mcp-session-id"])
        for session in opened:
            close_session(http, fleet.url, session, alice)


def test_a_method_spelled_with_json_escapes_is_limited_like_any_other(
    fleet: ProcessFleet, issuer: TokenIssuer
) -> None:
    """JSON lets a client spell a key or a method name with ``\\u`` escapes, and the
    transport reads them as written plainly: an ``initialize`` spelled so takes a place
    in the principal's sessions (refused at the cap), and rounds spelled so are rated."""
    carol = bearer(issuer.token("carol"))  # her own places: no other test's are pending
    escaped_init = initialize_body("limits-test").replace('"initialize"', '"\\u0069nitialize"')
    assert "\\u0069nitialize" in escaped_init and json.loads(escaped_init)["method"] == "initialize"
    with httpx.Client(timeout=10) as http:
        opened = [r.headers["mcp-session-id"] for r in at_cap(http, fleet.url, carol)]
        over = http.post(fleet.url, content=escaped_init, headers={**JSON_SSE, **carol})
        for session in opened:
            close_session(http, fleet.url, session, carol)
        assert_limited(over, "sessions")
        call = {
            "jsonrpc": "2.0",
            "id": 1,
            "\\u006dethod": "tools/call",
            "params": {"name": "whoami", "arguments": {}, "_meta": MODERN_META},
        }
        body = json.dumps(call).replace("\\\\u006d", "\\u006d")
        assert json.loads(body)["method"] == "tools/call", body
        headers = {
            **JSON_SSE,
            **carol,
            "mcp-protocol-version": MODERN,
            "mcp-method": "tools/call",
            "mcp-name": "whoami",
        }
        statuses = [
            http.post(fleet.url, content=body, headers=headers).status_code for _ in range(60)
        ]
    assert statuses.count(200) >= 1 and statuses.count(429) >= 1, statuses


def rounds_p50(url: str, token: str, count: int) -> tuple[float, list[int]]:
    """bob's modern ``whoami`` rounds, ten a second (an interactive user, under his
    rate of 20/s): their p50 (ms) and statuses."""
    times, statuses = [], []
    with httpx.Client(timeout=10) as http:
        for i in range(count):
            pace = BOB_START + i * 0.1 - time.perf_counter()
            BOB_PACE.wait(max(0.0, pace % 0.1))  # the pace of a user, not a wait for a state
            started = time.perf_counter()
            answer = modern_call(url, "whoami", {}, client=http, headers=bearer(token))
            times.append((time.perf_counter() - started) * 1000)
            statuses.append(answer.status)
    return statistics.median(times), statuses


def test_a_flood_of_rounds_is_refused_with_retry_after_and_another_principal_is_unaffected(
    fleet: ProcessFleet, issuer: TokenIssuer
) -> None:
    alice, bob = issuer.token("alice"), issuer.token("bob")
    rounds_p50(fleet.url, bob, 10)  # warm connections and caches
    alone, statuses = rounds_p50(fleet.url, bob, 40)
    assert set(statuses) == {200}
    stop = threading.Event()
    seen: dict[int, int] = {}
    retry_afters: set[str] = set()

    def flood() -> None:
        with httpx.Client(timeout=10) as http:
            while not stop.is_set():
                answer = modern_call(fleet.url, "whoami", {}, client=http, headers=bearer(alice))
                seen[answer.status] = seen.get(answer.status, 0) + 1
                if answer.status == 429:
                    retry_afters.add(str(answer.body["error"]["data"]["retryAfter"]))

    threads = [threading.Thread(target=flood) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: seen.get(429, 0) > 50, timeout=20, what="alice's flood to be refused")
        during, statuses = rounds_p50(fleet.url, bob, 40)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    print(
        f"\nbob's p50 alone {alone:.1f} ms, during alice's flood {during:.1f} ms"
        f" (x{during / alone:.2f}); alice's answers {dict(sorted(seen.items()))}"
    )
    assert set(statuses) == {200}, "bob was refused"
    assert seen.get(200, 0) > 0 and seen.get(429, 0) > 0
    assert retry_afters and all(int(r) >= 1 for r in retry_afters)
    # Loose on purpose: the figure itself is make bench's (--flood-only); this holds
    # only that alice's flood does not take bob's latency with it (test_limits_refused
    # holds the 16-thread flood's within x3).
    assert during <= alone * 3 + 2.0, (alone, during)


def test_the_rate_holds_fleet_wide_and_a_tool_of_its_own_gets_its_tighter_rate(
    fleet: ProcessFleet, issuer: TokenIssuer, limits_file: Path
) -> None:
    set_limits(
        fleet,
        limits_file,
        {
            **BASE,
            "rounds": {"rate": 2, "burst": 10},
            "tools": {"place_order": {"rate": 1, "burst": 2}},
        },
    )
    try:
        carol = bearer(issuer.token("carol"))
        with httpx.Client(timeout=10) as http:
            statuses = [
                modern_call(fleet.url, "whoami", {}, client=http, headers=carol).status
                for _ in range(14)
            ]
            replicas = {
                modern_call(fleet.url, "whoami", {}, client=http, headers=carol).replica
                for _ in range(4)
            }
        # A burst of 10 (plus what 2/s refills while the calls run), both replicas serving.
        assert 10 <= statuses.count(200) <= 12, statuses
        assert statuses.count(429) >= 2, statuses
        dave = bearer(issuer.token("dave"))
        with httpx.Client(timeout=10) as http:
            orders = [
                modern_call(
                    fleet.url,
                    "place_order",
                    {"item": "tea", "quantity": 1},
                    client=http,
                    headers=dave,
                )
                for _ in range(4)
            ]
            other = modern_call(fleet.url, "whoami", {}, client=http, headers=dave)
        assert [a.status for a in orders].count(429) >= 1, [a.status for a in orders]
        refused = next(a for a in orders if a.status == 429)
        assert "place_order" in refused.body["error"]["message"]
        assert other.status == 200
        assert None not in replicas or len(replicas) >= 1
    finally:
        set_limits(fleet, limits_file, BASE)


def test_a_handshake_sessions_rounds_are_rated_too_and_answered_with_their_request_id(
    fleet: ProcessFleet, issuer: TokenIssuer, limits_file: Path
) -> None:
    set_limits(fleet, limits_file, {**BASE, "rounds": {"rate": 1, "burst": 3}})
    try:
        gina = bearer(issuer.token("gina"))
        with httpx.Client(timeout=10) as http:
            resp = initialize(http, fleet.url, gina)
            assert resp.status_code == 200, resp.text
            session = resp.headers["mcp-session-id"]
            headers = {
                **JSON_SSE,
                **gina,
                "mcp-session-id": session,
                "mcp-protocol-version": "2025-11-25",
            }
            note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
            assert http.post(fleet.url, json=note, headers=headers).status_code == 202
            answers = [
                http.post(
                    fleet.url,
                    json={"jsonrpc": "2.0", "id": 100 + i, "method": "tools/list"},
                    headers=headers,
                )
                for i in range(6)
            ]
            # Notifications are never refused, even past the rate.
            assert http.post(fleet.url, json=note, headers=headers).status_code == 202
            close_session(http, fleet.url, session, gina)
        statuses = [a.status_code for a in answers]
        # The initialize was a round of the burst of 3: two more, then refused.
        assert statuses[:2] == [200, 200] and 429 in statuses, statuses
        refused = next(a for a in answers if a.status_code == 429)
        assert_limited(refused, "rounds")
        assert refused.json()["id"] == 100 + statuses.index(429)
    finally:
        set_limits(fleet, limits_file, BASE)


def test_counts_come_back_right_after_redis_restarts_empty(
    fleet: ProcessFleet, issuer: TokenIssuer
) -> None:
    erin = bearer(issuer.token("erin"))
    with httpx.Client(timeout=10) as http:
        at_cap(http, fleet.url, erin)
        fleet.stop_redis()
        fleet.start_redis()
        client = redis.Redis.from_url(fleet.redis_url)

        def renewed() -> bool:
            keys = client.keys("mcpfleet:*:limit:sessions:*")
            return any(client.zcard(k) == BASE["sessions"] for k in keys)

        # Each replica renews its sessions' places every 10 s, re-adding what Redis lost.
        wait_for(renewed, timeout=25, interval=0.5, what="the places renewed after the restart")
        client.close()
        # The router lost its routes with Redis: the sessions may be gone for the
        # client too. What matters here: the count is right again, erin stays capped.
        over = initialize(http, fleet.url, erin)
        assert_limited(over, "sessions")


def test_a_killed_replicas_sessions_give_their_places_back_within_the_lease(
    fleet: ProcessFleet, issuer: TokenIssuer
) -> None:
    frank = bearer(issuer.token("frank"))
    with httpx.Client(timeout=10) as http:
        opened = at_cap(http, fleet.url, frank)
        owners = {r.headers.get("x-mcpfleet-replica") for r in opened}
        victim = sorted(o for o in owners if o)[0]
        held_there = sum(1 for r in opened if r.headers.get("x-mcpfleet-replica") == victim)
        assert_limited(initialize(http, fleet.url, frank), "sessions")
        fleet.kill(victim)
        try:
            started = time.monotonic()
            wait_for(
                lambda: initialize(http, fleet.url, frank).status_code == 200,
                timeout=45,
                interval=1.0,
                what="the killed replica's places to lapse",
            )
            print(
                f"\n{held_there} place(s) of a SIGKILLed replica came back after"
                f" {time.monotonic() - started:.1f} s"
            )
        finally:
            fleet.add_replica(victim)


@pytest.fixture(scope="module")
def open_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessFleet]:
    workdir = tmp_path_factory.mktemp("limits-open")
    options = FleetOptions(replicas=1, replica_args=("--limit-sessions", "2"))
    with local_fleet(workdir, options) as lf, shared(lf):
        yield lf


def test_unauthenticated_clients_count_per_address_and_a_forged_forwarded_for_is_ignored(
    open_fleet: ProcessFleet,
) -> None:
    url = open_fleet.url
    replica = f"http://127.0.0.1:{next(iter(open_fleet.members.values())).port}/mcp"
    with httpx.Client(timeout=10) as http:
        # Through the router: each forged X-Forwarded-For is ignored, the router's
        # entry (127.0.0.1) counts: the third session is refused.
        got = [initialize(http, url, {"x-forwarded-for": f"10.9.0.{i}"}) for i in range(3)]
        assert [r.status_code for r in got[:2]] == [200, 200]
        assert_limited(got[2], "sessions")
        # Straight to the replica, which trusts one proxy (the router's place): the
        # entry that proxy would have written names the client, one principal each.
        for i in range(3):
            resp = initialize(http, replica, {"x-forwarded-for": f"198.51.100.7, 10.8.0.{i}"})
            assert resp.status_code == 200, resp.text
