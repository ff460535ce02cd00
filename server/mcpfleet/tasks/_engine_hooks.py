"""Every replacement mcpfleet makes inside FastMCP's tasks engine, beside its version gate.

The engine (``fastmcp-tasks``) has no hook for what the fleet needs of it, so
the fleet replaces functions of the engine's modules, all of them here, each
installed by a named function below, once per process:

===  ==================================================  ===================================
 #   replaced in the engine                              why (function here)
===  ==================================================  ===================================
1    ``fastmcp_tasks.extension.create_task``             admitted under its principal's cap
                                                         first; bounded by
                                                         ``--tasks-deadline``; counted
                                                         ``created``; waits for a replica
                                                         through Sentinel
                                                         (:func:`_replace_create_task`)
2    ``fastmcp_tasks.context.snapshot_codec``            stored snapshots scrubbed of
                                                         credentials, sealed under the ring
                                                         (:func:`_replace_snapshot_codec`)
3    ``fastmcp_tasks.components.reentrant_task_fn``      how each leg ended, which asyncio
                                                         task runs it (the drain); the
                                                         principal's share of the workers;
                                                         the leg's span, linked to the
                                                         task's creation (:mod:`._trace`)
                                                         (:func:`_replace_reentrant_task_fn`)
4    ``fastmcp_tasks.handlers.mark_cancelled``           counted ``cancelled``, unledgered
                                                         (:func:`_replace_mark_cancelled`)
5    ``fastmcp_tasks.context.restore_task_snapshot``     counted ``failed`` when the caller
                                                         is not restored, unledgered
                                                         (:func:`_replace_restore_snapshot`)
6    ``fastmcp_tasks.context.TaskContextSnapshot.save``  the seal ledger's entry written
                                                         before the snapshot
                                                         (:func:`_replace_snapshot_save`)
7    ``fastmcp_tasks.handlers.refresh_snapshot_ttl``     the seal ledger's and the cap's
                                                         scores slid with the snapshot's
                                                         TTL (:func:`_replace_refresh_ttl`)
8    ``fastmcp_tasks.extension.tasks_get``               read again while a ``tasks/update``
                                                         moves the task to its next leg,
                                                         never "completed" with no result
                                                         (:func:`_replace_tasks_get`)
===  ==================================================  ===================================

and, on the fleet's own ``TasksExtension`` (never the app's), its
``_handle_get``, ``_handle_update`` and ``_handle_cancel`` are bounded by the
deadline (:func:`bound_requests`). Each relies on the engine's internals (a
module attribute it reads at call time, a signature), as they are in the
versions :data:`TESTED_FASTMCP_TASKS` names: :func:`tested_engine` refuses
any other before anything is replaced.

One engine per process, so one :data:`ENGINE_HOOKS`: the replacements live in
the engine's modules, which exist once per process, and some are called with
nothing that leads back to a replica (the codec hook takes no argument, a
cancellation gets only the Docket, a mounted child's worker resolves its own
server), so they report to the replica that :meth:`EngineHooks.attach` named
last. Without one (:meth:`EngineHooks.detach`), each passes the engine's own
behaviour through, scrubbing aside. Wiring a replica attaches it; no test
needs to reset anything.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import importlib
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

from mcpfleet import tracing
from mcpfleet.contract import task_seals_of
from mcpfleet.tasks._deadline import bounded
from mcpfleet.tasks._fleet import FleetTasks, TaskEvent, tool_of_key
from mcpfleet.tasks._limits import prefix_of
from mcpfleet.tasks._sealing import PINNED, ScrubbingCodec, task_member
from mcpfleet.tasks._share import SHARE_PARAM, declares_concurrency, principal_share, with_share
from mcpfleet.tasks._status import announce, announce_settled, read_task
from mcpfleet.tasks._trace import forget_creator, leg_span

T = TypeVar("T")

log = logging.getLogger("mcpfleet.tasks")

#: ``fastmcp-tasks`` ``major.minor`` versions whose internals (every replacement
#: above, the snapshot codec hook first) :func:`tested_engine` accepts.
TESTED_FASTMCP_TASKS = ("4.1",)

#: Set on each function installed in the engine: installed once, never wrapped twice.
_MARK = "_mcpfleet_hook"


class TasksUnavailable(RuntimeError):
    """The app has a tasks extension the fleet cannot wire; the message says what to do."""


def tested_engine() -> Any:
    """The engine's ``TasksExtension`` class, if the installed engine is a tested version.

    Raises :class:`TasksUnavailable` when the engine does not import or is a
    version whose internals the replacements were not tested on: its task
    snapshots could carry credentials into Redis.
    """
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
    log.info(
        "tasks: fastmcp-tasks %s (tested on %s): the fleet's engine hooks are installed",
        fastmcp_tasks.__version__,
        ", ".join(v + ".x" for v in TESTED_FASTMCP_TASKS),
    )
    return TasksExtension


def bound_requests(extension: Any, deadline: float) -> None:
    """Bound the fleet's extension's ``tasks/get|update|cancel`` handlers by ``deadline``.

    The engine's Redis client reads without a timeout (its blocking reads need
    it): a stalled Redis would hold the request forever. Done before the
    extension's registration, which takes the handlers from ``methods()``.
    """
    for method in ("_handle_get", "_handle_update", "_handle_cancel"):
        setattr(extension, method, bounded(getattr(extension, method), deadline, "this request"))


def _ours(call: Any) -> bool:
    return bool(getattr(call, _MARK, False))


def _mark(call: T) -> T:
    setattr(call, _MARK, True)
    return call


#: The current task's leg asked for input (set by the observed tool body).
_ASKED: contextvars.ContextVar[list[bool] | None] = contextvars.ContextVar(
    "mcpfleet_task_asked", default=None
)


class EngineHooks:
    """The replacements installed in this process's engine, and the replica they report to."""

    def __init__(self) -> None:
        #: The replica whose worker runs in this process (the last attached), or None.
        self.fleet: FleetTasks | None = None

    def attach(self, fleet: FleetTasks) -> None:
        """Install every replacement (once per process: the first deadline stays) and report
        to ``fleet`` from now on. The engine's version is checked before
        (:func:`tested_engine`)."""
        self.fleet = fleet
        _replace_create_task(self, fleet.queue.deadline)
        _replace_reentrant_task_fn(self)
        _replace_mark_cancelled(self)
        _replace_restore_snapshot(self)
        _replace_snapshot_codec(self)
        _replace_snapshot_save(self)
        _replace_refresh_ttl(self)
        _replace_tasks_get()

    def detach(self) -> None:
        """Report to no replica: the replacements stay, passing the engine's behaviour through
        (snapshots are still scrubbed, creations still bounded)."""
        self.fleet = None


#: The one set of hooks of this process's engine (one engine per process: above).
ENGINE_HOOKS: Final = EngineHooks()


def _replace_create_task(hooks: EngineHooks, deadline: float) -> None:
    """The creation (a ``tools/call`` answered with a task): admitted under its principal's
    cap first (:meth:`TaskLimiter.admit <mcpfleet.tasks._limits.TaskLimiter.admit>`: refused
    past it, before anything is created), bounded by ``deadline`` (a
    creation cut off may exist), then counted ``created`` and, through Sentinel, held
    until a replica of the queue's master has it (:meth:`FleetTasks.replicate`, bounded
    on its own). The extension calls its module's ``create_task``; plain tool calls it
    passes through are not bounded here."""
    extension: Any = importlib.import_module("fastmcp_tasks.extension")
    if _ours(extension.create_task):
        return
    create = bounded(extension.create_task, deadline, "the task's creation (it may exist)")

    @functools.wraps(create)
    async def created(tool: Any, arguments: Any, ctx: Any) -> Any:
        fleet = hooks.fleet
        if fleet is None:
            return await create(tool, arguments, ctx)
        name, scope = str(tool.name), _task_scope()
        reservation = await fleet.limiter.admit(fleet.docket, name, scope)
        try:
            result = await create(tool, arguments, ctx)
        except Exception:
            if reservation is not None:
                await fleet.limiter.cancel(fleet.docket, reservation)
            raise
        ttl = _task_ttl(fleet.docket)
        if reservation is not None:
            await fleet.limiter.confirm(fleet.docket, reservation, scope, result.task_id, ttl)
        else:
            await fleet.limiter.record(fleet.docket, scope, result.task_id, ttl)
        fleet.event(name, "created")
        if fleet.queue.replicated:
            await fleet.replicate(name)
        return result

    extension.create_task = _mark(created)


def _task_scope() -> str | None:
    """The engine's task scope of the request being served (None: anonymous)."""
    context: Any = importlib.import_module("fastmcp_tasks.context")
    scope = context.get_task_scope()
    return None if scope is None else str(scope)


def _task_ttl(docket: Any) -> int:
    """Seconds the engine keeps a task's records (and slides on each poll): its
    Docket's execution TTL plus the engine's buffer, as its creation sets them."""
    creation: Any = importlib.import_module("fastmcp_tasks.creation")
    buffer = int(creation.TASK_MAPPING_TTL_BUFFER_SECONDS)
    return int(docket.execution_ttl.total_seconds()) + buffer


def _replace_snapshot_codec(hooks: EngineHooks) -> None:
    """Every snapshot the engine stores passes through :func:`scrub_snapshot` first.

    The engine reads its snapshot codec through ``fastmcp_tasks.context``'s
    ``snapshot_codec`` (plaintext, or Fernet with ``FASTMCP_TASKS_ENCRYPTION_KEY``);
    the fleet's wraps it, or the replica's :class:`RingSnapshotCodec` with
    ``--tasks-encrypt``: scrubbed, then encoded as that codec would.
    """
    # Any: the hook is a module attribute the engine does not export.
    context: Any = importlib.import_module("fastmcp_tasks.context")
    engines = context.snapshot_codec
    if _ours(engines):
        return

    def scrubbing_codec() -> Any:
        fleet = hooks.fleet
        sealer = fleet.sealer if fleet is not None else None
        return ScrubbingCodec(sealer if sealer is not None else engines())

    context.snapshot_codec = _mark(scrubbing_codec)


def _replace_reentrant_task_fn(hooks: EngineHooks) -> None:
    """The wrapper the engine's registration puts around each task tool: it also tells the
    replica how each leg ended (``input_required``, ``error``, ``completed``,
    ``failed``), which asyncio task runs it (for the drain), unledgers a task
    that ended, and declares the principal's share of the workers
    (:func:`_declare_share`)."""
    components: Any = importlib.import_module("fastmcp_tasks.components")
    reentrant = components.reentrant_task_fn
    if _ours(reentrant):
        return

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
            kwargs.pop(SHARE_PARAM, None)  # the share's slot, never the tool's
            fleet = hooks.fleet
            with leg_span(tool_name, fleet.queue.worker_name if fleet else None):
                return await _observed_leg(fleet, inner, tool_name, args, kwargs)

        _declare_share(hooks, leg, inner)
        return leg

    components.reentrant_task_fn = _mark(observed)


def _declare_share(hooks: EngineHooks, leg: Any, inner: Callable[..., Any]) -> None:
    """Give ``leg`` (registered with the queue) the principal's share of the workers:
    one more keyword parameter, pydocket's ``ConcurrencyLimit`` per principal
    (:mod:`._share`), resolved by pydocket from the signature and dropped by ``leg``
    before the tool runs. A tool with a ``ConcurrencyLimit`` of its own keeps it."""
    if declares_concurrency(inner):
        return
    fleet_share = principal_share(lambda: hooks.fleet.share_of() if hooks.fleet else None)
    signature = with_share(inspect.signature(inner), fleet_share)
    if signature is not None:
        leg.__signature__ = signature


async def _observed_leg(
    fleet: FleetTasks | None,
    inner: Callable[..., Awaitable[Any]],
    tool_name: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """One leg of a task tool, run by the engine's wrapper ``inner``, told to ``fleet``."""
    task = asyncio.current_task()
    if fleet is not None and task is not None:
        fleet.running.add(task)
    if fleet is not None:
        await announce(fleet.on_status, "working")
    asked: list[bool] = []
    token = _ASKED.set(asked)
    try:
        result = await inner(*args, **kwargs)
    except asyncio.CancelledError:
        raise  # a tasks/cancel (counted where it was recorded) or a hand-back
    except Exception:
        tracing.note("mcpfleet.task.outcome", "failed")
        if fleet is not None:
            fleet.event(tool_name, "failed")
            announce_settled(fleet.on_status, "failed")
            await fleet.unledger_current()
        raise
    finally:
        _ASKED.reset(token)
    ended: TaskEvent = "input_required" if asked else "error" if _is_error(result) else "completed"
    tracing.note("mcpfleet.task.outcome", ended)
    if fleet is not None:
        fleet.event(tool_name, ended)
        announce_settled(fleet.on_status, "input_required" if asked else "completed")
        if not asked:
            await fleet.unledger_current()
    return result


def _replace_mark_cancelled(hooks: EngineHooks) -> None:
    """The recording of a ``tasks/cancel``: counted ``cancelled`` (under the task's tool,
    read from its record; ``other`` if it cannot be read) and unledgered."""
    handlers: Any = importlib.import_module("fastmcp_tasks.handlers")
    keys: Any = importlib.import_module("fastmcp_tasks.keys")
    mark = handlers.mark_cancelled
    if _ours(mark):
        return

    @functools.wraps(mark)
    async def cancelled(docket: Any, task_scope: Any, task_id: str, *args: Any) -> Any:
        result = await mark(docket, task_scope, task_id, *args)
        fleet = hooks.fleet
        if fleet is not None:
            tool = "other"
            try:
                meta = docket.key(f"{keys.task_redis_prefix(task_scope)}:{task_id}")
                async with docket.redis() as redis:
                    raw = await redis.get(meta)
                if raw:
                    tool = tool_of_key(raw.decode() if isinstance(raw, bytes) else str(raw))
            except Exception:  # counted all the same, under "other"
                pass
            fleet.event(tool, "cancelled")
            await announce(fleet.on_status, "cancelled", task_id)
            await fleet.unledger(docket, task_scope, task_id)
        return result

    handlers.mark_cancelled = _mark(cancelled)


def _replace_tasks_get() -> None:
    """A client's ``tasks/get``: read again while a ``tasks/update`` moves the task to
    its next leg (:func:`mcpfleet.tasks._status.read_task`), so a poll that races an
    answer never reads the task completed with no result."""
    extension: Any = importlib.import_module("fastmcp_tasks.extension")
    tasks_get = extension.tasks_get
    if _ours(tasks_get):
        return

    @functools.wraps(tasks_get)
    async def settled(server: Any, task_id: str) -> Any:
        return await read_task(server, task_id, tasks_get)

    extension.tasks_get = _mark(settled)


def _replace_restore_snapshot(hooks: EngineHooks) -> None:
    """The worker's restoring of the caller's context: a failure (the task then fails)
    is counted ``failed`` and unledgered."""
    context: Any = importlib.import_module("fastmcp_tasks.context")
    restore = context.restore_task_snapshot
    if _ours(restore):
        return

    @functools.wraps(restore)
    async def restored(*args: Any, **kwargs: Any) -> Any:
        forget_creator()
        try:
            return await restore(*args, **kwargs)
        except Exception:
            key = kwargs.get("key", args[0] if args else "")
            fleet = hooks.fleet
            if fleet is not None:
                fleet.event(tool_of_key(str(key)), "failed")
                announce_settled(fleet.on_status, "failed")
                await fleet.unledger_key(str(key))
            raise

    context.restore_task_snapshot = _mark(restored)


def _replace_snapshot_save(hooks: EngineHooks) -> None:
    """The engine's snapshot save, with a sealer (``--tasks-encrypt``): the sealing key is
    chosen first, the task added to its kid's seal ledger
    (:meth:`mcpfleet.contract.RedisKeys.task_seals`, scored by the snapshot's expiry;
    expired members pruned in the same round trip), and only then is the snapshot,
    sealed with that very key, stored. So the operator retires a key only once no
    live task needs it. A replica lost between the two leaves an entry with no
    snapshot: counted until it expires, never missed. A task leaves the ledger
    when it ends (:meth:`FleetTasks.unledger`): its leg completed, errored or
    failed (not when it asks for input: its next leg reads the snapshot again),
    a restore that failed, a ``tasks/cancel``."""
    context: Any = importlib.import_module("fastmcp_tasks.context")
    snapshot_cls = context.TaskContextSnapshot
    save = snapshot_cls.save
    if _ours(save):
        return

    @functools.wraps(save)
    async def save_ledgered(
        self: Any, docket: Any, task_scope: str | None, task_id: str, ttl_seconds: int
    ) -> None:
        fleet = hooks.fleet
        if fleet is None or fleet.sealer is None:
            return await save(self, docket, task_scope, task_id, ttl_seconds)  # type: ignore[no-any-return]
        key = fleet.sealer.sealing_key()
        now = time.time()
        async with docket.redis() as redis, redis.pipeline(transaction=False) as pipe:
            ledger = task_seals_of(prefix_of(docket), key.kid)
            pipe.zremrangebyscore(ledger, "-inf", now)
            pipe.zadd(ledger, {task_member(task_scope, task_id): now + ttl_seconds})
            await pipe.execute()
        token = PINNED.set(key)
        try:
            await save(self, docket, task_scope, task_id, ttl_seconds)
        finally:
            PINNED.reset(token)

    snapshot_cls.save = _mark(save_ledgered)


def _replace_refresh_ttl(hooks: EngineHooks) -> None:
    """The engine's snapshot TTL refresh (a polled task): the task's place under its
    principal's cap, and with a sealer each seal ledger of the ring's kids that holds
    the task, have their score slid to the new expiry."""
    handlers: Any = importlib.import_module("fastmcp_tasks.handlers")
    refresh = handlers.refresh_snapshot_ttl
    if _ours(refresh):
        return

    @functools.wraps(refresh)
    async def refresh_ledgered(
        docket: Any, task_scope: str | None, task_id: str, ttl_seconds: int
    ) -> None:
        await refresh(docket, task_scope, task_id, ttl_seconds)
        fleet = hooks.fleet
        if fleet is None:
            return
        await fleet.limiter.slide(docket, task_scope, task_id, ttl_seconds)
        if fleet.sealer is None:
            return
        member, until = task_member(task_scope, task_id), time.time() + ttl_seconds
        async with docket.redis() as redis, redis.pipeline(transaction=False) as pipe:
            for kid in fleet.sealer.kids():
                pipe.zadd(task_seals_of(prefix_of(docket), kid), {member: until}, xx=True, gt=True)
            await pipe.execute()

    handlers.refresh_snapshot_ttl = _mark(refresh_ledgered)


def _asks(result: Any) -> bool:
    from fastmcp.tools.base import InputRequiredToolResult
    from mcp_types import InputRequiredResult

    return isinstance(result, InputRequiredResult | InputRequiredToolResult)


def _is_error(result: Any) -> bool:
    return bool(getattr(result, "is_error", False) or getattr(result, "isError", False))
