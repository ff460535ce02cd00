"""The kopf handlers: the thin I/O shell around :mod:`mcpfleet.operator.rotation`.

kopf watches the resources, keeps the indexes, runs the per-object timers,
holds finalizers, posts Events, and (with peering) lets exactly one operator
replica act. The handlers are synchronous (kopf runs them in its thread pool)
and do only this each tick: observe (the Secret, the Pods of the selector,
the attestations in Redis), ask the pure state machine, perform the one step
it names, and record the outcome in status, Events and metrics.

State lives in the cluster only: the ring and its owner in the Secret, the
phase in the KeyRotation's status. What is kept in memory is what may be
lost safely: when each wait started (a restarted operator waits a full
token TTL again, from when it re-confirmed the promotion: longer, never
shorter, and no wall clock of another machine is trusted for it) and
whether a stall was already announced.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf
import redis
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from redis.exceptions import RedisError

from mcpfleet.operator import secretring
from mcpfleet.operator.api import (
    ACTIVE_PHASES,
    FINALIZER,
    GROUP,
    KEYRINGS,
    KEYROTATIONS,
    TERMINAL_PHASES,
    VERSION,
    KeyRingSpec,
    RotationSpec,
    SpecError,
    condition,
    parse_time,
    rotation_manifest,
)
from mcpfleet.operator.metrics import OperatorMetrics
from mcpfleet.operator.rotation import (
    Convergence,
    Decision,
    Observed,
    PodView,
    QueueEntry,
    converge,
    decide,
    on_delete,
    turn,
)
from mcpfleet.server.contract import KEYRING_NUDGE_ANNOTATION, RedisKeys
from mcpfleet.server.keys.ring import KeyRing
from mcpfleet.server.redisconn import RedisSettings, describe, sync_client
from mcpfleet.server.registry import read_replicas_sync

log = logging.getLogger("mcpfleet.operator")

#: How often a running rotation is re-examined, and a KeyRing's status refreshed.
ROTATION_TICK = 0.25
KEYRING_TICK = 1.0
#: After an unexpected error (an API or Redis hiccup) a handler retries this
#: soon, not after kopf's default minute: a rotation must not idle that long.
ERROR_BACKOFF = 1.0


@dataclass
class _Clock:
    """In-memory timing of one rotation (lost on restart, which only makes waits longer)."""

    phase: str = ""
    entered: float = 0.0
    ttl_started: float | None = None
    stall_announced: bool = False


@dataclass
class Runtime:
    """What the handlers share: configuration, clients, metrics, locks and clocks.

    Passed to kopf as ``memo``; built by :func:`mcpfleet.operator.cli.run_operator`.
    """

    api: k8s.ApiClient
    redis_settings: RedisSettings
    stall_after: float = 120.0
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)
    _redis_client: redis.Redis | None = None
    _locks: dict[tuple[str, str], threading.Lock] = field(default_factory=dict)
    _clocks: dict[str, _Clock] = field(default_factory=dict)
    _guard: threading.Lock = field(default_factory=threading.Lock)

    @property
    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.api)

    @property
    def custom(self) -> k8s.CustomObjectsApi:
        return k8s.CustomObjectsApi(self.api)

    @property
    def redis_client(self) -> redis.Redis:
        with self._guard:
            if self._redis_client is None:
                self._redis_client = sync_client(self.redis_settings, timeout=2)
            return self._redis_client

    def lock(self, namespace: str, keyring: str) -> threading.Lock:
        """One decision at a time per KeyRing within this process."""
        with self._guard:
            return self._locks.setdefault((namespace, keyring), threading.Lock())

    def clock(self, uid: str) -> _Clock:
        with self._guard:
            return self._clocks.setdefault(uid, _Clock())

    def forget(self, uid: str) -> None:
        with self._guard:
            self._clocks.pop(uid, None)


def _now() -> str:
    """RFC 3339 UTC with milliseconds: phases can last well under a second."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


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
    assert namespace is not None, "namespaced resources only"
    times = status.get("phaseTimestamps") or {}
    return {
        (namespace, str(spec.get("keyRing", ""))): QueueEntry(
            name=name,
            uid=uid,
            created=str(meta.get("creationTimestamp", "")),
            phase=str(status.get("phase") or "Pending"),
            stalled=bool(status.get("stalled")),
            completed=str(times.get("Complete", "")),
        )
    }


@kopf.index(GROUP, VERSION, KEYRINGS)
def keyring_specs(
    name: str, namespace: str | None, spec: kopf.Spec, **_: Any
) -> dict[tuple[str, str], dict[str, Any]]:
    """Every KeyRing's spec, by (namespace, name): what a rotation needs to find its ring."""
    assert namespace is not None, "namespaced resources only"
    return {(namespace, name): dict(spec)}


def _queue(index: kopf.Index[Any, QueueEntry], namespace: str, keyring: str) -> list[QueueEntry]:
    return list(index.get((namespace, keyring), []))


# --------------------------------------------------------------------------- observation


def _pods(rt: Runtime, namespace: str, selector: str) -> list[k8s.V1Pod]:
    pods: list[k8s.V1Pod] = rt.core.list_namespaced_pod(namespace, label_selector=selector).items
    return pods


def _views(pods: Iterable[k8s.V1Pod]) -> list[PodView]:
    views = []
    for p in pods:
        meta = p.metadata
        assert meta is not None and meta.name
        running = p.status is not None and p.status.phase == "Running"
        views.append(PodView(name=meta.name, serving=running and meta.deletion_timestamp is None))
    return views


def _attested(rt: Runtime, fleet: str) -> dict[str, tuple[str, ...]]:
    return {n: a.kids for n, a in read_replicas_sync(rt.redis_client, RedisKeys(fleet)).items()}


def _nudge(rt: Runtime, pods: Iterable[k8s.V1Pod], version: str, only: Iterable[str] = ()) -> None:
    """Bump the nudge annotation so each kubelet refreshes the Secret volume now."""
    wanted = set(only)
    for pod in pods:
        meta = pod.metadata
        assert meta is not None and meta.name and meta.namespace
        name = meta.name
        if wanted and name not in wanted:
            continue
        if (meta.annotations or {}).get(KEYRING_NUDGE_ANNOTATION) == version:
            continue
        try:
            rt.core.patch_namespaced_pod(
                name,
                meta.namespace,
                {"metadata": {"annotations": {KEYRING_NUDGE_ANNOTATION: version}}},
            )
        except ApiException as exc:
            if exc.status != 404:  # a Pod gone meanwhile needs no nudge
                log.warning("cannot nudge pod %s: %s", name, exc.reason)


# --------------------------------------------------------------------------- KeyRing


@kopf.timer(GROUP, VERSION, KEYRINGS, interval=KEYRING_TICK, initial_delay=0, backoff=ERROR_BACKOFF)
def keyring_tick(
    name: str,
    namespace: str | None,
    spec: kopf.Spec,
    status: kopf.Status,
    meta: kopf.Meta,
    body: kopf.Body,
    patch: kopf.Patch,
    memo: Any,
    **indexes: Any,
) -> None:
    """Create or adopt the Secret, report convergence, start scheduled rotations."""
    assert namespace is not None, "namespaced resources only"
    rt: Runtime = memo
    previous = dict(status)
    new: dict[str, Any] = {"observedGeneration": meta.get("generation")}
    try:
        ring_spec = KeyRingSpec.parse(name, spec)
    except SpecError as exc:
        _keyring_invalid(new, previous, str(exc))
        _apply_status(patch, previous, new)
        return
    created_now = False
    with rt.lock(namespace, name):
        current = secretring.read(rt.core, namespace, ring_spec.secret_name)
        if current is None:
            created_now = True
            try:
                current = secretring.create(
                    rt.core, namespace, ring_spec.secret_name, KeyRing.generate(), keyring=name
                )
            except secretring.SecretConflict:
                return  # created by someone else meanwhile: adopt it next tick
            rt.metrics.secret_writes.labels(namespace, name, "create").inc()
            kopf.event(
                body,
                type="Normal",
                reason="Created",
                message=f"created Secret {ring_spec.secret_name} with a new one-key ring "
                f"(kid {current.ring.kids[0] if current.ring else '?'})",
            )
    if current.ring is None:
        if previous.get("phase") != "Invalid":
            kopf.warn(
                body,
                reason="InvalidSecret",
                message=f"Secret {ring_spec.secret_name} is not a valid key ring "
                f"(left untouched): {current.error}",
            )
        _keyring_invalid(
            new,
            previous,
            f"Secret {ring_spec.secret_name} is not a valid key ring: {current.error}",
        )
        _apply_status(patch, previous, new)
        return
    ring = current.ring
    if not previous.get("kids") and not created_now:
        kopf.event(
            body,
            type="Normal",
            reason="Adopted",
            message=f"Secret {ring_spec.secret_name} holds kids {list(ring.kids)}",
        )
    pods = _pods(rt, namespace, ring_spec.selector)
    try:
        attested = _attested(rt, ring_spec.fleet)
        redis_error = ""
    except (RedisError, OSError) as exc:
        attested, redis_error = {}, f"cannot read attestations from Redis: {describe(exc)}"
    conv = converge(_views(pods), attested, ring.kids)
    queue = _queue(indexes["rotation_queue"], namespace, name)
    active = next((q for q in queue if q.phase in ACTIVE_PHASES), None)
    pending = [q for q in queue if q.phase == "Pending"]
    done = sorted((q for q in queue if q.completed), key=lambda q: q.completed)

    if active is not None and active.stalled:
        phase, message = "Degraded", f"rotation {active.name} is stalled: {', '.join(conv.lagging)}"
    elif active is not None:
        phase, message = "Rotating", f"rotation {active.name} is {active.phase}"
    elif redis_error:
        phase, message = "Degraded", redis_error
    elif not conv.desired:
        phase, message = "Degraded", "the selector matches no serving Pod"
    elif conv.lagging:
        phase, message = "Degraded", f"not yet on the ring: {', '.join(conv.lagging)}"
    else:
        phase, message = "Ready", f"{len(conv.desired)} replica(s) hold the ring"
    created = parse_time(ring.keys[0].created)
    new.update(
        phase=phase,
        message=message,
        kids=list(ring.kids),
        sealingKid=ring.kids[0],
        ringPhase=ring.phase,
        convergence=conv.ratio,
        replicas={
            "desired": len(conv.desired),
            "converged": len(conv.converged),
            "lagging": list(conv.lagging),
        },
        activeRotation=active.name if active else "",
    )
    if created is not None:
        new["keyCreatedAt"] = ring.keys[0].created
        rt.metrics.key_age.labels(namespace, name).set(
            max(0.0, (dt.datetime.now(dt.UTC) - created).total_seconds())
        )
    if done:
        new["lastRotation"] = {"name": done[-1].name, "completedAt": done[-1].completed}
    old_conditions = previous.get("conditions") or []
    new["conditions"] = [
        condition("Ready", phase in ("Ready", "Rotating"), phase, message, old_conditions),
        condition(
            "Progressing",
            active is not None,
            "Rotating" if active else "Idle",
            f"rotation {active.name}: {active.phase}" if active else "no rotation running",
            old_conditions,
        ),
        condition(
            "Degraded",
            phase == "Degraded",
            "Stalled"
            if active and active.stalled
            else ("Lagging" if phase == "Degraded" else "AsExpected"),
            message if phase == "Degraded" else "",
            old_conditions,
        ),
    ]
    rt.metrics.set_replicas(namespace, name, len(conv.desired), len(conv.converged))
    if active is None:
        rt.metrics.set_phase(namespace, name, "pending" if pending else "idle")
        rt.metrics.stalled.labels(namespace, name).set(0)
    if not redis_error:
        _nudge(rt, pods, current.resource_version, conv.lagging)
    if ring_spec.rotate_every is not None:
        _schedule(rt, namespace, name, ring_spec.rotate_every, queue, new, created, meta)
    _apply_status(patch, previous, new)


def _degraded_reason(phase: str, active: QueueEntry | None) -> str:
    if active is not None and active.stalled:
        return "Stalled"
    return "Lagging" if phase == "Degraded" else "AsExpected"


def _keyring_invalid(new: dict[str, Any], previous: Mapping[str, Any], reason: str) -> None:
    old = previous.get("conditions") or []
    new.update(
        phase="Invalid",
        message=reason,
        conditions=[
            condition("Ready", False, "Invalid", reason, old),
            condition("Progressing", False, "Invalid", "", old),
            condition("Degraded", True, "Invalid", reason, old),
        ],
    )


def _schedule(
    rt: Runtime,
    namespace: str,
    name: str,
    every: float,
    queue: list[QueueEntry],
    new: dict[str, Any],
    key_created: dt.datetime | None,
    meta: kopf.Meta,
) -> None:
    """Create the next scheduled KeyRotation once ``rotateEvery`` has passed since the last.

    The name is derived from the due time, so a second tick (or a second
    operator) creating it again gets 409 instead of a duplicate rotation.
    """
    completed = [parse_time(q.completed) for q in queue if q.completed]
    last = max((c for c in completed if c is not None), default=None)
    base = last or key_created or parse_time(meta.get("creationTimestamp"))
    if base is None:
        return
    due = base + dt.timedelta(seconds=every)
    new["nextRotationAt"] = due.strftime("%Y-%m-%dT%H:%M:%SZ")
    if any(q.phase not in TERMINAL_PHASES for q in queue):
        return
    if dt.datetime.now(dt.UTC) < due:
        return
    rotation = f"{name}-scheduled-{int(due.timestamp())}"[:253]
    body = rotation_manifest(name, name=rotation, reason="scheduled (spec.rotateEvery)")
    try:
        rt.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, KEYROTATIONS, body)
        log.info("scheduled rotation %s of %s/%s", rotation, namespace, name)
    except ApiException as exc:
        if exc.status != 409:
            raise


@kopf.on.delete(GROUP, VERSION, KEYRINGS, optional=True)
def keyring_deleted(name: str, namespace: str | None, memo: Any, **_: Any) -> None:
    """The Secret stays (deleting keys would break every replica); only metrics go."""
    assert namespace is not None, "namespaced resources only"
    rt: Runtime = memo
    rt.metrics.forget(namespace, name)


# --------------------------------------------------------------------------- KeyRotation


def _not_terminal(status: kopf.Status, **_: Any) -> bool:
    return status.get("phase") not in TERMINAL_PHASES


@kopf.timer(
    GROUP,
    VERSION,
    KEYROTATIONS,
    interval=ROTATION_TICK,
    initial_delay=0,
    backoff=ERROR_BACKOFF,
    when=_not_terminal,
)
def rotation_tick(
    name: str,
    namespace: str | None,
    uid: str,
    spec: kopf.Spec,
    status: kopf.Status,
    meta: kopf.Meta,
    body: kopf.Body,
    patch: kopf.Patch,
    memo: Any,
    **indexes: Any,
) -> None:
    """Drive one rotation a step further, if the world allows it."""
    assert namespace is not None, "namespaced resources only"
    if meta.get("deletionTimestamp"):
        return  # the deletion handler decides now: abort, or finish first
    rt: Runtime = memo
    _advance(rt, name, namespace, uid, spec, status, meta, body, patch, indexes)


@kopf.on.delete(GROUP, VERSION, KEYROTATIONS, backoff=ERROR_BACKOFF)
def rotation_deleted(
    name: str,
    namespace: str | None,
    uid: str,
    spec: kopf.Spec,
    status: kopf.Status,
    meta: kopf.Meta,
    body: kopf.Body,
    patch: kopf.Patch,
    memo: Any,
    retry: int,
    **indexes: Any,
) -> None:
    """Abort before promotion; after it, hold the deletion until the rotation is done."""
    assert namespace is not None, "namespaced resources only"
    rt: Runtime = memo
    phase = str(status.get("phase") or "Pending")
    key_ring = str(spec.get("keyRing", ""))
    raw = _first(indexes["keyring_specs"], namespace, key_ring)
    if phase in TERMINAL_PHASES or raw is None:
        rt.forget(uid)
        return
    try:
        ring_spec = KeyRingSpec.parse(key_ring, raw)
    except SpecError:
        rt.forget(uid)
        return
    with rt.lock(namespace, key_ring):
        current = secretring.read(rt.core, namespace, ring_spec.secret_name)
        view = current.view() if current is not None and current.ring is not None else None
        action = on_delete(uid, view, str(status.get("newKid") or ""))
        if action == "abort":
            assert current is not None and current.ring is not None
            written = secretring.write_step(rt.core, current, "abort", owner=(name, uid))
            assert written.ring is not None
            rt.metrics.secret_writes.labels(namespace, key_ring, "abort").inc()
            _nudge(rt, _pods(rt, namespace, ring_spec.selector), written.resource_version)
            kopf.event(
                body,
                type="Normal",
                reason="Aborted",
                message=f"deleted before promotion: the ring is back to {list(written.ring.kids)}",
            )
    if action == "finish":
        if retry == 0:
            kopf.event(
                body,
                type="Normal",
                reason="DeletionHeld",
                message="the new key already seals: finishing the rotation before deleting it",
            )
        _advance(rt, name, namespace, uid, spec, status, meta, body, patch, indexes)
        if patch.get("status", {}).get("phase", phase) != "Complete":
            raise kopf.TemporaryError("finishing the rotation before deletion", delay=ROTATION_TICK)
        return
    if action in ("abort", "release"):
        rt.metrics.rotations.labels(namespace, key_ring, "aborted").inc()
        rt.metrics.set_phase(namespace, key_ring, "idle")
    rt.forget(uid)


def _first(index: kopf.Index[Any, Any], namespace: str, name: str) -> Any:
    for value in index.get((namespace, name), []):
        return value
    return None


def _advance(
    rt: Runtime,
    name: str,
    namespace: str,
    uid: str,
    spec: kopf.Spec,
    status: kopf.Status,
    meta: kopf.Meta,
    body: kopf.Body,
    patch: kopf.Patch,
    indexes: Mapping[str, Any],
) -> None:
    queue_index: kopf.Index[Any, QueueEntry] = indexes["rotation_queue"]
    specs_index: kopf.Index[Any, dict[str, Any]] = indexes["keyring_specs"]
    previous = dict(status)
    recorded = str(previous.get("phase") or "Pending")
    new: dict[str, Any] = {}
    try:
        rot = RotationSpec.parse(spec)
    except SpecError as exc:
        _finish(rt, namespace, "", body, previous, new, "Failed", str(exc))
        _apply_status(patch, previous, new)
        return
    new.update(keyRing=rot.key_ring, mode=rot.mode)
    if recorded == "Pending" and "Pending" not in (previous.get("phaseTimestamps") or {}):
        new["phaseTimestamps"] = {"Pending": _now()}
        if rot.reason:
            kopf.event(body, type="Normal", reason="Requested", message=rot.reason)
    raw = _first(specs_index, namespace, rot.key_ring)
    if raw is None:
        _pending(new, previous, f"KeyRing {rot.key_ring} does not exist in {namespace}")
        _apply_status(patch, previous, new)
        return
    try:
        ring_spec = KeyRingSpec.parse(rot.key_ring, raw)
    except SpecError as exc:
        _pending(new, previous, f"KeyRing {rot.key_ring} is invalid: {exc}")
        _apply_status(patch, previous, new)
        return
    clock = rt.clock(uid)
    with rt.lock(namespace, rot.key_ring):
        current = secretring.read(rt.core, namespace, ring_spec.secret_name)
        if current is None or current.ring is None:
            why = (
                "does not exist yet" if current is None else f"is not a valid ring: {current.error}"
            )
            _pending(new, previous, f"Secret {ring_spec.secret_name} {why}", keep=recorded)
            _apply_status(patch, previous, new)
            return
        pods = _pods(rt, namespace, ring_spec.selector)
        try:
            attested = _attested(rt, ring_spec.fleet)
        except (RedisError, OSError) as exc:
            _pending(new, previous, f"cannot read attestations: {describe(exc)}", keep=recorded)
            _apply_status(patch, previous, new)
            return
        view = current.view()
        new_kid = str(previous.get("newKid") or "")
        if not new_kid and view.owner == uid and view.phase != "stable":
            # Resumed after a crash between the stage write and the status: the
            # Secret says which keys this rotation staged.
            old, new_kid = view.kids if view.phase == "staged" else view.kids[::-1]
            new.update(oldKid=old, newKid=new_kid)
        conv = converge(_views(pods), attested, view.kids)
        mine, why = turn(
            uid,
            str(meta.get("creationTimestamp", "")),
            name,
            _queue(queue_index, namespace, rot.key_ring),
        )
        if recorded == "Waiting" and clock.ttl_started is None:
            clock.ttl_started = time.monotonic()  # resumed: the full TTL again, from now
        ttl_elapsed = (
            clock.ttl_started is not None
            and time.monotonic() - clock.ttl_started >= ring_spec.token_ttl
        )
        decision = decide(
            Observed(
                uid=uid,
                phase=recorded,
                new_kid=new_kid,
                ring=view,
                convergence=conv,
                emergency=rot.emergency,
                ttl_elapsed=ttl_elapsed,
                my_turn=mine,
                blocked=why,
            )
        )
        try:
            written = _perform(rt, decision, current, name, uid, namespace, rot.key_ring, new)
        except secretring.SecretConflict as exc:
            log.info("%s/%s: %s; deciding again", namespace, name, exc)
            return
        if written is not None:
            _nudge(rt, pods, written.resource_version)
            assert written.ring is not None
            # Convergence from now on is on the ring just written (none attest it yet).
            conv = converge(_views(pods), attested, written.ring.kids)
        elif decision.lagging:
            _nudge(rt, pods, current.resource_version, decision.lagging)
    _record(rt, decision, conv, ring_spec, rot, name, namespace, body, clock, previous, new)
    _apply_status(patch, previous, new)


def _perform(
    rt: Runtime,
    decision: Decision,
    current: secretring.RingSecret,
    name: str,
    uid: str,
    namespace: str,
    keyring: str,
    new: dict[str, Any],
) -> secretring.RingSecret | None:
    """Write the Secret for a stage/promote/retire decision; return what was written."""
    if decision.action not in secretring.STEPS:
        return None
    result = secretring.write_step(rt.core, current, decision.action, owner=(name, uid))
    assert result.ring is not None
    if decision.action == "stage":
        new.update(oldKid=result.ring.kids[0], newKid=result.ring.kids[1])
    rt.metrics.secret_writes.labels(namespace, keyring, decision.action).inc()
    return result


def _record(
    rt: Runtime,
    decision: Decision,
    conv: Convergence,
    ring_spec: KeyRingSpec,
    rot: RotationSpec,
    name: str,
    namespace: str,
    body: kopf.Body,
    clock: _Clock,
    previous: Mapping[str, Any],
    new: dict[str, Any],
) -> None:
    """Status, Events, metrics and clocks for the decision just carried out."""
    keyring = rot.key_ring
    phase = decision.next_phase
    now_mono = time.monotonic()
    times = dict(previous.get("phaseTimestamps") or {}) | dict(new.get("phaseTimestamps") or {})
    if decision.phase != (previous.get("phase") or "Pending") and decision.phase not in times:
        times[decision.phase] = _now()  # resumed into a phase the status had not recorded
    if phase != decision.phase or phase not in times:
        times.setdefault(phase, _now())
    new["phaseTimestamps"] = times
    if clock.phase != decision.phase:
        clock.phase, clock.entered, clock.stall_announced = decision.phase, now_mono, False
    if phase != decision.phase:
        lowered = decision.phase.lower()
        if lowered in ("staging", "promoting", "waiting", "retiring"):
            rt.metrics.phase_duration.labels(lowered).observe(now_mono - clock.entered)
        clock.phase, clock.entered, clock.stall_announced = phase, now_mono, False
        if decision.action == "start-ttl":
            clock.ttl_started = now_mono
        _announce(body, decision, ring_spec, rot)
    new["phase"] = phase
    new["message"] = decision.message
    if decision.action == "fail":
        _finish(rt, namespace, keyring, body, dict(previous), new, "Failed", decision.message)
        return
    if phase == "Complete":
        rt.metrics.rotations.labels(namespace, keyring, "complete").inc()
        rt.metrics.set_phase(namespace, keyring, "idle")
        rt.metrics.stalled.labels(namespace, keyring).set(0)
        rt.forget(str(body.get("metadata", {}).get("uid", "")))
    else:
        rt.metrics.set_phase(namespace, keyring, phase)
    stalled = (
        decision.action == "wait"
        and decision.phase in ACTIVE_PHASES
        and bool(decision.lagging)
        and now_mono - clock.entered >= rt.stall_after
    )
    if stalled and not clock.stall_announced:
        clock.stall_announced = True
        rt.metrics.stalls.labels(namespace, keyring).inc()
        kopf.warn(
            body,
            reason="Stalled",
            message=f"{decision.phase} for over {rt.stall_after:g}s; lagging: "
            f"{', '.join(decision.lagging)}",
        )
    if not stalled and previous.get("stalled") and phase != "Complete":
        kopf.event(body, type="Normal", reason="CaughtUp", message="every replica attests again")
    rt.metrics.stalled.labels(namespace, keyring).set(1 if stalled else 0)
    new.update(
        desired=len(conv.desired),
        converged=len(conv.converged),
        convergence=conv.ratio,
        lagging=list(decision.lagging),
        stalled=stalled,
    )
    if rot.emergency and phase in ("Retiring", "Complete"):
        new["ttlSkipped"] = True
    old = list(previous.get("conditions") or [])
    new["conditions"] = [
        condition(
            "Progressing",
            phase not in TERMINAL_PHASES,
            phase,
            decision.message,
            old,
        ),
        condition(
            "Degraded",
            stalled,
            "Stalled" if stalled else "AsExpected",
            decision.message if stalled else "",
            old,
        ),
        condition("Complete", phase == "Complete", phase, decision.message, old),
    ]


def _announce(
    body: kopf.Body, decision: Decision, ring_spec: KeyRingSpec, rot: RotationSpec
) -> None:
    phase = decision.next_phase
    messages = {
        "Staging": "staged a new key: it unseals, nothing seals with it yet",
        "Promoting": "promoted the new key: it seals now",
        "Waiting": f"every replica seals with the new key; waiting {ring_spec.token_ttl:g}s "
        "(one token TTL) before dropping the old key",
        "Retiring": "dropped the old key",
        "Complete": "every replica holds only the new key",
    }
    if phase in messages:
        kopf.event(body, type="Normal", reason=phase, message=messages[phase])
    if phase == "Retiring" and rot.emergency:
        kopf.warn(
            body,
            reason="TTLWaitSkipped",
            message="Emergency mode: the old key was dropped without waiting one token TTL; "
            "modern rounds sealed under it fail",
        )


def _pending(
    new: dict[str, Any], previous: Mapping[str, Any], message: str, keep: str = "Pending"
) -> None:
    """Not a step: the rotation waits (in its recorded phase) and says why."""
    new["phase"] = keep
    new["message"] = message
    old = list(previous.get("conditions") or [])
    new["conditions"] = [
        condition("Progressing", keep != "Pending", "Waiting", message, old),
        condition("Degraded", False, "AsExpected", "", old),
        condition("Complete", False, keep, message, old),
    ]


def _finish(
    rt: Runtime,
    namespace: str,
    keyring: str,
    body: kopf.Body,
    previous: Mapping[str, Any],
    new: dict[str, Any],
    phase: str,
    message: str,
) -> None:
    new["phase"] = phase
    new["message"] = message
    times = dict(previous.get("phaseTimestamps") or {}) | dict(new.get("phaseTimestamps") or {})
    times.setdefault(phase, _now())
    new["phaseTimestamps"] = times
    if keyring:
        rt.metrics.rotations.labels(namespace, keyring, phase.lower()).inc()
        rt.metrics.set_phase(namespace, keyring, "idle")
    kopf.warn(body, reason=phase, message=message)
    old = list(previous.get("conditions") or [])
    new["conditions"] = [
        condition("Progressing", False, phase, message, old),
        condition("Degraded", True, phase, message, old),
        condition("Complete", False, phase, message, old),
    ]


def _apply_status(patch: kopf.Patch, previous: Mapping[str, Any], new: Mapping[str, Any]) -> None:
    """Patch only the fields that changed: an unchanged tick costs no API call."""
    for key, value in new.items():
        if previous.get(key) != value:
            patch.status[key] = value
