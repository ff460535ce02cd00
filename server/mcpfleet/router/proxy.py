"""The sticky router: an ASGI reverse proxy in front of the replicas.

Per request (see :mod:`mcpfleet.router.decisions` for the pure decisions):

* ``Mcp-Session-Id`` present: to the session's owner (cache, then Redis). An
  owner that is gone, unknown, or refuses the connection gets the spec's 404
  at once and the entry is dropped, so the client re-initializes.
* ``initialize``: to the serving replica with the fewest sessions; the new
  session id is written to Redis before the response reaches the client, so
  any router can route the session's next request.
* everything else (modern era, sessionless): to any serving replica, chosen
  by power of two choices on requests in flight, with no Redis on the path.

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

:class:`Router` decides and keeps the books (in flight, sessions, latency,
outcomes); it forwards through :class:`~mcpfleet.router.upstream.Upstream`.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import gc
import json
import logging
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import uvicorn
from starlette.types import Message, Receive, Scope, Send

from mcpfleet.config import RouterConfig
from mcpfleet.contract import (
    DRAINING_HEADER,
    PRINCIPAL_HEADER,
    REHOME_HEADER,
    ROUTER_ERROR_HEADER,
    SESSION_HEADER,
    RedisKeys,
)
from mcpfleet.httpio import ErrorCode, jsonrpc_error, send_whole
from mcpfleet.redisconn import check_version, follow_master, redact_url
from mcpfleet.registry import connect
from mcpfleet.router.admission import ClientGone, Rejection, admit
from mcpfleet.router.decisions import (
    OriginPolicy,
    RouteKind,
    cancellations,
    classify,
    parses_as_json,
    pick_stateless,
    place_session,
    valid_session_id,
)
from mcpfleet.router.h1 import Broken, ConnectFailed, Response
from mcpfleet.router.http import WATCH_DISCONNECT
from mcpfleet.router.metrics import RouterMetrics
from mcpfleet.router.rehome import (
    InitRecord,
    Lost,
    answers_gone_work,
    client_session_line,
    close_session,
    initialize_params,
    join_route,
    reopen,
    split_route,
    swap_session,
)
from mcpfleet.router.table import (
    Health,
    LookupSource,
    RedisDown,
    ReplicaView,
    SessionTable,
)
from mcpfleet.router.upstream import Dropped, Failure, Upstream, session_ended
from mcpfleet.sigterm import SigtermFirstServer

log = logging.getLogger("mcpfleet.router")
_T = TypeVar("_T")


class RequestOutcome(enum.StrEnum):
    """How the router ended a request: the ``outcome`` label of ``mcpfleet_router_requests_total``.

    A :class:`Failure` of the last forward attempt is an outcome too.
    """

    OK = "ok"  # relayed a 1xx-3xx answer
    CLIENT_ERROR = "client_error"  # relayed (or, for an unknown session, made) a 4xx
    UPSTREAM_ERROR = "upstream_error"  # relayed a 5xx
    REJECTED = "rejected"  # refused by the router: bad or hostile input
    OWNER_GONE = "owner_gone"  # the session's owner is gone: the spec's 404
    UNAVAILABLE = "unavailable"  # the owner or the session directory cannot answer now
    NO_REPLICA = "no_replica"  # no serving replica (or all at their session cap)


class OwnerGone(enum.StrEnum):
    """Why a session's owner counts as gone: the ``reason`` of ``owner_gone_total``."""

    DEREGISTERED = "deregistered"  # known dead, or absent from the registry too long
    REFUSED = "refused"  # its address refused the connection
    UNKNOWN_TO_OWNER = "unknown_to_owner"  # it answered that it no longer has the session
    DIED = "died"  # it dropped a request mid-way and then refused connections


class Route(enum.StrEnum):
    """The ``route`` label: a :class:`RouteKind`, or ``invalid`` for a request never routed."""

    INVALID = "invalid"


_ROUTER_ERROR = (ROUTER_ERROR_HEADER.lower().encode(), b"1")


async def _respond(
    send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    """An answer the router made itself: marked so, never mistaken for a replica's."""
    await send_whole(send, status, body, headers=[_ROUTER_ERROR, *(extra or [])])


async def _retry_later(send: Send, status: int, code: int, message: str) -> None:
    """A JSON-RPC error the client may retry in a second (503 or 502 with Retry-After)."""
    await _respond(send, status, jsonrpc_error(code, message), [(b"retry-after", b"1")])


async def _outcome_unknown(send: Send, replica: str) -> None:
    """The 502 for a request a replica may have run: no Retry-After, it is not a hint
    that sending it again is safe (a once-flow's replay is; a plain tool's may not be)."""
    message = (
        f"Replica {replica} dropped the connection before answering: "
        "the request may have run; it was not sent again"
    )
    await _respond(send, 502, jsonrpc_error(ErrorCode.INTERNAL_ERROR, message))


class Router:
    """The ASGI application. Start it under uvicorn with ``lifespan='on'``."""

    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.keys = RedisKeys(config.fleet)
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
        #: Requests (POST) in flight per session on this router, counted when
        #: re-homing: a session with one when its owner went is not re-homed.
        self._busy: dict[str, int] = {}
        #: Re-homes this router runs now, by session: the new route, or None.
        self._moving: dict[str, asyncio.Future[str | None]] = {}
        self.metrics = RouterMetrics()
        self.origin_policy = OriginPolicy.for_bind(
            config.host, config.allowed_hosts, config.allowed_origins
        )
        self.upstream = Upstream(config.connect_timeout)
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
        """Through Sentinel: True when the master moved (the new one may lack routes)."""
        try:
            moved = await follow_master(self.redis)
        except RedisDown:
            return False  # the refresh that follows tells whether Redis is down
        if moved:
            log.warning("Redis master moved (Sentinel failover): writing back known sessions")
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
            await _respond(send, 200, json.dumps({"status": "alive"}).encode())
            return
        if path == "/readyz":
            # Degraded (Redis down) is still ready: cached sessions and stateless
            # traffic keep flowing. Not ready only when no replica serves.
            status = self.status()
            ready = status["serving"] and not self.closing
            await _respond(send, 200 if ready else 503, json.dumps(status).encode())
            return
        if path == "/metrics":
            body = self.metrics.render()
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", self.metrics.content_type.encode())],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        started = time.perf_counter()
        route, outcome = await self._route(scope, receive, send, started)
        self.metrics.request_done(route, outcome)

    async def _route(
        self, scope: Scope, receive: Receive, send: Send, started: float
    ) -> tuple[str, RequestOutcome | Failure]:
        """Handle one proxied request; returns (route kind, outcome) for the metrics."""
        try:
            admitted = await admit(scope, receive, self.config, self.origin_policy)
        except ClientGone:
            return Route.INVALID, Failure.DISCONNECTED
        if isinstance(admitted, Rejection):
            await _respond(send, admitted.status, jsonrpc_error(admitted.code, admitted.message))
            return Route.INVALID, RequestOutcome.REJECTED
        headers, body = admitted.headers, admitted.body
        method: str = scope["method"]
        kind = classify(method, headers, body)
        if kind is not RouteKind.STICKY and method == "POST" and not parses_as_json(body):
            # Answered here: a replica would open (and leak) a session for it.
            await _respond(
                send, 400, jsonrpc_error(ErrorCode.PARSE_ERROR, "Parse error: the body is not JSON")
            )
            return kind.value, RequestOutcome.REJECTED
        if kind is RouteKind.STICKY:
            outcome = await self._sticky(
                scope, receive, send, headers[SESSION_HEADER.lower()], body, started
            )
        else:
            outcome = await self._spread(scope, receive, send, kind, body, started)
        return kind.value, outcome

    async def _sticky(
        self, scope: Scope, receive: Receive, send: Send, session: str, body: bytes, started: float
    ) -> RequestOutcome | Failure:
        if not valid_session_id(session):
            await _respond(
                send,
                400,
                jsonrpc_error(ErrorCode.INVALID_REQUEST, "Bad Request: malformed Mcp-Session-Id"),
            )
            return RequestOutcome.REJECTED
        route, source = await self.sessions.lookup(session)
        self.metrics.lookups.labels(source).inc()
        if route is None:
            if source is LookupSource.BUSY:
                # A burst holds every Redis connection: the session may exist.
                await _retry_later(send, 503, ErrorCode.SERVER_ERROR, "Router busy; retry")
                return RequestOutcome.UNAVAILABLE
            if source is LookupSource.UNKNOWN:
                # Redis cannot say whether the session exists: a 404 could end a live one.
                await _retry_later(
                    send, 503, ErrorCode.SERVER_ERROR, "Session directory unavailable; retry"
                )
                return RequestOutcome.UNAVAILABLE
            await _respond(send, 404, jsonrpc_error(ErrorCode.INVALID_REQUEST, "Session not found"))
            return RequestOutcome.CLIENT_ERROR
        return await self._to_route(scope, receive, send, session, route, body, started)

    async def _to_route(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        session: str,
        route: str,
        body: bytes,
        started: float,
        rehomed: bool = False,
    ) -> RequestOutcome | Failure:
        """Forward a session's request along its ``route``; an owner found gone
        ends the session (the 404), or, re-homing, moves it (:meth:`_gone`).
        ``rehomed``: the route was just made; an owner gone again is a 503."""
        owner, upstream_session = split_route(route)
        address = await self.view.locate(owner)
        if address is None:
            # Known dead, or absent from the registry for long: it left.
            return await self._gone(
                scope, receive, send, session, route, body, started, OwnerGone.DEREGISTERED, rehomed
            )
        alias: tuple[bytes, bytes] | None = None
        forwarded = scope
        if upstream_session is not None:
            # The owner knows the session by its own id; answers carry the client's.
            headers = swap_session(scope["headers"], session, upstream_session)
            forwarded = {**scope, "headers": headers}
            alias = (upstream_session.encode("latin-1"), session.encode("latin-1"))
        # Only a re-homing router reads the count (a session busy here is not moved).
        counted = self.config.rehome_sessions and scope["method"] == "POST"
        if counted:
            self._busy[session] = self._busy.get(session, 0) + 1
        try:
            outcome = await self._forward(
                forwarded,
                receive,
                send,
                RouteKind.STICKY,
                owner,
                address,
                body,
                started,
                session,
                alias,
            )
            if counted and cancellations(body) and await self._cut(owner, address, outcome):
                # Its owner may have gone while the request ran: whichever router
                # the client turns to next must not re-home the session (its work
                # is gone). Marked while the request still counts in flight here,
                # so this router never re-homes it in between.
                await self.sessions.mark_lost(session, Lost.REQUEST_BROKE)
        finally:
            if counted:
                left = self._busy[session] - 1
                if left:
                    self._busy[session] = left
                else:
                    del self._busy[session]
        if outcome is Failure.REFUSED:
            self.view.drop_dead(owner)
            return await self._gone(
                scope, receive, send, session, route, body, started, OwnerGone.REFUSED, rehomed
            )
        if outcome is Failure.TIMEOUT:
            # Overloaded, or unreachable: not proof of death. The client may retry.
            await _retry_later(
                send, 503, ErrorCode.SERVER_ERROR, "Session owner unavailable; retry"
            )
            return RequestOutcome.UNAVAILABLE
        if outcome is Failure.DRAINING:
            # Only a replica that no longer knows the session (or, draining with
            # the handover, hands it over) answers this way.
            return await self._gone(
                scope,
                receive,
                send,
                session,
                route,
                body,
                started,
                OwnerGone.UNKNOWN_TO_OWNER,
                rehomed,
            )
        if outcome is Failure.DROPPED:
            # The owner may have run the request, so it goes nowhere else. An owner
            # that no longer takes connections died with the session: the spec's 404.
            if not await self.upstream.accepts(address):
                self.view.drop_dead(owner)
                if self.config.rehome_sessions and scope["method"] == "GET":
                    # A stream's opening request has no effect to repeat.
                    return await self._gone(
                        scope,
                        receive,
                        send,
                        session,
                        route,
                        body,
                        started,
                        OwnerGone.DIED,
                        rehomed,
                    )
                if self.config.rehome_sessions:
                    return await self._lose(send, session, owner, Lost.REQUEST_BROKE)
                return await self._owner_gone(send, session, owner, OwnerGone.DIED)
            await _outcome_unknown(send, owner)
            return Failure.DROPPED
        if scope["method"] == "DELETE" and isinstance(outcome, int) and outcome < 300:
            # Only the session's own credential can end it (anyone else gets a 404).
            await self.sessions.drop(session)
        return _outcome(outcome)

    async def _cut(self, owner: str, address: str, outcome: int | Failure) -> bool:
        """Whether a session's request that ended so may have been cut short with its owner.

        A broken or dropped answer may: it counts at once, whether or not the
        owner lives on (the mark matters only once the owner is gone, and a
        SIGKILLed owner's port may still take a connection for an instant). So
        may any end on a draining owner whose port then no longer takes
        connections: its shutdown may end a running request's stream cleanly.
        """
        if outcome in (Failure.UPSTREAM_BROKE, Failure.DROPPED):
            return True
        att = self.view.get(owner)
        if not isinstance(outcome, int) or att is None or att.state != "draining":
            return False
        return not await self.upstream.accepts(address)

    async def _gone(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        session: str,
        route: str,
        body: bytes,
        started: float,
        cause: OwnerGone,
        rehomed: bool,
    ) -> RequestOutcome | Failure:
        """The owner of ``session`` is gone: the 404, or, re-homing, a move."""
        owner = split_route(route)[0]
        if not self.config.rehome_sessions or scope["method"] == "DELETE":
            return await self._owner_gone(send, session, owner, cause)
        if rehomed:
            # The replica just chosen went at once: the session stays re-homable.
            await _retry_later(
                send, 503, ErrorCode.SERVER_ERROR, "Session owner unavailable; retry"
            )
            return RequestOutcome.UNAVAILABLE
        if self._busy.get(session):
            return await self._lose(send, session, owner, Lost.IN_FLIGHT)
        if scope["method"] == "POST" and answers_gone_work(body):
            return await self._lose(send, session, owner, Lost.ANSWER_ORPHANED)
        moved = await self._move(scope, send, session, route, cause)
        if moved is None or isinstance(moved, (RequestOutcome, Failure)):
            return moved or RequestOutcome.UNAVAILABLE
        # The client's own headers go along (its session id swapped by _to_route).
        return await self._to_route(scope, receive, send, session, moved, body, started, True)

    async def _move(
        self, scope: Scope, send: Send, session: str, route: str, cause: OwnerGone
    ) -> str | RequestOutcome | Failure | None:
        """Re-home ``session``: its new route, or the outcome of the answer sent instead.

        Concurrent requests of the session on this router share one re-home;
        across routers, one claim in Redis lets one router move it while the
        others wait for the new route (each wait bounded by ``rehome_timeout``).
        """
        for _ in range(self.config.attempts):
            pending = self._moving.get(session)
            if pending is None:
                break
            try:
                moved = await asyncio.wait_for(asyncio.shield(pending), self.config.rehome_timeout)
            except TimeoutError:
                await _retry_later(send, 503, ErrorCode.SERVER_ERROR, "Session moving; retry")
                return RequestOutcome.UNAVAILABLE
            if moved is not None:
                return moved
            # The other request's re-home failed (its credential, say): try with ours.
        else:
            await _retry_later(send, 503, ErrorCode.SERVER_ERROR, "Session moving; retry")
            return RequestOutcome.UNAVAILABLE
        future: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self._moving[session] = future
        result: str | RequestOutcome | Failure | None = None
        try:
            result = await self._lead_move(scope, send, session, route, cause)
            return result
        finally:
            del self._moving[session]
            future.set_result(result if isinstance(result, str) else None)

    async def _lead_move(
        self, scope: Scope, send: Send, session: str, route: str, cause: OwnerGone
    ) -> str | RequestOutcome | Failure:
        owner = split_route(route)[0]
        try:
            current_route, init_raw, lost_raw = await self.sessions.rehome_state(session)
        except RedisDown as exc:
            self.health.fail(exc)
            await _retry_later(
                send, 503, ErrorCode.SERVER_ERROR, "Session directory unavailable; retry"
            )
            return RequestOutcome.UNAVAILABLE
        if lost_raw is not None:
            reason = lost_raw.decode() if isinstance(lost_raw, bytes) else str(lost_raw)
            return await self._lose(
                send, session, owner, Lost(reason) if reason in set(Lost) else Lost.REQUEST_BROKE
            )
        if current_route is None:
            # Ended meanwhile (a DELETE, an expiry): the session is unknown.
            await self.sessions.drop(session)
            await _respond(send, 404, jsonrpc_error(ErrorCode.INVALID_REQUEST, "Session not found"))
            return RequestOutcome.OWNER_GONE
        if current_route != route:
            # Another router moved it already (this router's cache was stale).
            self.sessions.remember(session, current_route)
            return current_route
        record = InitRecord.from_json(init_raw)
        if record is None:
            # Not re-homable (opened before the mode, the app opted out, too large).
            return await self._owner_gone(send, session, owner, cause)
        try:
            claimed = await self.sessions.claim_move(session, self.config.rehome_timeout)
        except RedisDown as exc:
            self.health.fail(exc)
            await _retry_later(
                send, 503, ErrorCode.SERVER_ERROR, "Session directory unavailable; retry"
            )
            return RequestOutcome.UNAVAILABLE
        if not claimed:
            return await self._await_move(send, session, route)
        released = False

        async def release() -> None:
            nonlocal released
            if not released:
                released = True
                await self.sessions.release_move(session)

        async def send_released(message: Message) -> None:
            # The claim goes before any answer: the client's next request must
            # find the session free to re-home, not held by this one.
            if message["type"] == "http.response.start":
                await release()
            await send(message)

        moved = False
        try:
            async with asyncio.timeout(self.config.rehome_timeout):
                result = await self._reopen(scope, send_released, session, owner, record, cause)
            moved = isinstance(result, str)  # the move released the claim
            return result
        except TimeoutError:
            log.warning("re-home of a session of %s timed out", owner)
            await _retry_later(
                send_released, 503, ErrorCode.SERVER_ERROR, "Session re-home timed out; retry"
            )
            return RequestOutcome.UNAVAILABLE
        finally:
            if not moved:
                await release()

    async def _await_move(self, send: Send, session: str, route: str) -> str | RequestOutcome:
        """Another router holds the session's move: its new route once written
        (read every 50 ms, for at most ``rehome_timeout``), else a 503 to retry."""
        deadline = time.monotonic() + self.config.rehome_timeout
        while time.monotonic() < deadline:
            try:
                current = await self.sessions.route(session)
            except RedisDown as exc:
                self.health.fail(exc)
                break
            if current is None:
                await _respond(
                    send, 404, jsonrpc_error(ErrorCode.INVALID_REQUEST, "Session not found")
                )
                return RequestOutcome.OWNER_GONE
            if current != route:
                self.sessions.remember(session, current)
                return current
            await asyncio.sleep(0.05)
        await _retry_later(send, 503, ErrorCode.SERVER_ERROR, "Session moving; retry")
        return RequestOutcome.UNAVAILABLE

    async def _reopen(
        self,
        scope: Scope,
        send: Send,
        session: str,
        owner: str,
        record: InitRecord,
        cause: OwnerGone,
    ) -> str | RequestOutcome | Failure:
        """Open the session again on a live replica (the claim is held): its new route."""
        tried = {owner}
        for _ in range(self.config.attempts):
            choice = place_session(self.view.serving(exclude=tried), self.config.session_cap)
            if choice is None:
                break
            tried.add(choice.name)
            replica = self.view.get(choice.name)
            if replica is None:
                continue
            self.view.note_placement(choice.name)
            try:
                reopened = await reopen(
                    self.upstream.pool, replica.address, scope["headers"], record
                )
            except ConnectFailed:
                if await self.view.after_refusal(replica.name, replica.address):
                    tried.discard(replica.name)  # restarted elsewhere: it may take it
                continue
            except (TimeoutError, Broken) as exc:
                # An initialize has no effect but a session, which idles out unused.
                log.info("re-home on %s failed: %s", replica.name, type(exc).__name__)
                continue
            if reopened.status in (401, 403):
                # The current credential does not open sessions: the client hears why.
                extra = [
                    (k, v)
                    for k, v in reopened.raw_headers
                    if k.lower() in (b"www-authenticate", b"content-type")
                ]
                await send_whole(send, reopened.status, reopened.body, headers=extra)
                return RequestOutcome.CLIENT_ERROR
            if reopened.status == 503:
                continue  # draining, or at its session limit: another replica
            if reopened.session is None:
                return await self._lose(send, session, owner, Lost.REFUSED)
            if not reopened.allowed or reopened.principal != record.principal:
                # Another principal's credential (or an app that no longer allows
                # it): the same 404 as an unknown session; the original is untouched.
                await self._close_quietly(replica.address, scope, reopened.session)
                if not reopened.allowed:
                    return await self._owner_gone(send, session, owner, cause)
                log.info("re-home refused: the credential is not the session owner's")
                await _respond(
                    send, 404, jsonrpc_error(ErrorCode.INVALID_REQUEST, "Session not found")
                )
                return RequestOutcome.OWNER_GONE
            try:
                lost = await self.sessions.lost(session)
                if lost is None:
                    new_route = join_route(replica.name, reopened.session)
                    await self.sessions.move(session, new_route)
            except RedisDown as exc:
                self.health.fail(exc)
                await self._close_quietly(replica.address, scope, reopened.session)
                await _retry_later(
                    send, 503, ErrorCode.SERVER_ERROR, "Session directory unavailable; retry"
                )
                return RequestOutcome.UNAVAILABLE
            if lost is not None:
                # A router marked it lost while this one re-opened it.
                await self._close_quietly(replica.address, scope, reopened.session)
                return await self._lose(send, session, owner, Lost.REQUEST_BROKE)
            self.metrics.rehomed.labels(cause).inc()
            log.info("session of %s re-homed on %s (%s)", owner, replica.name, cause)
            return new_route
        await _retry_later(send, 503, ErrorCode.SERVER_ERROR, "No serving replica")
        return RequestOutcome.NO_REPLICA

    async def _close_quietly(self, address: str, scope: Scope, upstream_session: str) -> None:
        """DELETE a session the router opened and will not use; failures only logged."""
        try:
            async with asyncio.timeout(self.config.connect_timeout + 1.0):
                await close_session(self.upstream.pool, address, scope["headers"], upstream_session)
        except (ConnectFailed, Broken, TimeoutError) as exc:
            log.info("unused re-home session not closed: %s", type(exc).__name__)

    async def _lose(self, send: Send, session: str, owner: str, reason: Lost) -> RequestOutcome:
        """The session had work in flight when its owner went (or cannot be opened
        again): it ends with the spec's 404, counted by reason."""
        log.info("session of %s ended, not re-homed: %s", owner, reason)
        self.metrics.lost.labels(reason).inc()
        await self.sessions.drop(session)
        await _respond(send, 404, jsonrpc_error(ErrorCode.INVALID_REQUEST, "Session not found"))
        return RequestOutcome.OWNER_GONE

    async def _owner_gone(
        self, send: Send, session: str, owner: str, reason: OwnerGone
    ) -> RequestOutcome:
        log.info("session of %s answered 404: owner %s", owner, reason)
        await self.sessions.drop(session)
        self.metrics.owner_gone.labels(reason).inc()
        await _respond(send, 404, jsonrpc_error(ErrorCode.INVALID_REQUEST, "Session not found"))
        return RequestOutcome.OWNER_GONE

    async def _spread(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        kind: RouteKind,
        body: bytes,
        started: float,
    ) -> RequestOutcome | Failure:
        tried: set[str] = set()
        for _ in range(self.config.attempts):
            candidates = self.view.serving(exclude=tried)
            if kind is RouteKind.INITIALIZE:
                choice = place_session(candidates, self.config.session_cap)
            else:
                choice = pick_stateless(candidates)
            if choice is None:
                break
            tried.add(choice.name)
            replica = self.view.get(choice.name)
            if replica is None:
                continue
            if kind is RouteKind.INITIALIZE:
                self.view.note_placement(choice.name)
            outcome = await self._forward(
                scope, receive, send, kind, replica.name, replica.address, body, started
            )
            if isinstance(outcome, Failure) and outcome.nothing_processed:
                if outcome is Failure.REFUSED and await self.view.after_refusal(
                    replica.name, replica.address
                ):
                    tried.discard(replica.name)  # restarted elsewhere: it may take it
                self.metrics.retries.labels(outcome.value).inc()
                continue
            if outcome is Failure.DROPPED:
                await _outcome_unknown(send, replica.name)
            return _outcome(outcome)
        full = (
            kind is RouteKind.INITIALIZE
            and self.config.session_cap is not None
            and bool(self.view.serving())
        )
        message = "All replicas are at their session cap" if full else "No serving replica"
        await _retry_later(send, 503, ErrorCode.SERVER_ERROR, message)
        return RequestOutcome.NO_REPLICA

    async def _forward(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        kind: RouteKind,
        name: str,
        address: str,
        body: bytes,
        started: float,
        session: str | None = None,
        alias: tuple[bytes, bytes] | None = None,
    ) -> int | Failure:
        """Forward one request to replica ``name`` through :attr:`upstream`.

        Around the forwarding itself: the request counts in flight while it
        runs, a new session is recorded and the latency observed once the
        replica's headers arrived, and ``session``'s route is forgotten when the
        replica marks its 404 as "no such session" (an unmarked 404 answers a
        credential that is not the session's: the session lives on). Returns
        the status relayed to the client, or the :class:`Failure` that stopped it.
        """
        self.view.inflight[name] = self.view.inflight.get(name, 0) + 1
        try:
            try:
                upstream = await _unless_client_leaves(
                    self.upstream.open(
                        scope,
                        name,
                        address,
                        body,
                        client_session_line(session) if alias and session else b"",
                    ),
                    scope,
                    receive,
                    self.loop or asyncio.get_running_loop(),
                )
            except Dropped:
                # The request may have been processed: never re-sent. The caller answers.
                return Failure.DROPPED
            except _ClientLeft:
                # The client left before the replica answered: closing the upstream
                # connection cancels a stateless request on the replica.
                self._cancelled(kind, scope, address, body, session)
                return Failure.DISCONNECTED
            if isinstance(upstream, Failure):
                return upstream
            if upstream.status == 503 and upstream.headers.get(DRAINING_HEADER):
                await self.upstream.decline(upstream)
                return Failure.DRAINING
            try:
                if kind is RouteKind.INITIALIZE and upstream.status == 200:
                    created = upstream.headers.get(SESSION_HEADER)
                    if created and valid_session_id(created):
                        await self.sessions.record(created, name, self._init_record(upstream, body))
                elif session is not None and session_ended(upstream):
                    await self.sessions.drop(session)
            except BaseException:
                upstream.close()
                raise
            self.metrics.observe_latency(kind.value, time.perf_counter() - started)
            result = await self.upstream.relay(upstream, address, receive, send, alias)
            if result is Failure.UPSTREAM_BROKE:
                log.warning("replica %s broke off its response; aborting the client's", name)
            elif result is Failure.DISCONNECTED:
                self._cancelled(kind, scope, address, body, session)
            return result
        finally:
            self.view.inflight[name] -= 1

    def _init_record(self, upstream: Response, body: bytes) -> str | None:
        """What re-opens a new session elsewhere, when re-homing is on and the app allows it."""
        if not self.config.rehome_sessions or upstream.headers.get(REHOME_HEADER) == "0":
            return None
        params = initialize_params(body)
        if params is None:
            return None
        return InitRecord(params, upstream.headers.get(PRINCIPAL_HEADER) or "").to_json()

    def _cancelled(
        self, kind: RouteKind, scope: Scope, address: str, body: bytes, session: str | None
    ) -> None:
        """The client went away before its answer was complete: the request is cancelled.

        A stateless request is cancelled by the closed upstream connection alone
        (the replica sees its client leave). A session's request runs in the
        session, not in its HTTP request: the owner is told with the spec's
        ``notifications/cancelled`` for each request id the body carried, sent
        with the client's own headers (its session id and credentials).
        """
        self.metrics.cancelled.labels(kind.value).inc()
        if session is None:
            return
        notices = cancellations(body)
        if notices:
            task = asyncio.ensure_future(self.upstream.notify(scope, address, notices))
            self._notices.add(task)
            task.add_done_callback(self._notices.discard)


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
    watcher: asyncio.Future[Message] | None = None

    if watch_disconnect is not None:
        watch_disconnect(gone)
    else:
        # (Defined only here: the two refer to each other, a reference cycle the
        # collector would have to find for every request.)
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

        watch()
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
        if watcher is not None:
            watcher.cancel()


def _outcome(result: int | Failure) -> RequestOutcome | Failure:
    if isinstance(result, Failure):
        return result
    if result < 400:
        return RequestOutcome.OK
    return RequestOutcome.CLIENT_ERROR if result < 500 else RequestOutcome.UPSTREAM_ERROR


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


class ClosingServer(SigtermFirstServer):
    """uvicorn, but SIGTERM first closes keep-alive connections for ``drain_linger``
    seconds (the router's ``closing``), then shuts down; a second signal or SIGINT
    exits at once."""

    def __init__(self, config: uvicorn.Config, router: Router) -> None:
        super().__init__(config)
        self.router = router

    def takes_sigterm(self) -> bool:
        return self.router.config.drain_linger > 0

    def on_sigterm(self) -> None:
        linger = self.router.config.drain_linger
        self.router.closing = True
        log.info("SIGTERM: closing client connections for %.1fs, then shutting down", linger)
        asyncio.get_running_loop().call_later(linger, self._shut_down)

    def _shut_down(self) -> None:
        self.should_exit = True


def router_server(config: RouterConfig) -> ClosingServer:
    from mcpfleet.router.http import bounded_protocol

    router = Router(config)
    router.freeze_gc = True
    uv_config = uvicorn.Config(
        router,
        host=config.host,
        port=config.port,
        http=bounded_protocol(
            config.header_timeout, config.max_connections, config.max_header_bytes
        ),
        log_level="warning",
        lifespan="on",
        access_log=False,
        timeout_graceful_shutdown=config.graceful_timeout,
    )
    return ClosingServer(uv_config, router)


def run_router(config: RouterConfig) -> None:
    server = router_server(config)
    # uvicorn re-raises the SIGINT it handled; by then we are done.
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
