"""The router's replica view: grace for an emptied registry, no grace for refusals."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from mcpfleet.contract import Attestation, RedisKeys
from mcpfleet.router import replicas as router_replicas
from mcpfleet.router.decisions import place_session
from mcpfleet.router.health import Health
from mcpfleet.router.replicas import ReplicaView, ViewState, merge_registry


def _att(name: str, heartbeat: float, state: str = "serving") -> Attestation:
    return Attestation(
        name=name,
        address=f"http://{name}",
        state=state,  # type: ignore[arg-type]
        kids=("k",),
        heartbeat=heartbeat,
    )


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


View = tuple[ReplicaView, dict[str, Any], Clock]


@pytest.fixture
def view(monkeypatch: pytest.MonkeyPatch) -> View:
    registry: dict[str, Any] = {"value": {}}
    clock = Clock()

    async def fake_read(client: object, keys: RedisKeys) -> dict[str, Attestation]:
        if registry["value"] is None:
            raise ConnectionError("redis down")
        return dict(registry["value"])

    monkeypatch.setattr(router_replicas, "read_replicas", fake_read)
    monkeypatch.setattr(router_replicas.time, "monotonic", clock)
    client: Any = None  # never used: reads go through the fake above
    return ReplicaView(client=client, keys=RedisKeys("t"), health=Health()), registry, clock


async def test_registry_emptied_by_a_redis_restart_keeps_replicas_for_a_grace(view: View) -> None:
    v, registry, clock = view
    registry["value"] = {"a": _att("a", 1), "b": _att("b", 1)}
    await v.refresh()
    registry["value"] = {}
    clock.now += 0.5
    await v.refresh()
    assert set(v.replicas) == {"a", "b"}
    registry["value"] = {"a": _att("a", 2)}
    clock.now += 1.0
    await v.refresh()
    assert set(v.replicas) == {"a", "b"}
    clock.now += 1.0
    await v.refresh()
    assert set(v.replicas) == {"a"}, "b never came back: gone after the grace"


async def test_redis_down_keeps_the_last_known_set_and_marks_degraded(view: View) -> None:
    v, registry, clock = view
    registry["value"] = {"a": _att("a", 1)}
    await v.refresh()
    registry["value"] = None
    clock.now += 60
    await v.refresh()
    assert set(v.replicas) == {"a"} and v.health.degraded
    registry["value"] = {"a": _att("a", 2)}
    await v.refresh()
    assert not v.health.degraded


async def test_a_refused_replica_stays_dropped_until_it_heartbeats_again(view: View) -> None:
    v, registry, _ = view
    registry["value"] = {"a": _att("a", 5), "b": _att("b", 5)}
    await v.refresh()
    v.drop_dead("a")
    assert "a" not in v.replicas
    await v.refresh()
    assert "a" not in v.replicas, "its old record is not trusted"
    registry["value"] = {"a": _att("a", 6), "b": _att("b", 6)}
    await v.refresh()
    assert "a" in v.replicas, "a newer heartbeat brings it back"
    assert [c.name for c in v.serving()] == ["a", "b"]
    registry["value"] = {"a": _att("a", 7, "draining"), "b": _att("b", 7)}
    await v.refresh()
    assert [c.name for c in v.serving()] == ["b"]


async def test_a_refusal_reads_the_registry_at_once_and_finds_a_restart(view: View) -> None:
    v, registry, _ = view
    registry["value"] = {"a": _att("a", 5), "b": _att("b", 5)}
    await v.refresh()
    # "a" restarted on another address; "b" died and its record is still there.
    moved = Attestation(name="a", address="http://a-new", state="serving", kids=("k",), heartbeat=6)
    registry["value"] = {"a": moved, "b": _att("b", 5)}
    assert await v.after_refusal("a", "http://a") is True
    assert v.replicas["a"].address == "http://a-new"
    assert await v.after_refusal("b", "http://b") is False
    assert [c.name for c in v.serving()] == ["a"], "b's old record is not trusted"
    registry["value"] = None
    assert await v.after_refusal("a", "http://a-new") is False, "Redis down: not back"
    assert v.health.degraded


async def test_placements_count_until_an_attestation_includes_them(view: View) -> None:
    v, registry, _ = view
    registry["value"] = {"a": _att("a", 1), "b": _att("b", 1)}
    await v.refresh()
    v.note_placement("a")
    v.note_placement("a")
    await v.refresh()  # the attestations predate the placements: still counted
    assert {c.name: c.sessions for c in v.serving()} == {"a": 2, "b": 0}
    registry["value"] = {"a": _att("a", 2), "b": _att("b", 2)}
    await v.refresh()  # one newer record may have been published before the session existed
    assert {c.name: c.sessions for c in v.serving()} == {"a": 2, "b": 0}
    registry["value"] = {"a": _att("a", 3), "b": _att("b", 3)}
    await v.refresh()
    assert {c.name: c.sessions for c in v.serving()} == {"a": 0, "b": 0}


async def test_an_initialize_in_flight_holds_a_place_and_a_refused_one_gives_it_back(
    view: View,
) -> None:
    """An ``initialize`` counts on its replica while in flight; answered without a
    session (a 429, a 5xx, a dropped connection) it gives its place back at once,
    answered with one it is a placement until the attestations include it."""
    v, registry, _ = view
    registry["value"] = {"a": _att("a", 1)}
    await v.refresh()
    refused = v.placing("a")
    assert {c.name: c.sessions for c in v.serving()} == {"a": 1}
    refused.close()
    assert {c.name: c.sessions for c in v.serving()} == {"a": 0}
    assert v.opening == {}, "no name kept for a replica with nothing in flight"
    with v.placing("a") as place:
        place.opened()
        place.opened()  # settled once: counted once
    assert {c.name: c.sessions for c in v.serving()} == {"a": 1}
    assert v.state.placed == {"a": [1]}
    for _ in range(50):  # a loop of refused initializes leaves nothing behind
        with v.placing("a"):
            pass
    assert {c.name: c.sessions for c in v.serving()} == {"a": 1}


async def test_initializes_in_flight_count_against_the_cap_so_a_burst_cannot_overshoot_it(
    view: View,
) -> None:
    v, registry, _ = view
    att = Attestation(
        name="a", address="http://a", state="serving", kids=("k",), heartbeat=1, sessions=2
    )
    registry["value"] = {"a": att, "b": _att("b", 1)}
    await v.refresh()
    cap = 3
    burst = []
    for _ in range(4):
        choice = place_session(v.serving(), cap)
        assert choice is not None
        burst.append(v.placing(choice.name))
    # a: 2 sessions + 1 in flight; b: 3 in flight: both full until an answer comes.
    assert sorted(p.name for p in burst) == ["a", "b", "b", "b"]
    assert place_session(v.serving(), cap) is None
    next(p for p in burst if p.name == "a").close()  # refused: its place is free at once
    choice = place_session(v.serving(), cap)
    assert choice is not None and choice.name == "a"


async def test_a_new_session_waiting_for_a_place_wakes_when_an_initialize_is_answered(
    view: View,
) -> None:
    """Where only ``initialize`` requests in flight fill the cap, a new session waits for
    one of them to be answered (a refused one frees its place) rather than the 503."""
    v, registry, _ = view
    registry["value"] = {"a": _att("a", 1)}
    await v.refresh()
    in_flight = v.placing("a")
    assert place_session(v.serving(), 1) is None and v.opening_to(v.serving())
    waiter = asyncio.ensure_future(v.place_freed(5.0))
    await asyncio.sleep(0)  # the waiter waits
    assert not waiter.done()
    in_flight.close()  # refused: its place is given back, and the waiter looks again
    await asyncio.wait_for(waiter, 1.0)  # (the fixture's clock stands still: woken, not timed out)
    choice = place_session(v.serving(), 1)
    assert choice is not None and choice.name == "a"
    assert not v.opening_to(v.serving())


async def test_placements_ignore_the_replicas_wall_clock(view: View) -> None:
    """A replica whose clock is hours behind (or ahead) still has its placements settle."""
    v, registry, _ = view
    for skew in (-7200.0, 7200.0):
        registry["value"] = {"a": _att("a", time.time() + skew)}
        await v.refresh()
        v.note_placement("a")
        for step in (1, 2):
            registry["value"] = {"a": _att("a", time.time() + skew + step)}
            await v.refresh()
        assert {c.name: c.sessions for c in v.serving()} == {"a": 0}, skew


def test_the_merge_keeps_every_table_bounded_as_replicas_come_and_go() -> None:
    """A thousand pod names over time: the view only remembers the live and recently gone."""
    state = ViewState()
    now = 0.0
    for i in range(1000):
        now += 1.0
        registry = {f"pod-{j}": _att(f"pod-{j}", now) for j in range(i, i + 3)}
        state = merge_registry(state, registry, now, missing_grace=2.0, absent_limit=10.0)
        state.dead[f"pod-{i}"] = now  # refused, then its record expires
        state.placed.setdefault(f"pod-{i + 1}", []).append(state.generation[f"pod-{i + 1}"])
    for table in (state.replicas, state.missing, state.dead, state.generation, state.placed):
        assert len(table) <= 5, table
    assert len(state.last_seen) <= 13, "kept only within the owner-absent limit"


def test_the_merge_is_pure() -> None:
    before = ViewState(replicas={"a": _att("a", 1)}, generation={"a": 1})
    after = merge_registry(before, {"a": _att("a", 2)}, 5.0, missing_grace=2.0, absent_limit=10.0)
    assert before.replicas["a"].heartbeat == 1 and before.generation == {"a": 1}
    assert after.generation == {"a": 2} and after.last_seen == {"a": ("http://a", 5.0)}


def test_a_draining_replica_that_leaves_the_registry_is_gone_at_once() -> None:
    """A drain ends with the replica withdrawing its record: the router stops
    trying its address at once (a deleted pod's address may never refuse the
    connect), while a serving replica's missing record is still waited for."""
    before = ViewState()
    before = merge_registry(
        before,
        {"a": _att("a", 1, "draining"), "b": _att("b", 1)},
        1.0,
        missing_grace=2.0,
        absent_limit=10.0,
    )
    after = merge_registry(before, {}, 1.5, missing_grace=2.0, absent_limit=10.0)
    assert "a" not in after.replicas and "a" not in after.last_seen
    assert "b" in after.replicas and after.last_seen["b"] == ("http://b", 1.0)


async def test_waiting_for_a_place_is_bounded_by_its_timeout() -> None:
    client: Any = None
    v = ReplicaView(client=client, keys=RedisKeys("t"), health=Health())
    loop = asyncio.get_running_loop()
    started = loop.time()
    await v.place_freed(0.05)  # nothing in flight: nothing wakes it but the timeout
    assert 0.04 <= loop.time() - started < 1.0
