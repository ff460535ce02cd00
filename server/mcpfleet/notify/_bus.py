"""The fleet bus: the SDK's ``SubscriptionBus`` seam over one pub/sub channel in Redis.

mcp serves ``subscriptions/listen`` over a :class:`~mcp.server.subscriptions.SubscriptionBus`:
``publish`` hands an event to the bus, and the bus calls each listener it was
given (one per open listen stream) on the event loop. Its own bus is
in-process; a fleet needs every replica's streams to hear an event published
on any replica. :class:`FleetBus` publishes each event on the fleet's channel
(:attr:`mcpfleet.contract.RedisKeys.events`) and a reader task of each replica
hands what arrives to its local listeners: the replica's own events come back
the same way, so every stream sees the fleet's events in one order.

Bounded and honest about failure:

* ``publish`` waits for Redis at most ``deadline`` seconds; past it (Redis
  down or stalled) the event is dropped, counted (``redis``) and logged, and
  ``publish`` returns False: it never raises into a tool.
* the reader never blocks a listener: listeners are synchronous and each
  stream buffers on its own (:mod:`mcpfleet.notify._listen`).
* while Redis is away the reader retries, each attempt under the deadline;
  listen streams stay open and are told nothing: events published meanwhile
  are lost (pub/sub keeps nothing), which the docs say.

Without Redis (a standalone replica) the bus is in-process: ``publish``
calls the listeners at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any, Final, Protocol

from mcp.shared.subscriptions import (
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated,
    ServerEvent,
    ToolsListChanged,
)

from mcpfleet.notify._taskstatus import MAX_TASK_ID, TASK_STATUSES, TaskStatusChanged

log = logging.getLogger("mcpfleet.notify")

#: What the fleet bus carries: the SDK's events and a task's status change.
FleetEvent = ServerEvent | TaskStatusChanged

#: The kinds of event, as metrics label them and the wire names them.
KINDS: Final = ("tools", "prompts", "resources", "resource", "task")
#: Why an event did not reach a stream: Redis did not take it within the deadline,
#: a stream's buffer was full (the stream is ended), a frame was not one of ours,
#: or an SSE event was not stored for resumption (:mod:`mcpfleet.notify._eventstore`).
DROP_REASONS: Final = ("redis", "slow", "malformed", "store")

#: Longest URI a ``resources/updated`` event carries (a bound on a frame's size).
MAX_URI: Final = 4096

#: Seconds the reader waits for a message before it looks again (its stop and health).
READ_WAIT: Final = 1.0
#: Seconds between two attempts to (re)subscribe while Redis is away.
RETRY_WAIT: Final = 0.5


class BusObserver(Protocol):
    """Who counts what the bus does (the replica's metrics)."""

    def published(self, kind: str) -> None: ...

    def dropped(self, reason: str) -> None: ...

    def fanout(self, seconds: float) -> None: ...


class _Quiet:
    def published(self, kind: str) -> None:
        pass

    def dropped(self, reason: str) -> None:
        pass

    def fanout(self, seconds: float) -> None:
        pass


def kind_of(event: FleetEvent) -> str:
    """The event's kind (one of :data:`KINDS`)."""
    if isinstance(event, TaskStatusChanged):
        return "task"
    if isinstance(event, ToolsListChanged):
        return "tools"
    if isinstance(event, PromptsListChanged):
        return "prompts"
    if isinstance(event, ResourcesListChanged):
        return "resources"
    return "resource"


_BY_KIND: Final[dict[str, ServerEvent]] = {
    "tools": ToolsListChanged(),
    "prompts": PromptsListChanged(),
    "resources": ResourcesListChanged(),
}


def encode(event: FleetEvent, now: float | None = None) -> bytes:
    """The frame of ``event`` on the channel: its kind, URI (or task id and status)
    and when it was published."""
    frame: dict[str, Any] = {"k": kind_of(event), "t": time.time() if now is None else now}
    if isinstance(event, ResourceUpdated):
        frame["u"] = event.uri
    elif isinstance(event, TaskStatusChanged):
        frame["i"], frame["s"] = event.task_id, event.status
    return json.dumps(frame, separators=(",", ":")).encode()


def decode(data: bytes | str) -> tuple[FleetEvent, float] | None:
    """The event and its publication time in a frame, or None for anything else (pure)."""
    try:
        frame = json.loads(data)
        kind, sent = frame["k"], float(frame["t"])
    except (ValueError, KeyError, TypeError):
        return None
    if kind == "resource":
        uri = frame.get("u")
        if not isinstance(uri, str) or len(uri) > MAX_URI:
            return None
        return ResourceUpdated(uri=uri), sent
    if kind == "task":
        task_id, status = frame.get("i"), frame.get("s")
        if not isinstance(task_id, str) or not 0 < len(task_id) <= MAX_TASK_ID:
            return None
        return (TaskStatusChanged(task_id, status), sent) if status in TASK_STATUSES else None
    event = _BY_KIND.get(kind) if isinstance(kind, str) else None
    return (event, sent) if event is not None else None


class FleetBus:
    """A :class:`~mcp.server.subscriptions.SubscriptionBus` shared by a fleet's replicas.

    Local until :meth:`attach` gives it the fleet's Redis client; :meth:`run`
    then reads the channel until cancelled (the replica's lifespan runs it).
    """

    def __init__(
        self, channel: str, *, deadline: float, observer: BusObserver | None = None
    ) -> None:
        self.channel = channel
        self.deadline = deadline
        self.observer: BusObserver = observer or _Quiet()
        self._listeners: dict[object, Callable[[FleetEvent], None]] = {}
        self._redis: Any = None
        #: Set while the reader is subscribed (tests and the docs' figures wait on it).
        self.reading = asyncio.Event()

    def attach(self, client: Any) -> None:
        """Publish through ``client`` (an asyncio Redis client) from now on."""
        self._redis = client

    def detach(self) -> None:
        self._redis = None
        self.reading.clear()

    # --- the SubscriptionBus seam --------------------------------------------------------

    def subscribe(self, listener: Callable[[FleetEvent], None]) -> Callable[[], None]:
        """Register ``listener``; the idempotent callable returned unregisters it."""
        token = object()
        self._listeners[token] = listener

        def unsubscribe() -> None:
            self._listeners.pop(token, None)

        return unsubscribe

    async def publish(self, event: FleetEvent) -> None:
        """Publish ``event`` to the fleet (see :meth:`send` for the outcome)."""
        await self.send(event)

    async def send(self, event: FleetEvent) -> bool:
        """Publish ``event``; False if Redis did not take it within the deadline (counted)."""
        kind = kind_of(event)
        client = self._redis
        if client is None:
            self.observer.published(kind)
            self.deliver(event)
            await asyncio.sleep(0)  # let the streams write before the next publish
            return True
        try:
            async with asyncio.timeout(self.deadline):
                await client.publish(self.channel, encode(event))
        except Exception as exc:  # any driver's error, or the deadline
            self.observer.dropped("redis")
            log.warning(
                "notify: a %s event was not published (%s); it is lost", kind, type(exc).__name__
            )
            return False
        self.observer.published(kind)
        return True

    def deliver(self, event: FleetEvent) -> None:
        """Hand ``event`` to every local listener; one that raises is logged and skipped."""
        for listener in list(self._listeners.values()):
            try:
                listener(event)
            except Exception:  # fan-out boundary: one bad listener must not starve others
                log.exception("notify: a listener raised; continuing")

    # --- the reader ----------------------------------------------------------------------

    async def run(self) -> None:
        """Read the channel until cancelled, re-subscribing after any failure."""
        while True:
            client = self._redis
            if client is None:
                return
            pubsub = None
            try:
                async with asyncio.timeout(self.deadline):
                    # A Redis Cluster's client learns the slot map before its pub/sub
                    # can pick a node (a plain client's initialize does nothing here).
                    await client.initialize()
                    pubsub = client.pubsub()
                    await pubsub.subscribe(self.channel)
                self.reading.set()
                await self._read(pubsub)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis away or stalled: listeners stay open
                log.warning("notify: reading the fleet's events failed (%s)", type(exc).__name__)
            finally:
                self.reading.clear()
                if pubsub is not None:
                    await _close(pubsub)
            await asyncio.sleep(RETRY_WAIT)

    async def _read(self, pubsub: Any) -> None:
        while True:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=READ_WAIT)
            if message is None or message.get("type") != "message":
                continue
            found = decode(message["data"])
            if found is None:
                self.observer.dropped("malformed")
                continue
            event, sent = found
            self.observer.fanout(max(0.0, time.time() - sent))
            self.deliver(event)


async def _close(pubsub: Any) -> None:
    """Give the reader's connection back, bounded: a stalled Redis cannot hold the exit."""
    try:
        async with asyncio.timeout(1.0):
            await pubsub.aclose()
    except Exception:  # closing is best effort; the connection is dropped either way
        log.debug("notify: closing the reader's connection failed", exc_info=True)
