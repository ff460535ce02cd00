"""Driving one KeyRotation a step: observe, ask the state machine, perform, record.

The rotation timer and the deletion handler of :mod:`mcpfleet_operator.handlers`
call :func:`advance` once per tick. It observes the Secret, the Pods of the
selector and their attestations, asks :func:`~mcpfleet_operator.rotation.decide`
for the one step the world allows, performs it (a Secret write through
:func:`~mcpfleet_operator.secretring.write_step`, then the nudge), and records
the outcome in status, Events and metrics; a step that waits too long is a
stall, a spec or Secret that cannot be used fails the rotation.
"""

from __future__ import annotations

import logging
import time

import kopf
from redis.exceptions import RedisError

from mcpfleet.redisconn import describe
from mcpfleet_operator import secretring
from mcpfleet_operator.api import (
    KeyRingSpec,
    RotationSpec,
    SpecError,
)
from mcpfleet_operator.metrics import TIMED_PHASES
from mcpfleet_operator.rotation import (
    Convergence,
    Decision,
    Observed,
    RingView,
    converge,
    decide,
    is_stalled,
    resumed_kids,
    turn,
)
from mcpfleet_operator.runtime import Clock, Tick, views
from mcpfleet_operator.status import (
    Status,
    now_ms,
    phase_events,
    recorded_phase,
    rotation_ended,
    rotation_progress,
    rotation_tasks,
    rotation_waiting,
)

log = logging.getLogger("mcpfleet_operator")


def advance(t: Tick) -> None:
    """One step of a rotation: find its KeyRing, then observe, decide, perform and record.

    Each part returns the status fields it decided; they are merged here, in
    order, and written once.
    """
    try:
        rot = RotationSpec.parse(t.spec)
    except SpecError as exc:
        t.write(_fail(t, "", {}, str(exc)))
        return
    new: Status = {"keyRing": rot.key_ring, "mode": rot.mode}
    recorded = recorded_phase(t.status)
    if recorded == "Pending" and "Pending" not in (t.status.get("phaseTimestamps") or {}):
        new["phaseTimestamps"] = {"Pending": now_ms()}
        if rot.reason:
            t.event("Requested", rot.reason)
    ring_spec = t.keyring_spec(rot.key_ring)
    if isinstance(ring_spec, str):
        t.write({**new, **rotation_waiting(ring_spec, t.status)})
        return
    with t.rt.lock(t.namespace, rot.key_ring):
        outcome = _step(t, rot, ring_spec)
    if outcome is None:
        return  # the Secret changed meanwhile: decide again next tick
    if isinstance(outcome, str):
        t.write({**new, **rotation_waiting(outcome, t.status, keep=recorded)})
        return
    decision, conv, kids = outcome
    new.update(kids)
    t.write({**new, **_record(t, rot, ring_spec, decision, conv, new)})


def _step(
    t: Tick, rot: RotationSpec, ring_spec: KeyRingSpec
) -> tuple[Decision, Convergence, Status] | str | None:
    """Observe, decide and perform one step (under the KeyRing's lock).

    Returns the decision, the convergence on the ring as it now is and the kids
    this step learned (``oldKid``/``newKid``, when it staged or resumed), or why
    nothing can be observed yet, or None when the Secret changed since it was read.
    """
    current = secretring.read(t.rt.core, t.namespace, ring_spec.secret_name)
    if current is None or current.ring is None:
        why = "does not exist yet" if current is None else f"is not a valid ring: {current.error}"
        return f"Secret {ring_spec.secret_name} {why}"
    pods = t.rt.pods(t.namespace, ring_spec.selector)
    try:
        attested = t.rt.attested(ring_spec.fleet)
    except (RedisError, OSError) as exc:
        return f"cannot read attestations: {describe(exc)}"
    view = current.view()
    conv = converge(views(pods), attested, view.kids)
    observed, kids = _observe(t, rot, ring_spec, view, conv)
    decision = decide(observed)
    if decision.action not in secretring.STEPS:
        if decision.lagging:
            t.rt.refresh_volumes(pods, current.resource_version, decision.lagging)
        return decision, conv, kids
    try:
        written = secretring.write_step(t.rt.core, current, decision.action, owner=(t.name, t.uid))
    except secretring.SecretConflict as exc:
        log.info("%s/%s: %s; deciding again", t.namespace, t.name, exc)
        return None
    assert written.ring is not None
    t.metrics.secret_writes.labels(t.namespace, rot.key_ring, decision.action).inc()
    if decision.action == "stage":
        kids = {"oldKid": written.ring.kids[0], "newKid": written.ring.kids[1]}
    t.rt.refresh_volumes(pods, written.resource_version)
    # Convergence from now on is on the ring just written (none attest it yet).
    return decision, converge(views(pods), attested, written.ring.kids), kids


def _observe(
    t: Tick,
    rot: RotationSpec,
    ring_spec: KeyRingSpec,
    view: RingView,
    conv: Convergence,
) -> tuple[Observed, Status]:
    """What :func:`decide` needs, with the new kid and the TTL clock as this process
    knows them; and the kids resumed from the Secret when the status has none."""
    recorded = recorded_phase(t.status)
    new_kid = str(t.status.get("newKid") or "")
    kids: Status = {}
    resumed = None if new_kid else resumed_kids(t.uid, view)
    if resumed is not None:
        kids = {"oldKid": resumed[0], "newKid": resumed[1]}
        new_kid = resumed[1]
    clock = t.rt.clock(t.uid)
    ttl_elapsed = clock.ttl_elapsed(recorded == "Waiting", ring_spec.token_ttl)
    old_tasks: int | None = 0
    tasks_wait_over = False
    if recorded == "Waiting" and ttl_elapsed and view.phase == "promoted" and len(view.kids) > 1:
        # Counted only now: every replica has sealed with the new key for a token
        # TTL, so no snapshot sealed under the old one is still being added.
        try:
            old_tasks = t.rt.old_tasks(ring_spec.fleet, view.kids[1])
        except (RedisError, OSError) as exc:
            log.warning(
                "%s/%s: the seal ledger was not read: %s", t.namespace, t.name, describe(exc)
            )
            old_tasks = None
        tasks_wait_over = clock.tasks_wait_over(ring_spec.token_ttl, t.rt.tasks_wait_limit)
    mine, why = turn(t.uid, t.created, t.name, t.queue(rot.key_ring))
    observed = Observed(
        uid=t.uid,
        phase=recorded,
        new_kid=new_kid,
        ring=view,
        convergence=conv,
        emergency=rot.emergency,
        ttl_elapsed=ttl_elapsed,
        my_turn=mine,
        blocked=why,
        old_tasks=old_tasks,
        tasks_wait_over=tasks_wait_over,
    )
    return observed, kids


def _record(
    t: Tick,
    rot: RotationSpec,
    ring_spec: KeyRingSpec,
    decision: Decision,
    conv: Convergence,
    so_far: Status,
) -> Status:
    """Events, metrics and clocks for the decision just carried out; the status
    fields it decides (``so_far``: what this tick decided before, read only)."""
    clock, now, phase = t.rt.clock(t.uid), time.monotonic(), decision.next_phase
    spent = clock.advance(decision.phase, decision.next_phase, now)
    if spent is not None:
        left = decision.phase.lower()
        if left in TIMED_PHASES:
            t.metrics.phase_duration.labels(left).observe(spent)
        if decision.action == "start-ttl":
            clock.ttl_started = now
        for kind, reason, text in phase_events(phase, ring_spec.token_ttl, rot.emergency):
            kopf.event(t.body, type=kind, reason=reason, message=text)
    if decision.action == "fail":
        return _fail(t, rot.key_ring, so_far, decision.message)
    keyring = rot.key_ring
    t.metrics.set_old_key_tasks(
        t.namespace, keyring, max(0, decision.old_tasks or 0) if decision.action == "wait" else 0
    )
    if decision.abandoned is not None:
        held = "an unknown number of" if decision.abandoned < 0 else str(decision.abandoned)
        t.metrics.tasks_abandoned.labels(t.namespace, keyring).inc(max(0, decision.abandoned))
        t.warn(
            "TasksWaitExpired",
            f"the old key was dropped {t.rt.tasks_wait_limit:g}s after the token TTL "
            f"(--tasks-wait-limit) with {held} live task(s) sealed under it: they fail",
        )
    if phase == "Complete":
        t.metrics.rotation_ended(t.namespace, keyring, "complete")
        t.rt.forget_clock(t.uid)
    else:
        t.metrics.set_phase(t.namespace, keyring, phase)
    stalled = _stall(t, keyring, decision, clock, now)
    progress = rotation_progress(
        decision, conv, t.status, so_far, stalled=stalled, emergency=rot.emergency
    )
    return rotation_tasks(decision, t.status, progress)


def _stall(t: Tick, keyring: str, decision: Decision, clock: Clock, now: float) -> bool:
    """Whether the rotation is stalled now; a Warning when it becomes so, an Event when not."""
    stalled = is_stalled(decision, now - clock.entered, t.rt.stall_after)
    if stalled and not clock.stall_announced:
        clock.stall_announced = True
        t.metrics.stalls.labels(t.namespace, keyring).inc()
        t.warn(
            "Stalled",
            f"{decision.phase} for over {t.rt.stall_after:g}s; lagging: "
            f"{', '.join(decision.lagging)}",
        )
    if not stalled and t.status.get("stalled") and decision.next_phase != "Complete":
        t.event("CaughtUp", "every replica attests again")
    t.metrics.stalled.labels(t.namespace, keyring).set(1 if stalled else 0)
    return stalled


def _fail(t: Tick, keyring: str, so_far: Status, message: str) -> Status:
    """The rotation ends Failed: the status fields of that, its result metric, a
    warning Event (``so_far``: what this tick decided before, read only)."""
    if keyring:
        t.metrics.rotation_ended(t.namespace, keyring, "failed")
    t.warn("Failed", message)
    return {**so_far, **rotation_ended("Failed", message, t.status, so_far)}
