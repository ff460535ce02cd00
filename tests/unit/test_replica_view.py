"""The router's replica view: grace for an emptied registry, no grace for refusals."""

from __future__ import annotations

import time
from typing import Any

import pytest

from mcpfleet.server import routetable
from mcpfleet.server.contract import Attestation, RedisKeys
from mcpfleet.server.routetable import Health, ReplicaView


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

    monkeypatch.setattr(routetable, "read_replicas", fake_read)
    monkeypatch.setattr(routetable.time, "monotonic", clock)
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
    v.forget("a")
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


async def test_placements_count_until_an_attestation_includes_them(view: View) -> None:
    v, registry, _ = view
    registry["value"] = {"a": _att("a", 1), "b": _att("b", 1)}
    await v.refresh()
    v.note_placement("a")
    v.note_placement("a")
    await v.refresh()  # the attestations predate the placements: still counted
    assert {c.name: c.sessions for c in v.serving()} == {"a": 2, "b": 0}
    later = time.time() + 1
    registry["value"] = {"a": _att("a", later), "b": _att("b", later)}
    await v.refresh()
    assert {c.name: c.sessions for c in v.serving()} == {"a": 0, "b": 0}
