"""Multi-replica scenarios, written once against the ``Fleet`` interface.

Each tier's tests call these with their own backend (local processes, the
control plane, kind), so every backend proves the same behaviour.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

from fleetkit.clients.traffic import traffic
from fleetkit.fleet import Fleet
from mcpfleet.dev.wait import wait_for
from mcpfleet.fleetclient import Trace, connect, default_answer


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
    async with traffic() as load:
        for n in range(workers):
            args = {"destination": f"C{n}"}
            load.modern(fleet.url, "book_flight", args, "Booked", label=lambda: fleet.ring().phase)
        wait = asyncio.to_thread
        await load.progress(5, what="flows")
        staged = await wait(fleet.rotate_step, "stage")
        await wait(fleet.wait_attested, staged.kids)
        await load.progress(10, what="flows")
        promoted = await wait(fleet.rotate_step, "promote")
        await wait(fleet.wait_attested, promoted.kids)
        await load.progress(10, what="flows")
        # Step 5: tokens sealed under the old key expire within one TTL of the last
        # replica sealing with it; the protocol waits that long, by the clock.
        await asyncio.sleep(state_ttl + 0.5)
        retired = await wait(fleet.rotate_step, "retire")
        await wait(fleet.wait_attested, retired.kids)
        await load.progress(20, what="flows")
    assert load.failures == []
    assert {"staged", "promoted", "stable"} <= load.labels()
    assert retired.kids == (promoted.kids[0],) and retired.kids[0] not in original


# --- pods going away: a drain, a rolling update ------------------------------------------


async def drain_under_load(
    fleet: Fleet, victim: str, *, gone: Callable[[str], bool], timeout: float = 240
) -> None:
    """Drain ``victim`` (a SIGTERM) while it owns handshake sessions, under modern load.

    Ten handshake sessions open before the drain (some land on the victim and
    must finish on it), ten after it (none may land on the victim), with a
    stream of modern rounds all along; none fails, and ``gone(victim)`` turns
    true (the process has exited, the pod left the API).
    """
    drained = asyncio.Event()
    placed_after: list[str] = []
    owners: list[str] = []

    async def session(i: int) -> str:
        if i >= 10:
            await drained.wait()
        trace = Trace()

        async def thinker(message: str, schema: dict[str, Any]) -> Any:
            await asyncio.sleep(1.0)  # a person answering, while the replica is told to go
            return default_answer(message, schema)

        opened_after = drained.is_set()
        async with connect(fleet.url, "handshake", trace, answer=thinker) as client:
            result = await client.call_tool("plan_meeting", {"topic": f"T{i}"})
        (owner,) = trace.replicas()
        owners.append(owner)
        if opened_after:
            placed_after.append(owner)
        return str(result.data)

    def seen_draining() -> bool:
        record = fleet.attestations().get(victim)
        return record is None or record.state != "serving"

    async with traffic() as load:
        load.modern(fleet.url, "confirm_purchase", {"item": "tea", "amount_eur": 2}, "Purchased")
        sessions = [asyncio.create_task(session(i)) for i in range(20)]
        await asyncio.to_thread(
            wait_for,
            lambda: (
                fleet.attestations().get(victim) is not None
                and fleet.attestations()[victim].sessions >= 1
            ),
            timeout=60,
            what=f"a session on {victim}",
        )
        await asyncio.to_thread(fleet.drain, victim)
        await asyncio.to_thread(wait_for, seen_draining, timeout=30, what=f"{victim} draining")
        drained.set()
        results = await asyncio.wait_for(asyncio.gather(*sessions), timeout)
    assert all(r.startswith("Planned 'T") for r in results), results
    assert load.failures == [], load.failures[:5]
    assert load.done() > 5
    assert placed_after and victim not in placed_after
    assert victim in owners, "sessions pinned to the drained replica finished on it"
    await asyncio.to_thread(
        wait_for, lambda: gone(victim), timeout=timeout, interval=0.2, what=f"{victim} gone"
    )


async def rolling_update_under_load(
    fleet: Fleet, roll: Callable[[], None], timeout: float = 420
) -> list[str]:
    """``roll()`` replaces every replica (a changed pod template) while modern rounds and
    handshake sessions keep flowing: none fails. Returns the new replicas' names."""
    old = set(fleet.replica_names())
    count = len(old)
    async with traffic() as load:
        for n in range(2):
            load.modern(fleet.url, "book_flight", {"destination": "Oslo"}, "Booked")
            load.handshake(fleet.url, f"R{n}")
        await load.progress(5, what="traffic before the rollout")
        await asyncio.to_thread(roll)

        def rolled_out() -> list[str] | None:
            names = fleet.replica_names()
            attested = fleet.attestations()
            serving = [n for n in names if n in attested and attested[n].state == "serving"]
            if len(serving) == count and not set(names) & old:
                return names
            return None

        new: list[str] = await asyncio.to_thread(
            wait_for, rolled_out, timeout=timeout, interval=1, what="the rollout to finish"
        )
        await load.progress(5, what="traffic after the rollout")
    assert load.failures == [], load.failures[:5]
    assert not set(new) & old
    assert {"modern", "handshake"} <= load.labels()
    return new


async def operator_rotation_under_load(
    fleet: Fleet,
    rotate: Callable[[], tuple[str, ...]],
    workers: int = 3,
    *,
    handshakes: int = 1,
    before: int = 5,
    after: int = 5,
) -> tuple[str, ...]:
    """``rotate()`` asks the operator for a rotation and waits until it is Complete,
    returning the ring's kids then; ``workers`` users of modern bookings and
    ``handshakes`` of handshake plans run the whole time (``before`` rounds
    before it, ``after`` rounds after) and none fails. Every replica ends on
    the new ring alone."""
    original = fleet.ring().kids
    async with traffic() as load:
        for n in range(workers):
            load.modern(fleet.url, "book_flight", {"destination": f"C{n}"}, "Booked")
        for n in range(handshakes):
            load.handshake(fleet.url, f"rotating{n}")
        await load.progress(before, what="traffic before the rotation")
        kids = await asyncio.to_thread(rotate)
        await load.progress(after, what="traffic after it")
    assert load.failures == [], load.failures[:5]
    assert len(kids) == 1 and kids[0] not in original
    await asyncio.to_thread(fleet.wait_attested, kids)
    return kids
