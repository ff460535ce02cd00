"""A task's status changes, announced where they happen; a task read as ``tasks/get`` reads it.

The tasks extension (SEP-2663) lets a server push ``notifications/tasks`` on
a ``subscriptions/listen`` stream that named the task in ``taskIds``. On a
fleet the change happens on the worker that runs the leg (``working``,
``input_required``, ``completed``, ``failed``) or on the replica serving a
``tasks/cancel`` (``cancelled``), and the stream is held by any replica. This
module is the tasks side of it, knowing nothing of the bus:

* :func:`announce` and :func:`announce_settled` hand ``(task id, status)`` to
  the hook the replica set on :attr:`FleetTasks.on_status
  <mcpfleet.tasks.FleetTasks.on_status>` (the replica publishes it on the
  fleet bus). A leg's end is announced only once the engine recorded it (the
  queue writes a leg's state after the leg returns): a stream that reads the
  task on the announcement reads the new status, not the old one;
* :class:`TaskReader` reads a task for a listen stream exactly as the
  engine's ``tasks/get`` does, in the listen request's own context: the
  engine's scope (the caller's client id and subject) decides, so a stream
  only ever reads its own principal's tasks, and another's id reads as
  unknown. Nothing of a task's content travels on the bus.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final

log = logging.getLogger("mcpfleet.tasks")

__all__ = [
    "SETTLE_WAIT",
    "StatusHook",
    "TaskReader",
    "announce",
    "announce_settled",
    "read_task",
    "task_id_of_key",
]

#: Called with a task's id and its new status; bounded by its own deadline.
StatusHook = Callable[[str, str], Awaitable[object]]
#: Seconds an announcement waits at most for the engine to record a leg's end.
SETTLE_WAIT: Final = 5.0
#: Seconds between two reads of a leg's recorded state while it settles.
_SETTLE_POLL: Final = 0.02
#: The leg states that are still in progress (Docket's ``ExecutionState`` values).
_UNSETTLED: Final = frozenset({"scheduled", "queued", "running"})
#: Reads of a task at most, while a tasks/update moves it to its next leg (TaskReader).
_READS: Final = 3
#: Announcements waiting for their leg to settle, kept until done (never collected).
_PENDING: set[asyncio.Task[None]] = set()


def task_id_of_key(execution_key: str) -> str | None:
    """The client's task id of a queue execution's key (any leg), or None."""
    try:
        keys: Any = importlib.import_module("fastmcp_tasks.keys")
        return str(keys.parse_task_key(keys.base_task_key(execution_key))["client_task_id"])
    except Exception:
        return None


def _current_execution() -> Any:
    try:
        dependencies: Any = importlib.import_module("docket.dependencies")
        return dependencies.current_execution.get()
    except Exception:
        return None


async def announce(hook: StatusHook | None, status: str, task_id: str | None = None) -> None:
    """Hand ``status`` of ``task_id`` (default: the leg this worker runs) to ``hook``.

    Never raises into the engine: a status not announced is logged (without
    the task's id); the client still reads it with ``tasks/get``.
    """
    if hook is None:
        return
    if task_id is None:
        execution = _current_execution()
        task_id = task_id_of_key(str(execution.key)) if execution is not None else None
    if task_id is None:
        return
    try:
        await hook(task_id, status)
    except Exception as exc:  # the bus counts its own failures; nothing reaches the engine
        log.warning("tasks: a task's %s status was not announced: %s", status, type(exc).__name__)


def announce_settled(hook: StatusHook | None, status: str) -> None:
    """Announce the end of the leg this worker runs once the queue has recorded it.

    The leg's state is written by the queue after the leg returns; the
    announcement waits for it (reading the leg's state, at most
    :data:`SETTLE_WAIT` seconds) in a task of its own, so the worker goes on.
    """
    if hook is None:
        return
    execution = _current_execution()
    if execution is None:
        return
    task_id = task_id_of_key(str(execution.key))
    if task_id is None:
        return
    pending = asyncio.ensure_future(_settle_then_announce(hook, execution, task_id, status))
    _PENDING.add(pending)
    pending.add_done_callback(_PENDING.discard)


async def _settle_then_announce(
    hook: StatusHook, execution: Any, task_id: str, status: str
) -> None:
    try:
        async with asyncio.timeout(SETTLE_WAIT):
            while True:
                await execution.sync()
                state = getattr(getattr(execution, "state", None), "value", None)
                if state not in _UNSETTLED:
                    break
                await asyncio.sleep(_SETTLE_POLL)
    except Exception as exc:  # announced all the same: a stream reads what tasks/get says
        log.debug("tasks: a leg's end was not seen recorded: %s", type(exc).__name__)
    await announce(hook, status, task_id)


class TaskReader:
    """A task read for a listen stream as the engine's ``tasks/get`` reads it.

    Called from within the listen request (its context carries the caller's
    identity, as a ``tasks/get`` of that caller would).
    """

    def __init__(self, app: Any, deadline: float) -> None:
        self.app = app
        self.deadline = deadline

    def declared(self, ctx: Any) -> bool:
        """Whether the request declared the tasks extension in its capabilities."""
        extensions: Any = importlib.import_module("fastmcp.server.extensions")
        tasks: Any = importlib.import_module("fastmcp.utilities.tasks")
        return extensions.read_client_extension_settings(ctx, tasks.TASKS_EXTENSION_ID) is not None

    async def detail(self, task_id: str) -> dict[str, Any] | None:
        """The task as ``tasks/get`` answers the caller (``DetailedTask``, no
        ``resultType``), or None when it is unknown to the caller (another's,
        expired, never made). Raises TimeoutError past the deadline."""
        from mcp.shared.exceptions import MCPError

        handlers: Any = importlib.import_module("fastmcp_tasks.handlers")
        try:
            async with asyncio.timeout(self.deadline):
                result = await read_task(self.app, task_id, handlers.tasks_get)
        except MCPError:
            return None
        detail: dict[str, Any] = result.model_dump(by_alias=True, mode="json", exclude_none=True)
        detail.pop("resultType", None)
        return detail


async def read_task(app: Any, task_id: str, tasks_get: Callable[[Any, str], Awaitable[Any]]) -> Any:
    """The engine's ``tasks_get(app, task_id)``, read again while a ``tasks/update``
    moves the task to its next leg (at most :data:`_READS` reads).

    The engine reads the task's current leg, then whether that leg still asks for
    input. An update that lands between the two enqueues the next leg, moves the
    task to it, and clears the answered leg's questions, so the read finds a leg that
    ended asking nothing: the task "completed", with no result. A client that takes
    that for the end keeps ``None`` as its result. So a completed read is taken
    only when the task's current leg is the same before and after it
    (``tests/unit/test_task_reader.py`` lands an update inside the read).
    """
    result = None
    for _ in range(_READS):
        leg = await _leg(app, task_id)
        result = await tasks_get(app, task_id)
        if getattr(result, "status", None) != "completed" or await _leg(app, task_id) == leg:
            break
    return result


async def _leg(app: Any, task_id: str) -> tuple[str | None, int] | None:
    """The task's current leg (its execution key and number), as the engine reads it."""
    docket = getattr(app, "_docket", None)
    if docket is None:
        return None
    store: Any = importlib.import_module("fastmcp_tasks.input_store")
    scope: Any = importlib.import_module("fastmcp_tasks.context")
    leg: tuple[str | None, int] = await store.load_current_leg(
        docket, scope.get_task_scope(), task_id
    )
    return leg
