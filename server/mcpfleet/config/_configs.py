"""The settings of a replica and of a router, with their defaults: the config dataclasses.

Plain dataclasses with no I/O and no heavy imports, so a deployment reads one
place to see what a value means. Values that two components must agree on say
so: a replica's session idle time is the router's session TTL. A flag's default
is its field's here (:meth:`mcpfleet.config.Setting.default_in`).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from mcpfleet.contract import DEFAULT_FLEET, HEARTBEAT_INTERVAL, HEARTBEAT_TTL
from mcpfleet.limits import Count, LimitRules, Rate
from mcpfleet.redisconn import DEFAULT_DEADLINE, DEFAULT_FAILOVER_WAIT, RedisFiles

#: The app ``mcpfleet serve`` runs when no ``--app`` is given: the example app, in
#: the package ``mcpfleet_examples`` beside ``mcpfleet`` (the ``mcpfleet-examples``
#: distribution, which the image and the development venv install).
DEFAULT_APP = "mcpfleet_examples.app:app"

#: App modules that moved, by their former package: 0.1.0 shipped the example apps
#: inside ``mcpfleet``, and its default app, ``mcpfleet.example.app:app``, is in
#: users' values files (the chart's ``server.app``). An ``--app`` under a former
#: name is loaded from the new one (:func:`mcpfleet.replica.appload.load_app`,
#: with one log line).
MOVED_APP_MODULES = {"mcpfleet.example": "mcpfleet_examples"}


def _rename(module: str, table: dict[str, str]) -> str | None:
    for old, new in table.items():
        if module == old or module.startswith(old + "."):
            return new + module[len(old) :]
    return None


def moved_app_module(module: str) -> str | None:
    """Where the app module ``module`` is now, if it moved (None if it did not)."""
    return _rename(module, MOVED_APP_MODULES)


def first_app_name(spec: str) -> str:
    """The app spec ``spec`` under its module's first name (unchanged if it never moved).

    What a replica's default request-state audience is made of: replicas that
    name one app by its old and its new name (a rollout from 0.1.0's default)
    seal and unseal for the same audience, so no asking round is lost on the way.
    """
    module, sep, attr = spec.partition(":")
    first = _rename(module, {new: old for old, new in MOVED_APP_MODULES.items()})
    return f"{first}{sep}{attr}" if first else spec


#: The variable a replica takes its name from when ``--name`` is not given (the
#: chart sets it from the downward API), before ``host-port``.
POD_NAME_ENV = "POD_NAME"
#: The address a replica bound to every interface advertises when ``--advertise``
#: is not given (the chart sets it from the downward API), before 127.0.0.1.
POD_IP_ENV = "POD_IP"

#: How long an idle handshake-era session lives: the replica forgets it, and
#: the router's routing entry expires, after this long without a request.
SESSION_IDLE = 1800.0


@dataclass
class ReplicaConfig:
    keys_dir: Path
    app: str = DEFAULT_APP
    host: str = "127.0.0.1"
    port: int = 8001
    name: str = ""
    advertise: str = ""
    redis_url: str | None = None
    #: The password and TLS files (mcpfleet.redisconn): paths, never contents.
    redis_files: RedisFiles = field(default_factory=RedisFiles)
    fleet: str = DEFAULT_FLEET
    audience: str = ""
    state_ttl: float = 600.0
    drain_timeout: float = 30.0
    #: A draining replica stays up at least this long, even with nothing to
    #: finish, so every router sees it draining (a heartbeat, then a refresh)
    #: before its address stops answering: a request already on its way is
    #: then answered 503-draining and resent, never reset.
    drain_linger: float = 2.0
    #: Must equal the routers' ``session_ttl``.
    session_idle: float = SESSION_IDLE
    #: Whether routers that re-home sessions (``--rehome-sessions``) may re-open
    #: this app's sessions on another replica once this one is gone. Off for an
    #: app that keeps state of its own in a session (it would not come along).
    session_rehome: bool = True
    #: A draining replica exits as soon as no request is in flight, handing its
    #: idle sessions over to re-homing routers (docs/rehome.md), instead of
    #: waiting until they close or the drain timeout passes. Only for a fleet
    #: whose routers run with ``--rehome-sessions``.
    drain_handover: bool = False
    heartbeat_interval: float = HEARTBEAT_INTERVAL
    heartbeat_ttl: float = HEARTBEAT_TTL
    #: DNS-rebinding protection at the replica (FastMCP's Host/Origin guard in
    #: "auto" mode): a loopback-bound replica accepts only loopback Host and
    #: Origin values; these add to them, and any value set turns the guard on
    #: whatever the bind address (patterns as FastMCP takes them: ``*.svc``).
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    #: The deadline (s) of each Redis call on a request's path (a once-flow's
    #: claim, its confirmation, a replay's read): past it, the retryable error.
    redis_deadline: float = DEFAULT_DEADLINE
    #: Through Sentinel, how long (s) a once-flow's claim waits for a new master
    #: before the retryable error; covers a failover with down-after 1 s.
    redis_failover_wait: float = DEFAULT_FAILOVER_WAIT
    #: New once-flows are refused while Redis uses more than this share of its
    #: maxmemory (0 turns the check off), leaving the rest to heartbeats and routes.
    once_memory_limit: float = 0.8
    #: How modern rounds are answered: ``auto``, JSON for a round that asked for
    #: no progress or logs and SSE for one that did (mcpfleet.replica.respmode);
    #: ``sse``, every round through mcp's SSE mode, as FastMCP serves by default.
    response_mode: Literal["auto", "sse"] = "auto"
    #: MCP tasks (:mod:`mcpfleet.tasks`, apps with a tasks extension only): a
    #: task whose worker died (its lease, renewed every quarter of this, lapsed)
    #: runs again on another replica's worker after at most this many seconds.
    tasks_redelivery: float = 30.0
    #: Tasks one replica's worker runs at once.
    tasks_concurrency: int = 10
    #: Seconds a task request (a creation, ``tasks/get|update|cancel``) may wait
    #: on Redis before it is answered with an error saying the outcome is unknown.
    tasks_deadline: float = 10.0
    #: Encrypt every stored task snapshot (the caller's context a worker restores)
    #: under a key derived from the request-state key ring the replica already
    #: loads: sealed with its first key, opened with any of its keys
    #: (:class:`mcpfleet.tasks.RingSnapshotCodec`).
    tasks_encrypt: bool = False
    #: ``subscriptions/listen`` streams one replica serves at once; more are refused
    #: (each holds a connection and a bounded buffer: docs/notifications.md).
    listen_streams: int = 1024
    #: Events kept per handshake-era SSE stream in the fleet's Redis, so that a cut
    #: stream resumes with ``Last-Event-ID`` (mcpfleet.notify's event store): each
    #: event sent to a handshake session is one Redis write. 0 turns the store off:
    #: no write per event, no event ids, a cut stream is not resumable.
    sse_events: int = 1000
    #: Seconds an SSE event stays resumable (and a stream lives after its last event).
    sse_ttl: float = 600.0
    #: The tasks limit per principal (:mod:`mcpfleet.limits`, ``Count``): at most this
    #: many tasks queued, running or waiting for input, fleet-wide (0: no cap) ...
    limit_tasks: int = 0
    #: ... and this many of them run at once by the fleet's workers (0: no share).
    limit_tasks_running: int = 0
    #: Limits per principal (mcpfleet.limits; 0 is no limit), fleet-wide through
    #: Redis. The defaults protect a fleet shared by many users out of the box:
    #: an agent needs a handful of sessions, not a hundred (the chart's 1,000
    #: sessions per replica hold ten such principals at least), and an
    #: interactive agent sends a few rounds a second, not fifty.
    limit_sessions: int = 100
    #: ``subscriptions/listen`` streams one principal holds open at once, fleet-wide:
    #: a client needs one or two, not dozens.
    limit_listen: int = 20
    limit_rounds: float = 50.0
    limit_burst: int = 100
    #: A JSON file of limits over these (per tool, per principal), watched.
    limits_file: Path | None = None
    #: Proxies in front of the replica whose X-Forwarded-For entries are trusted
    #: (the router is one; the chart sets 1 + the hops in front of the router).
    #: 0: the connection's peer is the client (never a header a client wrote).
    trusted_hops: int = 0
    #: Unauthenticated principals: one per client ``address``, or one ``shared``.
    anonymous_principal: Literal["address", "shared"] = "address"

    def limit_rules(self) -> LimitRules:
        """The limits the flags set (the limits file goes over them)."""
        return LimitRules(
            sessions=self.limit_sessions,
            rounds=Rate(self.limit_rounds, self.limit_burst),
            tasks=Count(self.limit_tasks, self.limit_tasks_running),
            listen=self.limit_listen,
        )

    def resolved_name(self) -> str:
        return self.name or os.environ.get(POD_NAME_ENV) or f"{socket.gethostname()}-{self.port}"

    def resolved_audience(self) -> str:
        """``--audience``, or ``mcpfleet/<app>`` with the app under its first name."""
        return self.audience or f"mcpfleet/{first_app_name(self.app)}"

    def resolved_address(self) -> str:
        if self.advertise:
            return self.advertise.rstrip("/")
        host = self.host
        if host in ("0.0.0.0", "::", ""):
            host = os.environ.get(POD_IP_ENV) or "127.0.0.1"
        return f"http://{host}:{self.port}"


@dataclass
class RouterConfig:
    redis_url: str
    redis_files: RedisFiles = field(default_factory=RedisFiles)
    host: str = "127.0.0.1"
    port: int = 8000
    fleet: str = DEFAULT_FLEET
    refresh_interval: float = 0.5
    #: Must equal the replicas' ``session_idle``.
    session_ttl: float = SESSION_IDLE
    session_cap: int | None = None
    max_body_bytes: int = 4 * 1024 * 1024
    max_header_bytes: int = 16 * 1024
    connect_timeout: float = 3.0
    #: How long a client may take to send a request's headers, then its body.
    #: Responses (streams) are never bounded.
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    #: Connections (and requests in flight) the router holds at once; past it,
    #: new ones get 503 at once rather than queueing.
    max_connections: int = 10000
    #: The router's Redis connection pool: at most ``redis_pool_size`` connections;
    #: a lookup waits ``redis_pool_wait`` s for one, then 503 "Router busy" (a
    #: full pool is not Redis down: the router does not turn degraded).
    redis_pool_size: int = 64
    redis_pool_wait: float = 0.5
    #: Seconds an id Redis said it does not know is answered 404 from memory.
    unknown_session_ttl: float = 2.0
    #: DNS-rebinding protection (see router.decisions.OriginPolicy.for_bind): empty means
    #: loopback names for a loopback bind, else any Host and no browser Origin.
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    #: How long a session's owner may be absent from the registry (a late
    #: heartbeat) before the router stops trying its last known address.
    owner_absent_limit: float = 10.0
    #: The deadline (s) of each Redis call on a request's path (a session lookup
    #: the cache cannot answer, a new session's route): past it, Redis is down.
    redis_deadline: float = DEFAULT_DEADLINE
    #: Through Sentinel, how long (s) a session lookup the cache cannot answer
    #: waits for a new master before the 503; covers a failover with down-after 1 s.
    redis_failover_wait: float = DEFAULT_FAILOVER_WAIT
    attempts: int = 3
    #: Seconds the router lets requests and streams in flight finish after
    #: SIGTERM before it closes them (uvicorn's graceful shutdown); the chart
    #: sets it from router.gracefulTimeout, inside terminationGracePeriodSeconds.
    graceful_timeout: int = 5
    #: Seconds between SIGTERM and that shutdown in which the router still serves
    #: but answers every response with ``Connection: close`` and /readyz 503: a
    #: client's keep-alive connection is closed by the router after an answer
    #: (the client reconnects elsewhere), never under a request it just sent.
    drain_linger: float = 2.0
    #: Re-home idle handshake sessions whose replica is gone (docs/rehome.md):
    #: off by default, for clients that do not re-initialize on the spec's 404.
    rehome_sessions: bool = False
    #: Seconds a re-home (re-initialize on a live replica, then
    #: ``notifications/initialized``) may take before the request gets a 503
    #: with Retry-After; the session stays re-homable.
    rehome_timeout: float = 10.0
