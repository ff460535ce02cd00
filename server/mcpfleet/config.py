"""The settings of a replica and of a router: the one source of their defaults and flags.

Plain dataclasses with no I/O and no heavy imports, so a deployment reads one
place to see what a value means. Values that two components must agree on say
so: a replica's session idle time is the router's session TTL.

Below them, :data:`SETTINGS`: one table per process (``serve``, ``router``) of
its flags, in ``--help``'s order: each flag's name, how its value is read (the
argparse types here), its help line, the environment variable the process falls
back to, and the chart value that sets it. A flag's default is its config
field's; a flag both processes take (``--host``, ``--fleet``,
``--redis-deadline``, ...) is declared once and named in both tables.
:mod:`mcpfleet.commands` makes the parsers from the tables; the tests hold the
docs' stated defaults and the chart's values to them. The Redis flags
(:mod:`mcpfleet.commands.redisflags`) are declared there, once for ``serve``,
``router`` and the operator, which may not import this module; a table marks
where they go with :class:`RedisFlags`.
"""

from __future__ import annotations

import argparse
import builtins
import dataclasses
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from mcpfleet.contract import DEFAULT_FLEET, HEARTBEAT_INTERVAL, HEARTBEAT_TTL, check_fleet_name
from mcpfleet.limits import Count, LimitRules, Rate
from mcpfleet.redisconn import DEFAULT_DEADLINE, DEFAULT_FAILOVER_WAIT, RedisFiles

#: The app ``mcpfleet serve`` runs when no ``--app`` is given.
DEFAULT_APP = "mcpfleet.example.app:app"

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


# --------------------------------------------------------------------------- how flags are read


def positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def non_negative(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"not a port: {text}")
    return value


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def share(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return value


def fleet_name(text: str) -> str:
    try:
        return check_fleet_name(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# --------------------------------------------------------------------------- the flags


#: A :class:`Setting`'s default when it names none: its config field's.
FROM_CONFIG: Any = object()


@dataclass(frozen=True)
class Setting:
    """One flag of a process: its name, how its value is read, its help line.

    ``kind``: ``value`` takes one (read by ``type``, one of ``choices``);
    ``switch`` turns its field on and ``off-switch`` off; ``repeat`` adds one
    value each time it is given. ``help`` may name the default as ``{default}``
    (or ``{default:g}``). ``field`` is the config field (and the Namespace's
    attribute) it sets, when not the flag's own name. ``env``: the variable the
    process reads when the flag is not given. ``chart``: the chart value (a
    path in values.yaml) the chart passes it from, and ``chart_differs`` why
    that value's default is not the flag's, if it is not.
    """

    flag: str
    help: str
    type: Callable[[str], Any] | None = None
    kind: Literal["value", "switch", "off-switch", "repeat"] = "value"
    field: str = ""
    default: Any = FROM_CONFIG
    choices: tuple[str, ...] | None = None
    required: bool = False
    env: str | None = None
    chart: str | None = None
    chart_differs: str = ""

    @property
    def name(self) -> str:
        """The flag's own name as argparse makes it a name: ``--state-ttl`` is ``state_ttl``."""
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def dest(self) -> str:
        """The config field and Namespace attribute the flag sets."""
        return self.field or self.name

    def default_in(self, config: builtins.type) -> Any:
        """The default: the one declared here, else ``config``'s field's (None if it has none)."""
        if self.default is not FROM_CONFIG:
            return self.default
        (f,) = [f for f in dataclasses.fields(config) if f.name == self.dest]
        if f.default is not dataclasses.MISSING:
            return f.default
        if f.default_factory is not dataclasses.MISSING:
            return f.default_factory()
        return None

    def help_line(self, default: Any) -> str:
        return self.help.format(default=default)

    def said(self, help: str, *, chart: str | None = None, chart_differs: str = "") -> Setting:
        """This flag in one process's words (``help``), passed from ``chart`` there."""
        return dataclasses.replace(self, help=help, chart=chart, chart_differs=chart_differs)


@dataclass(frozen=True)
class RedisFlags:
    """Where a table takes the Redis flags (:mod:`mcpfleet.commands.redisflags`)."""

    url_help: str
    required: bool = False


@dataclass(frozen=True)
class Flags:
    """A process's flags in ``--help``'s order, their defaults from ``config``."""

    config: type
    rows: tuple[Setting | RedisFlags, ...]

    def settings(self) -> list[Setting]:
        return [row for row in self.rows if isinstance(row, Setting)]

    def defaults(self) -> dict[str, Any]:
        """Every flag's default, by flag."""
        return {s.flag: s.default_in(self.config) for s in self.settings()}


# Flags both processes take, declared once.
HOST = Setting("--host", "address to listen on")
PORT = Setting("--port", "port to listen on", port)
FLEET = Setting(
    "--fleet",
    "the fleet's name: its Redis keys' prefix, the same for every component",
    fleet_name,
)
REDIS_DEADLINE = Setting("--redis-deadline", "", positive)
REDIS_FAILOVER_WAIT = Setting("--redis-failover-wait", "", non_negative)
ALLOWED_HOST = Setting("--allowed-host", "", kind="repeat", field="allowed_hosts")
ALLOWED_ORIGIN = Setting("--allowed-origin", "", kind="repeat", field="allowed_origins")

#: The limits per principal, which ``mcpfleet dev`` passes on to its replicas too.
LIMIT_SETTINGS = (
    Setting(
        "--limit-sessions",
        "handshake sessions one principal holds at once, fleet-wide; 0: no limit"
        " (default {default})",
        non_negative_int,
        chart="server.limits.sessions",
    ),
    Setting(
        "--limit-listen",
        "subscriptions/listen streams one principal holds open at once, fleet-wide;"
        " 0: no limit (default {default})",
        non_negative_int,
        chart="server.limits.listen",
    ),
    Setting(
        "--limit-rounds",
        "requests per second one principal sends (initialize included), fleet-wide;"
        " 0: no limit (default {default:g})",
        non_negative,
        chart="server.limits.rounds.rate",
    ),
    Setting(
        "--limit-burst",
        "requests one principal may send at once past its rate (default {default})",
        non_negative_int,
        chart="server.limits.rounds.burst",
    ),
    Setting(
        "--limit-tasks",
        "MCP tasks one principal holds queued or running, fleet-wide; 0: no cap"
        " (default {default})",
        non_negative_int,
        chart="server.limits.tasks.cap",
    ),
    Setting(
        "--limit-tasks-running",
        "tasks of one principal the fleet's workers run at once (the rest wait while"
        " other principals' run); 0: no share (default {default})",
        non_negative_int,
        chart="server.limits.tasks.running",
    ),
    Setting(
        "--limits-file",
        "a JSON file of limits over these flags (per tool, per principal), read again"
        " when it changes (a ConfigMap's key)",
        Path,
    ),
    Setting(
        "--trusted-hops",
        "proxies in front of this replica (the router is one) whose X-Forwarded-For"
        " entries name an unauthenticated client (default {default}: the peer)",
        non_negative_int,
    ),
    Setting(
        "--anonymous-principal",
        "unauthenticated requests count per client address, or all as one principal"
        " (default {default})",
        choices=("address", "shared"),
        chart="server.limits.anonymousPrincipal",
    ),
)

#: ``mcpfleet serve``: one replica.
REPLICA_FLAGS = Flags(
    ReplicaConfig,
    (
        Setting("--app", "the FastMCP server, as module:attribute", chart="server.app"),
        HOST,
        PORT.said(PORT.help, chart="server.port"),
        Setting(
            "--keys", "key ring directory (a Secret volume)", Path, field="keys_dir", required=True
        ),
        RedisFlags("Redis for the registry (omit: standalone)"),
        Setting("--name", "replica name (default: $POD_NAME or host-port)", env=POD_NAME_ENV),
        Setting("--advertise", "URL other components reach this replica at", env=POD_IP_ENV),
        FLEET,
        Setting("--audience", "request-state audience (default: from --app)"),
        Setting("--state-ttl", "token TTL, s", positive, chart="server.stateTTL"),
        Setting(
            "--drain-timeout",
            "s a draining replica waits for its pinned sessions before it exits",
            positive,
            chart="server.drain.timeout",
        ),
        Setting(
            "--drain-linger",
            "s a draining replica stays up at least, so every router sees it draining",
            float,
            chart="server.drain.linger",
        ),
        Setting(
            "--drain-handover",
            "draining, hand idle sessions over to re-homing routers at once and wait only"
            " for requests in flight (with routers run with --rehome-sessions)",
            kind="switch",
        ),
        Setting(
            "--no-session-rehome",
            "routers may not re-open this app's sessions on another replica"
            " (for an app that keeps state of its own in a session; default: they may)",
            kind="off-switch",
            field="session_rehome",
            chart="server.sessionRehome",
        ),
        Setting(
            "--session-idle",
            "s an idle handshake session lives; must equal the router's --session-ttl",
            positive,
            chart="server.sessionIdle",
        ),
        Setting(
            "--heartbeat",
            "s between two attestations in Redis",
            positive,
            field="heartbeat_interval",
        ),
        Setting("--heartbeat-ttl", "s an attestation lives without a heartbeat", positive),
        ALLOWED_HOST.said("a Host also accepted", chart="server.allowedHosts"),
        ALLOWED_ORIGIN.said("an Origin accepted"),
        REDIS_DEADLINE.said(
            "s each Redis call of a once-flow may take (default {default})",
            chart="server.redisDeadline",
        ),
        REDIS_FAILOVER_WAIT.said(
            "s a once-flow's claim waits for a new master through Sentinel (default {default})",
            chart="server.redisFailoverWait",
        ),
        Setting(
            "--once-memory-limit",
            "share of Redis maxmemory past which new once-flows are refused and the SSE"
            " event store writes nothing; 0: no check (default {default})",
            share,
            chart="server.onceMemoryLimit",
        ),
        Setting(
            "--response-mode",
            "modern rounds: auto (JSON unless the request asked for progress or logs)"
            " or sse (every round in SSE mode) (default {default})",
            choices=("auto", "sse"),
        ),
        Setting(
            "--tasks-redelivery",
            "s after which a task whose worker died runs again on another replica"
            " (apps with MCP tasks; default {default})",
            positive,
            chart="server.tasks.redelivery",
        ),
        Setting(
            "--tasks-concurrency",
            "tasks one replica runs at once (default {default})",
            positive_int,
            chart="server.tasks.concurrency",
        ),
        Setting(
            "--tasks-deadline",
            "s a task request may wait on Redis before its error (default {default})",
            positive,
            chart="server.tasks.deadline",
        ),
        Setting(
            "--tasks-encrypt",
            "encrypt stored task snapshots under keys derived from the key ring (--keys)",
            kind="switch",
            chart="server.tasks.encrypt",
        ),
        Setting(
            "--listen-streams",
            "subscriptions/listen streams this replica serves at once; more are refused"
            " (default {default})",
            positive_int,
            chart="server.listenStreams",
        ),
        Setting(
            "--sse-events",
            "events kept per handshake SSE stream in Redis, so a cut stream resumes with"
            " Last-Event-ID; 0: no event store, one Redis write less per event"
            " (default {default})",
            non_negative_int,
            chart="server.sseEvents",
        ),
        Setting(
            "--sse-ttl",
            "s an SSE event stays resumable (default {default:g})",
            positive,
            chart="server.sseTtl",
        ),
        *LIMIT_SETTINGS,
    ),
)

#: ``mcpfleet router``: the sticky router.
ROUTER_FLAGS = Flags(
    RouterConfig,
    (
        HOST,
        PORT.said(PORT.help, chart="router.port"),
        RedisFlags("Redis for the routing table", required=True),
        FLEET,
        Setting(
            "--session-ttl",
            "s an idle session's route lives; must equal the replicas' --session-idle",
            positive,
            chart="server.sessionIdle",
        ),
        Setting(
            "--session-cap",
            "max sessions per replica (default: no cap)",
            int,
            chart="router.sessionCap",
            chart_differs="the chart caps each replica at 1000 sessions; a router run by hand has"
            " no cap",
        ),
        Setting(
            "--refresh-interval",
            "s between reads of the replica registry; a refused connection reads it"
            " at once (default {default})",
            positive,
        ),
        REDIS_DEADLINE.said(
            "s each Redis call on a request's path may take (default {default})",
            chart="router.redisDeadline",
        ),
        REDIS_FAILOVER_WAIT.said(
            "s a session lookup the cache cannot answer waits for a new master through"
            " Sentinel (default {default})",
            chart="router.redisFailoverWait",
        ),
        Setting(
            "--graceful-timeout",
            "s requests and streams in flight may finish after SIGTERM (default {default})",
            positive_int,
            chart="router.gracefulTimeout",
            chart_differs="the chart gives requests and streams in flight 10 s, counted in"
            " the Pod's terminationGracePeriodSeconds",
        ),
        Setting(
            "--drain-linger",
            "s after SIGTERM the router still serves, answering Connection: close,"
            " before its graceful shutdown (default {default})",
            non_negative,
            chart="router.drainLinger",
        ),
        Setting(
            "--rehome-sessions",
            "re-open an idle handshake session on a live replica when its own is gone,"
            " keeping its Mcp-Session-Id (docs/rehome.md; default off)",
            kind="switch",
            chart="router.rehomeSessions",
        ),
        Setting(
            "--rehome-timeout",
            "s a re-home may take, then 503 with Retry-After (default {default})",
            positive,
        ),
        Setting("--max-body-bytes", "largest request body read; past it, 413", int),
        Setting(
            "--max-header-bytes",
            "largest request header block, counted as it arrives; past it, 431",
            int,
        ),
        Setting(
            "--header-timeout",
            "s a client has to send its request line and headers; past it, 408",
            positive,
        ),
        Setting(
            "--body-timeout", "s a client has to send its request body; past it, 408", positive
        ),
        Setting(
            "--max-connections",
            "open client connections at once; past it, a JSON-RPC 503 at once (default {default})",
            positive_int,
        ),
        Setting(
            "--redis-pool-size",
            "Redis connections the router opens at most (default {default})",
            positive_int,
            chart="router.redisPoolSize",
        ),
        Setting(
            "--redis-pool-wait",
            "s a lookup waits for a free Redis connection, then 503 'Router busy'"
            " (default {default})",
            positive,
            chart="router.redisPoolWait",
        ),
        Setting(
            "--unknown-session-ttl",
            "s an id Redis does not know is answered 404 without asking again (default {default})",
            non_negative,
            chart="router.unknownSessionTTL",
        ),
        ALLOWED_HOST.said(
            "a Host the fleet answers (repeatable; name:* for any port);"
            " default: loopback names when bound to loopback, else any",
            chart="router.allowedHosts",
        ),
        ALLOWED_ORIGIN.said(
            "a browser Origin allowed (repeatable; scheme://name:* for any port);"
            " default: loopback origins when bound to loopback, else none",
            chart="router.allowedOrigins",
        ),
    ),
)

#: Each process's flags, by its command.
SETTINGS: dict[str, Flags] = {"serve": REPLICA_FLAGS, "router": ROUTER_FLAGS}
