"""Notifications across the fleet: ``subscriptions/listen`` on every replica, one bus in Redis.

On the 2026-07-28 era a client hears of server events only on a
``subscriptions/listen`` stream (SEP-2575), held by one replica; the event
happens wherever its cause ran. The replica runtime installs, for any FastMCP
app:

* a listen handler (:mod:`mcpfleet.notify._listen`): the acknowledgement, the
  filter, the frames tagged with the listen request's id, bounded buffers;
* a :class:`FleetBus` (:mod:`mcpfleet.notify._bus`), the SDK's
  ``SubscriptionBus`` seam over the fleet's pub/sub channel in Redis, so an
  event published on any replica reaches every matching stream on every one;
* the list changes FastMCP announces, published on that bus;
* for an app with MCP tasks, each task's status changes as
  ``notifications/tasks`` to the streams of its owner that named it
  (:mod:`mcpfleet.notify._taskstatus`).
* for handshake-era sessions (:mod:`mcpfleet.notify._sessions`,
  :mod:`mcpfleet.notify._eventstore`, :mod:`mcpfleet.notify._resume`):
  ``resources/subscribe``, the fleet's events on each session's GET stream,
  and SSE streams that resume with ``Last-Event-ID`` from an event store in
  the fleet's Redis.

For app code, :func:`publish_resource_updated` and :func:`publish_list_changed`
(exported from ``mcpfleet``) publish an event from anywhere: a tool, a
background task, a webhook handler, on any replica. Delivery is at most once
and not resumable: docs/notifications.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

from mcp.shared.subscriptions import (
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated,
    ServerEvent,
    ToolsListChanged,
)

from mcpfleet.notify._bus import (
    DROP_REASONS,
    KINDS,
    MAX_URI,
    BusObserver,
    FleetBus,
    FleetEvent,
    kind_of,
)
from mcpfleet.notify._eventstore import EVENT_TTL, EVENTS_PER_STREAM, RETRY_MS, RedisEventStore
from mcpfleet.notify._listen import (
    BUFFERED_EVENTS,
    MAX_STREAMS,
    ListenStreams,
    StreamObserver,
    install_listen,
)
from mcpfleet.notify._resume import prime_by_session
from mcpfleet.notify._sessions import HandshakeSessions, install_sessions
from mcpfleet.notify._taskstatus import TaskLookup, TaskStatusChanged

__all__ = [
    "BUFFERED_EVENTS",
    "DROP_REASONS",
    "EVENTS_PER_STREAM",
    "EVENT_TTL",
    "KINDS",
    "MAX_STREAMS",
    "RETRY_MS",
    "BusObserver",
    "FleetBus",
    "FleetEvent",
    "HandshakeSessions",
    "ListenStreams",
    "Notifications",
    "RedisEventStore",
    "StreamObserver",
    "TaskLookup",
    "TaskStatusChanged",
    "install_listen",
    "install_notifications",
    "install_sessions",
    "kind_of",
    "prime_by_session",
    "publish_list_changed",
    "publish_resource_updated",
    "set_bus",
]

#: The bus of the replica serving in this process (set by the replica runtime).
_bus: FleetBus | None = None


def set_bus(bus: FleetBus | None) -> None:
    """Make ``bus`` the one :func:`publish_resource_updated` publishes on."""
    global _bus
    _bus = bus


class Observer(BusObserver, StreamObserver, Protocol):
    """Who counts the bus and the streams both (the replica's metrics)."""


@dataclass
class Notifications:
    """One replica's side of the fleet's notifications: its bus and its listen streams."""

    bus: FleetBus
    streams: ListenStreams

    async def serve(self, client: Any) -> None:
        """Publish and read the fleet's events through ``client`` until cancelled."""
        self.bus.attach(client)
        try:
            await self.bus.run()
        finally:
            self.bus.detach()

    def read_tasks(self, lookup: TaskLookup) -> None:
        """Let listen streams name tasks (``taskIds``), read through ``lookup``."""
        self.streams.tasks = lookup

    async def task_status(self, task_id: str, status: str) -> bool:
        """Publish that task ``task_id`` is now ``status`` (for its owner's streams)."""
        return await self.bus.send(TaskStatusChanged(task_id, status))

    def close(self) -> None:
        """End every listen stream here (a draining replica): clients listen again elsewhere."""
        self.streams.close()


def install_notifications(
    app: Any, channel: str, *, deadline: float, observer: Observer, max_streams: int = MAX_STREAMS
) -> Notifications:
    """Serve ``subscriptions/listen`` for the FastMCP ``app`` over a fleet bus on
    ``channel``; the bus in-process until :meth:`Notifications.serve` runs, and the
    one :func:`publish_resource_updated` uses."""
    bus = FleetBus(channel, deadline=deadline, observer=observer)
    streams = install_listen(app, bus, observer, max_streams=max_streams)
    set_bus(bus)
    return Notifications(bus, streams)


async def _publish(event: ServerEvent) -> bool:
    bus = _bus
    if bus is None:
        return False
    return await bus.send(event)


async def publish_resource_updated(uri: str) -> bool:
    """Tell every listen stream of the fleet subscribed to ``uri`` that it changed.

    Call it from any code of an app served by mcpfleet, on any replica: the
    streams that listed ``uri`` in ``resourceSubscriptions`` get one
    ``notifications/resources/updated`` each, whichever replica holds them.
    Returns True once the fleet's Redis took the event; False if it did not
    within the Redis deadline (the event is lost, and counted), or if no
    replica runs in this process. It never raises for delivery: a client
    that must not miss a change re-reads the resource when it listens again.
    """
    if not isinstance(uri, str) or not uri or len(uri) > MAX_URI:
        raise ValueError(f"a resource URI is a non-empty string of at most {MAX_URI} characters")
    return await _publish(ResourceUpdated(uri=uri))


async def publish_list_changed(kind: Literal["tools", "prompts", "resources"]) -> bool:
    """Tell every listen stream of the fleet asking for ``kind`` that its list changed.

    For lists an app computes from shared state (a change made on one replica
    changes what every replica lists). Returns as :func:`publish_resource_updated`.
    """
    events: dict[str, ServerEvent] = {
        "tools": ToolsListChanged(),
        "prompts": PromptsListChanged(),
        "resources": ResourcesListChanged(),
    }
    if kind not in events:
        raise ValueError(f"kind must be 'tools', 'prompts' or 'resources', got {kind!r}")
    return await _publish(events[kind])
