"""The kopf handlers: the thin I/O shell around :mod:`mcpfleet.operator.rotation`.

kopf watches the resources, keeps the indexes, runs the per-object timers,
holds finalizers, posts Events, and (with peering) lets exactly one operator
replica act. The handlers are synchronous (kopf runs them in its thread pool)
and do only this each tick: observe (the Secret, the Pods of the selector,
the attestations in Redis), ask the pure state machine, perform the one step
it names, and record the outcome in status, Events and metrics.

State lives in the cluster only: the ring and its owner in the Secret, the
phase in the KeyRotation's status; what the status says is written by
:mod:`~mcpfleet.operator.status`, what the process keeps in memory (only what
may be lost safely) is in :mod:`~mcpfleet.operator.runtime`.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException
from redis.exceptions import RedisError

from mcpfleet.operator import secretring
from mcpfleet.operator.api import (
    FINALIZER,
    GROUP,
    KEYRINGS,
    KEYROTATIONS,
    TERMINAL_PHASES,
    VERSION,
    KeyRingSpec,
    RotationSpec,
    SpecError,
    parse_time,
    rotation_manifest,
)
from mcpfleet.operator.metrics import TIMED_PHASES
from mcpfleet.operator.rotation import (
    Convergence,
    Decision,
    DeleteAction,
    Observed,
    QueueEntry,
    RingView,
    active_of,
    converge,
    decide,
    is_stalled,
    on_delete,
    resumed_kids,
    schedule,
    turn,
)
from mcpfleet.operator.runtime import Clock, QueueIndex, Runtime, SpecIndex, Tick, views
from mcpfleet.operator.status import (
    Status,
    keyring_invalid,
    keyring_status,
    now_ms,
    phase_events,
    recorded_phase,
    rotation_ended,
    rotation_progress,
    rotation_waiting,
)
from mcpfleet.server.keys.ring import KeyRing
from mcpfleet.server.redisconn import describe

log = logging.getLogger("mcpfleet.operator")

#: How often a running rotation is re-examined, and a KeyRing's status refreshed.
ROTATION_TICK = 0.25
KEYRING_TICK = 1.0
#: After an unexpected error (an API or Redis hiccup) a handler retries this
#: soon, not after kopf's default minute: a rotation must not idle that long.
ERROR_BACKOFF = 1.0


def _namespaced(namespace: str | None) -> str:
    assert namespace is not None, "namespaced resources only"
    return namespace


# --------------------------------------------------------------------------- settings


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    """Keep kopf's own bookkeeping in annotations (the status schemas are ours)."""
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    # Resources are known from discovery at start; watching CRDs cluster-wide
    # would need a ClusterRole the operator has no other use for.
    settings.scanning.disabled = True
    # kopf's per-handler log lines stay logs; Events are the ones posted here.
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 120
    settings.watching.client_timeout = 150


# --------------------------------------------------------------------------- indexes


@kopf.index(GROUP, VERSION, KEYROTATIONS)
def rotation_queue(
    name: str,
    namespace: str | None,
    uid: str,
    spec: kopf.Spec,
    status: kopf.Status,
    meta: kopf.Meta,
    **_: Any,
) -> dict[tuple[str, str], QueueEntry]:
    """Every KeyRotation, by (namespace, KeyRing): who is active, who is next."""
    times = status.get("phaseTimestamps") or {}
    return {
        (_namespaced(namespace), str(spec.get("keyRing", ""))): QueueEntry(
            name=name,
            uid=uid,
            created=str(meta.get("creationTimestamp", "")),
            phase=recorded_phase(status),
            stalled=bool(status.get("stalled")),
            completed=str(times.get("Complete", "")),
        )
    }


@kopf.index(GROUP, VERSION, KEYRINGS)
def keyring_specs(
    name: str, namespace: str | None, spec: kopf.Spec, **_: Any
) -> dict[tuple[str, str], dict[str, Any]]:
    """Every KeyRing's spec, by (namespace, name): what a rotation needs to find its ring."""
    return {(_namespaced(namespace), name): dict(spec)}


# --------------------------------------------------------------------------- KeyRing


# kopf passes each index by its function's name; its handler protocols cannot say
# so, hence the ``arg-type`` ignores on the handlers that take them.
@kopf.timer(  # type: ignore[arg-type]
    GROUP, VERSION, KEYRINGS, interval=KEYRING_TICK, initial_delay=0, backoff=ERROR_BACKOFF
)
def keyring_tick(
    body: kopf.Body,
    patch: kopf.Patch,
    memo: Runtime,
    rotation_queue: QueueIndex,
    keyring_specs: SpecIndex,
    **_: Any,
) -> None:
    """Create or adopt the Secret, report convergence, start scheduled rotations."""
    t = Tick.of(memo, body, patch, rotation_queue, keyring_specs)
    new: Status = {"observedGeneration": body.metadata.get("generation")}
    try:
        ring_spec = KeyRingSpec.parse(t.name, t.spec)
    except SpecError as exc:
        t.write(new | keyring_invalid(str(exc), t.status))
        return
    found = _ensure_secret(t, ring_spec)
    if found is None:
        return  # created by someone else meanwhile: adopt it next tick
    current, created_now = found
    if current.ring is None:
        if t.status.get("phase") != "Invalid":
            t.warn(
                "InvalidSecret",
                f"Secret {ring_spec.secret_name} is not a valid key ring "
                f"(left untouched): {current.error}",
            )
        why = f"Secret {ring_spec.secret_name} is not a valid key ring: {current.error}"
        t.write(new | keyring_invalid(why, t.status))
        return
    if not t.status.get("kids") and not created_now:
        t.event("Adopted", f"Secret {ring_spec.secret_name} holds kids {list(current.ring.kids)}")
    t.write(new | _keyring_report(t, ring_spec, current))


def _ensure_secret(t: Tick, ring_spec: KeyRingSpec) -> tuple[secretring.RingSecret, bool] | None:
    """The KeyRing's Secret, created with a new one-key ring if missing (and whether it was)."""
    with t.rt.lock(t.namespace, t.name):
        current = secretring.read(t.rt.core, t.namespace, ring_spec.secret_name)
        if current is not None:
            return current, False
        try:
            current = secretring.create(
                t.rt.core, t.namespace, ring_spec.secret_name, KeyRing.generate(), keyring=t.name
            )
        except secretring.SecretConflict:
            return None
    t.metrics.secret_writes.labels(t.namespace, t.name, "create").inc()
    t.event(
        "Created",
        f"created Secret {ring_spec.secret_name} with a new one-key ring "
        f"(kid {current.ring.kids[0] if current.ring else '?'})",
    )
    return current, True


def _keyring_report(t: Tick, ring_spec: KeyRingSpec, current: secretring.RingSecret) -> Status:
    """Observe the replicas; the KeyRing's status; its metrics, nudges and schedule."""
    ring = current.ring
    assert ring is not None
    pods = t.rt.pods(t.namespace, ring_spec.selector)
    try:
        attested, redis_error = t.rt.attested(ring_spec.fleet), ""
    except (RedisError, OSError) as exc:
        attested, redis_error = {}, f"cannot read attestations from Redis: {describe(exc)}"
    conv = converge(views(pods), attested, ring.kids)
    queue = t.queue(t.name)
    new = keyring_status(ring, conv, queue, t.status, redis_error=redis_error)
    key_created = parse_time(ring.keys[0].created)
    if key_created is not None:
        age = (dt.datetime.now(dt.UTC) - key_created).total_seconds()
        t.metrics.key_age.labels(t.namespace, t.name).set(max(0.0, age))
    t.metrics.set_replicas(t.namespace, t.name, len(conv.desired), len(conv.converged))
    if active_of(queue) is None:
        pending = any(q.phase == "Pending" for q in queue)
        t.metrics.set_phase(t.namespace, t.name, "pending" if pending else "idle")
        t.metrics.stalled.labels(t.namespace, t.name).set(0)
    if not redis_error:
        t.rt.nudge(pods, current.resource_version, conv.lagging)
    if ring_spec.rotate_every is not None:
        due = schedule(
            ring_spec.rotate_every,
            queue,
            key_created,
            parse_time(t.created),
            dt.datetime.now(dt.UTC),
        )
        if due is not None:
            new["nextRotationAt"] = due.due_text
            if due.start:
                _start_scheduled(t, due.rotation_name(t.name))
    return new


def _start_scheduled(t: Tick, rotation_name: str) -> None:
    """Create the scheduled KeyRotation; one that exists already (409) is the same one."""
    body = rotation_manifest(t.name, name=rotation_name, reason="scheduled (spec.rotateEvery)")
    try:
        t.rt.custom.create_namespaced_custom_object(GROUP, VERSION, t.namespace, KEYROTATIONS, body)
        log.info("scheduled rotation %s of %s/%s", rotation_name, t.namespace, t.name)
    except ApiException as exc:
        if exc.status != 409:
            raise


@kopf.on.delete(GROUP, VERSION, KEYRINGS, optional=True)
def keyring_deleted(name: str, namespace: str | None, memo: Runtime, **_: Any) -> None:
    """The Secret stays (deleting keys would break every replica); only metrics go."""
    memo.metrics.forget(_namespaced(namespace), name)


# --------------------------------------------------------------------------- KeyRotation


def _not_terminal(status: kopf.Status, **_: Any) -> bool:
    return status.get("phase") not in TERMINAL_PHASES


@kopf.timer(  # type: ignore[arg-type]
    GROUP,
    VERSION,
    KEYROTATIONS,
    interval=ROTATION_TICK,
    initial_delay=0,
    backoff=ERROR_BACKOFF,
    when=_not_terminal,
)
def rotation_tick(
    meta: kopf.Meta,
    body: kopf.Body,
    patch: kopf.Patch,
    memo: Runtime,
    rotation_queue: QueueIndex,
    keyring_specs: SpecIndex,
    **_: Any,
) -> None:
    """Drive one rotation a step further, if the world allows it."""
    if meta.get("deletionTimestamp"):
        return  # the deletion handler decides now: abort, or finish first
    _advance(Tick.of(memo, body, patch, rotation_queue, keyring_specs))


@kopf.on.delete(GROUP, VERSION, KEYROTATIONS, backoff=ERROR_BACKOFF)  # type: ignore[arg-type]
def rotation_deleted(
    body: kopf.Body,
    patch: kopf.Patch,
    memo: Runtime,
    retry: int,
    rotation_queue: QueueIndex,
    keyring_specs: SpecIndex,
    **_: Any,
) -> None:
    """Abort before promotion; after it, hold the deletion until the rotation is done."""
    t = Tick.of(memo, body, patch, rotation_queue, keyring_specs)
    phase = recorded_phase(t.status)
    key_ring = str(t.spec.get("keyRing", ""))
    ring_spec = t.keyring_spec(key_ring)
    if phase in TERMINAL_PHASES or isinstance(ring_spec, str):
        memo.forget(t.uid)
        return
    with memo.lock(t.namespace, key_ring):
        action = _abort_if_unpromoted(t, key_ring, ring_spec)
    if action == "finish":
        if retry == 0:
            t.event(
                "DeletionHeld",
                "the new key already seals: finishing the rotation before deleting it",
            )
        _advance(t)
        if patch.get("status", {}).get("phase", phase) != "Complete":
            raise kopf.TemporaryError("finishing the rotation before deletion", delay=ROTATION_TICK)
        return
    t.metrics.rotation_ended(t.namespace, key_ring, "aborted")
    memo.forget(t.uid)


def _abort_if_unpromoted(t: Tick, key_ring: str, ring_spec: KeyRingSpec) -> DeleteAction:
    """What the deletion means (:func:`on_delete`); an abort is written here."""
    current = secretring.read(t.rt.core, t.namespace, ring_spec.secret_name)
    view = current.view() if current is not None and current.ring is not None else None
    action = on_delete(t.uid, view, str(t.status.get("newKid") or ""))
    if action == "abort":
        assert current is not None
        written = secretring.write_step(t.rt.core, current, "abort", owner=(t.name, t.uid))
        assert written.ring is not None
        t.metrics.secret_writes.labels(t.namespace, key_ring, "abort").inc()
        t.rt.nudge(t.rt.pods(t.namespace, ring_spec.selector), written.resource_version)
        t.event(
            "Aborted", f"deleted before promotion: the ring is back to {list(written.ring.kids)}"
        )
    return action


def _advance(t: Tick) -> None:
    """One step of a rotation: find its KeyRing, then observe, decide, perform and record."""
    new: Status = {}
    try:
        rot = RotationSpec.parse(t.spec)
    except SpecError as exc:
        _fail(t, "", new, str(exc))
        t.write(new)
        return
    new.update(keyRing=rot.key_ring, mode=rot.mode)
    recorded = recorded_phase(t.status)
    if recorded == "Pending" and "Pending" not in (t.status.get("phaseTimestamps") or {}):
        new["phaseTimestamps"] = {"Pending": now_ms()}
        if rot.reason:
            t.event("Requested", rot.reason)
    ring_spec = t.keyring_spec(rot.key_ring)
    if isinstance(ring_spec, str):
        new.update(rotation_waiting(ring_spec, t.status))
        t.write(new)
        return
    with t.rt.lock(t.namespace, rot.key_ring):
        outcome = _step(t, rot, ring_spec, new)
    if outcome is None:
        return  # the Secret changed meanwhile: decide again next tick
    if isinstance(outcome, str):
        new.update(rotation_waiting(outcome, t.status, keep=recorded))
    else:
        _record(t, rot, ring_spec, *outcome, new)
    t.write(new)


def _step(
    t: Tick, rot: RotationSpec, ring_spec: KeyRingSpec, new: Status
) -> tuple[Decision, Convergence] | str | None:
    """Observe, decide and perform one step (under the KeyRing's lock).

    Returns the decision and the convergence on the ring as it now is, or why
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
    decision = decide(_observe(t, rot, ring_spec, view, conv, new))
    if decision.action not in secretring.STEPS:
        if decision.lagging:
            t.rt.nudge(pods, current.resource_version, decision.lagging)
        return decision, conv
    try:
        written = secretring.write_step(t.rt.core, current, decision.action, owner=(t.name, t.uid))
    except secretring.SecretConflict as exc:
        log.info("%s/%s: %s; deciding again", t.namespace, t.name, exc)
        return None
    assert written.ring is not None
    t.metrics.secret_writes.labels(t.namespace, rot.key_ring, decision.action).inc()
    if decision.action == "stage":
        new.update(oldKid=written.ring.kids[0], newKid=written.ring.kids[1])
    t.rt.nudge(pods, written.resource_version)
    # Convergence from now on is on the ring just written (none attest it yet).
    return decision, converge(views(pods), attested, written.ring.kids)


def _observe(
    t: Tick,
    rot: RotationSpec,
    ring_spec: KeyRingSpec,
    view: RingView,
    conv: Convergence,
    new: Status,
) -> Observed:
    """What :func:`decide` needs, with the new kid and the TTL clock as this process knows them."""
    recorded = recorded_phase(t.status)
    new_kid = str(t.status.get("newKid") or "")
    resumed = None if new_kid else resumed_kids(t.uid, view)
    if resumed is not None:
        new.update(oldKid=resumed[0], newKid=resumed[1])
        new_kid = resumed[1]
    ttl_elapsed = t.rt.clock(t.uid).ttl_elapsed(recorded == "Waiting", ring_spec.token_ttl)
    mine, why = turn(t.uid, t.created, t.name, t.queue(rot.key_ring))
    return Observed(
        uid=t.uid,
        phase=recorded,
        new_kid=new_kid,
        ring=view,
        convergence=conv,
        emergency=rot.emergency,
        ttl_elapsed=ttl_elapsed,
        my_turn=mine,
        blocked=why,
    )


def _record(
    t: Tick,
    rot: RotationSpec,
    ring_spec: KeyRingSpec,
    decision: Decision,
    conv: Convergence,
    new: Status,
) -> None:
    """Status, Events, metrics and clocks for the decision just carried out."""
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
        _fail(t, rot.key_ring, new, decision.message)
        return
    keyring = rot.key_ring
    if phase == "Complete":
        t.metrics.rotation_ended(t.namespace, keyring, "complete")
        t.rt.forget(t.uid)
    else:
        t.metrics.set_phase(t.namespace, keyring, phase)
    stalled = _stall(t, keyring, decision, clock, now)
    new.update(
        rotation_progress(decision, conv, t.status, new, stalled=stalled, emergency=rot.emergency)
    )


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


def _fail(t: Tick, keyring: str, new: Status, message: str) -> None:
    """The rotation ends Failed: its status, its result metric, a warning Event."""
    new.update(rotation_ended("Failed", message, t.status, new))
    if keyring:
        t.metrics.rotation_ended(t.namespace, keyring, "failed")
    t.warn("Failed", message)
