"""MCP tasks (SEP-2663) across the replicas: FastMCP's tasks engine on the fleet's Redis.

A FastMCP app declares long-running tools with ``@mcp.tool(task=True)`` and
registers the engine, ``mcp.add_extension(TasksExtension(...))`` (the
``fastmcp-tasks`` package, ``mcpfleet[tasks]``). Served alone, the app's
extension points at whatever queue its author configured. Served by
``mcpfleet serve``, :func:`install_tasks` replaces it, as
:func:`~mcpfleet.replica.appload.install_codec` replaces the request-state
boundary, with one wired to the fleet:

* one Docket queue per fleet, named :attr:`RedisKeys.tasks
  <mcpfleet.contract.RedisKeys.tasks>`, in the fleet's Redis: every key and
  channel of it lies under that name, which the replica's ACL rules allow;
* a worker in every replica (named after the replica), so a task created
  through one replica runs on any, and ``tasks/get|update|cancel`` resolve on
  any: the task's records are in Redis, never in a replica's memory;
* the fleet's Redis credentials passed as a credential provider, never in a
  URL the engine could log (:func:`mcpfleet.redisconn.queue_target`);
* a redelivery timeout: a task whose worker died (its lease no longer
  renewed) is run again by another worker within it;
* the task's context snapshot (which the engine stores in Redis so that
  another worker can restore the caller) scrubbed of credentials: the
  ``Authorization``, ``Cookie`` and ``Proxy-Authorization`` headers and the
  access token's bearer string never reach Redis. A task's tool sees its
  caller's identity (client id, scopes, claims), not its token.

What the engine already does and the fleet relies on (docs/tasks.md): a task
is durably written before ``CreateTaskResult`` is answered, its id is 32
random bytes, and it is stored under its creator's scope (client id and
``sub``), so another principal's ``tasks/*`` on its id gets the same
"Task ... not found" as an unknown id.
"""

from __future__ import annotations

import asyncio
import base64
import contextvars
import functools
import hashlib
import importlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final, Literal, TypeVar, get_args

from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR

from mcpfleet.config import ReplicaConfig
from mcpfleet.contract import RedisKeys, task_seals_of
from mcpfleet.keys.ring import KeyRing, RingKey
from mcpfleet.redisconn import RedisFiles, queue_target, settings

log = logging.getLogger("mcpfleet.tasks")

T = TypeVar("T")

#: The identifier FastMCP's tasks extension registers under (SEP-2663).
TASKS_EXTENSION_ID = "io.modelcontextprotocol/tasks"

#: ``fastmcp-tasks`` ``major.minor`` versions whose internals (the snapshot
#: codec hook) :func:`install_tasks` is tested on.
TESTED_FASTMCP_TASKS = ("4.1",)

#: Request headers a task's stored snapshot never carries (lower case).
CREDENTIAL_HEADERS = frozenset({"authorization", "cookie", "proxy-authorization"})


#: The task queue's loggers, kept at WARNING: their INFO lines name task keys.
QUEUE_LOGGERS = ("docket",)


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


class TasksUnavailable(RuntimeError):
    """The app has a tasks extension the fleet cannot wire; the message says what to do."""


@dataclass(frozen=True)
class FleetQueue:
    """Where and how the replicas' shared task queue runs."""

    #: The Docket name: every key and channel of the queue starts with it.
    name: str
    #: The Redis URL, credential-free (``memory://`` for a standalone replica).
    url: str
    #: The redis-py credential provider, or None.
    credential_provider: Any
    #: This replica's worker name (its replica name).
    worker_name: str
    #: Seconds after which a task whose worker stopped renewing its lease is
    #: delivered to another worker.
    redelivery_timeout: float
    #: Tasks one replica's worker runs at once.
    concurrency: int
    #: Seconds a task request (a creation, ``tasks/get|update|cancel``) may
    #: wait on the queue's Redis, whose client has no read timeout of its own.
    deadline: float = 10.0
    #: The queue's Redis is reached through Sentinel: a creation waits (at most
    #: :data:`REPLICATION_WAIT`) until a replica of the master has it.
    replicated: bool = False


def fleet_queue(
    *,
    fleet: str,
    redis_url: str | None,
    redis_files: RedisFiles,
    replica: str,
    redelivery_timeout: float,
    concurrency: int,
    deadline: float = 10.0,
) -> FleetQueue:
    """The queue of ``fleet``: in its Redis, or in this process when standalone."""
    name = RedisKeys(fleet).tasks
    if not redis_url:
        url, provider = "memory://", None
    else:
        redis = settings(redis_url, redis_files)
        url, provider = queue_target(redis)
    return FleetQueue(
        name=name,
        url=url,
        credential_provider=provider,
        worker_name=replica,
        redelivery_timeout=redelivery_timeout,
        concurrency=concurrency,
        deadline=deadline,
        replicated=bool(redis_url) and redis.parsed.sentinel,
    )


def fleet_queue_of(config: ReplicaConfig, replica: str) -> FleetQueue:
    """The queue a replica with ``config`` and name ``replica`` serves and works."""
    return fleet_queue(
        fleet=config.fleet,
        redis_url=config.redis_url,
        redis_files=config.redis_files,
        replica=replica,
        redelivery_timeout=config.tasks_redelivery,
        concurrency=config.tasks_concurrency,
        deadline=config.tasks_deadline,
    )


def scrub_snapshot(payload: str) -> str:
    """A task context snapshot (the engine's JSON) without the caller's credentials.

    Headers named in :data:`CREDENTIAL_HEADERS` are dropped; the access
    token's ``token`` (the bearer string) is emptied, its identity kept.
    Anything not shaped as expected is returned with those parts removed
    where found, never with them kept.
    """
    data = json.loads(payload)
    if not isinstance(data, dict):
        return payload
    headers = data.get("http_headers")
    if isinstance(headers, dict):
        data["http_headers"] = {
            k: v for k, v in headers.items() if str(k).lower() not in CREDENTIAL_HEADERS
        } or None
    token_json = data.get("access_token_json")
    if isinstance(token_json, str):
        token = json.loads(token_json)
        if isinstance(token, dict) and "token" in token:
            token["token"] = ""
        data["access_token_json"] = json.dumps(token)
    return json.dumps(data)


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
) -> FleetTasks | None:
    """Wire ``app``'s tasks extension to the fleet's queue; None when it has none.

    The app's own extension (its URL, its queue name) is replaced: a task must
    be visible to every replica of the fleet, whatever the app was written
    for. Its tuning that the fleet does not set (reconnection delay, polling
    interval) is kept.
    """
    if not has_tasks_extension(app):
        return None
    try:
        import fastmcp_tasks
        from fastmcp_tasks import TasksExtension
    except ImportError as exc:  # the app imported it, so this is a broken install
        raise TasksUnavailable(
            f"the app registers the tasks extension but fastmcp_tasks does not import ({exc}); "
            "install mcpfleet[tasks]"
        ) from None
    minor = ".".join(fastmcp_tasks.__version__.split(".")[:2])
    if minor not in TESTED_FASTMCP_TASKS:
        raise TasksUnavailable(
            f"fastmcp-tasks {fastmcp_tasks.__version__} is not a version mcpfleet is tested on "
            f"({', '.join(v + '.x' for v in TESTED_FASTMCP_TASKS)}): its task snapshots could "
            "carry credentials into Redis; install a tested fastmcp-tasks"
        )
    kept = getattr(app._extensions[TASKS_EXTENSION_ID], "docket_settings", None)
    ours = TasksExtension(
        url=queue.url,
        name=queue.name,
        worker_name=queue.worker_name,
        concurrency=queue.concurrency,
        redelivery_timeout=timedelta(seconds=queue.redelivery_timeout),
        reconnection_delay=kept.reconnection_delay if kept else None,
        minimum_check_interval=kept.minimum_check_interval if kept else None,
        credential_provider=queue.credential_provider,
    )
    # Each task request waits on Redis within the deadline (the engine's client
    # reads without a timeout: a stalled Redis would hold the request forever).
    # Bound before registration, which takes the method handlers from methods().
    for method in ("_handle_get", "_handle_update", "_handle_cancel"):
        setattr(ours, method, bounded(getattr(ours, method), queue.deadline, "this request"))
    # FastMCP's registration replaces the predecessor's methods (tasks/get,
    # tasks/update, tasks/cancel) with ours; add_extension refuses a second one.
    app._install_extension(ours)
    handle = FleetTasks(app, queue, observe, sealer)
    _bound_creation(queue.deadline)
    _observe_engine(handle)
    _scrub_stored_snapshots()
    _ledger_seals()
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


def bounded(
    call: Callable[..., Awaitable[T]], deadline: float, what: str
) -> Callable[..., Awaitable[T]]:
    """``call`` answering within ``deadline`` seconds, else an MCP error saying so."""

    @functools.wraps(call)
    async def within(*args: Any, **kwargs: Any) -> T:
        try:
            async with asyncio.timeout(deadline):
                return await call(*args, **kwargs)
        except TimeoutError:
            raise MCPError(
                code=INTERNAL_ERROR,
                message=(
                    f"The task store did not answer within {deadline:g} s; the outcome of "
                    f"{what} is unknown: retry tasks/get"
                ),
            ) from None

    setattr(within, _BOUNDED, True)
    return within


_BOUNDED = "_mcpfleet_bounded"


def _bound_creation(deadline: float) -> None:
    """Bound the engine's task creation (a ``tools/call`` answered with a task) the same way.

    The extension calls its module's ``create_task``; plain tool calls it passes
    through are not bounded here. Idempotent (the first deadline stays).
    """
    extension: Any = importlib.import_module("fastmcp_tasks.extension")
    if not getattr(extension.create_task, _BOUNDED, False):
        extension.create_task = bounded(
            extension.create_task, deadline, "the task's creation (it may exist)"
        )


def _scrub_stored_snapshots() -> None:
    """Make every snapshot the engine stores pass through :func:`scrub_snapshot` first.

    The engine reads its snapshot codec through ``fastmcp_tasks.context``'s
    ``snapshot_codec`` (plaintext, or Fernet with ``FASTMCP_TASKS_ENCRYPTION_KEY``);
    the fleet's wraps it: scrubbed, then encoded as the engine would. Idempotent.
    """
    # Any: the hook is a module attribute the engine does not export.
    context: Any = importlib.import_module("fastmcp_tasks.context")
    current = context.snapshot_codec
    if getattr(current, "_mcpfleet_scrubbing", False):
        return

    def scrubbing_codec() -> Any:
        sealer = _current.sealer if _current is not None else None
        return _Scrubbing(sealer if sealer is not None else current())

    scrubbing_codec._mcpfleet_scrubbing = True  # type: ignore[attr-defined]
    context.snapshot_codec = scrubbing_codec


class _Scrubbing:
    """A snapshot codec that scrubs credentials before the engine's codec encodes."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.protected = inner.protected

    def encode(self, payload: str) -> str:
        return str(self.inner.encode(scrub_snapshot(payload)))

    def decode(self, stored: str | bytes) -> str:
        return str(self.inner.decode(stored))


# --- what the fleet observes of its tasks, and the drain ---------------------------------

#: The current task's leg asked for input (set by the observed tool body).
_ASKED: contextvars.ContextVar[list[bool] | None] = contextvars.ContextVar(
    "mcpfleet_task_asked", default=None
)
#: The replica whose worker runs in this process (one per process when served;
#: tests that build several keep the last, as the engine keeps its hooks).
_current: FleetTasks | None = None
_OBSERVED = "_mcpfleet_observed"


class FleetTasks:
    """One replica's side of the queue: what it counts, what its worker runs, its drain.

    Built by :func:`wire_tasks`. The engine sets ``app._docket`` and
    ``app._worker`` while its lifespan runs; before that (and when the app
    has no task tools) there is nothing to read or drain.
    """

    def __init__(
        self,
        app: Any,
        queue: FleetQueue,
        observe: TaskObserver | None,
        sealer: RingSnapshotCodec | None = None,
    ) -> None:
        self.app = app
        self.queue = queue
        self._observe = observe
        #: Encrypts the stored snapshots (``--tasks-encrypt``), or None.
        self.sealer = sealer
        self._tools: set[str] = set()
        #: The asyncio tasks of the executions this replica's worker runs.
        self.running: set[asyncio.Task[Any]] = set()
        self._unreplicated_logged = -_UNREPLICATED_LOG_EVERY
        #: Replicas the queue's master had at the last read (:meth:`watch_queue`,
        #: Sentinel only); None before the first. At 0 a creation does not wait.
        self.replicas_seen: int | None = None
        self._unreplicated_reason = ""

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
        now = time.monotonic()
        if now - self._unreplicated_logged >= _UNREPLICATED_LOG_EVERY:
            self._unreplicated_logged = now
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

    # --- the task-seal ledger (--tasks-encrypt): which live tasks each key sealed

    async def unledger(self, docket: Any, task_scope: str | None, task_id: str) -> None:
        """The task ended: drop it from the seal ledger of every kid this replica's ring
        holds (one of them sealed its snapshot). Bounded by the queue's deadline; a
        failure leaves the entry until its score passes (counted too long, never too
        short) and is logged without the task's id."""
        if self.sealer is None or docket is None:
            return
        member = task_member(task_scope, task_id)
        try:
            async with (
                asyncio.timeout(self.queue.deadline),
                docket.redis() as redis,
                redis.pipeline(transaction=False) as pipe,
            ):
                for kid in self.sealer.kids():
                    pipe.zrem(task_seals_of(docket.name, kid), member)
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
        if self.sealer is None:
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

        One MULTI of XLEN, XPENDING (the summary) and ZCOUNT on the queue's keys
        (the replica's ACL selector allows them); the caller bounds the wait.
        """
        docket = self.docket
        if docket is None:
            return None
        stream, group = docket.stream_key, docket.worker_group_name
        async with client.pipeline(transaction=True) as pipe:
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


def _tool_of(component_identifier: str) -> str:
    """``double`` of ``tool:double@`` (a component key: ``type:name@version``)."""
    name = component_identifier.split(":", 1)[1] if ":" in component_identifier else ""
    return name.rsplit("@", 1)[0] if "@" in name else name or "other"


def _tool_of_key(task_key: str) -> str:
    try:
        keys: Any = importlib.import_module("fastmcp_tasks.keys")
        return _tool_of(str(keys.parse_task_key(task_key)["component_identifier"]))
    except Exception:
        return "other"


def _observe_engine(handle: FleetTasks) -> None:
    """Make the engine tell :data:`_current` what its tasks do. Installed once per process.

    Four of the engine's module functions are wrapped (the version is checked
    by :func:`wire_tasks`): the creation (``created``), the wrapper its
    registration puts around each task tool (what the tool's leg ended with,
    and which executions this worker runs), the recording of a cancellation
    (``cancelled``), and the worker's restoring of the caller's context
    (``failed`` when it cannot).
    """
    global _current
    _current = handle
    extension: Any = importlib.import_module("fastmcp_tasks.extension")
    components: Any = importlib.import_module("fastmcp_tasks.components")
    handlers: Any = importlib.import_module("fastmcp_tasks.handlers")
    context: Any = importlib.import_module("fastmcp_tasks.context")
    if getattr(extension.create_task, _OBSERVED, False):
        return

    create = extension.create_task

    @functools.wraps(create)
    async def created(tool: Any, arguments: Any, ctx: Any) -> Any:
        result = await create(tool, arguments, ctx)
        if _current is not None:
            _current.event(str(tool.name), "created")
            if _current.queue.replicated:
                await _current.replicate(str(tool.name))
        return result

    setattr(created, _OBSERVED, True)
    setattr(created, _BOUNDED, getattr(create, _BOUNDED, False))
    extension.create_task = created

    components.reentrant_task_fn = _observed_task_fn(components.reentrant_task_fn)

    mark = handlers.mark_cancelled
    keys: Any = importlib.import_module("fastmcp_tasks.keys")

    @functools.wraps(mark)
    async def cancelled(docket: Any, task_scope: Any, task_id: str, *args: Any) -> Any:
        result = await mark(docket, task_scope, task_id, *args)
        if _current is not None:
            tool = "other"
            try:
                meta = docket.key(f"{keys.task_redis_prefix(task_scope)}:{task_id}")
                async with docket.redis() as redis:
                    raw = await redis.get(meta)
                if raw:
                    tool = _tool_of_key(raw.decode() if isinstance(raw, bytes) else str(raw))
            except Exception:  # counted all the same, under "other"
                pass
            _current.event(tool, "cancelled")
            await _current.unledger(docket, task_scope, task_id)
        return result

    handlers.mark_cancelled = cancelled

    restore = context.restore_task_snapshot

    @functools.wraps(restore)
    async def restored(*args: Any, **kwargs: Any) -> Any:
        try:
            return await restore(*args, **kwargs)
        except Exception:
            key = kwargs.get("key", args[0] if args else "")
            if _current is not None:
                _current.event(_tool_of_key(str(key)), "failed")
                await _current.unledger_key(str(key))
            raise

    context.restore_task_snapshot = restored


def _observed_task_fn(reentrant: Callable[..., Any]) -> Callable[..., Any]:
    """The engine's ``reentrant_task_fn``, whose wrapper also tells :data:`_current` how
    each leg ended and which asyncio task runs it (for the drain)."""

    @functools.wraps(reentrant)
    def observed(fn: Callable[..., Awaitable[Any]], tool_name: str) -> Any:
        @functools.wraps(fn)
        async def body(*args: Any, **kwargs: Any) -> Any:
            result = await fn(*args, **kwargs)
            asked = _ASKED.get()
            if asked is not None and _asks(result):
                asked.append(True)
            return result

        inner = reentrant(body, tool_name)

        @functools.wraps(inner)
        async def leg(*args: Any, **kwargs: Any) -> Any:
            handle = _current
            task = asyncio.current_task()
            if handle is not None and task is not None:
                handle.running.add(task)
            asked: list[bool] = []
            token = _ASKED.set(asked)
            try:
                result = await inner(*args, **kwargs)
            except asyncio.CancelledError:
                raise  # a tasks/cancel (counted where it was recorded) or a hand-back
            except Exception:
                if handle is not None:
                    handle.event(tool_name, "failed")
                    await handle.unledger_current()
                raise
            finally:
                _ASKED.reset(token)
            if handle is not None:
                handle.event(
                    tool_name,
                    "input_required" if asked else "error" if _is_error(result) else "completed",
                )
                if not asked:
                    await handle.unledger_current()
            return result

        return leg

    return observed


def _asks(result: Any) -> bool:
    from fastmcp.tools.base import InputRequiredToolResult
    from mcp_types import InputRequiredResult

    return isinstance(result, InputRequiredResult | InputRequiredToolResult)


def _is_error(result: Any) -> bool:
    return bool(getattr(result, "is_error", False) or getattr(result, "isError", False))


# --- stored snapshots encrypted under the key ring ----------------------------------------

#: The ring key the snapshot being saved in this context is sealed with: chosen,
#: and its ledger entry written, before the engine stores the snapshot.
_PINNED: contextvars.ContextVar[RingKey | None] = contextvars.ContextVar(
    "mcpfleet_task_seal_key", default=None
)


def task_member(task_scope: str | None, task_id: str) -> str:
    """A task's member in a seal ledger: a hash of its scope and id, never the id itself."""
    return hashlib.sha256(f"{task_scope or ''}\n{task_id}".encode()).hexdigest()[:32]


def _ledger_seals() -> None:
    """Keep, per kid, the ledger of live tasks whose snapshot that key sealed
    (:meth:`mcpfleet.contract.RedisKeys.task_seals`), so the operator retires a
    key only once no live task needs it. Installed once; acts with a sealer only.

    - The engine's snapshot save: the sealing key is chosen first, the task
      added to its kid's ledger (scored by the snapshot's expiry; expired
      members pruned in the same round trip), and only then is the snapshot,
      sealed with that very key, stored. A replica lost between the two
      leaves an entry with no snapshot: counted until it expires, never missed.
    - The engine's snapshot TTL refresh (a polled task): each ledger of the
      ring's kids that holds the task has its score slid to the new expiry.
    - A task's end (:meth:`FleetTasks.unledger`): its leg completed, errored
      or failed (not when it asks for input: its next leg reads the
      snapshot again), a restore that failed, a ``tasks/cancel``.
    """
    context: Any = importlib.import_module("fastmcp_tasks.context")
    handlers: Any = importlib.import_module("fastmcp_tasks.handlers")
    snapshot_cls = context.TaskContextSnapshot
    if getattr(snapshot_cls.save, _OBSERVED, False):
        return
    save = snapshot_cls.save

    @functools.wraps(save)
    async def save_ledgered(
        self: Any, docket: Any, task_scope: str | None, task_id: str, ttl_seconds: int
    ) -> None:
        handle = _current
        if handle is None or handle.sealer is None:
            return await save(self, docket, task_scope, task_id, ttl_seconds)  # type: ignore[no-any-return]
        key = handle.sealer.sealing_key()
        now = time.time()
        async with docket.redis() as redis, redis.pipeline(transaction=False) as pipe:
            ledger = task_seals_of(docket.name, key.kid)
            pipe.zremrangebyscore(ledger, "-inf", now)
            pipe.zadd(ledger, {task_member(task_scope, task_id): now + ttl_seconds})
            await pipe.execute()
        token = _PINNED.set(key)
        try:
            await save(self, docket, task_scope, task_id, ttl_seconds)
        finally:
            _PINNED.reset(token)

    setattr(save_ledgered, _OBSERVED, True)
    snapshot_cls.save = save_ledgered

    refresh = handlers.refresh_snapshot_ttl

    @functools.wraps(refresh)
    async def refresh_ledgered(
        docket: Any, task_scope: str | None, task_id: str, ttl_seconds: int
    ) -> None:
        await refresh(docket, task_scope, task_id, ttl_seconds)
        handle = _current
        if handle is None or handle.sealer is None:
            return
        member, until = task_member(task_scope, task_id), time.time() + ttl_seconds
        async with docket.redis() as redis, redis.pipeline(transaction=False) as pipe:
            for kid in handle.sealer.kids():
                pipe.zadd(task_seals_of(docket.name, kid), {member: until}, xx=True, gt=True)
            await pipe.execute()

    handlers.refresh_snapshot_ttl = refresh_ledgered


#: How a snapshot the fleet sealed is stored: ``mcpfleet:v1:<kid>:<Fernet token>``.
SEALED_PREFIX = "mcpfleet:v1:"
#: HKDF's info for a ring key's snapshot key: a key of its own, never the one
#: request-state tokens are sealed with.
SNAPSHOT_KEY_INFO = b"mcpfleet/tasks/snapshot/v1"


class RingSnapshotCodec:
    """Task snapshots sealed under the replica's key ring (``--tasks-encrypt``).

    The engine's own encryption reads one key from an environment variable;
    the fleet puts no secret there. This codec takes its keys from the
    request-state key ring the replica already loads from its Secret volume
    (written by the operator, hot-reloaded): a Fernet key per ring key,
    derived with HKDF-SHA256 (info :data:`SNAPSHOT_KEY_INFO`). It seals with
    the ring's first key and names that key's kid in the stored value; it
    opens a value with the key its kid names, if the ring holds it. So a
    rotation (stage, promote, retire) loses no task as long as the old key is
    retired only after no snapshot it sealed is still to be read. Anything
    else fails closed: a plaintext snapshot, one sealed by a key the ring no
    longer holds, or a tampered one fails its task rather than run it as
    someone else (the engine's contract for a protected codec).
    """

    protected = True

    def __init__(
        self, ring: Callable[[], KeyRing], observe: Callable[[str, str], None] | None = None
    ) -> None:
        self._ring = ring
        self._observe = observe
        self._fernets: dict[tuple[str, int], Any] = {}

    def _fernet(self, key: RingKey) -> Any:
        from cryptography.fernet import Fernet
        from cryptography.hazmat.primitives.hashes import SHA256
        from cryptography.hazmat.primitives.kdf.hkdf import HKDF

        cached = self._fernets.get((key.kid, id(key)))
        if cached is None:
            derived = HKDF(SHA256(), 32, salt=None, info=SNAPSHOT_KEY_INFO).derive(key.secret)
            cached = Fernet(base64.urlsafe_b64encode(derived))
            self._fernets = {k: v for k, v in self._fernets.items() if k[0] in self._kids()}
            self._fernets[(key.kid, id(key))] = cached
        return cached

    def _kids(self) -> tuple[str, ...]:
        return self._ring().kids

    def kids(self) -> tuple[str, ...]:
        """The kids of the ring as loaded now (first seals)."""
        return self._ring().kids

    def sealing_key(self) -> RingKey:
        """The key a snapshot stored now is sealed with (the ring's first)."""
        return self._ring().keys[0]

    def encode(self, payload: str) -> str:
        key = _PINNED.get() or self._ring().keys[0]
        token = self._fernet(key).encrypt(payload.encode()).decode()
        if self._observe is not None:
            self._observe("seal", key.kid)
        return f"{SEALED_PREFIX}{key.kid}:{token}"

    def decode(self, stored: str | bytes) -> str:
        from cryptography.fernet import InvalidToken
        from fastmcp_tasks.encryption import SnapshotDecryptionError

        text = stored.decode() if isinstance(stored, bytes) else stored
        if not text.startswith(SEALED_PREFIX):
            raise SnapshotDecryptionError(
                "The stored task snapshot is not sealed by the fleet (--tasks-encrypt): refused."
            )
        kid, _, token = text[len(SEALED_PREFIX) :].partition(":")
        ring = self._ring()
        key = next((k for k in ring.keys if k.kid == kid), None)
        if key is None:
            raise SnapshotDecryptionError(
                f"The stored task snapshot was sealed with key {kid}, which this replica's "
                f"key ring ({', '.join(ring.kids)}) no longer holds."
            )
        try:
            payload = str(self._fernet(key).decrypt(token.encode()).decode())
        except InvalidToken as exc:
            raise SnapshotDecryptionError(
                f"The stored task snapshot does not open with key {kid}: tampered."
            ) from exc
        if self._observe is not None:
            self._observe("unseal", kid)
        return payload
