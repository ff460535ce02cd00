"""``subscriptions/listen`` served for any FastMCP app, over the fleet bus.

FastMCP (4.2) does not register a ``subscriptions/listen`` handler on its
low-level server, so a modern client cannot listen to a FastMCP app at all.
:func:`install_listen` registers one (mcp's documented way: the low-level
server's ``add_request_handler``), as the replica installs its request-state
boundary: the app's author writes nothing. The handler keeps mcp's
:class:`~mcp.server.subscriptions.ListenHandler` contract, built from the
SDK's own pieces (the filter's admission, the frames, the subscription id):

* the acknowledgement first, naming the filter honoured;
* only the kinds and URIs the stream asked for;
* every frame tagged with the listen request's id
  (``_meta["io.modelcontextprotocol/subscriptionId"]``);
* a stream ended by :meth:`ListenStreams.close` (a draining replica) gets its
  ``SubscriptionsListenResult`` as the last frame, so the client knows to
  listen again elsewhere; a stream ended at its buffer's bound gets a JSON-RPC
  error (``data.reason``: ``slow``) instead, what it held dropped.

and adds what a fleet needs: each stream's backlog is bounded (a stream whose
client stops reading is ended at :data:`BUFFERED_EVENTS`, counted ``slow``),
the streams per replica are capped (:data:`MAX_STREAMS`), and every stream
opened, delivered to and dropped is counted. Keep-alive comments are mcp's
own: its 2026-07-28 transport sends ``: ping`` on a listen response after
every 15 s without a frame.

The list changes FastMCP already announces (a visibility change,
``ctx.send_notification(ToolListChangedNotification())``, a proxied server's)
go out on the request's own stream only, and on the modern era nobody else
hears them. :class:`ChangesToBus`, a low-level middleware, also publishes each
on the fleet bus, so every listen stream of the fleet that asked for that kind
hears it once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, Protocol

import anyio
from anyio.streams.memory import MemoryObjectSendStream
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import (
    SUBSCRIPTION_ID_META_KEY,
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated,
    ServerEvent,
    ToolsListChanged,
    event_matches,
    event_to_notification,
)
from mcp_types import (
    INTERNAL_ERROR,
    INVALID_REQUEST,
    SubscriptionFilter,
    SubscriptionsAcknowledgedNotification,
    SubscriptionsAcknowledgedNotificationParams,
    SubscriptionsListenRequestParams,
    SubscriptionsListenResult,
)

from mcpfleet.notify._bus import FleetBus, FleetEvent, kind_of, log
from mcpfleet.notify._taskstatus import (
    TaskLookup,
    TaskNotification,
    TaskStatusChanged,
    TaskWatch,
    requested_task_ids,
)

#: Events one stream may hold unsent; past it the stream is ended (``slow``).
BUFFERED_EVENTS: Final = 256
#: Listen streams one replica serves at once; more are refused before the ack.
MAX_STREAMS: Final = 1024

_OURS: Final = "_mcpfleet_listen"
#: The error a stream ended at its buffer's bound ends with (``data.reason``: ``slow``).
SLOW: Final = (
    "Listen stream ended: its client did not read the notifications fast enough; "
    "listen again and re-read what it follows"
)


class StreamObserver(Protocol):
    """Who counts the streams (the replica's metrics)."""

    def streams(self, delta: int) -> None: ...

    def delivered(self, kind: str) -> None: ...

    def dropped(self, reason: str) -> None: ...


def honoured(
    requested: SubscriptionFilter, task_ids: list[str] | None = None
) -> SubscriptionFilter:
    """What of ``requested`` a stream gets: all of it, falsy flags and no URIs left out
    (the SDK's rule: a kind or URI that never fires is still honoured); ``taskIds``
    only those ``task_ids`` granted (:mod:`._taskstatus`), None: not honoured."""
    extra: dict[str, Any] = {} if task_ids is None else {"taskIds": task_ids}
    return SubscriptionFilter(
        **extra,
        tools_list_changed=True if requested.tools_list_changed else None,
        prompts_list_changed=True if requested.prompts_list_changed else None,
        resources_list_changed=True if requested.resources_list_changed else None,
        resource_subscriptions=(
            list(requested.resource_subscriptions) if requested.resource_subscriptions else None
        ),
    )


class ListenStreams:
    """The ``subscriptions/listen`` handler: one call is one stream (module docstring)."""

    def __init__(
        self,
        bus: FleetBus,
        observer: StreamObserver,
        *,
        max_streams: int = MAX_STREAMS,
        buffered: int = BUFFERED_EVENTS,
    ) -> None:
        self.bus = bus
        self.observer = observer
        self.max_streams = max_streams
        self.buffered = buffered
        #: How streams read tasks (the replica sets it for an app with tasks), or None.
        self.tasks: TaskLookup | None = None
        self._streams: set[MemoryObjectSendStream[FleetEvent]] = set()
        #: Streams ended at their buffer's bound: they end with :data:`SLOW` as the reason.
        self._slow: set[MemoryObjectSendStream[FleetEvent]] = set()

    @property
    def open(self) -> int:
        return len(self._streams)

    async def __call__(
        self, ctx: ServerRequestContext[Any, Any], params: SubscriptionsListenRequestParams
    ) -> SubscriptionsListenResult:
        subscription_id = ctx.request_id
        if subscription_id is None:
            raise MCPError(INVALID_REQUEST, "subscriptions/listen requires a request id")
        if len(self._streams) >= self.max_streams:
            raise MCPError(INTERNAL_ERROR, "Subscription limit reached")
        watch = TaskWatch.of(self.tasks, ctx, requested_task_ids(params.notifications))
        filt = honoured(params.notifications)
        uris = frozenset(filt.resource_subscriptions or ())
        meta: dict[str, Any] = {SUBSCRIPTION_ID_META_KEY: subscription_id}
        send, recv = anyio.create_memory_object_stream[FleetEvent](self.buffered)
        deliver = self._deliverer(filt, uris, watch, send)
        # Subscribed before the ack: an event published meanwhile waits in the buffer,
        # and the ack is still the first frame (only this task writes the stream).
        unsubscribe = self.bus.subscribe(deliver)
        self._streams.add(send)
        self.observer.streams(1)
        try:
            first = await watch.grant() if watch is not None else []
            acked = honoured(params.notifications, watch.granted if watch is not None else None)
            await self._send(
                ctx,
                SubscriptionsAcknowledgedNotification(
                    params=SubscriptionsAcknowledgedNotificationParams(
                        notifications=acked, _meta=meta
                    )
                ),
            )
            for detail in first:
                await self._send(ctx, TaskNotification(params={**detail, "_meta": meta}))
            async for event in recv:
                if send in self._slow:
                    break  # what it holds is dropped: its reason goes out next
                await self._forward(ctx, event, watch, meta)
            if send in self._slow:
                raise MCPError(INTERNAL_ERROR, SLOW, data={"reason": "slow"})
        finally:
            unsubscribe()
            self._slow.discard(send)
            self._streams.discard(send)
            self.observer.streams(-1)
            send.close()
            recv.close()
        return SubscriptionsListenResult(_meta=meta)

    async def _send(self, ctx: ServerRequestContext[Any, Any], notification: Any) -> None:
        await ctx.session.send_notification(notification, related_request_id=ctx.request_id)

    async def _forward(
        self,
        ctx: ServerRequestContext[Any, Any],
        event: FleetEvent,
        watch: TaskWatch | None,
        meta: dict[str, Any],
    ) -> None:
        """One event onto the stream: a task's read again first (its owner's view)."""
        if isinstance(event, TaskStatusChanged):
            if watch is None:
                return
            try:
                detail = await watch.frame(event)
            except Exception as exc:  # the task store did not answer: the change is lost
                log.warning("notify: a task's status was not read (%s)", type(exc).__name__)
                self.observer.dropped("redis")
                return
            if detail is None:
                return
            await self._send(ctx, TaskNotification(params={**detail, "_meta": meta}))
        else:
            await self._send(ctx, event_to_notification(event, meta))
        self.observer.delivered(kind_of(event))

    def _deliverer(
        self,
        filt: SubscriptionFilter,
        uris: frozenset[str],
        watch: TaskWatch | None,
        send: MemoryObjectSendStream[FleetEvent],
    ) -> Callable[[FleetEvent], None]:
        def deliver(event: FleetEvent) -> None:
            if isinstance(event, TaskStatusChanged):
                if watch is None or not watch.wants(event):
                    return
            elif not event_matches(filt, uris, event):
                return
            try:
                send.send_nowait(event)
            except anyio.ClosedResourceError:
                pass  # closed by close(): the stream is unwinding
            except anyio.WouldBlock:
                # A client that stopped reading: end its stream now (its slot freed at
                # once: the handler may be stuck in a write closing cannot wake).
                log.warning("notify: a listen stream's buffer is full; ending the stream")
                self.observer.dropped("slow")
                self._slow.add(send)
                self._streams.discard(send)
                send.close()

        return deliver

    def close(self) -> None:
        """End every open stream gracefully: each sends what it holds, then its result."""
        for stream in list(self._streams):
            stream.close()


#: The list-changed notifications FastMCP sends, by the event each stands for.
_CHANGES: Final[dict[str, ServerEvent]] = {
    "notifications/tools/list_changed": ToolsListChanged(),
    "notifications/prompts/list_changed": PromptsListChanged(),
    "notifications/resources/list_changed": ResourcesListChanged(),
}


def event_of(notification: Any) -> ServerEvent | None:
    """The fleet event a server notification announces, or None (pure).

    A frame of a listen stream (its ``_meta`` names a subscription) announces
    nothing: it is an event already delivered, never published again.
    """
    method = getattr(notification, "method", None)
    params = getattr(notification, "params", None)
    if SUBSCRIPTION_ID_META_KEY in (getattr(params, "meta", None) or {}):
        return None
    if method == "notifications/resources/updated":
        uri = getattr(params, "uri", None)
        return ResourceUpdated(uri=str(uri)) if uri is not None else None
    return _CHANGES.get(method) if isinstance(method, str) else None


class ChangesToBus:
    """Low-level middleware: a change notification a request sends is also published.

    It wraps the request's session's ``send_notification`` once per session (a
    handshake session's is shared by its requests, a modern request's is its
    own): a list change or resource update goes to the fleet bus, then on its
    way as before.
    """

    def __init__(self, bus: FleetBus) -> None:
        self.bus = bus
        setattr(self, _OURS, True)

    async def __call__(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        session = ctx.session
        if ctx.method != "subscriptions/listen" and not getattr(session, _OURS, False):
            self._wrap(session)
        return await call_next(ctx)

    def _wrap(self, session: Any) -> None:
        original = session.send_notification
        bus = self.bus

        async def send_notification(notification: Any, related_request_id: Any = None) -> None:
            event = event_of(notification)
            if event is not None:
                await bus.send(event)
            await original(notification, related_request_id=related_request_id)

        session.send_notification = send_notification
        setattr(session, _OURS, True)


def install_listen(
    app: Any, bus: FleetBus, observer: StreamObserver, *, max_streams: int = MAX_STREAMS
) -> ListenStreams:
    """Serve ``subscriptions/listen`` for the FastMCP ``app`` over ``bus``; publish its changes.

    Installed again (tests build several replicas of one app object), it
    replaces the handler and its own middleware, never stacks them.
    """
    lowlevel = app._mcp_server
    handler = ListenStreams(bus, observer, max_streams=max_streams)
    lowlevel.add_request_handler("subscriptions/listen", SubscriptionsListenRequestParams, handler)
    lowlevel.middleware[:] = [mw for mw in lowlevel.middleware if not getattr(mw, _OURS, False)]
    lowlevel.middleware.append(ChangesToBus(bus))
    return handler
