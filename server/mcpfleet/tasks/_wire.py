"""Wiring an app's tasks extension to the fleet's queue."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from mcpfleet.tasks._engine_hooks import ENGINE_HOOKS, bound_requests, tested_engine
from mcpfleet.tasks._fleet import FleetTasks, TaskObserver
from mcpfleet.tasks._limits import LimitedHook, RulesProvider
from mcpfleet.tasks._queue import FleetQueue
from mcpfleet.tasks._sealing import RingSnapshotCodec

log = logging.getLogger("mcpfleet.tasks")

#: The identifier FastMCP's tasks extension registers under (SEP-2663).
TASKS_EXTENSION_ID = "io.modelcontextprotocol/tasks"

#: The task queue's loggers, kept at WARNING: their INFO lines name task keys.
QUEUE_LOGGERS = ("docket",)


def has_tasks_extension(app: Any) -> bool:
    """Whether ``app`` registered a tasks extension (its ``task=True`` tools need one)."""
    return TASKS_EXTENSION_ID in getattr(app, "_extensions", {})


def install_tasks(app: Any, queue: FleetQueue) -> bool:
    """Wire ``app``'s tasks extension to the fleet's queue; False when it has none.

    :func:`wire_tasks` without an observer, for callers that only need the wiring.
    """
    return wire_tasks(app, queue) is not None


def wire_tasks(
    app: Any,
    queue: FleetQueue,
    observe: TaskObserver | None = None,
    sealer: RingSnapshotCodec | None = None,
    limits: RulesProvider | None = None,
    on_limited: LimitedHook | None = None,
) -> FleetTasks | None:
    """Wire ``app``'s tasks extension to the fleet's queue; None when it has none.

    The app's own extension (its URL, its queue name) is replaced: a task must
    be visible to every replica of the fleet, whatever the app was written
    for. Its tuning that the fleet does not set (reconnection delay, polling
    interval) is kept. The engine's hooks (:mod:`._engine_hooks`) report to the
    returned :class:`FleetTasks` from now on. ``limits`` gives the rules in force
    (read at each creation and each leg: the tasks limit per principal,
    :mod:`._limits`; default none); ``on_limited(limit, tool)`` is called on each
    creation refused past a cap.
    """
    if not has_tasks_extension(app):
        return None
    tasks_extension = tested_engine()
    kept = getattr(app._extensions[TASKS_EXTENSION_ID], "docket_settings", None)
    ours = tasks_extension(
        url=queue.url,
        name=queue.name,
        worker_name=queue.worker_name,
        concurrency=queue.concurrency,
        redelivery_timeout=timedelta(seconds=queue.redelivery_timeout),
        reconnection_delay=kept.reconnection_delay if kept else None,
        minimum_check_interval=kept.minimum_check_interval if kept else None,
        credential_provider=queue.credential_provider,
    )
    bound_requests(ours, queue.deadline)
    # FastMCP's registration replaces the predecessor's methods (tasks/get,
    # tasks/update, tasks/cancel) with ours; add_extension refuses a second one.
    app._install_extension(ours)
    handle = FleetTasks(app, queue, observe, sealer, limits, on_limited)
    ENGINE_HOOKS.attach(handle)
    # The queue logs each execution's key at INFO: a task id (all that guards a
    # task without auth) and, with auth, the caller's client id and subject.
    for name in QUEUE_LOGGERS:
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLogger(name).level))
    log.info(
        "tasks: queue %s on %s, worker %s, redelivery %.0fs, concurrency %d",
        queue.name,
        queue.url.split("?", 1)[0],
        queue.worker_name,
        queue.redelivery_timeout,
        queue.concurrency,
    )
    return handle
