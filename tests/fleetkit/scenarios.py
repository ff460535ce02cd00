"""Multi-replica scenarios, written once against the ``Fleet`` interface.

Each tier's tests call these with their own backend (local processes, the
control plane, kind), so every backend proves the same behaviour.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from fleetkit.fleet import Fleet
from mcpfleet.server.dev.demo import Trace, connect


async def modern_rounds_spread(fleet: Fleet) -> None:
    """Modern bookings complete through the router, rounds landing on several replicas."""
    trace = Trace()
    async with connect(fleet.url, "modern", trace) as client:
        results = [
            await client.call_tool("book_flight", {"destination": d})
            for d in ("Oslo", "Porto", "Riga")
        ]
    for result in results:
        assert str(result.data).startswith("Booked economy to ")
    calls = trace.calls()
    assert len(calls) == 12, "each booking is one initial call and three continuations"
    assert all(c.status == 200 and c.replica for c in calls)
    assert len(trace.replicas("tools/call")) >= 2, Counter(c.replica for c in calls)


async def handshake_session(url: str, topic: str) -> tuple[str, set[str], int]:
    """One handshake-era meeting plan; returns its result, replicas seen and round count."""
    trace = Trace()
    async with connect(url, "handshake", trace) as client:
        result = await client.call_tool("plan_meeting", {"topic": topic})
    answers = [r for r in trace.rounds if r.rpc == "response"]
    assert len(answers) == 3, "attendees, minutes and day were each asked"
    return str(result.data), trace.replicas(), len(trace.rounds)


async def handshake_session_sticks(fleet: Fleet) -> None:
    text, replicas, rounds = await handshake_session(fleet.url, "Planning")
    assert text == "Planned 'Planning' on monday for 45 minutes with alice, bob."
    assert len(replicas) == 1, f"every request of one session reached one replica: {replicas}"
    assert rounds >= 6


async def concurrent_handshake_sessions(fleet: Fleet, count: int = 20) -> None:
    results = await asyncio.gather(
        *(handshake_session(fleet.url, f"topic {i}") for i in range(count))
    )
    owners: Counter[str] = Counter()
    for i, (text, replicas, _) in enumerate(results):
        assert text.startswith(f"Planned 'topic {i}' on monday")
        assert len(replicas) == 1
        owners[next(iter(replicas))] += 1
    expected = len(fleet.replica_names())
    assert len(owners) == expected, f"new sessions are spread over the replicas: {owners}"


async def rotation_under_load(fleet: Fleet, state_ttl: float, workers: int = 4) -> None:
    """stage, promote, wait one TTL, retire, each confirmed by every replica: no round fails."""
    original = fleet.ring().kids
    stop = asyncio.Event()
    completed: list[str] = []
    failures: list[str] = []

    async def worker(n: int) -> None:
        while not stop.is_set():
            try:
                async with connect(fleet.url, "modern") as client:
                    while not stop.is_set():
                        result = await client.call_tool("book_flight", {"destination": f"C{n}"})
                        if not str(result.data).startswith("Booked"):
                            failures.append(str(result.data))
                        completed.append(fleet.ring().phase)
            except Exception as exc:  # any failed round is a failure of the rotation
                failures.append(f"{type(exc).__name__}: {exc}")

    tasks = [asyncio.create_task(worker(n)) for n in range(workers)]

    async def progress(flows: int) -> None:
        """Let ``flows`` more bookings complete under the current ring before moving on."""
        target = len(completed) + flows
        deadline = time.monotonic() + 60
        while len(completed) < target and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert len(completed) >= target, f"flows stalled at {len(completed)}: {failures[:3]}"

    try:
        wait = asyncio.to_thread
        await progress(5)
        staged = await wait(fleet.rotate_step, "stage")
        await wait(fleet.wait_attested, staged.kids)
        await progress(10)
        promoted = await wait(fleet.rotate_step, "promote")
        await wait(fleet.wait_attested, promoted.kids)
        await progress(10)
        # Step 5: tokens sealed under the old key expire within one TTL of the last
        # replica sealing with it; the protocol waits that long, by the clock.
        await asyncio.sleep(state_ttl + 0.5)
        retired = await wait(fleet.rotate_step, "retire")
        await wait(fleet.wait_attested, retired.kids)
        await progress(20)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    assert failures == []
    assert {"staged", "promoted", "stable"} <= set(completed)
    assert retired.kids == (promoted.kids[0],) and retired.kids[0] not in original
