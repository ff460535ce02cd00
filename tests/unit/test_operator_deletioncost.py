"""The replica Pods' deletion cost and when the operator writes it, without I/O."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from kubernetes import client as k8s

from mcpfleet.contract import Attestation
from mcpfleet_operator.costkeeper import CostKeeper
from mcpfleet_operator.deletioncost import (
    DELETION_COST_ANNOTATION,
    INT32_MAX,
    INT32_MIN,
    WEIGHTS,
    PatchPolicy,
    PodCost,
    TokenBucket,
    Weights,
    clamp_int32,
    cost_of,
    needs_patch,
    parse_cost,
    plan,
)
from mcpfleet_operator.metrics import OperatorMetrics


def record(**counts: int) -> Attestation:
    return Attestation(
        name="r0", address="http://127.0.0.1:1", state="serving", kids=("aa",), heartbeat=1.0,
        **counts,
    )  # fmt: skip


# --------------------------------------------------------------------------- the cost


def test_an_empty_replica_costs_nothing() -> None:
    assert cost_of(record()) == 0


@pytest.mark.parametrize(
    ("counts", "expected"),
    [
        ({"paused": 1}, WEIGHTS.paused),
        ({"tasks": 1}, WEIGHTS.task),
        ({"sessions": 1}, WEIGHTS.session),
        ({"inflight": 1}, WEIGHTS.inflight),
        ({"listens": 1}, WEIGHTS.listen),
        (
            {"paused": 2, "tasks": 3, "sessions": 40, "inflight": 5, "listens": 7},
            2 * 100 + 3 * 50 + 40 * 10 + 5 * 5 + 7 * 1,
        ),
    ],
)
def test_the_cost_is_the_weighted_sum_of_what_the_replica_holds(
    counts: dict[str, int], expected: int
) -> None:
    assert cost_of(record(**counts)) == expected


def test_the_weights_order_what_a_scale_in_would_lose() -> None:
    # A paused user costs more than a task run again, which costs more than a
    # session re-homed, a request waited for, and a stream listened to again.
    w = WEIGHTS
    assert w.paused > w.task > w.session > w.inflight > w.listen > 0


def test_a_replica_holding_more_costs_more() -> None:
    fewer = record(sessions=10, listens=3)
    assert cost_of(record(sessions=11, listens=3)) > cost_of(fewer)
    assert cost_of(record(sessions=10, listens=3, paused=1)) > cost_of(fewer)


def test_the_cost_is_clamped_to_the_annotations_int32_range() -> None:
    huge = record(sessions=10**9, paused=10**9)
    assert cost_of(huge) == INT32_MAX
    assert cost_of(record(sessions=1), Weights(session=-(2**40))) == INT32_MIN
    assert clamp_int32(INT32_MAX + 1) == INT32_MAX and clamp_int32(7) == 7


@pytest.mark.parametrize(
    ("raw", "parsed"),
    [
        (None, None),
        ("", None),
        ("abc", None),
        ("12", 12),
        (" -5 ", -5),
        (str(INT32_MAX), INT32_MAX),
        (str(INT32_MAX + 1), None),
        (str(INT32_MIN - 1), None),
    ],
)
def test_a_pods_current_cost_is_read_or_taken_as_missing(
    raw: str | None, parsed: int | None
) -> None:
    assert parse_cost(raw) == parsed


# --------------------------------------------------------------------------- when to write


POLICY = PatchPolicy(min_step=10, relative_step=0.1, max_interval=30.0, per_second=5.0)


def test_a_pod_without_a_cost_is_written_at_once() -> None:
    assert needs_patch(None, 0, since_write=0.0, policy=POLICY)


def test_a_pod_carrying_its_cost_is_never_written() -> None:
    assert not needs_patch(40, 40, since_write=None, policy=POLICY)
    assert not needs_patch(40, 40, since_write=10**6, policy=POLICY)


def test_a_change_of_a_whole_step_is_written_at_once() -> None:
    assert needs_patch(0, 10, since_write=0.0, policy=POLICY)
    assert needs_patch(50, 40, since_write=0.0, policy=POLICY)


def test_a_small_change_waits_for_the_max_interval() -> None:
    assert not needs_patch(0, 9, since_write=0.0, policy=POLICY)
    assert not needs_patch(0, 9, since_write=29.9, policy=POLICY)
    assert needs_patch(0, 9, since_write=30.0, policy=POLICY)
    # Never written by this process (it restarted): a difference is written once.
    assert needs_patch(0, 9, since_write=None, policy=POLICY)


def test_on_a_large_cost_the_step_is_a_tenth_of_it() -> None:
    assert POLICY.step(10_000) == 1_000
    assert not needs_patch(10_000, 10_999, since_write=1.0, policy=POLICY)
    assert needs_patch(10_000, 11_000, since_write=1.0, policy=POLICY)
    assert needs_patch(10_000, 9_000, since_write=1.0, policy=POLICY)
    assert POLICY.step(5) == 10


@pytest.mark.parametrize(
    "kwargs",
    [{"min_step": 0}, {"relative_step": 1.0}, {"max_interval": 0}, {"per_second": 0}],
)
def test_a_policy_out_of_range_is_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        PatchPolicy(**kwargs)  # type: ignore[arg-type]


def test_the_plan_writes_the_most_urgent_within_the_budget() -> None:
    pods = [
        PodCost("steady", 30, 30),
        PodCost("small", 30, 35),
        PodCost("grew", 0, 500),
        PodCost("new", None, 0),
        PodCost("shrank", 200, 50),
    ]
    written = {"small": 100.0}
    todo, held = plan(pods, written, now=101.0, policy=POLICY, budget=2)
    assert [p.pod for p in todo] == ["new", "grew"]
    assert [p.pod for p in held] == ["shrank"]
    todo, held = plan(pods, written, now=131.0, policy=POLICY, budget=10)
    assert [p.pod for p in todo] == ["new", "grew", "shrank", "small"] and held == []


def test_the_plan_writes_nothing_without_a_budget() -> None:
    todo, held = plan([PodCost("a", None, 1)], {}, now=0.0, policy=POLICY, budget=0)
    assert todo == [] and [p.pod for p in held] == ["a"]


# --------------------------------------------------------------------------- the cap


def test_the_bucket_allows_its_rate_at_once_then_refills_at_the_rate() -> None:
    bucket = TokenBucket(rate=5.0)
    assert bucket.available(100.0) == 5
    bucket.take(5, 100.0)
    assert bucket.available(100.0) == 0
    assert bucket.available(100.2) == 1
    assert bucket.available(101.0) == 5
    assert bucket.available(1000.0) == 5  # never more than a second's worth


def test_the_bucket_caps_the_writes_of_a_long_run() -> None:
    bucket = TokenBucket(rate=2.0)
    total = 0
    for tick in range(101):  # 100 s of ticks every second, each asking for 50 writes
        now = float(tick)
        allowed = min(50, bucket.available(now))
        bucket.take(allowed, now)
        total += allowed
    assert total <= 2 * 100 + 2


def test_a_slow_rate_still_writes_one_at_a_time() -> None:
    bucket = TokenBucket(rate=0.5)
    assert bucket.available(0.0) == 1
    bucket.take(1, 0.0)
    assert bucket.available(1.0) == 0
    assert bucket.available(2.0) == 1


# --------------------------------------------------------------------------- the keeper


class _Patches:
    """Records the keeper's Pod patches (the one call it makes of the API)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def patch_namespaced_pod(self, name: str, namespace: str, body: dict[str, Any]) -> None:
        self.calls.append((name, body["metadata"]["annotations"][DELETION_COST_ANNOTATION]))


def _pod(name: str, cost: str | None = None, terminating: bool = False) -> k8s.V1Pod:
    annotations = {DELETION_COST_ANNOTATION: cost} if cost is not None else None
    meta = k8s.V1ObjectMeta(
        name=name,
        annotations=annotations,
        deletion_timestamp=dt.datetime.now(dt.UTC) if terminating else None,
    )
    return k8s.V1Pod(metadata=meta)


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_keeper_writes_due_costs_and_leaves_pods_it_knows_nothing_of() -> None:
    clock = _Clock()
    keeper = CostKeeper(OperatorMetrics(), POLICY, clock=clock)
    api = _Patches()
    pods = [_pod("busy"), _pod("idle", "0"), _pod("unknown"), _pod("going", terminating=True)]
    records = {n: record(sessions=s) for n, s in (("busy", 3), ("idle", 0), ("going", 9))}
    assert keeper.keep(api, "ns", "ring", pods, records) == 1  # type: ignore[arg-type]
    assert api.calls == [("busy", "30")]
    # The Pod now carries 30; a request in flight is under a step: not written...
    api.calls.clear()
    pods[0] = _pod("busy", "30")
    records["busy"] = record(sessions=3, inflight=1)
    clock.now += 1
    assert keeper.keep(api, "ns", "ring", pods, records) == 0  # type: ignore[arg-type]
    # ...until the max interval has passed since the write.
    clock.now += POLICY.max_interval
    assert keeper.keep(api, "ns", "ring", pods, records) == 1  # type: ignore[arg-type]
    assert api.calls == [("busy", "35")]


def test_the_keeper_writes_nothing_while_the_attestations_cannot_be_read() -> None:
    metrics = OperatorMetrics()
    keeper = CostKeeper(metrics, POLICY, clock=_Clock())
    for _ in range(5):
        keeper.stale("ns", "ring", "cannot read attestations from Redis: Timeout")
    assert metrics.costs_stale.labels("ns", "ring")._value.get() == 1
    assert metrics.cost_stale_ticks.labels("ns", "ring")._value.get() == 5
    api = _Patches()
    keeper.keep(api, "ns", "ring", [_pod("a")], {"a": record()})  # type: ignore[arg-type]
    assert api.calls == [("a", "0")]
    assert metrics.costs_stale.labels("ns", "ring")._value.get() == 0


def test_the_keeper_caps_its_writes_per_second_for_every_keyring_together() -> None:
    clock = _Clock()
    metrics = OperatorMetrics()
    keeper = CostKeeper(metrics, PatchPolicy(per_second=3.0), clock=clock)
    api = _Patches()
    for ring in ("one", "two"):
        pods = [_pod(f"{ring}-{i}") for i in range(4)]
        keeper.keep(api, "ns", ring, pods, {p.metadata.name: record() for p in pods})  # type: ignore[arg-type]
    assert len(api.calls) == 3
    assert metrics.cost_patches.labels("ns", "one", "deferred")._value.get() == 1
    assert metrics.cost_patches.labels("ns", "two", "deferred")._value.get() == 4
    clock.now += 1.0  # a second later, three more
    pods = [_pod(f"two-{i}") for i in range(4)]
    keeper.keep(api, "ns", "two", pods, {p.metadata.name: record() for p in pods})  # type: ignore[arg-type]
    assert len(api.calls) == 6
