"""The KeyRing and KeyRotation status: pure functions from what the operator saw to what it writes.

The status is the operator's voice to users (``kubectl get``, ``mcpfleet
rotate --status``, alerts on conditions), so its wording and its conditions
are written here once, where a unit test can read them, and the handlers
only patch what these functions return. Nothing here does I/O; the only
clock read is the wall-clock time stamped on a phase or a condition, and
each function that stamps one takes ``now`` for tests to fix.

Conventions kept throughout:

- a condition's ``lastTransitionTime`` moves only when its status flips;
- a phase's timestamp in ``phaseTimestamps`` is written once, when the
  phase is first seen, and never moved after;
- a tick that changes nothing patches nothing (:func:`changed`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

from mcpfleet.keys.ring import KeyRing
from mcpfleet_operator.api import TERMINAL_PHASES, KeyRingPhase, RotationPhase, parse_time
from mcpfleet_operator.rotation import Convergence, Decision, QueueEntry, active_of

Status = dict[str, Any]


def now_iso() -> str:
    """RFC 3339 UTC to the second: a condition's transition time."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_ms() -> str:
    """RFC 3339 UTC with milliseconds: phases can last well under a second."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def condition(
    kind: str,
    ok: bool,
    reason: str,
    message: str,
    previous: Sequence[Mapping[str, Any]] | None,
    *,
    now: str | None = None,
) -> dict[str, Any]:
    """A status condition; ``lastTransitionTime`` moves only when the status flips."""
    status = "True" if ok else "False"
    since = now or now_iso()
    for old in previous or []:
        if old.get("type") == kind and old.get("status") == status:
            since = old.get("lastTransitionTime") or since
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since,
    }


def conditions(
    previous: Mapping[str, Any], now: str | None, *entries: tuple[str, bool, str, str]
) -> list[dict[str, Any]]:
    """The conditions ``(type, ok, reason, message)``, each keeping its transition time."""
    old = _conditions(previous)
    return [
        condition(kind, ok, reason, message, old, now=now) for kind, ok, reason, message in entries
    ]


def changed(previous: Mapping[str, Any], new: Mapping[str, Any]) -> Status:
    """The fields of ``new`` that differ from ``previous``: what a status patch carries."""
    return {key: value for key, value in new.items() if previous.get(key) != value}


def recorded_phase(status: Mapping[str, Any]) -> RotationPhase:
    """The phase a KeyRotation's status records (Pending when none yet).

    The CRD's schema enumerates ``status.phase``, so the API server holds
    nothing else there.
    """
    return cast(RotationPhase, str(status.get("phase") or "Pending"))


def _conditions(status: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list(status.get("conditions") or [])


# --------------------------------------------------------------------------- KeyRing


def keyring_phase(
    conv: Convergence, active: QueueEntry | None, redis_error: str = ""
) -> tuple[KeyRingPhase, str]:
    """A KeyRing's phase and message: a rotation first, then why replicas may not hold the ring."""
    if active is not None and active.stalled:
        return "Degraded", f"rotation {active.name} is stalled: {', '.join(conv.lagging)}"
    if active is not None:
        return "Rotating", f"rotation {active.name} is {active.phase}"
    if redis_error:
        return "Degraded", redis_error
    if not conv.desired:
        return "Degraded", "the selector matches no serving Pod"
    if conv.lagging:
        return "Degraded", f"not yet on the ring: {', '.join(conv.lagging)}"
    return "Ready", f"{len(conv.desired)} replica(s) hold the ring"


def keyring_status(
    ring: KeyRing,
    conv: Convergence,
    queue: Iterable[QueueEntry],
    previous: Mapping[str, Any],
    *,
    redis_error: str = "",
    now: str | None = None,
) -> Status:
    """A valid KeyRing's status: its ring, its replicas, its rotations and three conditions."""
    entries = list(queue)
    active = active_of(entries)
    phase, message = keyring_phase(conv, active, redis_error)
    new: Status = {
        "phase": phase,
        "message": message,
        "kids": list(ring.kids),
        "sealingKid": ring.kids[0],
        "ringPhase": ring.phase,
        "convergence": conv.ratio,
        "replicas": {
            "desired": len(conv.desired),
            "converged": len(conv.converged),
            "lagging": list(conv.lagging),
        },
        "activeRotation": active.name if active else "",
        "covers": COVERS,
    }
    if parse_time(ring.keys[0].created) is not None:
        new["keyCreatedAt"] = ring.keys[0].created
    done = sorted((q for q in entries if q.completed), key=lambda q: q.completed)
    if done:
        new["lastRotation"] = {"name": done[-1].name, "completedAt": done[-1].completed}
    degraded = phase == "Degraded"
    if active is not None and active.stalled:
        degraded_reason = "Stalled"
    else:
        degraded_reason = "Lagging" if degraded else "AsExpected"
    new["conditions"] = conditions(
        previous,
        now,
        ("Ready", phase in ("Ready", "Rotating"), phase, message),
        (
            "Progressing",
            active is not None,
            "Rotating" if active else "Idle",
            f"rotation {active.name}: {active.phase}" if active else "no rotation running",
        ),
        ("Degraded", degraded, degraded_reason, message if degraded else ""),
    )
    return new


def keyring_invalid(reason: str, previous: Mapping[str, Any], *, now: str | None = None) -> Status:
    """A KeyRing that cannot be acted on (its spec, or a Secret that holds no ring)."""
    return {
        "phase": "Invalid",
        "message": reason,
        "conditions": conditions(
            previous,
            now,
            ("Ready", False, "Invalid", reason),
            ("Progressing", False, "Invalid", ""),
            ("Degraded", True, "Invalid", reason),
        ),
    }


# --------------------------------------------------------------------------- KeyRotation


def phase_timestamps(
    previous: Mapping[str, Any],
    new: Mapping[str, Any],
    phases: Iterable[str],
    *,
    now: str | None = None,
) -> dict[str, str]:
    """``phaseTimestamps`` with each of ``phases`` stamped ``now`` unless stamped before."""
    times = dict(previous.get("phaseTimestamps") or {}) | dict(new.get("phaseTimestamps") or {})
    stamp = now or now_ms()
    for phase in phases:
        times.setdefault(phase, stamp)
    return times


#: The Event a rotation posts on entering each phase.
PHASE_EVENTS: dict[str, str] = {
    "Staging": "staged a new key: it unseals, nothing seals with it yet",
    "Promoting": "promoted the new key: it seals now",
    "Waiting": "every replica seals with the new key; waiting {ttl:g}s "
    "(one token TTL) before dropping the old key",
    "Retiring": "dropped the old key",
    "Complete": "every replica holds only the new key",
}


def phase_events(phase: str, token_ttl: float, emergency: bool) -> list[tuple[str, str, str]]:
    """The Events (type, reason, message) a rotation posts on entering ``phase``."""
    events = []
    if phase in PHASE_EVENTS:
        events.append(("Normal", phase, PHASE_EVENTS[phase].format(ttl=token_ttl)))
    if phase == "Retiring" and emergency:
        events.append(
            (
                "Warning",
                "TTLWaitSkipped",
                "Emergency mode: the old key was dropped without waiting one token TTL; "
                "modern rounds sealed under it fail",
            )
        )
    return events


#: What the keys of a KeyRing seal, as its status and its rotations' say: request
#: state (modern rounds' tokens) and, with ``--tasks-encrypt``, stored task snapshots.
COVERS = ["request-state", "task-snapshots"]


def rotation_tasks(decision: Decision, previous: Mapping[str, Any], progress: Status) -> Status:
    """The task side of a rotation's status, merged into ``progress`` (what
    :func:`rotation_progress` returned): what its keys cover; while the retire
    step waits for live tasks sealed under the old key, how many
    (``oldKeyTasks``; -1 when the seal ledger could not be read); and the
    ``TasksDrained`` condition: False (``Waiting``) during that wait, True
    (``NoneLeft``) when the old key was dropped with none left, False
    (``WaitLimitExceeded``, with ``tasksAbandoned``) when the tasks wait limit
    forced it. A tick that says nothing of tasks keeps the condition as it was."""
    out: Status = {**progress, "covers": COVERS}
    entry: tuple[str, bool, str, str] | None = None
    if decision.abandoned is not None:
        out["oldKeyTasks"] = decision.abandoned
        out["tasksAbandoned"] = decision.abandoned
        entry = ("TasksDrained", False, "WaitLimitExceeded", decision.message)
    elif decision.old_tasks is not None and decision.action == "retire":
        out["oldKeyTasks"] = 0
        entry = ("TasksDrained", True, "NoneLeft", decision.message)
    elif decision.old_tasks is not None:
        out["oldKeyTasks"] = decision.old_tasks
        entry = ("TasksDrained", False, "Waiting", decision.message)
    listed = list(progress.get("conditions") or [])
    if entry is not None:
        listed += conditions(previous, None, entry)
    else:
        listed += [c for c in _conditions(previous) if c.get("type") == "TasksDrained"]
    out["conditions"] = listed
    return out


def rotation_waiting(
    message: str,
    previous: Mapping[str, Any],
    keep: RotationPhase = "Pending",
    *,
    now: str | None = None,
) -> Status:
    """Not a step: the rotation waits in its recorded phase ``keep`` and says why."""
    return {
        "phase": keep,
        "message": message,
        "conditions": conditions(
            previous,
            now,
            ("Progressing", keep != "Pending", "Waiting", message),
            ("Degraded", False, "AsExpected", ""),
            ("Complete", False, keep, message),
        ),
    }


def rotation_ended(
    phase: RotationPhase,
    message: str,
    previous: Mapping[str, Any],
    new: Mapping[str, Any],
    *,
    now: str | None = None,
) -> Status:
    """A rotation that ends without completing (Failed): degraded, not progressing."""
    return {
        "phase": phase,
        "message": message,
        "phaseTimestamps": phase_timestamps(previous, new, [phase], now=now),
        "conditions": conditions(
            previous,
            now,
            ("Progressing", False, phase, message),
            ("Degraded", True, phase, message),
            ("Complete", False, phase, message),
        ),
    }


def rotation_progress(
    decision: Decision,
    conv: Convergence,
    previous: Mapping[str, Any],
    new: Mapping[str, Any],
    *,
    stalled: bool,
    emergency: bool,
    now: str | None = None,
) -> Status:
    """The status after a decision other than ``fail`` was carried out.

    The phase the decision stood in is stamped too when the status had not
    recorded it (an operator resumed into it from the Secret).
    """
    phase = decision.next_phase
    stamps = [decision.phase] if decision.phase != recorded_phase(previous) else []
    out: Status = {
        "phaseTimestamps": phase_timestamps(previous, new, [*stamps, phase], now=now),
        "phase": phase,
        "message": decision.message,
        "desired": len(conv.desired),
        "converged": len(conv.converged),
        "convergence": conv.ratio,
        "lagging": list(decision.lagging),
        "stalled": stalled,
    }
    if emergency and phase in ("Retiring", "Complete"):
        out["ttlSkipped"] = True
    message = decision.message
    out["conditions"] = conditions(
        previous,
        now,
        ("Progressing", phase not in TERMINAL_PHASES, phase, message),
        ("Degraded", stalled, "Stalled" if stalled else "AsExpected", message if stalled else ""),
        ("Complete", phase == "Complete", phase, message),
    )
    return out
