"""The kopf handlers: the thin I/O shell around :mod:`mcpfleet_operator.rotation`.

kopf watches the resources, keeps the indexes, runs the per-object timers,
holds finalizers, posts Events, and (with peering) lets exactly one operator
replica act. The handlers are synchronous (kopf runs them in its thread pool)
and do only this each tick: observe (the Secret, the Pods of the selector,
the attestations in Redis), ask the pure state machine, perform the one step
it names, and record the outcome in status, Events and metrics.

State lives in the cluster only: the ring and its owner in the Secret, the
phase in the KeyRotation's status; what the status says is written by
:mod:`~mcpfleet_operator.status`, what the process keeps in memory (only what
may be lost safely) is in :mod:`~mcpfleet_operator.runtime`, and one rotation
step (observe, decide, perform, record) is :mod:`~mcpfleet_operator.stepping`.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

import kopf
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from redis.exceptions import RedisError

from mcpfleet.contract import Attestation
from mcpfleet.keys.ring import KeyRing
from mcpfleet.redisconn import describe
from mcpfleet_operator import secretring
from mcpfleet_operator.api import (
    FINALIZER,
    GROUP,
    KEYRINGS,
    KEYROTATIONS,
    TERMINAL_PHASES,
    VERSION,
    KeyRingSpec,
    SpecError,
    parse_time,
    rotation_manifest,
)
from mcpfleet_operator.rotation import (
    DeleteAction,
    QueueEntry,
    active_of,
    converge,
    on_delete,
    schedule,
)
from mcpfleet_operator.runtime import QueueIndex, Runtime, SpecIndex, Tick, views
from mcpfleet_operator.status import (
    Status,
    keyring_invalid,
    keyring_status,
    recorded_phase,
)
from mcpfleet_operator.stepping import advance

log = logging.getLogger("mcpfleet_operator")

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
        records, redis_error = t.rt.attestations(ring_spec.fleet), ""
    except (RedisError, OSError) as exc:
        records, redis_error = {}, f"cannot read attestations from Redis: {describe(exc)}"
    _keep_costs(t, pods, records, redis_error)
    attested = {name: record.kids for name, record in records.items()}
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
        t.rt.refresh_volumes(pods, current.resource_version, conv.lagging)
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


def _keep_costs(
    t: Tick, pods: list[k8s.V1Pod], records: dict[str, Attestation], redis_error: str
) -> None:
    """The Pods' deletion costs from this tick's attestations; kept as they are without."""
    costs = t.rt.costs
    if costs is None:
        return
    if redis_error:
        costs.stale(t.namespace, t.name, redis_error)
    else:
        costs.keep(t.rt.core, t.namespace, t.name, pods, records)


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
    memo.metrics.forget_keyring(_namespaced(namespace), name)
    if memo.costs is not None:
        memo.costs.forget(_namespaced(namespace), name)


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
    advance(Tick.of(memo, body, patch, rotation_queue, keyring_specs))


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
        memo.forget_clock(t.uid)
        return
    with memo.lock(t.namespace, key_ring):
        action = _abort_if_unpromoted(t, key_ring, ring_spec)
    if action == "finish":
        if retry == 0:
            t.event(
                "DeletionHeld",
                "the new key already seals: finishing the rotation before deleting it",
            )
        advance(t)
        if patch.get("status", {}).get("phase", phase) != "Complete":
            raise kopf.TemporaryError("finishing the rotation before deletion", delay=ROTATION_TICK)
        return
    t.metrics.rotation_ended(t.namespace, key_ring, "aborted")
    memo.forget_clock(t.uid)


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
        t.rt.refresh_volumes(t.rt.pods(t.namespace, ring_spec.selector), written.resource_version)
        t.event(
            "Aborted", f"deleted before promotion: the ring is back to {list(written.ring.kids)}"
        )
    return action
