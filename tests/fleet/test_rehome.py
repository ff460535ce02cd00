"""Session re-homing (router ``--rehome-sessions``, docs/rehome.md) with real processes.

Clients here never re-initialize (:mod:`fleetkit.clients.rawsession`): they keep their
``Mcp-Session-Id`` whatever happens. An idle session whose replica is gone
(drained in a rolling restart, or SIGKILLed) answers its next request on its
old id through a live replica; a session with an elicitation pending when its
replica went gets the spec's 404 and is never re-homed; another principal's
request on a gone replica's session gets the 404 and changes nothing.

One fleet with the mode on is shared by the module's scenarios (each leaves
three serving replicas); the fleet with the mode off lives for one test.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fleetkit.clients.jwtkit import TokenIssuer
from fleetkit.clients.rawsession import RawSession, bounded, metric_sum, open_sessions
from fleetkit.fleet import FleetOptions, ProcessFleet, local_fleet
from mcpfleet.dev.ports import free_port
from mcpfleet.dev.wait import wait_for

from .conftest import shared, watched

pytestmark = pytest.mark.fleet

OWN_APP = Path(__file__).resolve().parents[2] / "deploy" / "own-app"
#: A drain waits this long for work in flight (a pending elicitation) before the replica exits.
DRAIN_TIMEOUT = "3"
ON = FleetOptions(
    fleet="rehome",
    router_args=("--rehome-sessions",),
    replica_args=("--drain-handover", "--drain-timeout", DRAIN_TIMEOUT),
)
OFF = FleetOptions(fleet="plain", replica_args=("--drain-timeout", DRAIN_TIMEOUT))
REHOMED = "mcpfleet_router_sessions_rehomed_total"
LOST = "mcpfleet_router_sessions_lost_total"

_generation = itertools.count(1)


@pytest.fixture(scope="module")
def on_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessFleet]:
    with local_fleet(tmp_path_factory.mktemp("rehome-on"), ON) as lf, shared(lf):
        yield lf


@pytest.fixture
def off_fleet(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ProcessFleet]:
    with local_fleet(tmp_path, OFF) as lf, watched(request, lf):
        yield lf


def router_metrics(lf: ProcessFleet) -> str:
    return httpx.get(f"http://127.0.0.1:{lf.router_ports[0]}/metrics", timeout=5).text


def router_replicas(lf: ProcessFleet) -> dict[str, str]:
    resp = httpx.get(lf.url.replace("/mcp", "/readyz"), timeout=2)
    return dict(resp.json()["replicas"])


def live(lf: ProcessFleet) -> list[str]:
    return [name for name, m in lf.members.items() if m.proc.alive]


def replace(lf: ProcessFleet, old: str, *, drain: bool = True) -> None:
    """Start a replacement for ``old`` and wait until the router routes to it; then
    (``drain``) SIGTERM ``old`` and wait for its exit."""
    new = f"r{next(_generation)}"
    lf.add_replica(new)
    wait_for(
        lambda: router_replicas(lf).get(new) == "serving",
        timeout=15,
        what=f"the router to route to {new}",
        retry_on=(httpx.HTTPError, ValueError, KeyError),
    )
    if drain:
        lf.drain(old)
        assert lf.members[old].proc.wait(30) is not None, f"{old} did not exit within 30 s"


def restart_all(lf: ProcessFleet) -> None:
    """Every replica replaced at once: the new ones ready, then the old ones drained."""
    old = live(lf)
    new = [f"r{next(_generation)}" for _ in old]
    for name in new:
        lf.add_replica(name, wait=False)
    for name in new:
        lf.wait_replica(name)
    wait_for(
        lambda: all(router_replicas(lf).get(n) == "serving" for n in new),
        timeout=15,
        what="the router to route to the new replicas",
        retry_on=(httpx.HTTPError, ValueError, KeyError),
    )
    for name in old:
        lf.drain(name)
    for name in old:
        assert lf.members[name].proc.wait(30) is not None, f"{name} did not exit within 30 s"


def roll(lf: ProcessFleet) -> float:
    """A rolling restart of every replica (as a Deployment's: the new one ready,
    then the old one drained); the seconds it took."""
    started = time.monotonic()
    for old in live(lf):
        replace(lf, old)
    return time.monotonic() - started


async def idle_sessions_through_a_rollout(
    lf: ProcessFleet, count: int
) -> tuple[Counter[int], int, float]:
    """``count`` idle sessions, a rolling restart, then one request on each:
    (statuses, answers that carried the session's own id, rollout seconds)."""
    async with httpx.AsyncClient(timeout=30) as http:
        sessions = await open_sessions(lf.url, http, count)
        took = await asyncio.to_thread(roll, lf)
        answers = await bounded(sessions, lambda s: s.ping())
        again = await bounded(sessions, lambda s: s.ping())
    statuses = Counter(a.status_code for a in answers)
    same_id = sum(
        1
        for s, a in zip(sessions, answers, strict=True)
        if a.status_code == 200 and a.headers.get("mcp-session-id", s.session) == s.session
    )
    if statuses[200] == count:
        assert Counter(a.status_code for a in again) == {200: count}, "a re-homed session broke"
    return statuses, same_id, took


async def test_rolling_restart_idle_sessions_answer_on_their_old_id_with_rehoming_and_404_without(
    on_fleet: ProcessFleet, off_fleet: ProcessFleet
) -> None:
    count = 100
    before = metric_sum(router_metrics(on_fleet), REHOMED)
    on_statuses, on_kept, on_took = await idle_sessions_through_a_rollout(on_fleet, count)
    off_statuses, _, off_took = await idle_sessions_through_a_rollout(off_fleet, count)
    rehomed = metric_sum(router_metrics(on_fleet), REHOMED) - before
    print(
        f"\n{count} idle sessions of a client that never re-initializes, 3 replicas rolled:"
        f"\n  rehoming on : {on_kept}/{count} answered on their old id,"
        f" statuses {dict(on_statuses)}, {rehomed:.0f} re-homed, rollout {on_took:.1f} s"
        f"\n  rehoming off: {off_statuses[404]}/{count} got 404, statuses {dict(off_statuses)},"
        f" rollout {off_took:.1f} s"
    )
    assert on_kept == count, on_statuses
    assert rehomed == count
    assert off_statuses == {404: count}


async def test_sessions_with_an_elicitation_pending_at_a_restart_get_404_and_are_never_rehomed(
    on_fleet: ProcessFleet,
) -> None:
    lf = on_fleet
    text = router_metrics(lf)
    rehomed_before, lost_before = metric_sum(text, REHOMED), metric_sum(text, LOST)
    async with httpx.AsyncClient(timeout=30) as http:
        sessions = await open_sessions(lf.url, http, 10)
        pending = await bounded(
            sessions,
            lambda s: s.start_elicitation("confirm_purchase", {"item": "tea", "amount_eur": 3}),
        )
        try:
            await asyncio.to_thread(restart_all, lf)
            # Half answer their elicitation first, half send a new request first.
            first = await bounded(
                list(zip(sessions, pending, strict=True)),
                lambda sp: (
                    sp[0].answer(sp[1].request_id, {"confirm": True})
                    if sessions.index(sp[0]) % 2
                    else sp[0].ping()
                ),
            )
            then = await bounded(sessions, lambda s: s.ping())
        finally:
            for call in pending:
                await call.aclose()
    text = router_metrics(lf)
    print(
        f"\n10 sessions with a pending elicitation through a restart: first requests "
        f"{Counter(r.status_code for r in first)}, lost by reason "
        + str(
            {
                r: metric_sum(text, LOST, reason=r)
                for r in ("answer_orphaned", "request_broke", "in_flight", "drain_deadline")
            }
        )
    )
    assert [r.status_code for r in first] == [404] * 10
    assert [r.status_code for r in then] == [404] * 10
    assert metric_sum(text, REHOMED) == rehomed_before
    assert metric_sum(text, LOST) - lost_before == 10


async def test_idle_sessions_of_a_sigkilled_replica_are_rehomed_and_a_get_stream_reconnects(
    on_fleet: ProcessFleet,
) -> None:
    lf = on_fleet
    before = metric_sum(router_metrics(lf), REHOMED)
    async with httpx.AsyncClient(timeout=30) as http:
        sessions = await open_sessions(lf.url, http, 12)
        victim = Counter(s.replica for s in sessions).most_common(1)[0][0]
        on_victim = [s for s in sessions if s.replica == victim]
        lf.kill(victim)
        # The first request after the kill is a GET stream: it re-homes the session.
        stream_session = on_victim[0]
        async with http.stream(
            "GET",
            lf.url,
            headers={
                "accept": "text/event-stream",
                "mcp-session-id": stream_session.session,
                "mcp-protocol-version": "2025-11-25",
            },
        ) as stream:
            assert stream.status_code == 200
            assert stream.headers["content-type"].startswith("text/event-stream")
            assert stream.headers.get("mcp-session-id", stream_session.session) == (
                stream_session.session
            )
        answers = await bounded(sessions, lambda s: s.ping())
    assert Counter(a.status_code for a in answers) == {200: len(sessions)}
    assert metric_sum(router_metrics(lf), REHOMED) - before == len(on_victim)
    await asyncio.to_thread(replace, lf, victim, drain=False)  # three serving again


@pytest.fixture
def auth_fleet(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[ProcessFleet, TokenIssuer]]:
    issuer = TokenIssuer()
    key = issuer.write_public_key(tmp_path / "jwt-public.pem")
    port = free_port()
    env = {**issuer.app_env(key, f"http://127.0.0.1:{port}"), "PYTHONPATH": str(OWN_APP)}
    options = FleetOptions(
        fleet="rehome-auth",
        replicas=2,
        app="ownapp.server:mcp",
        env=env,
        port=port,
        router_args=("--rehome-sessions",),
    )
    with local_fleet(tmp_path, options) as lf, watched(request, lf):
        yield lf, issuer


async def test_another_principal_on_a_gone_replicas_session_gets_404_and_the_owner_still_rehomes(
    auth_fleet: tuple[ProcessFleet, TokenIssuer],
) -> None:
    lf, issuer = auth_fleet
    alice = {"authorization": f"Bearer {issuer.token('alice')}"}
    bob = {"authorization": f"Bearer {issuer.token('bob')}"}
    async with httpx.AsyncClient(timeout=30) as http:
        session = RawSession(lf.url, http, alice)
        await session.open()
        lf.kill(session.replica)
        as_bob = RawSession(lf.url, http, bob, session=session.session)
        for _ in range(2):  # refused, and refused again: nothing of hers changed
            forged = await as_bob.request("tools/call", {"name": "whoami", "arguments": {}})
            assert forged.status_code == 404, forged.text
        result = await session.call_tool("whoami", {})
    assert "alice" in str(result["result"]), result
    assert metric_sum(router_metrics(lf), REHOMED) == 1
