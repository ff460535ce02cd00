"""The sticky router: an ASGI reverse proxy in front of the replicas.

Per request (see :mod:`mcpfleet.router.decisions` for the pure decisions):

* ``Mcp-Session-Id`` present (:mod:`~mcpfleet.router.sticky`): to the
  session's owner (cache, then Redis). An owner that is gone, unknown, or
  refuses the connection gets the spec's 404 at once and the entry is
  dropped, so the client re-initializes.
* ``initialize`` (:mod:`~mcpfleet.router.spread`, as the next): to the
  serving replica with the fewest sessions (those in flight to it count, one
  answered without a session does not); the new
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
:mod:`~mcpfleet.router.process`.

:class:`Router` is the ASGI application and the process's state: it starts
and stops the router, answers the health, readiness and metrics paths, admits
each request and hands it, as one :class:`~mcpfleet.router.exchange.Exchange`,
to :class:`~mcpfleet.router.sticky.Sticky` (a session's) or
:class:`~mcpfleet.router.spread.Spread` (any other); both forward through one
:class:`~mcpfleet.router.forward.Forwarder` (the books: in flight, sessions,
latency), and a session whose owner is gone goes to the
:class:`~mcpfleet.router.rehome.Rehomer`.
"""

from __future__ import annotations

import asyncio
import enum
import gc
import json
import logging
import time
from typing import Any

from starlette.types import Receive, Scope, Send

from mcpfleet import tracing
from mcpfleet.answers import ErrorCode, jsonrpc_error
from mcpfleet.config import RouterConfig
from mcpfleet.contract import MCP_PATH, RedisKeys
from mcpfleet.jsonbody import parses_as_json
from mcpfleet.redisconn import check_version, follow_master, parse_url, redact_url
from mcpfleet.registry import connect
from mcpfleet.router.admission import ClientGone, Rejection, admit
from mcpfleet.router.decisions import OriginPolicy, RouteKind, classify, era_of
from mcpfleet.router.exchange import RequestOutcome, respond
from mcpfleet.router.forward import Forwarder
from mcpfleet.router.health import Health, RedisDown
from mcpfleet.router.metrics import RouterMetrics
from mcpfleet.router.refused import RefusedCredentials, refuse
from mcpfleet.router.rehome import Rehomer
from mcpfleet.router.replicas import ReplicaView
from mcpfleet.router.spread import Spread
from mcpfleet.router.sticky import Sticky
from mcpfleet.router.table import SessionTable
from mcpfleet.router.upstream import Failure, Upstream

log = logging.getLogger("mcpfleet.router")

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
        # A session's requests go to its owner (sticky), any other is placed or
        # spread; both forward to a replica through one forwarder.
        self.forwarder = Forwarder(
            self.view, self.sessions, self.upstream, self.refused, self.metrics, self.rehomer
        )
        sticky = (self.sessions, self.view, self.upstream, self.metrics, self.rehomer)
        self.sticky = Sticky(config, *sticky, self.forwarder)
        self.spread = Spread(config, self.view, self.refused, self.metrics, self.forwarder)
        self._tasks: list[asyncio.Task[None]] = []
        #: Set at SIGTERM: answers close their connections, /readyz says 503.
        self.closing = False
        #: Whether startup moves every object alive by then out of the cyclic
        #: collector's sight (``gc.freeze``): set for the router process.
        self.freeze_gc = False
        #: The loop the router serves on (set at startup).
        self.loop: asyncio.AbstractEventLoop | None = None

    # --- lifecycle -------------------------------------------------------------------

    async def startup(self) -> None:
        self.loop = self.forwarder.loop = asyncio.get_running_loop()
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
        for task in [*self._tasks, *self.forwarder.notices]:
            task.cancel()
        await asyncio.gather(*self._tasks, *self.forwarder.notices, return_exceptions=True)
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
        self.metrics.in_flight += 1
        try:
            if tracing.ON:
                route, outcome = await self._traced(scope, receive, send, started)
            else:
                route, outcome = await self._route(scope, receive, send, started)
        finally:
            self.metrics.in_flight -= 1
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
            outcome = await self.sticky.route(x)
        else:
            outcome = await self.spread.route(x, kind)
        return kind.value, outcome


def _accept(scope: Scope) -> str:
    """The request's ``Accept`` header ("" without one)."""
    for name, value in scope["headers"]:
        if name == b"accept":
            return str(value.decode("latin-1"))
    return ""


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
