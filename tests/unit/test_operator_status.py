"""The KeyRing and KeyRotation status the operator writes, from plain data (no cluster)."""

from __future__ import annotations

from typing import Any

import pytest

from mcpfleet.keys.ring import KeyRing
from mcpfleet_operator.rotation import Convergence, Decision, PodView, QueueEntry, converge
from mcpfleet_operator.status import (
    changed,
    condition,
    keyring_invalid,
    keyring_phase,
    keyring_status,
    phase_events,
    phase_timestamps,
    recorded_phase,
    rotation_ended,
    rotation_progress,
    rotation_waiting,
)

pytestmark = pytest.mark.unit

T0, T1 = "2026-12-01T10:00:00Z", "2026-12-01T11:00:00Z"
PODS = [PodView("r0", True), PodView("r1", True)]


def conv(kids: tuple[str, ...], lagging: tuple[str, ...] = ()) -> Convergence:
    return converge(PODS, {p.name: kids for p in PODS if p.name not in lagging}, kids)


def entry(name: str, phase: Any, stalled: bool = False, completed: str = "") -> QueueEntry:
    return QueueEntry(name, f"uid-{name}", T0, phase, stalled, completed)


def by_type(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


def test_a_condition_keeps_its_transition_time_until_its_status_flips() -> None:
    first = condition("Ready", True, "Ready", "ok", None, now=T0)
    same = condition("Ready", True, "Ready", "still ok", [first], now=T1)
    flipped = condition("Ready", False, "Degraded", "lagging", [same], now=T1)
    assert first["lastTransitionTime"] == same["lastTransitionTime"] == T0
    assert flipped["lastTransitionTime"] == T1 and flipped["status"] == "False"


def test_only_changed_fields_are_patched() -> None:
    assert changed({"phase": "Ready", "kids": ["a"]}, {"phase": "Ready", "kids": ["b"]}) == {
        "kids": ["b"]
    }
    assert changed({"phase": "Ready"}, {"phase": "Ready"}) == {}


@pytest.mark.parametrize(
    ("lagging", "active", "redis_error", "phase", "words"),
    [
        ((), None, "", "Ready", "2 replica(s) hold the ring"),
        (("r1",), None, "", "Degraded", "not yet on the ring: r1"),
        ((), None, "cannot read attestations", "Degraded", "cannot read attestations"),
        (("r1",), entry("rot", "Staging"), "", "Rotating", "rotation rot is Staging"),
        (("r1",), entry("rot", "Staging", stalled=True), "", "Degraded", "rot is stalled: r1"),
    ],
)
def test_the_keyring_phase_names_a_rotation_first_then_why_replicas_lag(
    lagging: tuple[str, ...],
    active: QueueEntry | None,
    redis_error: str,
    phase: str,
    words: str,
) -> None:
    got_phase, message = keyring_phase(conv(("k1",), lagging), active, redis_error)
    assert got_phase == phase and words in message


def test_a_selector_without_serving_pods_degrades_the_keyring() -> None:
    empty = converge([PodView("gone", False)], {}, ("k1",))
    assert keyring_phase(empty, None) == ("Degraded", "the selector matches no serving Pod")


def test_keyring_status_reports_the_ring_the_replicas_and_the_last_rotation() -> None:
    ring = KeyRing.generate().stage()
    queue = [
        entry("old", "Complete", completed="2026-11-01T00:00:00.000Z"),
        entry("newer", "Complete", completed="2026-11-20T00:00:00.000Z"),
        entry("now", "Promoting"),
    ]
    st = keyring_status(ring, conv(ring.kids, ("r1",)), queue, {}, now=T0)
    assert st["phase"] == "Rotating" and st["activeRotation"] == "now"
    assert st["kids"] == list(ring.kids) and st["sealingKid"] == ring.kids[0]
    assert st["ringPhase"] == "staged" and st["convergence"] == "1/2"
    assert st["replicas"] == {"desired": 2, "converged": 1, "lagging": ["r1"]}
    assert st["lastRotation"] == {"name": "newer", "completedAt": "2026-11-20T00:00:00.000Z"}
    assert st["keyCreatedAt"] == ring.keys[0].created
    conditions = by_type(st)
    assert conditions["Ready"]["status"] == "True"
    assert conditions["Progressing"]["status"] == "True"
    assert conditions["Progressing"]["message"] == "rotation now: Promoting"
    assert conditions["Degraded"] == {
        "type": "Degraded",
        "status": "False",
        "reason": "AsExpected",
        "message": "",
        "lastTransitionTime": T0,
    }


def test_a_stalled_rotation_degrades_the_keyring_with_reason_stalled() -> None:
    ring = KeyRing.generate()
    st = keyring_status(ring, conv(ring.kids, ("r1",)), [entry("rot", "Waiting", True)], {})
    degraded = by_type(st)["Degraded"]
    assert st["phase"] == "Degraded" and by_type(st)["Ready"]["status"] == "False"
    assert degraded["status"] == "True" and degraded["reason"] == "Stalled"
    idle = keyring_status(ring, conv(ring.kids, ("r1",)), [], {})
    assert by_type(idle)["Degraded"]["reason"] == "Lagging"
    assert by_type(idle)["Progressing"]["reason"] == "Idle" and "lastRotation" not in idle


def test_an_invalid_keyring_is_degraded_and_says_why() -> None:
    st = keyring_invalid("Secret keys is not a valid key ring: no keyring.json", {})
    assert st["phase"] == "Invalid" and "no keyring.json" in st["message"]
    assert [c["status"] for c in st["conditions"]] == ["False", "False", "True"]


def test_a_phase_timestamp_is_written_once_and_never_moved() -> None:
    previous = {"phaseTimestamps": {"Pending": T0}}
    times = phase_timestamps(previous, {}, ["Pending", "Staging"], now=T1)
    assert times == {"Pending": T0, "Staging": T1}
    later = phase_timestamps({"phaseTimestamps": times}, {}, ["Staging"], now="2027-01-01T00:00Z")
    assert later["Staging"] == T1


def test_progress_stamps_the_next_phase_and_a_phase_resumed_into() -> None:
    decision = Decision("promote", "Staging", "Promoting", "every replica holds the new key")
    previous = {"phase": "Pending", "phaseTimestamps": {"Pending": T0}}
    st = rotation_progress(
        decision, conv(("n", "o")), previous, {}, stalled=False, emergency=False, now=T1
    )
    # The status had not recorded Staging (the Secret said so): stamped, with Promoting.
    assert st["phaseTimestamps"] == {"Pending": T0, "Staging": T1, "Promoting": T1}
    assert st["phase"] == "Promoting" and st["convergence"] == "2/2" and not st["stalled"]
    assert "ttlSkipped" not in st
    assert [c["status"] for c in st["conditions"]] == ["True", "False", "False"]


def test_progress_of_a_stalled_emergency_rotation() -> None:
    wait = Decision("wait", "Retiring", "Retiring", "waiting for r1", ("r1",))
    previous = {"phase": "Retiring", "phaseTimestamps": {"Retiring": T0}}
    st = rotation_progress(
        wait, conv(("n",), ("r1",)), previous, {}, stalled=True, emergency=True, now=T1
    )
    assert st["phaseTimestamps"] == {"Retiring": T0} and st["ttlSkipped"] is True
    assert st["lagging"] == ["r1"] and st["stalled"] is True
    assert by_type(st)["Degraded"]["reason"] == "Stalled"
    done = Decision("complete", "Retiring", "Complete", "every replica holds only the new key")
    end = rotation_progress(done, conv(("n",)), previous, {}, stalled=False, emergency=False)
    assert by_type(end)["Complete"]["status"] == "True"
    assert by_type(end)["Progressing"]["status"] == "False"


def test_a_waiting_rotation_keeps_its_phase_and_an_ended_one_is_degraded() -> None:
    waiting = rotation_waiting("Secret keys does not exist yet", {}, keep="Staging")
    assert waiting["phase"] == "Staging" and by_type(waiting)["Progressing"]["status"] == "True"
    assert by_type(rotation_waiting("no KeyRing", {}))["Progressing"]["status"] == "False"
    failed = rotation_ended("Failed", "changed outside", {}, {"phaseTimestamps": {"Pending": T0}})
    assert set(failed["phaseTimestamps"]) == {"Pending", "Failed"}
    assert by_type(failed)["Degraded"]["status"] == "True"


def test_recorded_phase_defaults_to_pending() -> None:
    assert recorded_phase({}) == "Pending"
    assert recorded_phase({"phase": "Waiting"}) == "Waiting"


def test_phase_events_announce_each_phase_and_warn_on_a_skipped_ttl() -> None:
    assert phase_events("Waiting", 600, False) == [
        (
            "Normal",
            "Waiting",
            "every replica seals with the new key; waiting 600s "
            "(one token TTL) before dropping the old key",
        )
    ]
    assert [e[1] for e in phase_events("Retiring", 600, True)] == ["Retiring", "TTLWaitSkipped"]
    assert phase_events("Pending", 600, False) == []


def test_the_phase_clock_times_the_phase_a_step_leaves() -> None:
    from mcpfleet_operator.runtime import Clock

    clock = Clock()
    assert clock.advance("Pending", "Staging", now=10.0) == 0.0  # unseen phase: from now
    assert clock.advance("Staging", "Staging", now=12.0) is None
    assert clock.advance("Staging", "Promoting", now=15.5) == pytest.approx(5.5)
    clock.stall_announced = True
    assert clock.advance("Promoting", "Promoting", now=16.0) is None and clock.stall_announced
    # A restarted operator resumes into a phase it never saw: counted from then, not before.
    assert clock.advance("Retiring", "Complete", now=20.0) == 0.0


def test_a_lost_ttl_clock_starts_the_full_ttl_again() -> None:
    from mcpfleet_operator.runtime import Clock

    clock = Clock()
    assert not clock.ttl_elapsed(waiting=False, ttl=0.0), "no TTL runs before Waiting"
    assert clock.ttl_started is None
    assert not clock.ttl_elapsed(waiting=True, ttl=3600.0) and clock.ttl_started is not None
    assert clock.ttl_elapsed(waiting=True, ttl=0.0)


def test_the_rotation_status_says_what_its_keys_cover_and_who_holds_the_old_key() -> None:
    from mcpfleet_operator.status import rotation_tasks

    ring = conv(("new", "old"))
    wait = Decision("wait", "Waiting", "Waiting", "waiting: 50 live task(s)", old_tasks=50)
    progress = rotation_progress(wait, ring, {}, {}, stalled=False, emergency=False, now=T0)
    status = rotation_tasks(wait, {}, progress)
    assert status["covers"] == ["request-state", "task-snapshots"]
    assert status["oldKeyTasks"] == 50 and "tasksAbandoned" not in status
    drained = by_type(status)["TasksDrained"]
    assert (drained["status"], drained["reason"]) == ("False", "Waiting")
    assert {"Progressing", "Degraded", "Complete"} <= set(by_type(status))
    retire = Decision("retire", "Waiting", "Retiring", "none left", old_tasks=0)
    progress = rotation_progress(retire, ring, status, {}, stalled=False, emergency=False)
    after = rotation_tasks(retire, status, progress)
    assert after["oldKeyTasks"] == 0
    assert (by_type(after)["TasksDrained"]["status"], by_type(after)["TasksDrained"]["reason"]) == (
        "True",
        "NoneLeft",
    )
    # A later tick that says nothing of tasks keeps the condition.
    done = Decision("complete", "Retiring", "Complete", "every replica holds only the new key")
    progress = rotation_progress(done, conv(("new",)), after, {}, stalled=False, emergency=False)
    kept = rotation_tasks(done, after, progress)
    assert by_type(kept)["TasksDrained"] == by_type(after)["TasksDrained"]
    assert "oldKeyTasks" not in kept  # unchanged, so not patched


def test_a_forced_retire_marks_the_tasks_it_failed() -> None:
    from mcpfleet_operator.status import rotation_tasks

    forced = Decision("retire", "Waiting", "Retiring", "limit passed", old_tasks=4, abandoned=4)
    progress = rotation_progress(
        forced, conv(("new", "old")), {}, {}, stalled=False, emergency=False
    )
    status = rotation_tasks(forced, {}, progress)
    assert status["tasksAbandoned"] == 4 and status["oldKeyTasks"] == 4
    drained = by_type(status)["TasksDrained"]
    assert (drained["status"], drained["reason"]) == ("False", "WaitLimitExceeded")


def test_the_tasks_wait_limit_counts_from_the_end_of_the_ttl() -> None:
    from mcpfleet_operator.runtime import Clock

    clock = Clock()
    assert not clock.tasks_wait_over(ttl=0.0, limit=0.0), "no limit runs before the TTL"
    assert not clock.ttl_elapsed(waiting=True, ttl=3600.0)
    assert not clock.tasks_wait_over(ttl=3600.0, limit=0.0)
    assert not clock.tasks_wait_over(ttl=0.0, limit=3600.0)
    assert clock.tasks_wait_over(ttl=0.0, limit=0.0)
