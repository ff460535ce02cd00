"""The replica's drain: refuse new work at once, then wait for what it owns to end.

On SIGTERM (:mod:`mcpfleet.replica.process`) the replica attests ``draining``
and refuses new work; :func:`drain` returns once every session it owns is
closed (or, with the handover, every request in flight ended), nothing is in
flight and its task worker runs no task, or the drain deadline passes; then
the sessions cut by the deadline are marked lost and the tasks still running
handed back to the other replicas' workers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Protocol

from mcpfleet.config import ReplicaConfig
from mcpfleet.contract import LOST_AT_DRAIN_DEADLINE
from mcpfleet.notify import Notifications
from mcpfleet.registry import Publisher
from mcpfleet.replica.gate import GateState
from mcpfleet.tasks import FleetTasks

log = logging.getLogger("mcpfleet.replica")

#: Seconds each step of handing a draining worker's tasks back may take.
TASK_HAND_BACK_WAIT = 2.0


class Draining(Protocol):
    """What the drain reads of a replica (:class:`~mcpfleet.replica.runtime.Replica`),
    each when it needs it: the publisher and the Redis client are the replica's at
    that moment."""

    config: ReplicaConfig
    state: GateState
    notify: Notifications
    tasks: FleetTasks | None
    publisher: Publisher | None
    redis: Any


async def drain(replica: Draining) -> None:
    """Refuse new work now; return once every owned session is closed, nothing is in
    flight and this replica's worker runs no task, or the deadline passes.

    With MCP tasks, the worker takes no new task from the moment the drain
    starts and finishes those it runs, their leases renewed; what it still
    runs at the deadline it hands back to the other replicas' workers
    (:meth:`mcpfleet.tasks.FleetTasks.hand_back`).
    """
    cfg = replica.config
    replica.state.draining = True
    replica.state.handover = cfg.drain_handover and cfg.session_rehome
    if replica.publisher is not None:
        replica.publisher.publish_soon()
    # Listen streams end now (their result frame last): clients listen elsewhere.
    replica.notify.close()
    work = replica.tasks
    if work is not None and work.stop_taking():
        # A read of the queue already sent may still deliver, within its window.
        await asyncio.sleep(work.read_window)
        log.info("draining: the task worker takes no new task")
    log.info(
        "draining: %d session(s), %d request(s) in flight, %d task(s) running; deadline %.0fs",
        replica.state.live_sessions(),
        replica.state.inflight,
        work.busy() if work is not None else 0,
        cfg.drain_timeout,
    )
    started = time.monotonic()
    deadline = started + cfg.drain_timeout
    linger = started + min(cfg.drain_linger, cfg.drain_timeout)
    # With the handover, idle sessions go to re-homing routers at once: their
    # requests get the drain's 503 (nothing run), which routers answer by
    # re-homing; the drain waits only for requests in flight (a tool call,
    # a pending elicitation), and the linger lets every router see it.
    handover = replica.state.handover
    while time.monotonic() < deadline:
        busy = work.busy() if work is not None else 0
        done = replica.state.inflight == 0 if handover else replica.state.idle()
        if done and not busy and time.monotonic() >= linger:
            tail = ", no task running" if work is not None else ""
            log.info(
                "drained: no request in flight%s%s",
                " (idle sessions handed over)" if handover else " and no open session",
                tail,
            )
            return
        await asyncio.sleep(0.1)
    log.warning(
        "drain deadline passed with %d request(s) in flight, %d open session(s) and "
        "%d task(s) running; exiting",
        replica.state.inflight,
        replica.state.live_sessions(),
        work.busy() if work is not None else 0,
    )
    if handover:
        await _mark_cut_sessions_lost(replica)
    if work is not None and work.busy():
        handed = await work.hand_back(replica.redis, TASK_HAND_BACK_WAIT)
        log.warning("drain: %d task(s) handed back to the other replicas' workers", handed)


async def _mark_cut_sessions_lost(replica: Draining) -> None:
    """Mark in Redis the sessions whose requests the drain deadline is about to cut,
    before any of their streams ends: a re-homing router must answer their next
    request with the 404, whatever it saw of the end (a stream may end cleanly)."""
    sessions = replica.state.busy_client_sessions()
    if not sessions or replica.publisher is None:
        return
    marked = await replica.publisher.mark_lost(
        sessions, LOST_AT_DRAIN_DEADLINE, replica.config.redis_deadline
    )
    if marked:
        log.info("%d session(s) with a request in flight marked lost", len(sessions))
