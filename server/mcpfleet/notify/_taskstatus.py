"""Task status on listen streams: ``notifications/tasks`` of the tasks extension (SEP-2663).

A client names the tasks it wants to hear of in its listen filter
(``notifications.taskIds``); the server acknowledges the ids it agreed to,
and sends ``notifications/tasks`` (params: the task as ``tasks/get`` would
answer it, a ``DetailedTask``) when one of them changes status. On the fleet:

* a status change is published on the fleet bus as a :class:`TaskStatusChanged`
  (the task's id and its new status: nothing else of the task travels), by the
  replica or worker where it happened (:mod:`mcpfleet.tasks._status`);
* the replica holding a stream that was granted that id reads the task **in
  the listen request's own context**, as that caller's ``tasks/get`` would
  (a :class:`TaskLookup`, which the replica wires to the tasks engine), and
  sends what it read. The engine's scope decides who reads a task, so a stream
  is granted only ids its own principal owns (another's reads as unknown: not
  granted, never heard of), and every frame is what its owner could poll;
* right after the acknowledgement a stream gets each granted task's current
  status once (a task that ended between its creation and the listen is not
  missed); after that a frame per change, a repeat of the last frame of a task
  left out, and a task is forgotten once it ended.

Asking for ``taskIds`` without declaring the extension on the listen request
is refused with ``-32021``, as the extension requires; on an app without a
tasks engine ``taskIds`` is not honoured (left out of the acknowledgement).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol

from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, SubscriptionFilter
from pydantic import BaseModel

__all__ = [
    "FINAL_STATUSES",
    "MAX_TASK_ID",
    "MAX_TASK_IDS",
    "MISSING_CAPABILITY",
    "TASK_STATUSES",
    "TaskLookup",
    "TaskNotification",
    "TaskStatusChanged",
    "TaskWatch",
    "requested_task_ids",
]

#: A task's statuses (SEP-2663), and those that end it.
TASK_STATUSES: Final = ("working", "input_required", "completed", "failed", "cancelled")
FINAL_STATUSES: Final = frozenset({"completed", "failed", "cancelled"})
#: Task ids one stream may name; longest id accepted (the engine's are 43 characters).
MAX_TASK_IDS: Final = 64
MAX_TASK_ID: Final = 256
#: Missing Required Client Capability (SEP-2663's code for a listen naming tasks
#: without the extension declared).
MISSING_CAPABILITY: Final = -32021
_EXTENSION: Final = "io.modelcontextprotocol/tasks"


@dataclass(frozen=True)
class TaskStatusChanged:
    """Task ``task_id`` has a new ``status``: read it again (a level trigger)."""

    task_id: str
    status: str


class TaskLookup(Protocol):
    """How a listen stream reads tasks (the replica wires the tasks engine's)."""

    def declared(self, ctx: Any) -> bool:
        """Whether the listen request declared the tasks extension."""
        ...

    async def detail(self, task_id: str) -> dict[str, Any] | None:
        """The task as the caller's ``tasks/get`` answers (no ``resultType``), or None
        when it is unknown to the caller. May raise (a deadline, Redis away)."""
        ...


class TaskNotification(BaseModel):
    """A ``notifications/tasks`` frame (the session dumps ``method`` and ``params``)."""

    method: Literal["notifications/tasks"] = "notifications/tasks"
    params: dict[str, Any]


def requested_task_ids(requested: SubscriptionFilter) -> list[str] | None:
    """The task ids a listen filter names (duplicates dropped), None when it names none.

    Raises ``INVALID_PARAMS`` for anything but a list of at most
    :data:`MAX_TASK_IDS` non-empty strings of at most :data:`MAX_TASK_ID` characters.
    """
    raw = (requested.model_extra or {}).get("taskIds")
    if raw is None:
        return None
    if (
        not isinstance(raw, list)
        or len(raw) > MAX_TASK_IDS
        or not all(isinstance(i, str) and 0 < len(i) <= MAX_TASK_ID for i in raw)
    ):
        raise MCPError(
            INVALID_PARAMS,
            f"notifications.taskIds must be a list of at most {MAX_TASK_IDS} task ids",
        )
    return list(dict.fromkeys(raw))


def _fingerprint(detail: dict[str, Any]) -> str:
    """What makes two frames of a task the same (its update time left out)."""
    same = {k: v for k, v in detail.items() if k != "lastUpdatedAt"}
    return hashlib.sha256(json.dumps(same, sort_keys=True, default=str).encode()).hexdigest()


class TaskWatch:
    """One listen stream's tasks: the ids it asked for, those granted, the last frame of each.

    Until :meth:`grant` has read them, every id asked for is wanted (an event
    that arrives meanwhile waits in the stream's buffer, and is read again).
    """

    def __init__(self, lookup: TaskLookup, requested: list[str]) -> None:
        self.lookup = lookup
        self.ids: set[str] = set(requested)
        #: The ids :meth:`grant` kept (what the acknowledgement names).
        self.granted: list[str] = []
        self._sent: dict[str, str] = {}

    @classmethod
    def of(
        cls, lookup: TaskLookup | None, ctx: Any, requested: list[str] | None
    ) -> TaskWatch | None:
        """The watch of a listen request naming ``requested`` (None: it names none, or
        the app has no tasks). Raises ``-32021`` when the request did not declare the
        tasks extension."""
        if requested is None or lookup is None:
            return None
        if not lookup.declared(ctx):
            raise MCPError(
                MISSING_CAPABILITY,
                "Missing required client capability: notifications.taskIds needs the "
                f"{_EXTENSION} extension declared on the listen request",
                data={"requiredCapabilities": {"extensions": {_EXTENSION: {}}}},
            )
        return cls(lookup, requested)

    async def grant(self) -> list[dict[str, Any]]:
        """Read each id asked for as its caller's ``tasks/get``: keep those it reads (its
        own), drop the others; the current state of each kept one."""
        first: list[dict[str, Any]] = []
        for task_id in sorted(self.ids):
            try:
                detail = await self.lookup.detail(task_id)
            except Exception:  # unread (Redis away): not granted, the ack says so
                detail = None
            if detail is None:
                self.ids.discard(task_id)
                continue
            self.granted.append(task_id)
            fresh = self.fresh(task_id, detail)
            if fresh is not None:
                first.append(fresh)
        return first

    def wants(self, event: TaskStatusChanged) -> bool:
        return event.task_id in self.ids

    async def frame(self, event: TaskStatusChanged) -> dict[str, Any] | None:
        """The params of the frame ``event`` calls for (the task read again), or None
        when the stream has nothing new to hear of it. May raise as the lookup does."""
        if event.task_id not in self.ids:
            return None
        detail = await self.lookup.detail(event.task_id)
        if detail is None:  # expired, or gone: nothing more to hear of it
            self.ids.discard(event.task_id)
            self._sent.pop(event.task_id, None)
            return None
        return self.fresh(event.task_id, detail)

    def fresh(self, task_id: str, detail: dict[str, Any]) -> dict[str, Any] | None:
        """``detail`` unless it repeats the last frame sent of the task; an ended task
        is forgotten (no status follows an end)."""
        mark = _fingerprint(detail)
        if self._sent.get(task_id) == mark:
            return None
        if detail.get("status") in FINAL_STATUSES:
            self.ids.discard(task_id)
            self._sent.pop(task_id, None)
        else:
            self._sent[task_id] = mark
        return detail
