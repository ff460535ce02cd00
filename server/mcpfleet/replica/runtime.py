"""One replica: any FastMCP app, the shared key ring, the registry, and a graceful drain.

The :class:`Replica` is what ``mcpfleet serve`` runs
(:func:`mcpfleet.replica.process.run_replica`), which refuses to start without a
valid key ring (a replica that cannot unseal other replicas' tokens would fail
every modern continuation routed to it), then serves under uvicorn with:

* a :class:`~mcpfleet.keys.watch.KeyRingWatcher` reloading the ring;
* a :class:`~mcpfleet.registry.Publisher` attesting the LOADED ring's
  kids, the replica's address, state and load (when Redis is configured);
* Prometheus metrics on ``/metrics``: the app's rounds (a
  :class:`~mcpfleet.replica.middleware.PrometheusMiddleware`, added unless the app
  has one), request state and key ring, sessions and drain state
  (:mod:`mcpfleet.replica.metrics`);
* the once-ledger of ``ask_then(..., once=True)`` flows
  (:mod:`mcpfleet.once`): the fleet's Redis when configured, so a final
  round replayed on any replica runs ``finish`` once; this process's memory
  when standalone;
* MCP tasks (:mod:`mcpfleet.tasks`), for an app with a tasks extension: the
  fleet's one queue in its Redis, a worker in this replica;
* drain on SIGTERM: the replica attests ``draining`` and refuses new work at
  once, serves the sessions it owns until every one is closed (deleted, or idle
  past the session idle time) and nothing is in flight, or the deadline
  passes, then exits. SIGINT stops at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib.metadata
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastmcp.server.http import StarletteWithLifespan
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.types import ASGIApp, Receive, Scope, Send

from mcpfleet import tracing
from mcpfleet.answers import send_whole
from mcpfleet.config import ReplicaConfig
from mcpfleet.contract import (
    MCP_PATH,
    Attestation,
    RedisKeys,
)
from mcpfleet.keys.codec import ReloadableCodec
from mcpfleet.keys.ring import KeyRing
from mcpfleet.keys.watch import KeyRingWatcher
from mcpfleet.limits import SESSION_LEASE
from mcpfleet.notify import (
    RETRY_MS,
    install_notifications,
    install_sessions,
    prime_by_session,
)
from mcpfleet.once import Ledger, MemoryLedger, RedisLedger, install_ledger
from mcpfleet.once import settle as settle_once
from mcpfleet.redisconn import DirectCommands, check_version, parse_url, redact_url
from mcpfleet.registry import Publisher, connect
from mcpfleet.replica import wiring
from mcpfleet.replica.appload import install_codec, load_app, quiet_telemetry
from mcpfleet.replica.drain import drain as drain_replica
from mcpfleet.replica.gate import GateState, ReplicaGate
from mcpfleet.replica.hostcheck import KeptHostGuard
from mcpfleet.replica.limitgate import LimitGate, RefusedCredentials
from mcpfleet.replica.metrics import ReplicaMetrics, exposition
from mcpfleet.replica.middleware import PrometheusMiddleware
from mcpfleet.replica.respmode import ResponseModes
from mcpfleet.replica.roundparams import parse_round_params_once
from mcpfleet.replica.spans import skip_span_helpers
from mcpfleet.replica.toollookup import skip_lookup_tasks
from mcpfleet.replica.tracing import TracedRequests, traced_codec_events
from mcpfleet.tasks import (
    FleetTasks,
    TaskReader,
)

log = logging.getLogger("mcpfleet.replica")

_OURS = "_mcpfleet_replica_installed"

#: Seconds between two reads of the task queue's depth (a metric).
TASK_QUEUE_READ_INTERVAL = 2.0


def _spare_fastmcps_repeats() -> None:
    """FastMCP's work on every round that no one uses, left out (each module says why)."""
    if quiet_telemetry():
        log.info("no OpenTelemetry SDK configured: FastMCP's and mcp's spans are off")
    # With the spans off, FastMCP's helpers still build every span's attributes;
    # each tool lookup makes a task group, even for one provider; and each read of
    # a round's input responses or state parses the request's params again.
    skip_span_helpers()
    skip_lookup_tasks()
    parse_round_params_once()


class Replica:
    """The assembled replica: app, gate, watcher, publisher, drain."""

    def __init__(self, config: ReplicaConfig, ring: KeyRing) -> None:
        self.config = config
        self.name = config.resolved_name()
        self.address = config.resolved_address()
        self.started = time.time()
        self.state = GateState(
            name=self.name, session_idle=config.session_idle, rehome=config.session_rehome
        )
        self.metrics = ReplicaMetrics(app=config.app, ring=lambda: self.codec.ring, gate=self.state)
        self.codec = ReloadableCodec(ring, observer=traced_codec_events(self.metrics.codec_event))
        self.mcp_app = load_app(config.app)
        _spare_fastmcps_repeats()
        self.rounds = install_rounds_middleware(self.mcp_app, self.metrics)
        self.limiter, self.rules_watcher = wiring.limits(config, self.metrics)
        self.audience = config.resolved_audience()
        install_codec(self.mcp_app, self.codec, audience=self.audience, ttl=config.state_ttl)
        # subscriptions/listen for the app, over the fleet's bus (mcpfleet.notify).
        self.notify = install_notifications(
            self.mcp_app,
            RedisKeys(config.fleet).events,
            deadline=config.redis_deadline,
            observer=self.metrics,
            max_streams=config.listen_streams,
        )
        # Handshake sessions: resources/subscribe, the fleet's events on their GET
        # streams, and SSE streams resumable from the fleet's Redis (mcpfleet.notify).
        self.sessions = install_sessions(self.mcp_app, self.notify.bus, self.metrics)
        self.event_store = wiring.event_store(config, self.metrics)
        # An app with MCP tasks: one queue for the fleet, a worker here (mcpfleet.tasks).
        self.tasks: FleetTasks | None = wiring.fleet_tasks(
            self.mcp_app, config, self.name, self.codec, self.metrics, self.limiter
        )
        if self.tasks is not None:
            self.metrics.enable_tasks(self.tasks.busy)
            # Task status as notifications/tasks: announced here, read by the owner's streams.
            self.tasks.on_status = self.notify.task_status
            self.notify.read_tasks(TaskReader(self.mcp_app, config.tasks_deadline))
        # Standalone, once-flows claim in this process; with Redis, fleet-wide (lifespan).
        self._install_ledger(MemoryLedger())
        self.publisher: Publisher | None = None
        self.watcher = KeyRingWatcher(
            config.keys_dir,
            self.codec,
            on_change=self._ring_changed,
            on_result=self.metrics.reload_result,
        )
        #: The same app in JSON mode, for modern rounds that cannot stream (respmode).
        self.json_app: StarletteWithLifespan | None = None
        self.asgi: ASGIApp = self._asgi_stack()
        self._drained = asyncio.Event()
        #: Whether serving starts by moving every object alive by then out of the
        #: cyclic collector's sight (``gc.freeze``): set for the replica process.
        self.freeze_gc = False
        #: The fleet's Redis, while the replica serves with one.
        self.redis: Any = None

    def _asgi_stack(self) -> ASGIApp:
        """The app as the replica serves it: both response modes, the Host/Origin guard,
        the trace (when on) and the gate in front."""
        self.http_main = self._http_app(json_response=None)
        inner: ASGIApp = self.http_main
        if self.config.response_mode == "auto":
            self.json_app = self._http_app(json_response=True)
            inner = ResponseModes(inner, self.json_app, MCP_PATH)
        # DNS-rebinding protection: FastMCP's guard ("auto" mode), its verdicts kept (hostcheck).
        inner = KeptHostGuard(
            inner,
            allowed_hosts=list(self.config.allowed_hosts) or None,
            allowed_origins=list(self.config.allowed_origins) or None,
        )
        # A token refused under a rate is refused again before the app's auth checks it.
        inner = RefusedCredentials(inner, self.limiter, observer=self.metrics)
        if tracing.ON:
            # The caller's trace continued around the app (FastMCP's spans join it).
            inner = TracedRequests(inner, self.name)
        return ReplicaGate(inner, self.state, extra_routes={"/metrics": self.serve_metrics})

    def _http_app(self, json_response: bool | None) -> StarletteWithLifespan:
        config = self.config
        limits = Middleware(
            LimitGate,
            limiter=self.limiter,
            trusted_hops=config.trusted_hops,
            anonymous=config.anonymous_principal,
            observer=self.metrics,
        )
        # SSE streams with ids, a priming event and a retry field (not the JSON app's).
        store = self.event_store if json_response is None else None
        return self.mcp_app.http_app(
            path=MCP_PATH,
            json_response=json_response,
            event_store=store,
            retry_interval=RETRY_MS if store is not None else None,
            # The replica forgets an idle session when the router's route expires.
            session_idle_timeout=config.session_idle,
            # The Host/Origin guard is in front of both apps, once (KeptHostGuard).
            host_origin_protection=False,
            # After the app's auth (the principal is known), before the transport.
            middleware=[limits],
        )

    def attestation(self) -> Attestation:
        st = self.state
        return Attestation(
            name=self.name,
            address=self.address,
            state="draining" if st.draining else "serving",
            kids=self.codec.kids,
            heartbeat=time.time(),
            sessions=st.live_sessions(),
            inflight=st.inflight,
            started=self.started,
            paused=self.rounds.paused,
            listens=self.notify.streams.open,
            tasks=self.tasks.busy() if self.tasks is not None else 0,
        )

    async def serve_metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``/metrics``: the replica's registry, and the app's own middleware's if it had one,
        in the format the scraper's ``Accept`` asks for (OpenMetrics carries exemplars)."""
        registries = [self.metrics.registry]
        if self.rounds.registry is not self.metrics.registry:
            registries.append(self.rounds.registry)
        body, content_type = exposition(registries, Headers(scope=scope).get("accept", ""))
        await send_whole(send, 200, body, content_type=content_type.encode())

    def _install_ledger(self, ledger: Ledger) -> None:
        install_ledger(
            self.mcp_app,
            ledger,
            token_ttl=self.config.state_ttl,
            replica=self.name,
            observe=self.metrics.once_outcome,
            boot=self.started,
        )

    def _ring_changed(self, ring: KeyRing) -> None:
        if self.publisher is not None:
            self.publisher.publish_soon()

    @contextlib.asynccontextmanager
    async def lifespan(self) -> AsyncIterator[None]:
        # The app's session manager exists now (its lifespan started first).
        prime_sessions(self.http_main)
        async with contextlib.AsyncExitStack() as stack:
            if self.json_app is not None:
                # Its session manager (modern rounds only: no sessions) runs beside the
                # main app's; FastMCP's lifespan is reference-counted, so the app's own
                # lifespan still runs once.
                await stack.enter_async_context(
                    self.json_app.router.lifespan_context(self.json_app)
                )
            async with self._serving():
                yield

    @contextlib.asynccontextmanager
    async def _serving(self) -> AsyncIterator[None]:
        self.metrics.watch_rejections()
        tasks = [asyncio.create_task(self.watcher.run(), name="keyring-watch")]
        if self.rules_watcher is not None:
            tasks.append(asyncio.create_task(self.rules_watcher.run(), name="limits-watch"))
        client = None
        direct: DirectCommands | None = None
        if self.config.redis_url:
            client, direct = await self._join_fleet(self.config.redis_url, tasks)
        tasks.append(asyncio.create_task(self._renew_session_places(), name="limits-renew"))
        if self.freeze_gc:
            # Everything alive once serving starts (modules, classes, the app, the
            # clients) lives as long as the process: out of the cyclic collector's
            # sight, a full collection walks only what requests made, not every
            # object of FastMCP, pydantic and mcp (tens of ms a round would wait out).
            gc.collect()
            gc.freeze()
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.metrics.unwatch_rejections()
            # Results of once-flows answered just before shutdown reach the ledger first.
            await settle_once()
            self.redis = None
            self.sessions.close()
            if self.event_store is not None:
                self.event_store.detach()
            await self.limiter.aclose()
            if direct is not None:
                await direct.aclose()
            if client is not None and self.publisher is not None:
                await self.publisher.withdraw(self.name)
                await client.aclose()

    async def _join_fleet(
        self, redis_url: str, tasks: list[asyncio.Task[Any]]
    ) -> tuple[Any, DirectCommands]:
        """Serve with the fleet's Redis at ``redis_url``: the once-ledger there, the
        heartbeat, and the watches of its memory and of the task queue, each a task
        added to ``tasks``. Returns the client and the direct command driver."""
        config = self.config
        client = connect(redis_url, config.redis_files)
        keys = RedisKeys(config.fleet, cluster=parse_url(redis_url).cluster)
        await check_version(client, config.redis_deadline)
        self.redis = client
        # The claim and its confirmation are on the final round's answer path:
        # sent on connections of their own, without redis-py's per-command costs.
        direct = DirectCommands(client)
        ledger = RedisLedger(
            direct,
            keys,
            deadline=config.redis_deadline,
            failover_wait=config.redis_failover_wait,
            memory_limit=config.once_memory_limit,
        )
        self._install_ledger(ledger)
        self.limiter.attach(direct)
        tasks.append(
            asyncio.create_task(
                ledger.watch_memory(self.metrics.redis_memory.set), name="redis-memory"
            )
        )
        self.publisher = Publisher(
            client,
            keys,
            self.attestation,
            interval=config.heartbeat_interval,
            ttl=config.heartbeat_ttl,
            redis_label=redact_url(redis_url),
            sessions=self.state.sessions.keys,
            session_ttl=config.session_idle,
        )
        tasks.append(asyncio.create_task(self.publisher.run(), name="heartbeat"))
        tasks.append(asyncio.create_task(self.notify.serve(client), name="events"))
        if self.event_store is not None:
            # Past the once limit the store stops writing too: routes and heartbeats
            # keep the memory that is left.
            self.event_store.attach(client, full=lambda: ledger.full)
        if self.tasks is not None:
            watch = self.tasks.watch_queue(
                client,
                self.metrics.task_queue_depth,
                interval=TASK_QUEUE_READ_INTERVAL,
                deadline=config.redis_deadline,
            )
            tasks.append(asyncio.create_task(watch, name="task-queue-depth"))
        return client, direct

    async def _renew_session_places(self) -> None:
        """Every third of a place's lease: the places of the sessions this replica holds
        renewed (re-added after a Redis restart), those of ended sessions given back."""
        while True:
            await asyncio.sleep(SESSION_LEASE / 3)
            self.state.live_sessions()
            try:
                await self.limiter.renew_sessions(set(self.state.sessions))
            except Exception as e:  # any driver's error, or the deadline
                self.metrics.failed("sessions")
                log.warning("limits: renewing session places failed (%s)", type(e).__name__)

    async def drain(self) -> None:
        """Refuse new work now; return once what this replica owns has ended, or the
        deadline passed (:func:`mcpfleet.replica.drain.drain`)."""
        await drain_replica(self)


def prime_sessions(http_app: Any) -> bool:
    """:func:`mcpfleet.notify.prime_by_session` on ``http_app``, and which path it took
    logged (its refusal logs why mcp's own transport serves)."""
    primed = prime_by_session(http_app)
    if primed:
        log.info(
            "sse: mcp %s: handshake sessions get mcpfleet's transport (primed by session, "
            "resumed without loss)",
            importlib.metadata.version("mcp"),
        )
    return primed


def install_rounds_middleware(app: Any, metrics: ReplicaMetrics) -> PrometheusMiddleware:
    """The app's rounds middleware: its own if it installed one, else a new one, outermost.

    Outermost, so a round refused by another middleware of the app is still
    counted. An app's own middleware keeps its registry; ``/metrics`` serves it
    too. One installed for an earlier replica of the same app object (tests
    build several in one process) is replaced, never stacked.
    """
    app.middleware[:] = [mw for mw in app.middleware if not getattr(mw, _OURS, False)]
    for mw in app.middleware:
        if isinstance(mw, PrometheusMiddleware):
            return mw
    ours = PrometheusMiddleware(metrics.registry)
    setattr(ours, _OURS, True)
    app.middleware.insert(0, ours)
    return ours
