"""The sticky router under failure: dead owners, Redis outages, several routers."""

from __future__ import annotations

import asyncio
import http.client
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
import redis

from fleetkit.clients.traffic import Traffic
from fleetkit.clients.wire import MODERN, MODERN_META, accept, initialize_body, modern_call
from fleetkit.fleet import FleetOptions, ProcessFleet, local_fleet
from mcpfleet.contract import REPLICA_HEADER, ROUTER_ERROR_HEADER, RedisKeys
from mcpfleet.dev.wait import wait_for
from mcpfleet.fleetclient import Trace, connect, default_answer

from .conftest import watched

HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
LIST = json.dumps({"jsonrpc": "2.0", "id": 9, "method": "tools/list", "params": {}})


@pytest.fixture
def fresh_fleet(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ProcessFleet]:
    with local_fleet(tmp_path, FleetOptions(routers=2)) as lf, watched(request, lf):
        yield lf


class Person:
    """An elicitation answerer that stops at a question until released."""

    def __init__(self, stop_at: str) -> None:
        self.stop_at = stop_at
        self.asked = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, message: str, schema: dict[str, Any]) -> Any:
        if self.stop_at in message:
            self.asked.set()
            await self.release.wait()
        return default_answer(message, schema)


def _sessions(trace: Trace) -> set[str]:
    return {r.session for r in trace.rounds if r.session}


async def test_owner_killed_mid_elicitation_gives_404_fast_then_a_new_session_completes(
    fresh_fleet: ProcessFleet,
) -> None:
    lf = fresh_fleet
    person = Person("How many minutes")
    trace = Trace()
    client = connect(lf.url, "handshake", trace, answer=person, timeout=10)
    failed: BaseException | None = None
    async with client:
        call = asyncio.create_task(client.call_tool("plan_meeting", {"topic": "Doomed"}))
        await asyncio.wait_for(person.asked.wait(), 30)
        (owner,) = trace.replicas()
        (session,) = _sessions(trace)
        killed = time.monotonic()
        await asyncio.to_thread(lf.kill, owner)
        async with httpx.AsyncClient(timeout=5) as raw:
            resp = await raw.post(
                lf.url, content=LIST, headers={**HEADERS, "mcp-session-id": session}
            )
        first_404 = time.monotonic() - killed
        assert resp.status_code == 404, resp.text
        assert resp.json()["error"]["message"] == "Session not found"
        assert first_404 < 2.0, f"owner death to 404 took {first_404:.2f}s"
        person.release.set()
        try:
            await asyncio.wait_for(call, 30)
        except Exception as exc:  # the paused tool died with its replica
            failed = exc
    assert failed is not None, "the call cannot complete: its replica is gone"
    # The router dropped the entry: every router now answers 404 for it.
    for i in range(2):
        resp = httpx.post(
            lf.router_url(i),
            content=LIST,
            timeout=5,
            headers={**HEADERS, "mcp-session-id": session},
        )
        assert resp.status_code == 404
    # The client re-initializes and completes on a surviving replica.
    retry = Trace()
    async with connect(lf.url, "handshake", retry) as again:
        result = await again.call_tool("plan_meeting", {"topic": "Doomed"})
    assert str(result.data).startswith("Planned 'Doomed'")
    assert owner not in retry.replicas() and len(retry.replicas()) == 1
    metrics = httpx.get(lf.url.replace("/mcp", "/metrics"), timeout=2).text
    assert 'mcpfleet_router_owner_gone_total{reason="refused"}' in metrics
    assert 'mcpfleet_router_requests_total{outcome="owner_gone",route="sticky"}' in metrics
    print(f"owner death to first 404: {first_404 * 1000:.0f} ms")


def _round_on(conn: http.client.HTTPConnection, port: int) -> http.client.HTTPResponse:
    """A modern round's first call on ``conn`` (one TCP connection, kept alive), read whole."""
    params = {"name": "book_flight", "arguments": {"destination": "Oslo"}, "_meta": MODERN_META}
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params})
    modern = {"mcp-protocol-version": MODERN, "mcp-method": "tools/call", "mcp-name": "book_flight"}
    conn.request(
        "POST", "/mcp", body=body, headers={**HEADERS, **modern, "host": f"127.0.0.1:{port}"}
    )
    resp = conn.getresponse()
    resp.read()
    return resp


def test_sigterm_closes_each_keepalive_connection_after_an_answer_then_the_router_exits(
    tmp_path: Path,
) -> None:
    """SIGTERM: for --drain-linger seconds the router still answers, each answer with
    Connection: close (the client's next request goes out on a new connection, to a
    router that stays), /readyz says 503; then it shuts down and exits 0."""
    linger = 3.0
    options = FleetOptions(routers=2, router_args=("--drain-linger", str(linger)))
    with local_fleet(tmp_path, options) as lf:
        port = lf.router_ports[0]
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            first = _round_on(conn, port)
            assert first.status == 200 and first.getheader("connection") is None
            kept = conn.sock
            assert kept is not None, "the connection is kept alive before SIGTERM"
            assert _round_on(conn, port).status == 200 and conn.sock is kept
            signal_at = time.monotonic()
            lf.router_procs[0].signal(signal.SIGTERM)
            wait_for(
                lambda: httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 503,
                timeout=linger,
                what="router-0's /readyz to say 503 once SIGTERMed",
            )
            ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).json()
            assert ready["closing"] is True
            # The same connection, still open: answered, then closed by the router.
            assert conn.sock is kept
            answer = _round_on(conn, port)
            assert time.monotonic() - signal_at < linger, "answered within the linger"
            assert answer.status == 200 and answer.getheader("connection") == "close"
            assert conn.sock is None, "http.client closes a connection answered with close"
        finally:
            conn.close()
        # The other router serves on; router-0 exits by itself, after the linger.
        assert modern_call(lf.router_url(1), "book_flight", {"destination": "Oslo"}).status == 200
        code = lf.router_procs[0].wait(linger + 10)
        assert code == 0, f"router-0 exited with {code}:\n{lf.router_procs[0].tail()}"
        assert time.monotonic() - signal_at >= linger


async def test_a_session_alternating_between_two_routers_completes(
    fresh_fleet: ProcessFleet,
) -> None:
    lf = fresh_fleet
    urls = [httpx2.URL(lf.router_url(0)), httpx2.URL(lf.router_url(1))]
    turn = {"n": 0}
    used: list[int] = []

    async def alternate(request: httpx2.Request) -> None:
        target = urls[turn["n"] % 2]
        used.append(target.port or 0)
        turn["n"] += 1
        request.url = request.url.copy_with(port=target.port)
        request.headers["host"] = f"127.0.0.1:{target.port}"

    trace = Trace()
    async with connect(lf.url, "handshake", trace, request_hook=alternate) as client:
        result = await client.call_tool("plan_meeting", {"topic": "Relay"})
    assert str(result.data).startswith("Planned 'Relay'")
    assert len(set(used)) == 2 and len(used) >= 6
    assert len(trace.replicas()) == 1, "both routers sent the session to its owner"


async def test_redis_outage_keeps_sessions_and_modern_rounds_flowing(
    fresh_fleet: ProcessFleet,
) -> None:
    lf = fresh_fleet
    keys = RedisKeys(lf.fleet)

    # Sessions opened before the outage, paused at a question.
    people = [Person("How many minutes") for _ in range(4)]
    traces = [Trace() for _ in people]
    clients = [
        connect(lf.url, "handshake", t, answer=p) for t, p in zip(traces, people, strict=True)
    ]
    for c in clients:
        await c.__aenter__()
    calls = [
        asyncio.create_task(c.call_tool("plan_meeting", {"topic": f"S{i}"}))
        for i, c in enumerate(clients)
    ]
    await asyncio.wait_for(asyncio.gather(*(p.asked.wait() for p in people)), 30)
    load = Traffic()
    # A flow without once=True: a once-flow fails closed while Redis
    # is down (asserted below), everything else must keep flowing.
    load.modern(lf.url, "create_task", {"project": "ops"}, "Created normal task")
    try:
        await asyncio.to_thread(lf.stop_redis)
        outage = time.monotonic()
        await asyncio.to_thread(
            wait_for,
            lambda: httpx.get(lf.url.replace("/mcp", "/readyz"), timeout=1).json()["degraded"],
            timeout=10,
            what="the router to report degraded",
            retry_on=(Exception,),
        )
        # Cached sessions keep routing: half of them finish during the outage.
        for p in people[:2]:
            p.release.set()
        done = await asyncio.wait_for(asyncio.gather(*calls[:2]), 30)
        assert all(str(r.data).startswith("Planned") for r in done)
        # A new session during the outage is placed from the last known replica set.
        during = Trace()
        async with connect(lf.url, "handshake", during) as c:
            fresh = await c.call_tool("confirm_purchase", {"item": "cup", "amount_eur": 1})
        assert str(fresh.data).startswith("Purchased")
        (opened_during,) = _sessions(during)
        metrics = httpx.get(lf.url.replace("/mcp", "/metrics"), timeout=2).text
        assert "mcpfleet_router_degraded 1.0" in metrics
        while time.monotonic() - outage < 10:
            await asyncio.sleep(0.2)
        ok_during = [r for r in load.rounds if r.at > outage]
        assert len(ok_during) > 20, "modern rounds kept completing while Redis was down"
        # A once-flow's final round fails closed: the retryable error, nothing purchased.
        args = {"item": "vase", "amount_eur": 9}
        first = await asyncio.to_thread(modern_call, lf.url, "confirm_purchase", args)
        assert first.result.get("resultType") == "input_required", first.body
        closed = await asyncio.to_thread(
            modern_call,
            lf.url,
            "confirm_purchase",
            args,
            request_state=first.result["requestState"],
            input_responses={"ok": accept(True)},
        )
        assert closed.error is not None and closed.error["data"]["retryable"], closed.body

        await asyncio.to_thread(lf.start_redis)  # back, and empty
        await asyncio.to_thread(
            wait_for,
            lambda: len(lf.attestations()) == 3,
            timeout=15,
            what="every replica to re-register",
            retry_on=(Exception,),
        )
        await asyncio.to_thread(
            wait_for,
            lambda: not httpx.get(lf.url.replace("/mcp", "/readyz"), timeout=1).json()["degraded"],
            timeout=15,
            what="the router to recover",
            retry_on=(Exception,),
        )
        for p in people[2:]:
            p.release.set()
        rest = await asyncio.wait_for(asyncio.gather(*calls[2:]), 30)
        assert all(str(r.data).startswith("Planned") for r in rest)
        # Sessions this router knew were written back, so the other router routes them too.
        client = redis.Redis(port=lf.redis_port)
        try:
            for t in traces[2:]:
                (sid,) = _sessions(t)
                key = keys.session(sid)
                await asyncio.to_thread(
                    wait_for,
                    lambda key=key: client.get(key) is not None,
                    timeout=10,
                    what=f"session {sid[:8]} back in Redis",
                    retry_on=(Exception,),
                )
        finally:
            client.close()
        resp = httpx.post(
            lf.router_url(1),
            content=LIST,
            timeout=5,
            headers={**HEADERS, "mcp-session-id": next(iter(_sessions(traces[3])))},
        )
        assert resp.status_code == 200
        del opened_during
    finally:
        await load.stop()
        for c in clients:
            await c.__aexit__(None, None, None)
    assert load.failures == []


# Under this load the third-party MCP client now and then drops a finished HTTP
# connection without closing it; that ResourceWarning is the client's, not the fleet's.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.timeout(300)
async def test_two_hundred_concurrent_handshake_sessions(fresh_fleet: ProcessFleet) -> None:
    lf = fresh_fleet
    statuses: list[int] = []

    async def one(i: int) -> str:
        trace = Trace()
        try:
            async with connect(lf.router_url(i % 2), "handshake", trace, timeout=120) as c:
                result = await c.call_tool("confirm_purchase", {"item": f"n{i}", "amount_eur": 1})
        except Exception:
            for r in trace.rounds:
                print(
                    f"session {i}: {r.method} {r.rpc} -> {r.status} by {r.replica} "
                    f"({(r.session or '')[:8]})"
                )
            raise
        statuses.extend(r.status for r in trace.rounds)
        assert len(trace.replicas()) == 1
        return str(result.data)

    results = await asyncio.gather(*(one(i) for i in range(200)))
    assert all(r.startswith("Purchased") for r in results)
    assert 404 not in statuses, "no live session was ever 'not found'"
    per_replica = {n: a.sessions for n, a in lf.attestations().items()}
    assert len(per_replica) == 3


def test_a_deleted_session_leaves_the_routing_table(fresh_fleet: ProcessFleet) -> None:
    lf = fresh_fleet
    trace = Trace()

    async def run() -> None:
        async with connect(lf.url, "handshake", trace) as c:
            await c.call_tool("confirm_purchase", {"item": "mug", "amount_eur": 4})

    asyncio.run(run())
    (sid,) = _sessions(trace)
    assert any(r.method == "DELETE" for r in trace.rounds)
    client = redis.Redis(port=lf.redis_port)
    try:
        assert client.get(RedisKeys(lf.fleet).session(sid)) is None
    finally:
        client.close()


def test_a_session_of_another_fleet_is_not_found(fresh_fleet: ProcessFleet) -> None:
    lf = fresh_fleet
    client = redis.Redis(port=lf.redis_port)
    try:
        client.set(RedisKeys("otherfleet").session("feedfacefeedface"), "replica-0")
    finally:
        client.close()
    resp = httpx.post(
        lf.url, content=LIST, timeout=5, headers={**HEADERS, "mcp-session-id": "feedfacefeedface"}
    )
    assert resp.status_code == 404
    assert resp.headers.get(ROUTER_ERROR_HEADER) == "1", "the router answered"
    assert REPLICA_HEADER not in resp.headers, "no replica was asked"


def test_unknown_protocol_version_is_answered_and_nothing_else_is_disturbed(
    fresh_fleet: ProcessFleet,
) -> None:
    lf = fresh_fleet
    resp = httpx.post(
        lf.url, content=LIST, timeout=5, headers={**HEADERS, "mcp-protocol-version": "1999-01-01"}
    )
    assert resp.status_code == 400
    assert "error" in resp.json()
    answer = modern_call(lf.url, "confirm_purchase", {"item": "pen", "amount_eur": 2})
    assert answer.status == 200


def test_session_cap_turns_new_sessions_away_with_retry_after(tmp_path: Path) -> None:
    init = initialize_body("cap")
    with local_fleet(tmp_path, FleetOptions(replicas=2, router_args=("--session-cap", "2"))) as lf:
        owners = []
        for _ in range(4):
            resp = httpx.post(lf.url, content=init, headers=HEADERS, timeout=5)
            assert resp.status_code == 200
            owners.append(resp.headers["x-mcpfleet-replica"])
        assert sorted(owners) == ["replica-0", "replica-0", "replica-1", "replica-1"]
        full = httpx.post(lf.url, content=init, headers=HEADERS, timeout=5)
        assert full.status_code == 503
        assert full.headers["retry-after"] == "1"
        assert full.json()["error"]["message"] == "All replicas are at their session cap"
        # Stateless traffic is not capped.
        assert modern_call(lf.url, "confirm_purchase", {"item": "a", "amount_eur": 1}).status == 200


def test_replicas_restarted_on_new_ports_serve_before_the_routers_next_registry_read(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Every replica SIGKILLed and started again under its name on a new port: the
    router's view still holds the dead addresses (its periodic read is a minute
    away here). The first refused connection makes it read the registry at once,
    so the next request is served, not answered 503 "No serving replica"."""
    options = FleetOptions(replicas=2, router_args=("--refresh-interval", "60"))
    with local_fleet(tmp_path, options) as lf, watched(request, lf):
        before = {name: member.port for name, member in lf.members.items()}
        for name in before:
            lf.kill(name)
        for name in before:
            lf.add_replica(name, wait=False)
        for name in before:
            lf.wait_replica(name)
        wait_for(
            lambda: all(
                att.address.endswith(f":{lf.members[n].port}")
                for n, att in lf.attestations().items()
            ),
            timeout=30,
            what="the registry to hold the new ports",
        )
        assert all(lf.members[n].port != port for n, port in before.items())
        stateless = modern_call(lf.url, "confirm_purchase", {"item": "pen", "amount_eur": 2})
        assert stateless.status == 200, stateless
        assert stateless.replica in before
        resp = httpx.post(
            lf.url, content=initialize_body("after-restart"), headers=HEADERS, timeout=10
        )
        assert resp.status_code == 200, resp.text
        assert resp.headers.get("mcp-session-id")
        metrics = httpx.get(f"{lf.url.rsplit('/', 1)[0]}/metrics", timeout=5).text
        assert 'mcpfleet_router_resends_total{reason="refused"}' in metrics, metrics
