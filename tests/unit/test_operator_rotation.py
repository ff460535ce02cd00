"""The rotation state machine, the queue and the safety invariant, without I/O."""

from __future__ import annotations

import datetime as dt
import itertools

import pytest

from mcpfleet_operator.rotation import (
    Convergence,
    Decision,
    Observed,
    PodView,
    QueueEntry,
    RingView,
    active_of,
    converge,
    decide,
    is_stalled,
    on_delete,
    resumed_kids,
    schedule,
    sealing_is_safe,
    turn,
)

pytestmark = pytest.mark.unit

PODS = [PodView("r0", True), PodView("r1", True), PodView("gone", False)]
OLD, NEW = "aaaa0001", "bbbb0002"
ME = "uid-me"


def conv(expected: tuple[str, ...], lagging: tuple[str, ...] = ()) -> Convergence:
    attested = {p.name: expected for p in PODS if p.name not in lagging}
    attested.update({n: ("other",) for n in lagging})
    return converge(PODS, attested, expected)


def observe(
    phase: str,
    ring_phase: str,
    kids: tuple[str, ...],
    *,
    owner: str = ME,
    lagging: tuple[str, ...] = (),
    new_kid: str = "",
    **kw: object,
) -> Observed:
    return Observed(
        uid=ME,
        phase=phase,
        new_kid=new_kid,
        ring=RingView(ring_phase, kids, owner),  # type: ignore[arg-type]
        convergence=conv(kids, lagging),
        **kw,  # type: ignore[arg-type]
    )


def test_convergence_counts_only_serving_pods_and_wants_the_exact_order() -> None:
    c = converge(PODS, {"r0": (NEW, OLD), "r1": (OLD, NEW), "gone": ()}, (NEW, OLD))
    assert c.desired == ("r0", "r1")
    assert c.converged == ("r0",) and c.lagging == ("r1",)
    assert not c.done and c.ratio == "1/2"
    assert converge(PODS, {"r0": (NEW,), "r1": (NEW,)}, (NEW,)).done


def test_no_serving_pod_never_counts_as_converged() -> None:
    c = converge([PodView("x", False)], {}, (OLD,))
    assert not c.done and c.desired == ()


def test_the_full_protocol_runs_stage_promote_wait_retire_complete() -> None:
    d = decide(observe("Pending", "stable", (OLD,), owner=""))
    assert (d.action, d.next_phase) == ("stage", "Staging")
    d = decide(observe("Staging", "staged", (OLD, NEW), new_kid=NEW))
    assert (d.action, d.next_phase) == ("promote", "Promoting")
    d = decide(observe("Promoting", "promoted", (NEW, OLD), new_kid=NEW))
    assert (d.action, d.next_phase) == ("start-ttl", "Waiting")
    d = decide(observe("Waiting", "promoted", (NEW, OLD), new_kid=NEW))
    assert (d.action, d.next_phase) == ("wait", "Waiting")
    d = decide(observe("Waiting", "promoted", (NEW, OLD), new_kid=NEW, ttl_elapsed=True))
    assert (d.action, d.next_phase) == ("retire", "Retiring")
    d = decide(observe("Retiring", "stable", (NEW,), new_kid=NEW))
    assert (d.action, d.next_phase) == ("complete", "Complete")
    assert decide(observe("Complete", "stable", (NEW,), new_kid=NEW)).action == "none"


@pytest.mark.parametrize(
    ("phase", "ring_phase", "kids", "waiting_in"),
    [
        ("Pending", "stable", (OLD,), "Pending"),
        ("Staging", "staged", (OLD, NEW), "Staging"),
        ("Promoting", "promoted", (NEW, OLD), "Promoting"),
        ("Waiting", "promoted", (NEW, OLD), "Waiting"),
        ("Retiring", "stable", (NEW,), "Retiring"),
    ],
)
def test_no_step_is_taken_while_a_serving_replica_lags(
    phase: str, ring_phase: str, kids: tuple[str, ...], waiting_in: str
) -> None:
    owner = "" if phase == "Pending" else ME
    d = decide(
        observe(
            phase, ring_phase, kids, owner=owner, lagging=("r1",), new_kid=NEW, ttl_elapsed=True
        )
    )
    assert d.action == "wait" and d.phase == waiting_in
    assert d.lagging == ("r1",) and "r1" in d.message


def test_emergency_skips_the_ttl_wait_but_not_the_confirmations() -> None:
    d = decide(observe("Promoting", "promoted", (NEW, OLD), new_kid=NEW, emergency=True))
    assert (d.action, d.next_phase) == ("retire", "Retiring")
    lagging = observe(
        "Promoting", "promoted", (NEW, OLD), new_kid=NEW, emergency=True, lagging=("r0",)
    )
    assert decide(lagging).action == "wait"


@pytest.mark.parametrize(
    ("recorded", "ring_phase", "kids", "action", "phase"),
    [
        # killed after writing [old, new], before recording Staging
        ("Pending", "staged", (OLD, NEW), "promote", "Staging"),
        # killed after writing [new, old], before recording Promoting
        ("Staging", "promoted", (NEW, OLD), "start-ttl", "Promoting"),
        # killed after writing [new], before recording Retiring
        ("Waiting", "stable", (NEW,), "complete", "Retiring"),
        ("Promoting", "stable", (NEW,), "complete", "Retiring"),
    ],
)
def test_a_restarted_operator_resumes_where_the_secret_says(
    recorded: str, ring_phase: str, kids: tuple[str, ...], action: str, phase: str
) -> None:
    new_kid = "" if recorded == "Pending" else NEW
    d = decide(observe(recorded, ring_phase, kids, new_kid=new_kid))
    assert (d.action, d.phase) == (action, phase)


def test_resumed_waiting_still_needs_the_ttl() -> None:
    d = decide(observe("Waiting", "promoted", (NEW, OLD), new_kid=NEW, ttl_elapsed=False))
    assert d.action == "wait"


def test_a_ring_changed_behind_the_rotations_back_fails_it() -> None:
    d = decide(observe("Staging", "stable", (OLD,), owner="someone-else", new_kid=NEW))
    assert d.action == "fail" and "outside" in d.message
    d = decide(observe("Staging", "staged", (OLD, "cccc0003"), new_kid=NEW))
    assert d.action == "fail"


def test_a_pending_rotation_waits_for_its_turn_and_for_a_stable_ring() -> None:
    d = decide(
        observe("Pending", "stable", (OLD,), owner="", my_turn=False, blocked="queued behind x")
    )
    assert (d.action, d.phase, d.message) == ("wait", "Pending", "queued behind x")
    d = decide(observe("", "staged", (OLD, NEW), owner="other-uid"))
    assert d.action == "wait" and "another rotation" in d.message


def test_a_selector_without_serving_pods_never_stages() -> None:
    o = Observed(
        uid=ME,
        phase="Pending",
        new_kid="",
        ring=RingView("stable", (OLD,), ""),
        convergence=converge([], {}, (OLD,)),
    )
    d = decide(o)
    assert d.action == "wait" and "no serving Pod" in d.message


def test_turn_goes_to_the_oldest_pending_rotation_and_never_beside_an_active_one() -> None:
    a = QueueEntry("a", "ua", "2026-01-01T00:00:00Z", "Pending")
    b = QueueEntry("b", "ub", "2026-01-01T00:00:05Z", "Pending")
    done = QueueEntry("old", "uo", "2025-01-01T00:00:00Z", "Complete")
    assert turn("ua", a.created, "a", [a, b, done]) == (True, "")
    ok, why = turn("ub", b.created, "b", [a, b, done])
    assert not ok and "queued behind rotation a" in why
    active = QueueEntry("c", "uc", "2027-01-01T00:00:00Z", "Promoting")
    ok, why = turn("ua", a.created, "a", [a, active])
    assert not ok and "c (Promoting)" in why


def test_deleting_aborts_before_promotion_and_finishes_after() -> None:
    assert on_delete(ME, RingView("staged", (OLD, NEW), ME)) == "abort"
    assert on_delete(ME, RingView("promoted", (NEW, OLD), ME)) == "finish"
    assert on_delete(ME, RingView("stable", (NEW,), ME), NEW) == "finish", "retired, unconfirmed"
    assert on_delete(ME, RingView("stable", (OLD,), ME), NEW) == "release"
    assert on_delete(ME, RingView("staged", (OLD, NEW), "other")) == "release"
    assert on_delete(ME, None) == "release"


def test_the_safety_invariant_holds_through_the_protocol_and_catches_a_skipped_step() -> None:
    steps = [(OLD,), (OLD, NEW), (NEW, OLD), (NEW,)]
    for a, b in itertools.pairwise(steps):
        assert sealing_is_safe([a, b]), (a, b)
    assert not sealing_is_safe([(OLD,), (NEW, OLD)]), "promoted before every replica staged"
    assert not sealing_is_safe([(OLD, NEW), (NEW,)]), "retired before every replica promoted"


def test_a_stall_is_an_active_step_held_up_by_lagging_replicas_past_the_bound() -> None:
    lagging = Decision("wait", "Staging", "Staging", "waiting", ("r1",))
    assert is_stalled(lagging, waited=120.0, stall_after=120.0)
    assert not is_stalled(lagging, waited=119.9, stall_after=120.0)
    # The TTL wait with every replica converged is the protocol, not a stall.
    ttl_wait = Decision("wait", "Waiting", "Waiting", "waiting one token TTL")
    assert not is_stalled(ttl_wait, waited=3600.0, stall_after=120.0)
    # A pending rotation is not holding the ring: it waits, it never stalls.
    queued = Decision("wait", "Pending", "Pending", "not yet", ("r1",))
    assert not is_stalled(queued, waited=3600.0, stall_after=120.0)
    step = Decision("promote", "Staging", "Promoting", "go", ("r1",))
    assert not is_stalled(step, waited=3600.0, stall_after=120.0)


def _q(name: str, phase: str, completed: str = "") -> QueueEntry:
    return QueueEntry(name, f"uid-{name}", "2026-01-01T00:00:00Z", phase, completed=completed)  # type: ignore[arg-type]


def test_the_schedule_counts_from_the_last_completion_else_the_key_else_the_keyring() -> None:
    t0 = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
    day = 86400.0
    done = [
        _q("a", "Complete", "2026-12-03T00:00:00Z"),
        _q("b", "Complete", "2026-12-02T00:00:00Z"),
    ]
    due = schedule(day, done, t0, t0, now=t0)
    assert due is not None and due.due == dt.datetime(2026, 12, 4, tzinfo=dt.UTC)
    assert not due.start and due.due_text == "2026-12-04T00:00:00Z"
    by_key = schedule(day, [], t0 + dt.timedelta(hours=1), t0, now=t0)
    assert by_key is not None and by_key.due == t0 + dt.timedelta(days=1, hours=1)
    by_ring = schedule(day, [], None, t0, now=t0 + dt.timedelta(days=1))
    assert by_ring is not None and by_ring.start
    assert by_ring.rotation_name("keys") == f"keys-scheduled-{int(by_ring.due.timestamp())}"
    assert schedule(day, [], None, None, now=t0) is None


def test_a_due_rotation_waits_while_another_is_open() -> None:
    t0 = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
    late = t0 + dt.timedelta(days=30)
    for open_phase in ("Pending", "Staging", "Waiting"):
        due = schedule(86400.0, [_q("x", open_phase)], t0, t0, now=late)
        assert due is not None and not due.start, open_phase
    ended = schedule(86400.0, [_q("x", "Failed")], t0, t0, now=late)
    assert ended is not None and ended.start


def test_the_active_rotation_is_the_one_that_owns_the_ring() -> None:
    assert active_of([_q("p", "Pending"), _q("c", "Complete")]) is None
    active = active_of([_q("p", "Pending"), _q("s", "Retiring")])
    assert active is not None and active.name == "s"


def test_a_resumed_rotation_reads_its_kids_back_from_the_secret() -> None:
    assert resumed_kids(ME, RingView("staged", (OLD, NEW), ME)) == (OLD, NEW)
    assert resumed_kids(ME, RingView("promoted", (NEW, OLD), ME)) == (OLD, NEW)
    assert resumed_kids(ME, RingView("staged", (OLD, NEW), "other")) is None
    assert resumed_kids(ME, RingView("stable", (NEW,), ME)) is None


def test_the_retire_step_waits_for_live_tasks_sealed_under_the_old_key() -> None:
    waiting = {"new_kid": NEW, "ttl_elapsed": True}
    d = decide(observe("Waiting", "promoted", (NEW, OLD), old_tasks=50, **waiting))
    assert (d.action, d.next_phase, d.old_tasks, d.abandoned) == ("wait", "Waiting", 50, None)
    assert f"50 live task(s) hold a snapshot sealed under {OLD}" in d.message
    assert not is_stalled(d, waited=1e9, stall_after=1.0), "a task wait is not a stall"
    # An unreadable ledger (a Redis stall) is no evidence that none is left.
    d = decide(observe("Waiting", "promoted", (NEW, OLD), old_tasks=None, **waiting))
    assert (d.action, d.old_tasks) == ("wait", -1) and "cannot be read" in d.message
    d = decide(observe("Waiting", "promoted", (NEW, OLD), old_tasks=0, **waiting))
    assert (d.action, d.next_phase, d.old_tasks, d.abandoned) == ("retire", "Retiring", 0, None)
    # Tasks never hold the TTL wait shorter, nor a lagging replica's confirmation.
    d = decide(observe("Waiting", "promoted", (NEW, OLD), new_kid=NEW, old_tasks=0))
    assert d.action == "wait" and "token TTL" in d.message
    d = decide(observe("Waiting", "promoted", (NEW, OLD), lagging=("r1",), old_tasks=0, **waiting))
    assert d.action == "wait" and d.lagging == ("r1",)


def test_the_tasks_wait_limit_retires_anyway_and_says_how_many_tasks_fail() -> None:
    over = {"new_kid": NEW, "ttl_elapsed": True, "tasks_wait_over": True}
    d = decide(observe("Waiting", "promoted", (NEW, OLD), old_tasks=3, **over))
    assert (d.action, d.next_phase, d.abandoned) == ("retire", "Retiring", 3)
    assert "3 live task(s)" in d.message and "fail" in d.message
    d = decide(observe("Waiting", "promoted", (NEW, OLD), old_tasks=None, **over))
    assert (d.action, d.abandoned) == ("retire", -1) and "unknown number" in d.message
    # None left when the limit passes: an ordinary retire, nothing abandoned.
    d = decide(observe("Waiting", "promoted", (NEW, OLD), old_tasks=0, **over))
    assert (d.action, d.abandoned) == ("retire", None)


def test_emergency_retires_without_waiting_for_tasks() -> None:
    d = decide(observe("Waiting", "promoted", (NEW, OLD), new_kid=NEW, emergency=True, old_tasks=7))
    assert d.action == "retire"
