"""Both protocol eras through the router of a three-replica fleet."""

from __future__ import annotations

import asyncio
from collections import Counter

from mcpfleet.server.demo import Trace, connect
from mcpfleet.server.devfleet import LocalFleet


async def test_modern_booking_rounds_land_on_several_replicas(fleet: LocalFleet) -> None:
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


async def _handshake_session(url: str, topic: str) -> tuple[str, set[str], int]:
    trace = Trace()
    async with connect(url, "handshake", trace) as client:
        result = await client.call_tool("plan_meeting", {"topic": topic})
    answers = [r for r in trace.rounds if r.rpc == "response"]
    assert len(answers) == 3, "attendees, minutes and day were each asked"
    return str(result.data), trace.replicas(), len(trace.rounds)


async def test_handshake_session_stays_on_the_replica_that_owns_it(fleet: LocalFleet) -> None:
    text, replicas, rounds = await _handshake_session(fleet.url, "Planning")
    assert text == "Planned 'Planning' on monday for 45 minutes with alice, bob."
    assert len(replicas) == 1, f"every request of one session reached one replica: {replicas}"
    assert rounds >= 6


async def test_twenty_concurrent_handshake_sessions_all_succeed(fleet: LocalFleet) -> None:
    results = await asyncio.gather(
        *(_handshake_session(fleet.url, f"topic {i}") for i in range(20))
    )
    owners = Counter()
    for i, (text, replicas, _) in enumerate(results):
        assert text.startswith(f"Planned 'topic {i}' on monday")
        assert len(replicas) == 1
        owners[next(iter(replicas))] += 1
    assert len(owners) == 3, f"new sessions are spread over the replicas: {owners}"
