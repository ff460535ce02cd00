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
import functools
import importlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR

from mcpfleet.config import ReplicaConfig
from mcpfleet.contract import RedisKeys
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
        url, provider = queue_target(settings(redis_url, redis_files))
    return FleetQueue(
        name=name,
        url=url,
        credential_provider=provider,
        worker_name=replica,
        redelivery_timeout=redelivery_timeout,
        concurrency=concurrency,
        deadline=deadline,
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

    The app's own extension (its URL, its queue name) is replaced: a task must
    be visible to every replica of the fleet, whatever the app was written
    for. Its tuning that the fleet does not set (reconnection delay, polling
    interval) is kept.
    """
    if not has_tasks_extension(app):
        return False
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
    _bound_creation(queue.deadline)
    _scrub_stored_snapshots()
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
    return True


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
        return _Scrubbing(current())

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
