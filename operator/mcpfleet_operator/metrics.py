"""The operator's Prometheus metrics, served on their own port.

The names and labels are a contract with the chart's dashboards and alerts:
add metrics, never rename one. Labels are bounded: namespace and KeyRing
names, phase and result enums; never a kid, a Pod name or a key.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

#: The phases a rotation spends time in (the KeyRotation phases, lowercased).
TIMED_PHASES = ("staging", "promoting", "waiting", "retiring")
#: The values of ``mcpfleet_operator_rotation_phase``'s ``phase`` label.
GAUGE_PHASES = ("idle", "pending", *TIMED_PHASES)
RESULTS = ("complete", "failed", "aborted")


class OperatorMetrics:
    """Every metric the operator exports, in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.rotations = Counter(
            "mcpfleet_operator_rotations_total",
            "Rotations finished, by result.",
            ["namespace", "keyring", "result"],
            registry=r,
        )
        self.phase_duration = Histogram(
            "mcpfleet_operator_phase_duration_seconds",
            "Seconds a rotation spent in each phase (waiting includes the token TTL).",
            ["phase"],
            buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600),
            registry=r,
        )
        self.rotation_phase = Gauge(
            "mcpfleet_operator_rotation_phase",
            "1 for the phase the KeyRing's rotation is in (idle when none runs), else 0.",
            ["namespace", "keyring", "phase"],
            registry=r,
        )
        self.key_age = Gauge(
            "mcpfleet_operator_key_age_seconds",
            "Age of the KeyRing's sealing key.",
            ["namespace", "keyring"],
            registry=r,
        )
        self.replicas = Gauge(
            "mcpfleet_operator_replicas",
            "Replicas of the KeyRing that can serve (desired) and that attest its ring "
            "(converged).",
            ["namespace", "keyring", "state"],
            registry=r,
        )
        self.stalls = Counter(
            "mcpfleet_operator_stalls_total",
            "Rotation steps that waited longer than the stall bound.",
            ["namespace", "keyring"],
            registry=r,
        )
        self.stalled = Gauge(
            "mcpfleet_operator_stalled",
            "1 while a rotation step of the KeyRing is past the stall bound.",
            ["namespace", "keyring"],
            registry=r,
        )
        self.secret_writes = Counter(
            "mcpfleet_operator_secret_writes_total",
            "Key ring Secret writes by this operator process, by step.",
            ["namespace", "keyring", "step"],
            registry=r,
        )
        self.old_key_tasks = Gauge(
            "mcpfleet_operator_old_key_tasks",
            "Live MCP tasks whose stored snapshot the old key sealed, while a rotation's "
            "retire step waits for them (0 otherwise).",
            ["namespace", "keyring"],
            registry=r,
        )
        self.tasks_abandoned = Counter(
            "mcpfleet_operator_tasks_abandoned_total",
            "Live MCP tasks under the old key when a rotation retired it at the tasks wait "
            "limit (they fail).",
            ["namespace", "keyring"],
            registry=r,
        )
        self._deletion_costs(r)
        self._lock = threading.Lock()

    def _deletion_costs(self, r: CollectorRegistry) -> None:
        """The replica Pods' deletion costs (:mod:`mcpfleet_operator.costkeeper`)."""
        self.cost_patches = Counter(
            "mcpfleet_operator_deletion_cost_patches_total",
            "Writes of replica Pods' deletion cost, by result: patched, failed, or deferred "
            "(due, but held back by the cap of writes per second).",
            ["namespace", "keyring", "result"],
            registry=r,
        )
        self.cost_stale_ticks = Counter(
            "mcpfleet_operator_deletion_cost_stale_ticks_total",
            "Ticks on which the attestations could not be read: the Pods kept their last costs.",
            ["namespace", "keyring"],
            registry=r,
        )
        self.costs_stale = Gauge(
            "mcpfleet_operator_deletion_costs_stale",
            "1 while the KeyRing's Pods carry costs from before the last failed read of the "
            "attestations, else 0.",
            ["namespace", "keyring"],
            registry=r,
        )

    def set_phase(self, namespace: str, keyring: str, phase: str) -> None:
        """Make ``phase`` (lowercased) the only phase at 1 for this KeyRing.

        It also creates the KeyRing's rotation counters at 0, one per result: a
        series first exported at its first failure would be, to Prometheus's
        ``increase()``, no increase at all, and ``McpfleetKeyRotationFailed``
        would miss the KeyRing's first failed rotation.
        """
        current = phase.lower()
        with self._lock:
            for p in GAUGE_PHASES:
                self.rotation_phase.labels(namespace, keyring, p).set(1 if p == current else 0)
            for result in RESULTS:
                self.rotations.labels(namespace, keyring, result)

    def rotation_ended(self, namespace: str, keyring: str, result: str) -> None:
        """A rotation of the KeyRing ended with ``result`` (one of :data:`RESULTS`): count it,
        and the KeyRing's phase gauge goes back to idle."""
        self.rotations.labels(namespace, keyring, result).inc()
        self.set_phase(namespace, keyring, "idle")

    def set_old_key_tasks(self, namespace: str, keyring: str, count: int) -> None:
        """The live tasks holding the old key while the retire step waits (0 otherwise).

        Called at every step of a rotation, it also creates the KeyRing's
        abandoned-tasks counter at 0: a counter series first exported at its
        first abandonment would be, to Prometheus's ``increase()``, no increase
        at all, and ``McpfleetKeyRotationAbandonedTasks`` would miss it.
        """
        self.old_key_tasks.labels(namespace, keyring).set(count)
        self.tasks_abandoned.labels(namespace, keyring)

    def set_replicas(self, namespace: str, keyring: str, desired: int, converged: int) -> None:
        self.replicas.labels(namespace, keyring, "desired").set(desired)
        self.replicas.labels(namespace, keyring, "converged").set(converged)

    def forget_keyring(self, namespace: str, keyring: str) -> None:
        """Drop a deleted KeyRing's gauge series; its counters are kept."""
        for gauge_phase in GAUGE_PHASES:
            _remove(self.rotation_phase, (namespace, keyring, gauge_phase))
        for state in ("desired", "converged"):
            _remove(self.replicas, (namespace, keyring, state))
        for metric in (self.key_age, self.stalled, self.old_key_tasks, self.costs_stale):
            _remove(metric, (namespace, keyring))

    def serve(self, port: int, host: str = "0.0.0.0") -> None:
        start_http_server(port, addr=host, registry=self.registry)


def _remove(metric: Gauge, labels: Iterable[str]) -> None:
    with contextlib.suppress(KeyError):
        metric.remove(*labels)
