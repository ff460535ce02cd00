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
from mcpfleet.server.demo import Trace, connect, default_answer
from mcpfleet.server.devfleet import LocalFleet, wait_for

from .conftest import watched


@pytest.fixture
def small_fleet(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LocalFleet]:
    args = ("--drain-timeout", "30", "--drain-quiet", "1")
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
            f"{owner} to report draining",
            lambda: httpx.get(member.url + "/readyz", timeout=1).status_code == 503,
            10,
        )
        router_ready = lf.url.replace("/mcp", "/readyz")
        await asyncio.to_thread(
            wait_for,
            "the router to see the drain",
            lambda: httpx.get(router_ready, timeout=1).json()["replicas"][owner] == "draining",
            10,
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
    assert "drained: no request in flight" in member.proc.tail()
    await asyncio.to_thread(
        wait_for,
        "the drained replica to leave the registry",
        lambda: owner not in lf.attestations(),
        10,
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
