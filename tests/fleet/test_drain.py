"""SIGTERM drains a replica: no new work, its sessions finish, then it exits."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleetkit import scenarios
from fleetkit.clients.wire import modern_call
from fleetkit.fleet import FleetOptions, ProcessFleet, local_fleet
from mcpfleet.dev.wait import wait_for
from mcpfleet.fleetclient import Trace, connect, default_answer

from .conftest import watched


@pytest.fixture
def small_fleet(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ProcessFleet]:
    args = (
        "--drain-timeout",
        "30",
    )
    with local_fleet(tmp_path, FleetOptions(replica_args=args)) as lf, watched(request, lf):
        yield lf


async def test_sigterm_drains_then_exits_after_its_session_finishes(
    small_fleet: ProcessFleet,
) -> None:
    lf = small_fleet
    release = asyncio.Event()
    asked = asyncio.Event()

    async def slow_person(message: str, schema: dict[str, Any]) -> Any:
        if "How many minutes" in message:
            asked.set()
            await release.wait()  # the user thinks, while the replica is told to drain
        return default_answer(message, schema)

    trace = Trace()
    async with connect(lf.url, "handshake", trace, answer=slow_person) as client:
        pending = asyncio.create_task(client.call_tool("plan_meeting", {"topic": "Drain"}))
        await asyncio.wait_for(asked.wait(), 30)
        (owner,) = trace.replicas()
        lf.drain(owner)
        member = lf.members[owner]
        await asyncio.to_thread(
            wait_for,
            lambda: httpx.get(member.url + "/readyz", timeout=1).status_code == 503,
            timeout=10,
            what=f"{owner} to report draining",
            retry_on=(Exception,),
        )
        router_ready = lf.url.replace("/mcp", "/readyz")
        await asyncio.to_thread(
            wait_for,
            lambda: httpx.get(router_ready, timeout=1).json()["replicas"][owner] == "draining",
            timeout=10,
            what="the router to see the drain",
            retry_on=(Exception,),
        )

        # New sessions and modern rounds go elsewhere while the session lives on.
        placed: Counter[str] = Counter()
        for i in range(6):
            t = Trace()
            async with connect(lf.url, "handshake", t) as other:
                result = await other.call_tool(
                    "confirm_purchase", {"item": f"i{i}", "amount_eur": 1}
                )
            assert str(result.data).startswith("Purchased")
            placed.update(t.replicas())
        for _ in range(10):
            answer = modern_call(lf.url, "confirm_purchase", {"item": "x", "amount_eur": 1})
            assert answer.status == 200
            placed[answer.replica or "?"] += 1
        assert owner not in placed, placed

        assert member.proc.alive, "the owner waits for its session"
        release.set()
        result = await asyncio.wait_for(pending, 30)
    assert str(result.data) == "Planned 'Drain' on monday for 45 minutes with alice, bob."
    assert trace.replicas() == {owner}
    code = await asyncio.to_thread(member.proc.wait, 15)
    assert code == 0, member.proc.tail()
    assert "drained: no request in flight and no open session" in member.proc.tail()
    await asyncio.to_thread(
        wait_for,
        lambda: owner not in lf.attestations(),
        timeout=10,
        what="the drained replica to leave the registry",
        retry_on=(Exception,),
    )


def test_health_endpoints(small_fleet: ProcessFleet) -> None:
    for member in small_fleet.members.values():
        assert httpx.get(member.url + "/healthz", timeout=2).json()["status"] == "alive"
        ready = httpx.get(member.url + "/readyz", timeout=2)
        assert ready.status_code == 200 and ready.headers["x-mcpfleet-replica"] == member.name
    status = httpx.get(small_fleet.url.replace("/mcp", "/readyz"), timeout=2).json()
    assert status == {
        "closing": False,
        "degraded": False,
        "serving": 3,
        "replicas": {n: "serving" for n in small_fleet.members},
    }


async def test_draining_one_of_three_under_load_loses_nothing(small_fleet: ProcessFleet) -> None:
    """The shared drain scenario on local processes: handshake sessions before and
    after the drain and a stream of modern rounds, none failing; the drained replica
    then exits cleanly."""
    victim = "replica-1"
    member = small_fleet.members[victim]
    await scenarios.drain_under_load(small_fleet, victim, gone=lambda _: not member.proc.alive)
    assert await asyncio.to_thread(member.proc.wait, 30) == 0


@pytest.mark.timeout(240)
async def test_rolling_restart_of_every_replica_under_load_loses_no_session(
    small_fleet: ProcessFleet,
) -> None:
    """The shared rolling-update scenario on local processes: surge one new replica,
    drain one old, three times over, as a Deployment's rollout does."""
    lf = small_fleet
    old = sorted(lf.members)

    def roll() -> None:
        for i, name in enumerate(old):
            lf.add_replica(f"replica-{len(old) + i}")
            lf.drain(name)
            code = lf.members[name].proc.wait(60)
            assert code == 0, lf.members[name].proc.tail()

    new = await scenarios.rolling_update_under_load(lf, roll)
    assert set(new) == {f"replica-{n}" for n in range(3, 6)}
