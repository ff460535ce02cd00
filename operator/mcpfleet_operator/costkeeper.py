"""Keeping each replica Pod's deletion cost current: the I/O around the decisions.

The decisions are :mod:`~mcpfleet_operator.deletioncost`'s. The KeyRing
timer (:func:`mcpfleet_operator.handlers.keyring_tick`) lists the Pods of the
KeyRing's selector and reads the fleet's attestations once a tick; it hands
both to :meth:`CostKeeper.keep`, which asks
:func:`~mcpfleet_operator.deletioncost.plan` which Pods to write, and patches
their ``controller.kubernetes.io/pod-deletion-cost`` annotation. A tick whose
read of Redis failed (each command has the client's timeout) calls
:meth:`CostKeeper.stale` instead: no Pod is written, every Pod keeps its last
cost, and the next successful read carries on.

What is kept in memory (when each Pod's cost was last written, the write
budget) may be lost safely: a restarted operator compares the costs the Pods
carry with the attestations and writes what differs, within the same budget.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from mcpfleet.contract import Attestation
from mcpfleet_operator.deletioncost import (
    DELETION_COST_ANNOTATION,
    WEIGHTS,
    PatchPolicy,
    PodCost,
    TokenBucket,
    Weights,
    cost_of,
    parse_cost,
    plan,
)
from mcpfleet_operator.metrics import OperatorMetrics

log = logging.getLogger("mcpfleet_operator")


@dataclass
class CostKeeper:
    """Writes replica Pods' deletion costs for every KeyRing of this operator process.

    One write budget (:attr:`PatchPolicy.per_second`) for the whole process,
    shared by the KeyRings' timers, which kopf runs in several threads.
    """

    metrics: OperatorMetrics
    policy: PatchPolicy = field(default_factory=PatchPolicy)
    weights: Weights = WEIGHTS
    clock: Callable[[], float] = time.monotonic
    _bucket: TokenBucket = field(init=False)
    #: When each Pod's cost was last written, by (namespace, KeyRing), then Pod.
    _written: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)
    _stale: set[tuple[str, str]] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._bucket = TokenBucket(self.policy.per_second)

    def keep(
        self,
        core: k8s.CoreV1Api,
        namespace: str,
        keyring: str,
        pods: Iterable[k8s.V1Pod],
        records: Mapping[str, Attestation],
    ) -> int:
        """Write the costs that are due for ``pods``, from fresh ``records``; the writes made.

        A Pod without a record (not registered yet, or its heartbeat lapsed) is
        left as it is: no news is not an empty replica. A terminating Pod is
        left too: the ReplicaSet no longer chooses among those.
        """
        key = (namespace, keyring)
        seen: list[PodCost] = []
        for pod in pods:
            meta = pod.metadata
            if meta is None or not meta.name or meta.deletion_timestamp is not None:
                continue
            record = records.get(meta.name)
            if record is None:
                continue
            current = parse_cost((meta.annotations or {}).get(DELETION_COST_ANNOTATION))
            seen.append(PodCost(meta.name, current, cost_of(record, self.weights)))
        with self._lock:
            now = self.clock()
            written = self._written.setdefault(key, {})
            for gone in set(written) - {p.pod for p in seen}:
                del written[gone]
            todo, held = plan(seen, written, now, self.policy, self._bucket.available(now))
            self._bucket.take(len(todo), now)
            if key in self._stale:
                self._stale.discard(key)
                log.info("deletion costs of %s/%s: attestations read again", namespace, keyring)
        self.metrics.costs_stale.labels(namespace, keyring).set(0)
        if held:
            self.metrics.cost_patches.labels(namespace, keyring, "deferred").inc(len(held))
        patched = 0
        for cost in todo:
            if self._patch(core, namespace, keyring, cost):
                patched += 1
                with self._lock:
                    self._written.setdefault(key, {})[cost.pod] = now
        return patched

    def _patch(self, core: k8s.CoreV1Api, namespace: str, keyring: str, cost: PodCost) -> bool:
        body = {"metadata": {"annotations": {DELETION_COST_ANNOTATION: str(cost.wanted)}}}
        try:
            core.patch_namespaced_pod(cost.pod, namespace, body)
        except ApiException as exc:
            if exc.status == 404:
                return False  # gone meanwhile: nothing to choose among
            self.metrics.cost_patches.labels(namespace, keyring, "failed").inc()
            log.warning("cannot write the deletion cost of pod %s: %s", cost.pod, exc.reason)
            return False
        self.metrics.cost_patches.labels(namespace, keyring, "patched").inc()
        return True

    def stale(self, namespace: str, keyring: str, why: str) -> None:
        """The attestations could not be read: every Pod keeps its last cost (logged once)."""
        key = (namespace, keyring)
        with self._lock:
            first = key not in self._stale
            self._stale.add(key)
        self.metrics.cost_stale_ticks.labels(namespace, keyring).inc()
        self.metrics.costs_stale.labels(namespace, keyring).set(1)
        if first:
            log.warning("deletion costs of %s/%s kept as they are: %s", namespace, keyring, why)

    def forget(self, namespace: str, keyring: str) -> None:
        """A deleted KeyRing: drop what was kept for its Pods."""
        with self._lock:
            self._written.pop((namespace, keyring), None)
            self._stale.discard((namespace, keyring))
