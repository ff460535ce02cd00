"""The sticky router: an ASGI reverse proxy in front of the replicas.

Per request (see :mod:`mcpfleet.router.decisions` for the pure decisions):

* ``Mcp-Session-Id`` present: to the session's owner (cache, then Redis). An
  owner that is gone, unknown, or refuses the connection gets the spec's 404
  at once and the entry is dropped, so the client re-initializes.
* ``initialize``: to the serving replica with the fewest sessions (those in
  flight to it count, one answered without a session does not); the new
  session id is written to Redis before the response reaches the client, so
  any router can route the session's next request.
* everything else (modern era, sessionless): to any serving replica, chosen
  by power of two choices on requests in flight, with no Redis on the path.

A credential a replica refused under its principal's rate is refused by the
router itself, from memory, until the ``Retry-After`` the replica gave
(:mod:`~mcpfleet.router.refused`, docs/limits.md).

With ``--rehome-sessions`` (:mod:`~mcpfleet.router.rehome`, docs/rehome.md), a
session whose owner is gone is opened again on a live replica instead of the
404, unless work of the session was in flight when the owner went.

A request is first read whole and judged (:mod:`~mcpfleet.router.admission`:
routing needs the body, read within a size and a time bound); the response,
streams included, then passes through unbuffered
(:mod:`~mcpfleet.router.upstream`). A client that goes away tears down
the upstream request, and vice versa. Requests that no replica processed
(refused connection, a draining replica's 503) are resent to another replica;
nothing else is retried: a request that may have reached a replica gets a
502 marked ``X-Mcpfleet-Router-Error`` (a session's: the spec's 404 when its
owner then refuses connections).

Shutdown (SIGTERM, after the Pod's preStop pause): for ``drain_linger`` seconds
the router still serves, but every response carries ``Connection: close`` and
/readyz answers 503, so each client's keep-alive connection is closed by the
router right after an answer (the client's next request opens a connection to
another router); then uvicorn's graceful shutdown lets what is in flight finish
(``graceful_timeout``). Without the linger, a request a client sent on an idle
pooled connection could meet that connection's close and be lost unanswered.
The process around the router (uvicorn and its signals) is
:mod:`~mcpfleet.router.serve`.

:class:`Router` decides and keeps the books (in flight, sessions, latency,
outcomes); a request travels through it as one
:class:`~mcpfleet.router.exchange.Exchange`; it forwards through
:class:`~mcpfleet.router.upstream.Upstream`, and hands a session whose owner is
gone to its :class:`~mcpfleet.router.rehome.Rehomer`.
"""

from __future__ import annotations

import asyncio
import enum
import gc
import json
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from starlette.types import Message, Receive, Scope, Send

from mcpfleet import tracing
from mcpfleet.config import RouterConfig
from mcpfleet.contract import DRAINING_HEADER, MCP_PATH, SESSION_HEADER, RedisKeys
from mcpfleet.httpio import ErrorCode, jsonrpc_error
from mcpfleet.jsonbody import parses_as_json
from mcpfleet.limits import Held
from mcpfleet.redisconn import check_version, follow_master, parse_url, redact_url
from mcpfleet.registry import connect
from mcpfleet.router.admission import ClientGone, Rejection, admit
from mcpfleet.router.decisions import (
    Candidate,
    OriginPolicy,
    RouteKind,
    cancellations,
    classify,
    era_of,
    pick_stateless,
    place_session,
    valid_session_id,
)
from mcpfleet.router.exchange import (
    Exchange,
    RequestOutcome,
    outcome_of,
    outcome_unknown,
    respond,
    retry_later,
    session_not_found,
)
from mcpfleet.router.h1 import Response
from mcpfleet.router.health import Health, RedisDown
from mcpfleet.router.http import WATCH_DISCONNECT
from mcpfleet.router.metrics import RouterMetrics
from mcpfleet.router.refused import RefusedCredentials, refuse
from mcpfleet.router.rehome import (
    OwnerGone,
    Rehomer,
    client_session_line,
    swap_session,
)
from mcpfleet.router.replicas import Placement, ReplicaView
from mcpfleet.router.route import SessionRoute
from mcpfleet.router.table import LookupSource, SessionTable
from mcpfleet.router.upstream import Dropped, Failure, Upstream, session_ended

log = logging.getLogger("mcpfleet.router")
_T = TypeVar("_T")

#: Seconds a new session waits for a place where only ``initialize`` requests in
#: flight fill every replica's ``--session-cap`` (a refused one gives its place back).
PLACE_WAIT = 1.0

#: The paths the router names as ``http.route`` in its spans (any other: none).
_ROUTES = frozenset({MCP_PATH})


class Route(enum.StrEnum):
    """The ``route`` label: a :class:`RouteKind`, or ``invalid`` for a request never routed."""

    INVALID = "invalid"


class Router:
    """The ASGI application. Start it under uvicorn with ``lifespan='on'``."""

    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.keys = RedisKeys(config.fleet, cluster=parse_url(config.redis_url).cluster)
        self.health = Health()
        self.redis = connect(
            config.redis_url,
            config.redis_files,
            pool_size=config.redis_pool_size,
            pool_wait=config.redis_pool_wait,
        )
        self.view = ReplicaView(
            self.redis,
            self.keys,
            self.health,
            absent_limit=config.owner_absent_limit,
            deadline=config.redis_deadline,
        )
        self.sessions = SessionTable(
            self.redis,
            self.keys,
            self.health,
            ttl=config.session_ttl,
            deadline=config.redis_deadline,
            failover_wait=config.redis_failover_wait,
            negative_ttl=config.unknown_session_ttl,
        )
        self.sessions.rehome = config.rehome_sessions
        self.metrics = RouterMetrics()
        self.origin_policy = OriginPolicy.for_bind(
            config.host, config.allowed_hosts, config.allowed_origins
        )
        # Tracing: the client's traceparent is replaced by the router's span's.
        self.upstream = Upstream(config.connect_timeout, own_traceparent=tracing.ON)
        #: Credentials a replica refused under a rate, refused here until their time.
        self.refused = RefusedCredentials()
        #: What becomes of a session whose owner is gone (the 404, or a move).
        self.rehomer = Rehomer(
            config, self.sessions, self.view, self.upstream, self.metrics, self.health
        )
        self._tasks: list[asyncio.Task[None]] = []
        #: ``notifications/cancelled`` on their way to replicas.
        self._notices: set[asyncio.Future[None]] = set()
        #: Set at SIGTERM: answers close their connections, /readyz says 503.
        self.closing = False
        #: Whether startup moves every object alive by then out of the cyclic
        #: collector's sight (``gc.freeze``): set for the router process.
        self.freeze_gc = False
        #: The loop the router serves on (set at startup).
        self.loop: asyncio.AbstractEventLoop | None = None

    # --- lifecycle -------------------------------------------------------------------

    async def startup(self) -> None:
        self.loop = asyncio.get_running_loop()
        await check_version(self.redis, self.config.redis_deadline)
        await self.upstream.start()
        await self.view.refresh()
        log.info(
            "router for fleet %s, Redis %s: %d replica(s) known%s",
            self.config.fleet,
            redact_url(self.config.redis_url),
            len(self.view.replicas),
            " (degraded: Redis unreachable)" if self.health.degraded else "",
        )
        self._tasks.append(asyncio.create_task(self._refresh_loop(), name="replica-view"))
        if self.freeze_gc:
            # Everything alive now (modules, classes, the clients) lives as long as
            # the process: out of the collector's sight, a full collection no longer
            # walks ~120,000 objects (over 100 ms, a pause every request waits out).
            gc.freeze()

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.refresh_interval)
            was_degraded = self.health.degraded
            moved = await self._follow_master()
            await self.view.refresh()
            self.metrics.degraded.set(1 if self.health.degraded else 0)
            self.metrics.observe_view(
                {n: a.state for n, a in self.view.replicas.items()},
                {n: a.sessions for n, a in self.view.replicas.items()},
            )
            if (was_degraded or moved or self.sessions.unsaved) and not self.health.degraded:
                # Redis may have restarted empty, or failed over without the
                # latest writes: put back what this router knows.
                await self.sessions.republish()

    async def _follow_master(self) -> bool:
        """Through Sentinel or on a cluster: True when a master moved (the new one may
        lack routes)."""
        try:
            moved = await follow_master(self.redis)
        except RedisDown:
            return False  # the refresh that follows tells whether Redis is down
        if moved:
            log.warning("a Redis master moved (a failover): writing back known sessions")
        return moved

    async def shutdown(self) -> None:
        for task in [*self._tasks, *self._notices]:
            task.cancel()
        await asyncio.gather(*self._tasks, *self._notices, return_exceptions=True)
        await self.upstream.close()
        await self.redis.aclose()

    # --- ASGI ------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def status(self) -> dict[str, Any]:
        return {
            "closing": self.closing,
            "degraded": self.health.degraded,
            "replicas": {n: a.state for n, a in sorted(self.view.replicas.items())},
            "serving": len(self.view.serving()),
        }

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.closing:
            send = _closing_connection(send)
        path: str = scope["path"]
        if path == "/healthz":
            await respond(send, 200, json.dumps({"status": "alive"}).encode())
            return
        if path == "/readyz":
            # Degraded (Redis down) is still ready: cached sessions and stateless
            # traffic keep flowing. Not ready only when no replica serves.
            status = self.status()
            ready = status["serving"] and not self.closing
            await respond(send, 200 if ready else 503, json.dumps(status).encode())
            return
        if path == "/metrics":
            body, content_type = self.metrics.render_for(_accept(scope))
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", content_type.encode())],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        started = time.perf_counter()
        if tracing.ON:
            route, outcome = await self._traced(scope, receive, send, started)
        else:
            route, outcome = await self._route(scope, receive, send, started)
        self.metrics.request_done(route, outcome)

    async def _traced(
        self, scope: Scope, receive: Receive, send: Send, started: float
    ) -> tuple[str, RequestOutcome | Failure]:
        """:meth:`_route` in the request's SERVER span (tracing on): the client's trace
        continued, the routing decision and the outcome as its attributes."""
        route_name = tracing.http_route(scope["path"], _ROUTES)
        with tracing.server_span(scope, route_name) as span:
            recording, status = tracing.status_recorder(send)
            route, outcome = await self._route(scope, receive, recording, started)
            span.set_attribute("mcpfleet.route", route)
            span.set_attribute("mcpfleet.outcome", outcome.value)
            failed = outcome.value if isinstance(outcome, Failure) else None
            if status and status[0] == 429:
                # A replica refused it under a limit per principal (its span says which).
                span.set_attribute("mcpfleet.limited", True)
            tracing.end_http(span, status[0] if status else None, failed)
        return route, outcome

    async def _route(
        self, scope: Scope, receive: Receive, send: Send, started: float
    ) -> tuple[str, RequestOutcome | Failure]:
        """Handle one proxied request; returns (route kind, outcome) for the metrics."""
        try:
            x = await admit(scope, receive, send, started, self.config, self.origin_policy)
        except ClientGone:
            return Route.INVALID, Failure.DISCONNECTED
        if isinstance(x, Rejection):
            await respond(send, x.status, jsonrpc_error(x.code, x.message))
            return Route.INVALID, RequestOutcome.REJECTED
        method: str = scope["method"]
        kind = classify(method, x.headers, x.body)
        if tracing.ON:
            era = era_of(kind, x.headers)
            if era is not None:
                tracing.note("mcpfleet.era", era)
        if kind is not RouteKind.STICKY and method == "POST" and not parses_as_json(x.body):
            # Answered here: a replica would open (and leak) a session for it.
            await respond(
                send, 400, jsonrpc_error(ErrorCode.PARSE_ERROR, "Parse error: the body is not JSON")
            )
            return kind.value, RequestOutcome.REJECTED
        if self.refused.memory and (held := self.refused.held(x)) is not None:
            # A replica refused this credential under its rate: until then, refused here.
            await refuse(x, held)
            return kind.value, RequestOutcome.LIMITED
        if kind is RouteKind.STICKY:
            outcome = await self._sticky(x)
        else:
            outcome = await self._spread(x, kind)
        return kind.value, outcome

    async def _sticky(self, x: Exchange) -> RequestOutcome | Failure:
        session = x.session
        assert session is not None  # (the request carries Mcp-Session-Id: STICKY)
        if not valid_session_id(session):
            await respond(
                x.send,
                400,
                jsonrpc_error(ErrorCode.INVALID_REQUEST, "Bad Request: malformed Mcp-Session-Id"),
            )
            return RequestOutcome.REJECTED
        route, source = await self.sessions.lookup(session)
        self.metrics.lookups.labels(source).inc()
        if tracing.ON:
            tracing.note("mcpfleet.session.lookup", source.value)
        if route is None:
            if source is LookupSource.BUSY:
                # A burst holds every Redis connection: the session may exist.
                await retry_later(x.send, 503, ErrorCode.SERVER_ERROR, "Router busy; retry")
                return RequestOutcome.UNAVAILABLE
            if source is LookupSource.UNKNOWN:
                # Redis cannot say whether the session exists: a 404 could end a live one.
                await retry_later(
                    x.send, 503, ErrorCode.SERVER_ERROR, "Session directory unavailable; retry"
                )
                return RequestOutcome.UNAVAILABLE
            await session_not_found(x.send)
            return RequestOutcome.CLIENT_ERROR
        return await self._to_route(x, route)

    async def _to_route(
        self, x: Exchange, route: SessionRoute, rehomed: bool = False
    ) -> RequestOutcome | Failure:
        """Forward a session's request along its ``route``; an owner found gone is
        the :class:`~mcpfleet.router.rehome.Rehomer`'s (:meth:`_gone`).
        ``rehomed``: the route was just made; an owner gone again is a 503."""
        session = x.session
        assert session is not None  # (a sticky exchange's)
        owner, upstream_id = route.owner, route.upstream_id
        address = await self.view.locate(owner)
        if address is None:
            # Known dead, or absent from the registry for long: it left.
            return await self._gone(x, route, OwnerGone.DEREGISTERED, rehomed)
        alias: tuple[bytes, bytes] | None = None
        forwarded = x
        if upstream_id is not None:
            # The owner knows the session by its own id; answers carry the client's.
            forwarded = x.with_headers(swap_session(x.scope["headers"], session, upstream_id))
            alias = (upstream_id.encode("latin-1"), session.encode("latin-1"))
        # Only a re-homing router reads the count (a session busy here is not moved).
        method: str = x.scope["method"]
        counted = self.config.rehome_sessions and method == "POST"
        if counted:
            self.rehomer.enter(session)
        try:
            outcome = await self._forward(forwarded, RouteKind.STICKY, owner, address, alias)
            if counted and cancellations(x.body):
                # Marked lost (if it may have been cut with its owner) while the
                # request still counts in flight here.
                await self.rehomer.ended(session, owner, address, outcome)
        finally:
            if counted:
                self.rehomer.leave(session)
        if outcome is Failure.REFUSED:
            self.view.drop_dead(owner)
            return await self._gone(x, route, OwnerGone.REFUSED, rehomed)
        if outcome is Failure.TIMEOUT:
            # Overloaded, or unreachable: not proof of death. The client may retry.
            await retry_later(
                x.send, 503, ErrorCode.SERVER_ERROR, "Session owner unavailable; retry"
            )
            return RequestOutcome.UNAVAILABLE
        if outcome is Failure.DRAINING:
            # Only a replica that no longer knows the session (or, draining with
            # the handover, hands it over) answers this way.
            return await self._gone(x, route, OwnerGone.UNKNOWN_TO_OWNER, rehomed)
        if outcome is Failure.DROPPED:
            # The owner may have run the request, so it goes nowhere else. An owner
            # that no longer takes connections died with the session: the spec's 404.
            if not await self.upstream.accepts(address):
                self.view.drop_dead(owner)
                return await self._gone(x, route, OwnerGone.DIED, rehomed)
            await outcome_unknown(x.send, owner)
            return Failure.DROPPED
        if method == "DELETE" and isinstance(outcome, int) and outcome < 300:
            # Only the session's own credential can end it (anyone else gets a 404).
            await self.sessions.drop(session)
        return outcome_of(outcome)

    async def _gone(
        self, x: Exchange, route: SessionRoute, cause: OwnerGone, rehomed: bool
    ) -> RequestOutcome | Failure:
        """The owner on ``route`` is gone: the 404, or, re-homing, on to the new route."""
        if tracing.ON:
            tracing.note("mcpfleet.owner_gone", cause.value)
        moved = await self.rehomer.gone(x, route, cause, rehomed)
        if isinstance(moved, RequestOutcome):
            return moved
        if tracing.ON:
            tracing.note("mcpfleet.rehomed", True)
        # The client's own headers go along (its session id swapped by _to_route).
        return await self._to_route(x, moved, True)

    async def _spread(self, x: Exchange, kind: RouteKind) -> RequestOutcome | Failure:
        tried: set[str] = set()
        for _ in range(self.config.attempts):
            if kind is RouteKind.INITIALIZE:
                placed = await self._placement(x, tried)
                if isinstance(placed, Held):
                    await refuse(x, placed)
                    return RequestOutcome.LIMITED
                choice = placed
            else:
                choice = pick_stateless(self.view.serving(exclude=tried))
            if choice is None:
                break
            tried.add(choice.name)
            replica = self.view.get(choice.name)
            if replica is None:
                continue
            # An initialize holds a place on the replica until its answer.
            place = self.view.placing(replica.name) if kind is RouteKind.INITIALIZE else None
            try:
                outcome = await self._forward(x, kind, replica.name, replica.address, place=place)
            finally:
                if place is not None:
                    place.close()
            if isinstance(outcome, Failure) and outcome.nothing_processed:
                if outcome is Failure.REFUSED and await self.view.after_refusal(
                    replica.name, replica.address
                ):
                    tried.discard(replica.name)  # restarted elsewhere: it may take it
                self.metrics.retries.labels(outcome.value).inc()
                if tracing.ON:
                    _note_resend(len(tried), outcome)
                continue
            if outcome is Failure.DROPPED:
                await outcome_unknown(x.send, replica.name)
            return outcome_of(outcome)
        full = (
            kind is RouteKind.INITIALIZE
            and self.config.session_cap is not None
            and bool(self.view.serving())
        )
        message = "All replicas are at their session cap" if full else "No serving replica"
        await retry_later(x.send, 503, ErrorCode.SERVER_ERROR, message)
        return RequestOutcome.NO_REPLICA

    async def _placement(self, x: Exchange, tried: set[str]) -> Candidate | Held | None:
        """The replica for the new session of ``x`` (None: every one is full).

        Where only ``initialize`` requests in flight fill the cap, it waits (at most
        :data:`PLACE_WAIT` seconds) for one to be answered: a refused one gives its
        place back at once, and a credential a replica refused meanwhile is refused
        here from memory (the :class:`Held` returned) rather than waiting on.
        """
        cap = self.config.session_cap
        deadline: float | None = None
        while True:
            candidates = self.view.serving(exclude=tried)
            choice = place_session(candidates, cap)
            if choice is not None or not self.view.opening_to(candidates):
                return choice
            now = time.monotonic()
            deadline = now + PLACE_WAIT if deadline is None else deadline
            if now >= deadline:
                return None
            await self.view.place_freed(deadline - now)
            if self.refused.memory and (held := self.refused.held(x)) is not None:
                return held

    async def _forward(
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
            self._notices.add(task)
            task.add_done_callback(self._notices.discard)


def _accept(scope: Scope) -> str:
    """The request's ``Accept`` header ("" without one)."""
    for name, value in scope["headers"]:
        if name == b"accept":
            return str(value.decode("latin-1"))
    return ""


def _note_resend(attempts: int, why: Failure) -> None:
    """A request sent again to another replica: how many times so far, and why."""
    tracing.note("mcpfleet.resend.count", attempts)
    tracing.note("mcpfleet.resend.reason", why.value)


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

    Served by the router's own HTTP protocol (:mod:`mcpfleet.router.http`), the
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


_CLOSE = (b"connection", b"close")


def _closing_connection(send: Send) -> Send:
    """``send`` with ``Connection: close`` added to the response's headers (uvicorn
    then closes the connection once the response is complete)."""

    async def closing(message: Any) -> None:
        if message["type"] == "http.response.start":
            headers = [h for h in message.get("headers", []) if h[0].lower() != b"connection"]
            message = {**message, "headers": [*headers, _CLOSE]}
        await send(message)

    return closing
