"""The Prometheus metrics of an app's MCP tasks on a replica (:mod:`mcpfleet.tasks`).

Declared only for an app with task tools, in the registry of the replica's own
metrics (:class:`~mcpfleet.replica.metrics.ReplicaMetrics`, which adds them and
serves them on the same ``/metrics``):

* ``mcpfleet_tasks_created_total{tool}`` (answered with a ``CreateTaskResult``
  here), ``mcpfleet_tasks_finished_total{tool, status}`` (``completed``:
  the tool returned, on this replica's worker; ``error``: it raised, the
  task completes with an ``isError`` result; ``failed``: the engine failed
  it; ``cancelled``: a ``tasks/cancel`` here recorded it),
  ``mcpfleet_tasks_input_requests_total{tool}`` (legs that ended asking),
  ``mcpfleet_tasks_unreplicated_total{tool}`` (Sentinel: creations answered
  before a replica of the master acknowledged them),
  ``mcpfleet_tasks_running`` (executions this replica's worker runs), and
  ``mcpfleet_tasks_queue_depth`` (tasks waiting for a worker, fleet-wide: the
  same on every replica), read every few seconds in the background with a
  deadline, never on a request's path, with the time of its last good read.
  ``tool`` is a task tool's name: the app's own, bounded (past 64, ``other``).
* With ``--tasks-encrypt``, ``mcpfleet_tasks_snapshot_seals_total{kid}`` and
  ``..._unseals_total{kid}``: which ring key sealed and opened the stored
  task snapshots, so a person sees when an old key stops being read.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge


class TaskMetrics:
    """The task metrics of one replica process, in the replica's registry ``r``;
    ``running`` is read at scrape."""

    def __init__(self, r: CollectorRegistry, running: Callable[[], int]) -> None:
        self.tasks_created = Counter(
            "mcpfleet_tasks_created",
            "MCP tasks this replica created (answered with a CreateTaskResult), by tool.",
            ["tool"],
            registry=r,
        )
        self.tasks_finished = Counter(
            "mcpfleet_tasks_finished",
            "MCP tasks ended, by tool and status: completed and error (the tool raised) on "
            "the worker that ran them, failed by the engine, cancelled where tasks/cancel was "
            "recorded.",
            ["tool", "status"],
            registry=r,
        )
        self.tasks_input = Counter(
            "mcpfleet_tasks_input_requests",
            "Task legs that ended asking for input (input_required), by tool.",
            ["tool"],
            registry=r,
        )
        self.tasks_queue_depth = Gauge(
            "mcpfleet_tasks_queue_depth",
            "MCP tasks waiting for a worker in the fleet's queue (the same on every replica), "
            "as this replica last read it.",
            registry=r,
        )
        self.tasks_queue_read = Gauge(
            "mcpfleet_tasks_queue_read_timestamp_seconds",
            "When this replica last read the task queue's depth (Unix time; 0: never).",
            registry=r,
        )
        self.tasks_unreplicated = Counter(
            "mcpfleet_tasks_unreplicated",
            "MCP tasks created through Sentinel and answered before a replica of the master "
            "acknowledged them (a failover then would lose them), by tool.",
            ["tool"],
            registry=r,
        )
        self.snapshot_seals = Counter(
            "mcpfleet_tasks_snapshot_seals",
            "Task snapshots sealed (--tasks-encrypt), by the kid of the key ring key used.",
            ["kid"],
            registry=r,
        )
        self.snapshot_unseals = Counter(
            "mcpfleet_tasks_snapshot_unseals",
            "Task snapshots opened (--tasks-encrypt), by the kid of the key that opened them.",
            ["kid"],
            registry=r,
        )
        running_gauge = Gauge(
            "mcpfleet_tasks_running",
            "MCP task executions this replica's worker runs now.",
            registry=r,
        )
        running_gauge.set_function(lambda: float(running()))

    def task_event(self, tool: str, event: str) -> None:
        """:mod:`mcpfleet.tasks`' observer (``TaskObserver``)."""
        if event == "created":
            self.tasks_created.labels(tool).inc()
        elif event == "input_required":
            self.tasks_input.labels(tool).inc()
        elif event == "unreplicated":
            self.tasks_unreplicated.labels(tool).inc()
        else:
            self.tasks_finished.labels(tool, event).inc()

    def snapshot_event(self, event: str, kid: str) -> None:
        """:class:`mcpfleet.tasks.RingSnapshotCodec`'s observer: seals and unseals by kid."""
        if event == "seal":
            self.snapshot_seals.labels(kid).inc()
        else:
            self.snapshot_unseals.labels(kid).inc()

    def task_queue_depth(self, depth: int) -> None:
        self.tasks_queue_depth.set(depth)
        self.tasks_queue_read.set_to_current_time()
