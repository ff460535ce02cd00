"""One replica's side of the fleet's task queue: what it counts, its worker, its drain.

:class:`FleetTasks` is what the engine's hooks (:mod:`._engine_hooks`) report
to, and what the replica runtime reads (metrics, the queue's depth) and
drains. It reads the engine's Docket and worker where the engine puts them
(``app._docket``, ``app._worker``) and replaces nothing inside the engine.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Final, Literal, get_args

from mcpfleet.contract import task_seals_of
from mcpfleet.logthrottle import LogThrottle
from mcpfleet.redisconn import on_cluster
from mcpfleet.tasks._limits import (
    LimitedHook,
    RulesProvider,
    TaskLimiter,
    capped,
    no_limits,
    prefix_of,
    shared_out,
)
from mcpfleet.tasks._queue import FleetQueue
from mcpfleet.tasks._sealing import RingSnapshotCodec, task_member
from mcpfleet.tasks._status import StatusHook

log = logging.getLogger("mcpfleet.tasks")

#: What the fleet counts of a task (``mcpfleet_tasks_*`` metrics, by tool):
#: ``created``, answered with a ``CreateTaskResult`` by this replica;
#: ``completed``, its tool returned, on this replica's worker; ``error``, its
#: tool raised (the task completes with an ``isError`` result, as a plain call
#: would); ``failed``, the engine failed it (a protocol error raised by the
#: tool, or the caller's context could not be restored); ``cancelled``, a
#: ``tasks/cancel`` on this replica recorded the cancellation;
#: ``input_required``, a leg ended asking for input (the task goes on after
#: ``tasks/update``).
#: ``unreplicated`` (Sentinel only): a creation answered before a replica of the
#: queue's master acknowledged it (:data:`REPLICATION_WAIT`).
TaskEvent = Literal[
    "created", "completed", "error", "failed", "cancelled", "input_required", "unreplicated"
]
TASK_EVENTS: Final[tuple[TaskEvent, ...]] = get_args(TaskEvent)
#: The events that end a task.
FINAL_EVENTS: Final[tuple[TaskEvent, ...]] = ("completed", "error", "failed", "cancelled")
#: Called with a tool's name and an event; must not block.
TaskObserver = Callable[[str, TaskEvent], None]
#: Distinct tool names counted; past it, ``other`` (an app's task tools are few,
#: but tools can be added at run time).
MAX_TOOL_LABELS = 64


#: Seconds a task's creation waits, through Sentinel, for a replica of the
#: queue's master to acknowledge what it wrote before the ``CreateTaskResult``
#: goes out (Redis replicates asynchronously: a master lost before its replica
#: had the task would take an answered task with it). Bounded so that a master
#: left without a replica still serves, each such creation counted.
REPLICATION_WAIT: Final = 1.0
#: How often (seconds) at most the replica logs creations left unreplicated.
_UNREPLICATED_LOG_EVERY = 60.0


class FleetTasks:
    """One replica's side of the queue: what it counts, what its worker runs, its drain.

    Built by :func:`~mcpfleet.tasks.wire_tasks`. The engine sets ``app._docket`` and
    ``app._worker`` while its lifespan runs; before that (and when the app
    has no task tools) there is nothing to read or drain.
    """

    def __init__(
        self,
        app: Any,
        queue: FleetQueue,
        observe: TaskObserver | None,
        sealer: RingSnapshotCodec | None = None,
        limits: RulesProvider | None = None,
        on_limited: LimitedHook | None = None,
    ) -> None:
        self.app = app
        self.queue = queue
        self._observe = observe
        #: Encrypts the stored snapshots (``--tasks-encrypt``), or None.
        self.sealer = sealer
        #: The tasks limit per principal (a cap, a share of the workers), from the
        #: rules in force (``limits``, read at each use); its Redis calls are bounded
        #: by half the queue's deadline, so a creation still fits in about one.
        self.limiter = TaskLimiter(limits or no_limits, queue.deadline / 2, on_limited)
        self._tools: set[str] = set()
        #: The asyncio tasks of the executions this replica's worker runs.
        self.running: set[asyncio.Task[Any]] = set()
        self._unreplicated_log = LogThrottle[str](_UNREPLICATED_LOG_EVERY)
        #: Replicas the queue's master had at the last read (:meth:`watch_queue`,
        #: Sentinel only); None before the first. At 0 a creation does not wait.
        self.replicas_seen: int | None = None
        self._unreplicated_reason = ""
        #: Told each status change of a task seen here (:mod:`._status`); set by the replica.
        self.on_status: StatusHook | None = None

    def event(self, tool: str, event: TaskEvent) -> None:
        if self._observe is None:
            return
        if tool not in self._tools:
            if len(self._tools) >= MAX_TOOL_LABELS:
                tool = "other"
            else:
                self._tools.add(tool)
        self._observe(tool, event)

    @property
    def docket(self) -> Any:
        return getattr(self.app, "_docket", None)

    @property
    def worker(self) -> Any:
        return getattr(self.app, "_worker", None)

    async def replicate(self, tool: str) -> int:
        """Wait (bounded) until a replica of the queue's master holds what a creation wrote.

        Redis replicates in one ordered stream: a write of this connection made
        after the creation's, acknowledged by a replica (``WAIT``), shows the
        creation is there too. Within :data:`REPLICATION_WAIT` (and a client-side
        bound on top, for a stalled master); past it the task is answered all the
        same (the master alone still serves: a replica down must not stop task
        creation), counted as ``unreplicated`` and logged at most every minute.
        Returns the replicas that acknowledged (0 when none did or Redis failed).
        """
        acked = 0
        docket = self.docket
        if self.replicas_seen == 0:
            self._unreplicated_reason = "the master had no replica at the last read"
        else:
            acked = await self._wait_replica(docket)
        if int(acked or 0) >= 1:
            return int(acked)
        self.event(tool, "unreplicated")
        if self._unreplicated_log.due("unreplicated"):
            log.warning(
                "tasks: a task was created on the queue's master and answered before any "
                "replica had it (%s within %.1f s): a failover now would lose it",
                self._unreplicated_reason,
                REPLICATION_WAIT,
            )
        return 0

    async def _wait_replica(self, docket: Any) -> int:
        acked = 0
        try:
            async with asyncio.timeout(REPLICATION_WAIT + 1.0):
                async with docket.redis() as redis:
                    pipe = redis.pipeline(transaction=False)
                    pipe.set(f"{self.queue.name}:replicated", "1", px=60_000)
                    pipe.execute_command("WAIT", 1, int(REPLICATION_WAIT * 1000))
                    _, acked = await pipe.execute()
        except Exception as exc:  # the creation stands; the log says why it is unconfirmed
            self._unreplicated_reason = f"the wait failed: {type(exc).__name__}"
        else:
            self._unreplicated_reason = "no replica acknowledged it"
        return int(acked or 0)

    def share_of(self) -> Any:
        """How a worker finds an execution's principal and share, or None when no
        principal has a share (:mod:`._share`)."""
        return self.limiter.share_of if shared_out(self.limiter.rules()) else None

    # --- what a task holds until it ends: its place under its principal's cap, and
    # (--tasks-encrypt) its entry in the seal ledger of the key that sealed it

    async def unledger(self, docket: Any, task_scope: str | None, task_id: str) -> None:
        """The task ended: give back its place under its principal's cap
        (:meth:`TaskLimiter.release`), and drop it from the seal ledger of every kid
        this replica's ring holds (one of them sealed its snapshot). Bounded by the
        queue's deadline; a failure leaves the entry until its score passes (counted
        too long, never too short) and is logged without the task's id."""
        if docket is None:
            return
        await self.limiter.release(docket, task_scope, task_id)
        if self.sealer is None:
            return
        member = task_member(task_scope, task_id)
        try:
            async with (
                asyncio.timeout(self.queue.deadline),
                docket.redis() as redis,
                redis.pipeline(transaction=False) as pipe,
            ):
                for kid in self.sealer.kids():
                    pipe.zrem(task_seals_of(prefix_of(docket), kid), member)
                await pipe.execute()
        except Exception as exc:  # Redis down or stalled: the entry expires by its score
            log.warning("tasks: an ended task stays in the seal ledger: %s", type(exc).__name__)

    async def unledger_key(self, execution_key: str) -> None:
        """:meth:`unledger` for the task of a queue execution's key (any leg)."""
        try:
            keys: Any = importlib.import_module("fastmcp_tasks.keys")
            parts = keys.parse_task_key(keys.base_task_key(execution_key))
        except Exception:
            return
        await self.unledger(self.docket, parts["task_scope"], str(parts["client_task_id"]))

    async def unledger_current(self) -> None:
        """:meth:`unledger` for the task whose leg this worker runs now."""
        if self.sealer is None and not capped(self.limiter.rules()):
            return
        try:
            dependencies: Any = importlib.import_module("docket.dependencies")
            key = str(dependencies.current_execution.get().key)
        except Exception:
            return
        await self.unledger_key(key)

    def busy(self) -> int:
        """Executions this replica's worker runs now (acknowledged ones excluded)."""
        self.running = {t for t in self.running if not t.done()}
        return len(self.running)

    async def queue_depth(self, client: Any) -> int | None:
        """Tasks waiting for a worker, fleet-wide: queued and not yet delivered, plus
        scheduled ones that are due. None before the engine runs.

        One MULTI (a pipeline on a cluster) of XLEN, XPENDING (the summary) and ZCOUNT on
        the queue's keys
        (the replica's ACL selector allows them); the caller bounds the wait.
        """
        docket = self.docket
        if docket is None:
            return None
        stream, group = docket.stream_key, docket.worker_group_name
        # On a Redis Cluster no MULTI: redis-py's asyncio cluster client runs each
        # command queued in one on a thread it joins on the event loop (see
        # mcpfleet.registry); the three reads then are not one snapshot.
        transaction = not on_cluster(client)
        async with client.pipeline(transaction=transaction) as pipe:
            pipe.xlen(stream)
            pipe.xpending(stream, group)
            pipe.zcount(docket.queue_key, 0, time.time())
            length, pending, due = await pipe.execute(raise_on_error=False)
        for answer in (length, due):
            if isinstance(answer, Exception):
                raise answer
        if isinstance(pending, Exception):
            if "NOGROUP" not in str(pending):
                raise pending
            delivered = 0  # no worker has read the stream yet
        else:
            delivered = int(pending["pending"])
        return max(0, int(length) - delivered) + int(due)

    async def watch_queue(
        self,
        client: Any,
        observe: Callable[[int], None],
        *,
        interval: float,
        deadline: float,
    ) -> None:
        """Read :meth:`queue_depth` every ``interval`` s, each read bounded by ``deadline``,
        until cancelled; ``observe`` gets each depth read (a failed read keeps the last)."""
        failing = False
        while True:
            try:
                async with asyncio.timeout(deadline):
                    depth = await self.queue_depth(client)
                    if self.queue.replicated:
                        info = await client.info("replication")
                        self.replicas_seen = int(info.get("connected_slaves", 0))
            except Exception as exc:  # Redis down, stalled, refused: the next read retries
                if not failing:
                    log.warning("tasks: the queue's depth was not read: %s", type(exc).__name__)
                failing = True
            else:
                failing = False
                if depth is not None:
                    observe(depth)
            await asyncio.sleep(interval)

    def stop_taking(self) -> bool:
        """Let the worker take no new task (a drain); what it runs goes on, its leases
        renewed. False when no worker runs here.

        The worker reads its free slots (``concurrency`` minus what it runs) before
        each read of the queue: at 0 it reads no more. A read already waiting
        (at most the worker's ``minimum_check_interval``) may still deliver.
        """
        worker = self.worker
        if worker is None:
            return False
        worker.concurrency = 0
        return True

    @property
    def read_window(self) -> float:
        """Seconds a read of the queue the worker already sent may still deliver."""
        interval = getattr(self.worker, "minimum_check_interval", None)
        return interval.total_seconds() if isinstance(interval, timedelta) else 0.0

    async def hand_back(self, client: Any, wait: float) -> int:
        """Stop the worker and leave what it still runs to another replica's worker, now.

        The engine's worker, once stopping, leaves the message of an execution
        cancelled under it pending and unacknowledged (pydocket: "a cancel during
        shutdown leaves the message pending for redelivery"); its lease is then
        marked idle for the whole redelivery timeout (XCLAIM IDLE), so another
        worker's next sweep takes it, within about a quarter of the timeout,
        instead of the whole timeout. Returns how many executions were handed
        back; the whole hand-back takes at most ``wait`` s (past it, what is
        left is redelivered after the timeout, as after a SIGKILL).
        """
        worker = self.worker
        running = {t for t in self.running if not t.done()}
        if worker is None or not running:
            return 0
        stopping = getattr(worker, "_worker_stopping", None)
        if not isinstance(stopping, asyncio.Event):
            log.warning(
                "tasks: this pydocket's worker cannot be stopped from outside: %d task(s) "
                "are left to redelivery after %.0fs",
                len(running),
                self.queue.redelivery_timeout,
            )
            return 0
        stopping.set()
        try:
            async with asyncio.timeout(wait):
                while not _session_stopping(worker):
                    await asyncio.sleep(0.02)
                for task in running:
                    task.cancel()
                await asyncio.wait(running)
                if client is not None:
                    await self._release(client)
        except Exception as exc:  # TimeoutError, or Redis refusing the release
            log.warning(
                "tasks: hand-back cut short (%s): what is left runs again after %.0fs",
                type(exc).__name__,
                self.queue.redelivery_timeout,
            )
        return sum(1 for t in running if t.cancelled())

    async def _release(self, client: Any) -> None:
        """Mark every message this worker holds idle for the whole redelivery timeout."""
        docket = self.docket
        if docket is None:
            return
        stream, group, me = docket.stream_key, docket.worker_group_name, self.queue.worker_name
        held = await client.xpending_range(stream, group, "-", "+", 1000, consumername=me)
        ids = [entry["message_id"] for entry in held]
        if ids:
            idle = int(self.queue.redelivery_timeout * 1000)
            await client.xclaim(stream, group, me, 0, ids, idle=idle, justid=True)


def _session_stopping(worker: Any) -> bool:
    """The worker's processing pass has ended (or none runs): a cancel now is a hand-back."""
    session = getattr(worker, "_processing_session", None)
    return session is None or bool(session.stopping.is_set())


def tool_of(component_identifier: str) -> str:
    """``double`` of ``tool:double@`` (a component key: ``type:name@version``)."""
    name = component_identifier.split(":", 1)[1] if ":" in component_identifier else ""
    return name.rsplit("@", 1)[0] if "@" in name else name or "other"


def tool_of_key(task_key: str) -> str:
    try:
        keys: Any = importlib.import_module("fastmcp_tasks.keys")
        return tool_of(str(keys.parse_task_key(task_key)["component_identifier"]))
    except Exception:
        return "other"
