"""What the operator's handlers share, and the I/O each tick does besides the Secret.

:class:`Runtime` is the process-wide part (clients, metrics, per-KeyRing locks,
per-rotation clocks), handed to kopf as ``memo``; :class:`Tick` is one handler
call on one resource, so that the steps of a handler take one argument instead
of kopf's dozen. The observations a tick makes (the Pods of a selector, what
replicas attest in Redis) and the nudges it sends are here too: the handlers
keep to deciding what to write.

What is kept in memory is what may be lost safely (see :class:`Clock`).
"""

from __future__ import annotations

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

from mcpfleet.contract import KEYRING_NUDGE_ANNOTATION, Attestation, RedisKeys
from mcpfleet.redisconn import RedisSettings, sync_client
from mcpfleet.registry import read_replicas_sync
from mcpfleet_operator.api import KeyRingSpec, SpecError
from mcpfleet_operator.costkeeper import CostKeeper
from mcpfleet_operator.metrics import OperatorMetrics
from mcpfleet_operator.rotation import TASKS_WAIT_LIMIT, PodView, QueueEntry
from mcpfleet_operator.status import changed

log = logging.getLogger("mcpfleet_operator")

#: The operator's two indexes, by (namespace, KeyRing name).
QueueIndex = kopf.Index[tuple[str, str], QueueEntry]
SpecIndex = kopf.Index[tuple[str, str], dict[str, Any]]


@dataclass
class Clock:
    """In-memory timing of one rotation (lost on restart, which only makes waits longer).

    A restarted operator waits a full token TTL again, from when it
    re-confirmed the promotion: longer, never shorter, and no wall clock of
    another machine is trusted for it.
    """

    phase: str = ""
    entered: float = 0.0
    ttl_started: float | None = None
    stall_announced: bool = False

    def enter(self, phase: str, now: float) -> None:
        self.phase, self.entered, self.stall_announced = phase, now, False

    def advance(self, phase: str, next_phase: str, now: float) -> float | None:
        """Track a step from ``phase`` to ``next_phase`` (the same while waiting).

        Returns the seconds spent in ``phase`` when the step leaves it, else None.
        A phase this clock had not seen (a restart) counts from now.
        """
        if self.phase != phase:
            self.enter(phase, now)
        if next_phase == phase:
            return None
        spent = now - self.entered
        self.enter(next_phase, now)
        return spent

    def ttl_elapsed(self, waiting: bool, ttl: float) -> bool:
        """Whether one token TTL has passed since the promotion was confirmed.

        ``waiting`` is whether the status records Waiting: a clock lost to a
        restart starts the full TTL again now.
        """
        if waiting and self.ttl_started is None:
            self.ttl_started = time.monotonic()
        return self.ttl_started is not None and time.monotonic() - self.ttl_started >= ttl

    def tasks_wait_over(self, ttl: float, limit: float) -> bool:
        """Whether ``limit`` seconds have passed since the token TTL did (:meth:`ttl_elapsed`
        first): how long the retire step waits for live tasks under the old key."""
        return self.ttl_started is not None and time.monotonic() - self.ttl_started >= ttl + limit


@dataclass
class Runtime:
    """What the handlers share: configuration, clients, metrics, locks and clocks.

    Passed to kopf as ``memo``; built by :func:`mcpfleet_operator.cli.run_operator`.
    """

    api: k8s.ApiClient
    redis_settings: RedisSettings
    stall_after: float = 120.0
    tasks_wait_limit: float = TASKS_WAIT_LIMIT
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)
    #: Keeps replica Pods' deletion costs current; None when that is turned off.
    costs: CostKeeper | None = None
    _redis_client: redis.Redis | None = None
    _locks: dict[tuple[str, str], threading.Lock] = field(default_factory=dict)
    _clocks: dict[str, Clock] = field(default_factory=dict)
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

    def keys(self, fleet: str) -> RedisKeys:
        """``fleet``'s Redis key names (hash-tagged on a Redis Cluster)."""
        return RedisKeys(fleet, cluster=self.redis_settings.parsed.cluster)

    def lock(self, namespace: str, keyring: str) -> threading.Lock:
        """One decision at a time per KeyRing within this process."""
        with self._guard:
            return self._locks.setdefault((namespace, keyring), threading.Lock())

    def clock(self, uid: str) -> Clock:
        with self._guard:
            return self._clocks.setdefault(uid, Clock())

    def forget_clock(self, uid: str) -> None:
        with self._guard:
            self._clocks.pop(uid, None)

    # --- observation and nudges

    def pods(self, namespace: str, selector: str) -> list[k8s.V1Pod]:
        pods: list[k8s.V1Pod] = self.core.list_namespaced_pod(
            namespace, label_selector=selector
        ).items
        return pods

    def attested(self, fleet: str) -> dict[str, tuple[str, ...]]:
        """The kids each replica of ``fleet`` attests, by Pod name (Redis errors propagate)."""
        return {n: a.kids for n, a in self.attestations(fleet).items()}

    def attestations(self, fleet: str) -> dict[str, Attestation]:
        """What each live replica of ``fleet`` attests, by Pod name: two reads (SMEMBERS,
        MGET), each within the client's timeout (Redis errors propagate)."""
        return read_replicas_sync(self.redis_client, self.keys(fleet))

    def old_tasks(self, fleet: str, kid: str) -> int:
        """Live MCP tasks of ``fleet`` whose stored snapshot ``kid`` sealed: the members
        of the kid's seal ledger whose expiry has not passed (one ZCOUNT, bounded by the
        client's timeout; Redis errors propagate)."""
        count = self.redis_client.zcount(self.keys(fleet).task_seals(kid), time.time(), "+inf")
        return int(count)

    def refresh_volumes(
        self, pods: Iterable[k8s.V1Pod], version: str, only: Iterable[str] = ()
    ) -> None:
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
                self.core.patch_namespaced_pod(
                    name,
                    meta.namespace,
                    {"metadata": {"annotations": {KEYRING_NUDGE_ANNOTATION: version}}},
                )
            except ApiException as exc:
                if exc.status != 404:  # a Pod gone meanwhile needs no nudge
                    log.warning("cannot nudge pod %s: %s", name, exc.reason)


def views(pods: Iterable[k8s.V1Pod]) -> list[PodView]:
    """The Pods as the rotation sees them: serving when Running and not terminating."""
    out = []
    for p in pods:
        meta = p.metadata
        assert meta is not None and meta.name
        running = p.status is not None and p.status.phase == "Running"
        out.append(PodView(name=meta.name, serving=running and meta.deletion_timestamp is None))
    return out


@dataclass(frozen=True)
class Tick:
    """One handler call on one resource: what every step of it reads and where it writes."""

    rt: Runtime
    name: str
    namespace: str
    uid: str
    spec: Mapping[str, Any]
    #: The status as this call read it; the new one is patched over it by :meth:`write`.
    status: Mapping[str, Any]
    body: kopf.Body
    patch: kopf.Patch
    queues: QueueIndex
    specs: SpecIndex

    @classmethod
    def of(
        cls, rt: Runtime, body: kopf.Body, patch: kopf.Patch, queues: QueueIndex, specs: SpecIndex
    ) -> Tick:
        """The tick of a handler called on ``body`` (its status read once, here)."""
        meta = body.metadata
        assert meta.namespace is not None, "namespaced resources only"
        return cls(
            rt=rt,
            name=str(meta.name),
            namespace=meta.namespace,
            uid=str(meta.uid),
            spec=dict(body.spec),
            status=dict(body.status),
            body=body,
            patch=patch,
            queues=queues,
            specs=specs,
        )

    @property
    def metrics(self) -> OperatorMetrics:
        return self.rt.metrics

    @property
    def created(self) -> str:
        """``metadata.creationTimestamp``: the order in which rotations take turns."""
        return str(self.body.get("metadata", {}).get("creationTimestamp", ""))

    def queue(self, keyring: str) -> list[QueueEntry]:
        return list(self.queues.get((self.namespace, keyring), []))

    def keyring_spec(self, keyring: str) -> KeyRingSpec | str:
        """The KeyRing's parsed spec, or why there is none to act on."""
        raw = next(iter(self.specs.get((self.namespace, keyring), [])), None)
        if raw is None:
            return f"KeyRing {keyring} does not exist in {self.namespace}"
        try:
            return KeyRingSpec.parse(keyring, raw)
        except SpecError as exc:
            return f"KeyRing {keyring} is invalid: {exc}"

    def event(self, reason: str, message: str) -> None:
        kopf.event(self.body, type="Normal", reason=reason, message=message)

    def warn(self, reason: str, message: str) -> None:
        kopf.warn(self.body, reason=reason, message=message)

    def write(self, new: Mapping[str, Any]) -> None:
        """Patch only the fields that changed: an unchanged tick costs no API call."""
        for key, value in changed(self.status, new).items():
            self.patch.status[key] = value
