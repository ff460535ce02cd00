"""SIGTERM drains a replica: no new work, its sessions finish, then it exits."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleetkit.fleet import local_fleet
from fleetkit.wire import modern_call
from mcpfleet.server.dev.demo import Trace, connect, default_answer
from mcpfleet.server.dev.fleet import LocalFleet
from mcpfleet.server.dev.wait import wait_for

from .conftest import watched


@pytest.fixture
def small_fleet(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LocalFleet]:
    args = (
        "--drain-timeout",
        "30",
    )
    with local_fleet(tmp_path, replica_args=args) as lf, watched(request, lf):
        yield lf


async def test_sigterm_drains_then_exits_after_its_session_finishes(
    small_fleet: LocalFleet,
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


def test_health_endpoints(small_fleet: LocalFleet) -> None:
    for member in small_fleet.members.values():
        assert httpx.get(member.url + "/healthz", timeout=2).json()["status"] == "alive"
        ready = httpx.get(member.url + "/readyz", timeout=2)
        assert ready.status_code == 200 and ready.headers["x-mcpfleet-replica"] == member.name
    status = httpx.get(small_fleet.url.replace("/mcp", "/readyz"), timeout=2).json()
    assert status == {
        "degraded": False,
        "serving": 3,
        "replicas": {n: "serving" for n in small_fleet.members},
    }


async def test_draining_one_of_three_under_load_loses_nothing(small_fleet: LocalFleet) -> None:
    """30 handshake sessions and a stream of modern rounds while one replica drains.

    Fifteen sessions open before the drain (some land on the victim and must
    finish there), fifteen after it (none may land on the victim).
    """
    lf = small_fleet
    victim = "replica-1"
    drained = asyncio.Event()
    stop = asyncio.Event()
    modern: list[str | None] = []
    modern_failed: list[str] = []
    placed_after_drain: list[str] = []
    owners: list[str] = []

    async def modern_stream() -> None:
        async with connect(lf.url, "modern") as client:
            while not stop.is_set():
                try:
                    result = await client.call_tool(
                        "confirm_purchase", {"item": "tea", "amount_eur": 2}
                    )
                    assert str(result.data).startswith("Purchased")
                    modern.append("ok")
                except Exception as exc:
                    modern_failed.append(f"{type(exc).__name__}: {exc}")

    async def session(i: int) -> str:
        if i >= 15:
            await drained.wait()  # the second half opens once the drain is under way
        trace = Trace()

        async def thinker(message: str, schema: dict[str, Any]) -> Any:
            await asyncio.sleep(0.5)  # a person answering
            return default_answer(message, schema)

        opened_after = drained.is_set()
        async with connect(lf.url, "handshake", trace, answer=thinker) as client:
            result = await client.call_tool("plan_meeting", {"topic": f"T{i}"})
        (owner,) = trace.replicas()
        owners.append(owner)
        if opened_after:
            placed_after_drain.append(owner)
        return str(result.data)

    load = asyncio.create_task(modern_stream())
    sessions = [asyncio.create_task(session(i)) for i in range(30)]
    await asyncio.to_thread(
        wait_for,
        lambda: lf.attestations()[victim].sessions >= 2,
        timeout=20,
        what=f"sessions on {victim}",
        retry_on=(Exception,),
    )
    lf.drain(victim)
    router_ready = lf.url.replace("/mcp", "/readyz")
    await asyncio.to_thread(
        wait_for,
        lambda: httpx.get(router_ready, timeout=1).json()["replicas"].get(victim) != "serving",
        timeout=10,
        what="the router to see the drain",
        retry_on=(Exception,),
    )
    drained.set()
    results = await asyncio.wait_for(asyncio.gather(*sessions), 120)
    stop.set()
    await load
    assert all(r.startswith("Planned 'T") for r in results), results
    assert modern_failed == []
    assert len(modern) > 10
    assert placed_after_drain and victim not in placed_after_drain
    assert victim in owners, "sessions pinned to the draining replica finished on it"
    code = await asyncio.to_thread(lf.members[victim].proc.wait, 30)
    assert code == 0


@pytest.mark.timeout(240)
async def test_rolling_restart_of_every_replica_under_load_loses_no_session(
    small_fleet: LocalFleet,
) -> None:
    """Surge one new replica, drain one old, three times over, with traffic all along."""
    lf = small_fleet
    stop = asyncio.Event()
    done: list[str] = []
    failed: list[str] = []

    async def handshake_user(n: int) -> None:
        while not stop.is_set():
            try:
                async with connect(lf.url, "handshake") as client:
                    result = await client.call_tool("plan_meeting", {"topic": f"R{n}"})
                if not str(result.data).startswith(f"Planned 'R{n}'"):
                    failed.append(f"handshake: not a plan: {result.data}")
                done.append(str(result.data))
            except Exception as exc:
                failed.append(f"handshake {type(exc).__name__}: {exc}")

    async def modern_user() -> None:
        async with connect(lf.url, "modern") as client:
            while not stop.is_set():
                try:
                    result = await client.call_tool("book_flight", {"destination": "Kyiv"})
                    if not str(result.data).startswith("Booked economy to Kyiv"):
                        failed.append(f"modern: not a booking: {result.data}")
                    done.append("modern")
                except Exception as exc:
                    failed.append(f"modern {type(exc).__name__}: {exc}")

    users = [asyncio.create_task(handshake_user(n)) for n in range(6)]
    users.append(asyncio.create_task(modern_user()))
    old = sorted(lf.members)
    try:
        for i, name in enumerate(old):
            before = len(done)
            await asyncio.to_thread(lf.add_replica, f"replica-{len(old) + i}")
            lf.drain(name)
            code = await asyncio.to_thread(lf.members[name].proc.wait, 60)
            assert code == 0, lf.members[name].proc.tail()
            await asyncio.to_thread(
                wait_for,
                lambda b=before: len(done) > b + 5,
                timeout=30,
                what="traffic to go on after the restart",
                retry_on=(Exception,),
            )
    finally:
        stop.set()
        await asyncio.gather(*users)
    assert failed == []
    assert sum(1 for d in done if d.startswith("Planned")) >= 18
    assert set(lf.replica_names()) == {f"replica-{n}" for n in range(3, 6)}
