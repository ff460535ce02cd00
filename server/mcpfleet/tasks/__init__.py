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

The package, by seam: where the queue lives (``_queue``), the snapshot codecs
that scrub and seal what the engine stores (``_sealing``), one replica's side
of the queue, its counts and its drain (``_fleet``), every replacement inside
the engine beside its version gate (``_engine_hooks``), the deadline on the
engine's calls a request waits on (``_deadline``), a task's status changes
announced and a task read for a listen stream (``_status``), a task's trace kept
in its snapshot and each leg linked to it (``_trace``), the tasks limit per
principal (``_limits``) and a principal's share of the workers (``_share``), and
the wiring of an app's extension (``_wire``). Importing it needs no ``fastmcp_tasks``: the
engine is imported when an app with a tasks extension is wired.
"""

from mcpfleet.tasks._deadline import bounded
from mcpfleet.tasks._engine_hooks import TESTED_FASTMCP_TASKS, TasksUnavailable
from mcpfleet.tasks._fleet import (
    MAX_TOOL_LABELS,
    REPLICATION_WAIT,
    TASK_EVENTS,
    FleetTasks,
    TaskEvent,
    TaskObserver,
)
from mcpfleet.tasks._queue import FleetQueue, fleet_queue, fleet_queue_of
from mcpfleet.tasks._sealing import CREDENTIAL_HEADERS, RingSnapshotCodec, scrub_snapshot
from mcpfleet.tasks._status import StatusHook, TaskReader
from mcpfleet.tasks._wire import (
    TASKS_EXTENSION_ID,
    has_tasks_extension,
    install_tasks,
    wire_tasks,
)

__all__ = [
    "CREDENTIAL_HEADERS",
    "MAX_TOOL_LABELS",
    "REPLICATION_WAIT",
    "TASKS_EXTENSION_ID",
    "TASK_EVENTS",
    "TESTED_FASTMCP_TASKS",
    "FleetQueue",
    "FleetTasks",
    "RingSnapshotCodec",
    "StatusHook",
    "TaskEvent",
    "TaskObserver",
    "TaskReader",
    "TasksUnavailable",
    "bounded",
    "fleet_queue",
    "fleet_queue_of",
    "has_tasks_extension",
    "install_tasks",
    "scrub_snapshot",
    "wire_tasks",
]
