"""A task's trace: the creating request's context kept in its snapshot, each leg linked to it.

A task outlives the request that created it and runs, leg by leg, on any
replica's worker. So that its legs tell one story with that request, the
snapshot the engine stores for the task (the caller's context, which every
worker restores before each leg) also carries the W3C ``traceparent`` of the
span current when the task was created (:data:`CREATOR_FIELD`): added by the
fleet's snapshot codec after the credentials are scrubbed and before the
snapshot is sealed (:class:`~mcpfleet.tasks._sealing.ScrubbingCodec`), so it
is stored, and sealed with ``--tasks-encrypt``, exactly where the snapshot is.
The worker reads it back as it opens the snapshot (:func:`read_creator`), and
runs the leg in a span of its own (:func:`leg_span`: a trace root with a link
to the creator's span, the OpenTelemetry messaging conventions' model of a
message processed later).

Nothing here runs when tracing is off: no field is written, none is read,
no span is made. The engine ignores a snapshot field it does not know.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
from collections.abc import Iterator
from typing import Any, Final

from mcpfleet import tracing

#: The snapshot's field holding the creating request's ``traceparent``.
CREATOR_FIELD: Final = "mcpfleet_traceparent"

#: The ``traceparent`` read from the snapshot restored for the leg this context runs
#: (set before each leg: None when the snapshot carries none).
CREATOR: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "mcpfleet_task_creator", default=None
)

#: The name of a leg's span.
LEG_SPAN: Final = "mcpfleet.task.leg"


def with_creator(payload: str) -> str:
    """The snapshot ``payload`` (the engine's JSON, scrubbed) with the current span's
    ``traceparent`` in :data:`CREATOR_FIELD`; ``payload`` itself when tracing is off
    or no span is current."""
    if not tracing.ON:
        return payload
    parent = tracing.traceparent()
    if not parent:
        return payload
    data = json.loads(payload)
    if not isinstance(data, dict):
        return payload
    data[CREATOR_FIELD] = parent.decode("ascii")
    return json.dumps(data)


def forget_creator() -> None:
    """Before a leg's snapshot is restored: no creator until one is read (a worker
    may run legs of several tasks in one context)."""
    if tracing.ON:
        CREATOR.set(None)


def read_creator(payload: str) -> None:
    """Keep the creator's ``traceparent`` of a snapshot being restored (tracing on)."""
    if not tracing.ON:
        return
    try:
        data: Any = json.loads(payload)
    except ValueError:
        return  # the engine refuses it itself
    value = data.get(CREATOR_FIELD) if isinstance(data, dict) else None
    CREATOR.set(value if isinstance(value, str) and value else None)


def leg_span(tool: str, worker: str | None) -> contextlib.AbstractContextManager[Any]:
    """The span of one leg of a task of ``tool`` run by ``worker`` (the replica's name),
    linked to its creator's span; a shared no-op when tracing is off."""
    if not tracing.ON:
        return contextlib.nullcontext()
    return _leg_span(tool, worker)


@contextlib.contextmanager
def _leg_span(tool: str, worker: str | None) -> Iterator[Any]:
    attributes: dict[str, str | int | bool] = {"gen_ai.tool.name": tool}
    if worker:
        attributes["mcpfleet.replica"] = worker
    leg = _leg_number()
    if leg is not None:
        attributes["mcpfleet.task.leg"] = leg
    with tracing.linked_span(LEG_SPAN, CREATOR.get(), **attributes) as span:
        yield span


def _leg_number() -> int | None:
    """The engine's number of the leg running (1, then one more after each input)."""
    try:
        from fastmcp_tasks.context import get_task_leg_number
    except ImportError:
        return None
    return int(get_task_leg_number())
