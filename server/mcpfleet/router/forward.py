"""One request forwarded to one replica, and the books the router keeps around it.

:class:`Forwarder` wraps :class:`~mcpfleet.router.upstream.Upstream` (which
only forwards) with what the router knows of the request: it counts in
flight on its replica while it runs; once the replica's headers arrived, a new
session is recorded in the session table (before the client has the answer),
a session the replica no longer knows is dropped, a rate refusal learnt, the
latency observed. A client that goes away before the answer cancels the
request on the replica (a session's with ``notifications/cancelled``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from starlette.types import Message, Receive, Scope

from mcpfleet import tracing
from mcpfleet.contract import DRAINING_HEADER, SESSION_HEADER
from mcpfleet.router.decisions import RouteKind, cancellations, valid_session_id
from mcpfleet.router.exchange import Exchange
from mcpfleet.router.h1client import Response
from mcpfleet.router.h1server import WATCH_DISCONNECT
from mcpfleet.router.metrics import RouterMetrics
from mcpfleet.router.refused import RefusedCredentials
from mcpfleet.router.rehome import Rehomer
from mcpfleet.router.replicas import Placement, ReplicaView
from mcpfleet.router.route import SessionRoute, client_session_line
from mcpfleet.router.table import SessionTable
from mcpfleet.router.upstream import Dropped, Failure, Upstream, session_ended

log = logging.getLogger("mcpfleet.router")
_T = TypeVar("_T")


class Forwarder:
    """The forward of a request to one replica, with the router's books around it."""

    def __init__(
        self,
        view: ReplicaView,
        sessions: SessionTable,
        upstream: Upstream,
        refused: RefusedCredentials,
        metrics: RouterMetrics,
        rehomer: Rehomer,
    ) -> None:
        self.view = view
        self.sessions = sessions
        self.upstream = upstream
        self.refused = refused
        self.metrics = metrics
        self.rehomer = rehomer
        #: ``notifications/cancelled`` on their way to replicas.
        self.notices: set[asyncio.Future[None]] = set()
        #: The loop the router serves on (set at startup).
        self.loop: asyncio.AbstractEventLoop | None = None

    async def forward(
        self,
        x: Exchange,
        kind: RouteKind,
        name: str,
        address: str,
        alias: tuple[bytes, bytes] | None = None,
        place: Placement | None = None,
    ) -> int | Failure:
        """Forward the request of ``x`` to replica ``name`` through :attr:`upstream`.

        Around the forwarding itself: the request counts in flight while it
        runs; once the replica's headers arrived a new session is recorded, a
        rate refusal learnt, the latency observed; the session's route is forgotten
        when the replica marks its 404 as "no such session" (an unmarked 404 answers
        a credential that is not the session's). ``alias``: the owner's and the
        client's ids of a re-homed session; ``place``: an ``initialize``'s place on
        the replica. Returns the status relayed, or the :class:`Failure` that stopped it.
        """
        session = x.session
        self.view.inflight[name] = self.view.inflight.get(name, 0) + 1
        try:
            try:
                line = client_session_line(session) if alias and session else b""
                if tracing.ON:
                    line += _traced_to(name)
                upstream = await _unless_client_leaves(
                    self.upstream.open(x.scope, name, address, x.body, line),
                    x.scope,
                    x.receive,
                    self.loop or asyncio.get_running_loop(),
                )
            except Dropped:
                # The request may have been processed: never re-sent. The caller answers.
                return Failure.DROPPED
            except _ClientLeft:
                # The client left before the answer: the closed upstream cancels it.
                self._cancelled(kind, x, address)
                return Failure.DISCONNECTED
            if isinstance(upstream, Failure):
                return upstream
            if upstream.status == 503 and upstream.headers.get(DRAINING_HEADER):
                await self.upstream.decline(upstream)
                return Failure.DRAINING
            # A session opened or ended, a rate refusal (rare: the common path only tests).
            if place is not None and 200 <= upstream.status < 300:
                await self._record(x, name, upstream, place)
            elif session is not None and session_ended(upstream):
                await self._forget(session, upstream)
            elif upstream.status == 429:
                self.refused.learn(x, upstream)
            self._observe_latency(kind, x.started)
            result = await self.upstream.relay(upstream, address, x.receive, x.send, alias)
            if result is Failure.UPSTREAM_BROKE:
                log.warning("replica %s broke off its response; aborting the client's", name)
            elif result is Failure.DISCONNECTED:
                self._cancelled(kind, x, address)
            return result
        finally:
            self.view.inflight[name] -= 1

    def _observe_latency(self, kind: RouteKind, started: float) -> None:
        """The request's time to the replica's headers; with tracing on, its trace's ids
        as the observation's exemplar (when sampled)."""
        exemplar = tracing.exemplar() if tracing.ON else None
        self.metrics.observe_latency(kind.value, time.perf_counter() - started, exemplar)

    async def _record(self, x: Exchange, name: str, upstream: Response, place: Placement) -> None:
        """An ``initialize`` was answered 2xx: the session it opened (if it names one)
        counts on ``name`` and is routed to it (before the client has the answer). On
        any error the upstream response is closed."""
        try:
            session = upstream.headers.get(SESSION_HEADER)
            if session and valid_session_id(session):
                place.opened()
                init = self.rehomer.init_record(upstream, x.body)
                await self.sessions.record(session, SessionRoute(name), init)
        except BaseException:
            upstream.close()
            raise

    async def _forget(self, session: str, upstream: Response) -> None:
        """The owner said "no such session": its route goes. On any error the upstream
        response is closed."""
        try:
            await self.sessions.drop(session)
        except BaseException:
            upstream.close()
            raise

    def _cancelled(self, kind: RouteKind, x: Exchange, address: str) -> None:
        """The client went away before its answer was complete: the request is cancelled.

        A stateless request is cancelled by the closed upstream connection alone
        (the replica sees its client leave). A session's request runs in the
        session, not in its HTTP request: the owner is told with the spec's
        ``notifications/cancelled`` for each request id the body carried, sent
        with the client's own headers (its session id and credentials).
        """
        self.metrics.cancelled.labels(kind.value).inc()
        if x.session is None:
            return
        notices = cancellations(x.body)
        if notices:
            task = asyncio.ensure_future(self.upstream.notify(x.scope, address, notices))
            self.notices.add(task)
            task.add_done_callback(self.notices.discard)


def _traced_to(name: str) -> bytes:
    """The forward to replica ``name`` noted on the request's span, and the header
    line that carries the span's context to the replica."""
    tracing.note("mcpfleet.replica", name)
    parent = tracing.traceparent()
    return b"traceparent: " + parent + b"\r\n" if parent else b""


class _ClientLeft(Exception):
    """The client went away while the router waited for the replica's answer."""


async def _unless_client_leaves(
    opening: Coroutine[Any, Any, _T],
    scope: Scope,
    receive: Receive,
    loop: asyncio.AbstractEventLoop,
) -> _T:
    """Await ``opening`` in this task; raise :class:`_ClientLeft` (``opening``
    cancelled: it closes its connection) if the client leaves first.

    Served by the router's own HTTP protocol (:mod:`mcpfleet.router.h1server`), the
    connection tells when it closes, and that cancels this task: no task, no
    ``asyncio.wait`` per request (two tasks and a wait per forwarded request
    were a measurable share of the router's CPU). Elsewhere (an ASGI test
    client) one task reads the next ASGI message, which is the client's
    disconnect, whenever it comes (the request body was read whole before).
    """
    task = asyncio.current_task(loop)  # (given the loop: no getpid() call on Python 3.11)
    assert task is not None
    left = False
    armed = True

    def gone() -> None:
        nonlocal left
        if armed:
            left = True
            task.cancel()

    watch_disconnect = scope.get("extensions", {}).get(WATCH_DISCONNECT)
    unwatch = None
    if watch_disconnect is not None:
        watch_disconnect(gone)
    else:
        unwatch = _watch_receive(receive, loop, gone)
    try:
        return await opening
    except asyncio.CancelledError:
        if left and task.uncancel() == 0:
            raise _ClientLeft from None
        raise
    finally:
        armed = False
        if watch_disconnect is not None:
            watch_disconnect(None)
        if unwatch is not None:
            unwatch()


def _watch_receive(
    receive: Receive, loop: asyncio.AbstractEventLoop, gone: Callable[[], None]
) -> Callable[[], None]:
    """Call ``gone`` when the next ASGI message ``receive`` gives is the client's
    disconnect (served by anything but the router's own HTTP protocol); returns
    what stops the watch.

    (A function of its own: ``watch`` and ``on_message`` refer to each other, a
    reference cycle the collector would have to find for every request were they
    made on the router's own path.)
    """
    armed = True
    watcher: asyncio.Future[Message] | None = None

    def watch() -> None:
        nonlocal watcher
        watcher = loop.create_task(receive())  # type: ignore[arg-type]
        watcher.add_done_callback(on_message)

    def on_message(done: asyncio.Future[Message]) -> None:
        if not armed or done.cancelled() or done.exception() is not None:
            return
        if done.result()["type"] == "http.disconnect":
            gone()
        else:  # not a disconnect (none is expected): keep watching
            watch()

    def unwatch() -> None:
        nonlocal armed
        armed = False
        if watcher is not None:
            watcher.cancel()

    watch()
    return unwatch
