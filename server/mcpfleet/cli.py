"""The ``mcpfleet`` command line.

Subcommands: ``serve`` (one replica), ``router``, ``keys`` (generate and
rotate a local key ring directory), ``dev`` (a whole local fleet), ``demo``
(a real client run against a fleet), ``operator`` and ``rotate`` (the key
ring operator and its client, in ``mcpfleet_operator.cli``). Errors a user
can fix are printed as one clear line and exit with status 2; nothing prints
key material.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from mcpfleet import __version__, redisconn
from mcpfleet.config import DEFAULT_APP, ReplicaConfig, RouterConfig
from mcpfleet.contract import check_fleet_name
from mcpfleet.redisconn import RedisFiles, RedisSettings
from mcpfleet.replica.appload import AppLoadError

log = logging.getLogger("mcpfleet")


class UsageError(Exception):
    """A problem the user can fix; printed as one line, exit status 2."""


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _non_negative(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"not a port: {text}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def _share(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return value


def _fleet(text: str) -> str:
    try:
        return check_fleet_name(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _redis(args: argparse.Namespace) -> RedisSettings | None:
    """The checked Redis settings of ``serve``/``router``; a UsageError names what to fix."""
    if not args.redis:
        return None
    try:
        return redisconn.from_args(args)
    except redisconn.RedisConfigError as exc:
        raise UsageError(str(exc)) from None


class HelpWithDefaults(argparse.HelpFormatter):
    """Every flag's help line ends with its default, unless it names one already
    (or has none worth naming: a switch, an empty list, no value)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            not action.option_strings
            or "default" in text
            or default is None
            or default is argparse.SUPPRESS
            or isinstance(default, bool)
            or default in ([], "", ())
        ):
            return text
        return f"{text} (default: %(default)s)"


#: The entry-point group through which installed packages add subcommands.
COMMANDS_GROUP = "mcpfleet.commands"


def command_plugins() -> list[Any]:
    """The installed packages' subcommand modules (``COMMANDS``, ``add_parsers``, ``run``).

    The operator registers its ``operator`` and ``rotate`` here (pyproject's
    entry points), so this module, and the server package, never import it.
    """
    return [ep.load() for ep in sorted(entry_points(group=COMMANDS_GROUP), key=lambda e: e.name)]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mcpfleet", description=__doc__.splitlines()[0] if __doc__ else ""
    )
    p.add_argument("--version", action="version", version=f"mcpfleet {__version__}")
    p.add_argument(
        "--log-level",
        default=os.environ.get("MCPFLEET_LOG_LEVEL", "INFO"),
        help="DEBUG, INFO, WARNING or ERROR ($MCPFLEET_LOG_LEVEL)",
    )
    sub = p.add_subparsers(dest="command", required=True)

    # Every default comes from the config dataclasses (mcpfleet.config).
    rep, rtr = ReplicaConfig, RouterConfig
    s = sub.add_parser("serve", help="run one replica of a FastMCP app")
    s.add_argument("--app", default=rep.app, help="the FastMCP server, as module:attribute")
    s.add_argument("--host", default=rep.host, help="address to listen on")
    s.add_argument("--port", type=_port, default=rep.port, help="port to listen on")
    s.add_argument("--keys", type=Path, required=True, help="key ring directory (a Secret volume)")
    redisconn.add_flags(s, url_help="Redis for the registry (omit: standalone)")
    s.add_argument("--name", default="", help="replica name (default: $POD_NAME or host-port)")
    s.add_argument("--advertise", default="", help="URL other components reach this replica at")
    s.add_argument(
        "--fleet",
        type=_fleet,
        default=rep.fleet,
        help="the fleet's name: its Redis keys' prefix, the same for every component",
    )
    s.add_argument("--audience", default="", help="request-state audience (default: from --app)")
    s.add_argument("--state-ttl", type=_positive, default=rep.state_ttl, help="token TTL, s")
    s.add_argument(
        "--drain-timeout",
        type=_positive,
        default=rep.drain_timeout,
        help="s a draining replica waits for its pinned sessions before it exits",
    )
    s.add_argument(
        "--drain-linger",
        type=float,
        default=rep.drain_linger,
        help="s a draining replica stays up at least, so every router sees it draining",
    )
    s.add_argument(
        "--session-idle",
        type=_positive,
        default=rep.session_idle,
        help="s an idle handshake session lives; must equal the router's --session-ttl",
    )
    s.add_argument(
        "--heartbeat",
        type=_positive,
        default=rep.heartbeat_interval,
        help="s between two attestations in Redis",
    )
    s.add_argument(
        "--heartbeat-ttl",
        type=_positive,
        default=rep.heartbeat_ttl,
        help="s an attestation lives without a heartbeat",
    )
    s.add_argument("--allowed-host", action="append", default=[], help="a Host also accepted")
    s.add_argument("--allowed-origin", action="append", default=[], help="an Origin accepted")
    s.add_argument(
        "--redis-deadline",
        type=_positive,
        default=rep.redis_deadline,
        help=f"s each Redis call of a once-flow may take (default {rep.redis_deadline})",
    )
    s.add_argument(
        "--redis-failover-wait",
        type=_non_negative,
        default=rep.redis_failover_wait,
        help="s a once-flow's claim waits for a new master through Sentinel"
        f" (default {rep.redis_failover_wait})",
    )
    s.add_argument(
        "--once-memory-limit",
        type=_share,
        default=rep.once_memory_limit,
        help="share of Redis maxmemory past which new once-flows are refused; 0: no check"
        f" (default {rep.once_memory_limit})",
    )
    s.add_argument(
        "--tasks-redelivery",
        type=_positive,
        default=rep.tasks_redelivery,
        help="s after which a task whose worker died runs again on another replica"
        f" (apps with MCP tasks; default {rep.tasks_redelivery})",
    )
    s.add_argument(
        "--tasks-concurrency",
        type=_positive_int,
        default=rep.tasks_concurrency,
        help=f"tasks one replica runs at once (default {rep.tasks_concurrency})",
    )
    s.add_argument(
        "--tasks-deadline",
        type=_positive,
        default=rep.tasks_deadline,
        help=f"s a task request may wait on Redis before its error (default {rep.tasks_deadline})",
    )

    r = sub.add_parser("router", help="run the sticky router")
    r.add_argument("--host", default=rtr.host, help="address to listen on")
    r.add_argument("--port", type=_port, default=rtr.port, help="port to listen on")
    redisconn.add_flags(r, url_help="Redis for the routing table", required=True)
    r.add_argument(
        "--fleet",
        type=_fleet,
        default=rtr.fleet,
        help="the fleet's name: its Redis keys' prefix, the same for every component",
    )
    r.add_argument(
        "--session-ttl",
        type=_positive,
        default=rtr.session_ttl,
        help="s an idle session's route lives; must equal the replicas' --session-idle",
    )
    r.add_argument(
        "--session-cap",
        type=int,
        default=None,
        help="max sessions per replica (default: no cap)",
    )
    r.add_argument(
        "--redis-deadline",
        type=_positive,
        default=rtr.redis_deadline,
        help=f"s each Redis call on a request's path may take (default {rtr.redis_deadline})",
    )
    r.add_argument(
        "--graceful-timeout",
        type=_positive_int,
        default=rtr.graceful_timeout,
        help="s requests and streams in flight may finish after SIGTERM"
        f" (default {rtr.graceful_timeout})",
    )
    r.add_argument(
        "--drain-linger",
        type=_non_negative,
        default=rtr.drain_linger,
        help="s after SIGTERM the router still serves, answering Connection: close,"
        f" before its graceful shutdown (default {rtr.drain_linger})",
    )
    r.add_argument(
        "--max-body-bytes",
        type=int,
        default=rtr.max_body_bytes,
        help="largest request body read; past it, 413",
    )
    r.add_argument(
        "--max-header-bytes",
        type=int,
        default=rtr.max_header_bytes,
        help="largest request header block, counted as it arrives; past it, 431",
    )
    r.add_argument(
        "--header-timeout",
        type=_positive,
        default=rtr.header_timeout,
        help="s a client has to send its request line and headers; past it, 408",
    )
    r.add_argument(
        "--body-timeout",
        type=_positive,
        default=rtr.body_timeout,
        help="s a client has to send its request body; past it, 408",
    )
    r.add_argument(
        "--max-connections",
        type=_positive_int,
        default=rtr.max_connections,
        help="open client connections at once; past it, a JSON-RPC 503 at once "
        f"(default {rtr.max_connections})",
    )
    r.add_argument(
        "--redis-pool-size",
        type=_positive_int,
        default=rtr.redis_pool_size,
        help=f"Redis connections the router opens at most (default {rtr.redis_pool_size})",
    )
    r.add_argument(
        "--redis-pool-wait",
        type=_positive,
        default=rtr.redis_pool_wait,
        help="s a lookup waits for a free Redis connection, then 503 'Router busy'"
        f" (default {rtr.redis_pool_wait})",
    )
    r.add_argument(
        "--unknown-session-ttl",
        type=_non_negative,
        default=rtr.unknown_session_ttl,
        help="s an id Redis does not know is answered 404 without asking again"
        f" (default {rtr.unknown_session_ttl})",
    )
    r.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        help="a Host the fleet answers (repeatable; name:* for any port);"
        " default: loopback names when bound to loopback, else any",
    )
    r.add_argument(
        "--allowed-origin",
        action="append",
        default=[],
        help="a browser Origin allowed (repeatable; scheme://name:* for any port);"
        " default: loopback origins when bound to loopback, else none",
    )

    k = sub.add_parser("keys", help="create or rotate a local key ring directory")
    k.add_argument(
        "action",
        choices=["generate", "stage", "promote", "retire", "abort", "show"],
        help="what to do to the ring",
    )
    k.add_argument("dir", type=Path, help="the key ring directory")
    k.add_argument("--force", action="store_true", help="generate over an existing ring")

    d = sub.add_parser("dev", help="run a whole fleet on 127.0.0.1 until Ctrl-C")
    d.add_argument("--replicas", type=int, default=3, help="replica processes")
    d.add_argument("--port", type=_port, default=8000, help="the router's port")
    d.add_argument("--app", default=DEFAULT_APP, help="the FastMCP server, as module:attribute")
    d.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="where keys, logs and Redis data go (default: a new temporary directory)",
    )

    m = sub.add_parser("demo", help="book a flight through a fleet and show where rounds land")
    m.add_argument("--url", default="http://127.0.0.1:8000/mcp", help="the fleet's MCP endpoint")
    m.add_argument(
        "--era",
        choices=["modern", "handshake"],
        default="modern",
        help="the protocol era the client speaks",
    )

    t = sub.add_parser(
        "selftest",
        help="both eras through a fleet: initialize and tools/list, or an auth app's 401",
    )
    t.add_argument("url", help="the fleet's MCP endpoint, e.g. http://mcpfleet-router/mcp")
    for plugin in command_plugins():
        plugin.add_parsers(sub)  # e.g. mcpfleet_operator.cli: `operator` and `rotate`
    p.formatter_class = HelpWithDefaults
    for parser in sub.choices.values():
        parser.formatter_class = HelpWithDefaults
    return p


def cmd_keys(action: str, directory: Path, force: bool) -> None:
    from mcpfleet.keys.files import read_ring, write_ring
    from mcpfleet.keys.ring import KeyRing, KeyRingError

    try:
        if action == "generate":
            if not force and directory.exists() and any(directory.iterdir()):
                raise UsageError(f"{directory} is not empty; pass --force to replace its ring")
            ring = KeyRing.generate()
        elif action == "show":
            ring = read_ring(directory)
            print(f"phase {ring.phase}, kids {' '.join(ring.kids)} (first seals)")
            return
        else:
            ring = getattr(read_ring(directory), action)()
        write_ring(directory, ring)
    except KeyRingError as exc:
        raise UsageError(str(exc)) from None
    print(f"{action}: {directory} now holds kids {' '.join(ring.kids)} ({ring.phase}; first seals)")


def cmd_dev(replicas: int, port: int, app: str, workdir: Path | None) -> None:
    import shutil

    from mcpfleet.dev.fleet import FleetError, LocalFleet, start_monitoring
    from mcpfleet.dev.supervisor import Supervisor
    from mcpfleet.dev.wait import WaitTimeout

    if replicas < 1:
        raise UsageError("--replicas must be at least 1")
    work = workdir or Path(tempfile.mkdtemp(prefix="mcpfleet-dev-"))
    if shutil.which("redis-server") is None:
        print(
            "redis-server not found (install: apt-get install redis-server).\n"
            "Falling back to embedded mode: ONE replica, no Redis, no router.",
            file=sys.stderr,
        )
        from mcpfleet.keys.files import write_ring
        from mcpfleet.keys.ring import KeyRing
        from mcpfleet.replica.runtime import run_replica

        write_ring(work / "keys", KeyRing.generate())
        print(f"mcpfleet (embedded) serving {app} at http://127.0.0.1:{port}/mcp", flush=True)
        run_replica(ReplicaConfig(keys_dir=work / "keys", app=app, port=port, name="replica-0"))
        return
    fleet = LocalFleet(
        work,
        replicas=replicas,
        port=port,
        app=app,
        fleet="dev",
        replica_args=("--drain-timeout", "5"),
    )
    stop = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        fleet.start()
    except (FleetError, WaitTimeout) as exc:
        fleet.stop()
        for name, tail in fleet.logs():
            print(f"--- {name} ---\n{tail}", file=sys.stderr)
        raise UsageError(f"the fleet did not start: {exc}") from None
    print(f"mcpfleet dev: {replicas} replica(s) behind the router at {fleet.url}")
    print(f"  redis {fleet.redis_url}, key ring {fleet.keys_dir}, logs in {work}")
    prometheus = start_monitoring(fleet, work / "prometheus")
    print(
        f"  try: mcpfleet demo --url {fleet.url} --era modern   (Ctrl-C stops the fleet)",
        flush=True,
    )
    supervisor = Supervisor(fleet, say=lambda line: print(f"mcpfleet dev: {line}", flush=True))
    try:
        while not stop:
            supervisor.tick(time.monotonic())
            time.sleep(0.25)
    finally:
        print("stopping the fleet", flush=True)
        if prometheus is not None:
            prometheus.stop()
        fleet.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # Per-request client logs would drown the fleet's own; they say nothing new.
    for noisy in ("httpx", "httpx2"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        if args.command == "serve":
            redis = _redis(args)
            from mcpfleet.keys.ring import KeyRingError
            from mcpfleet.replica.runtime import run_replica

            try:
                run_replica(
                    ReplicaConfig(
                        keys_dir=args.keys,
                        app=args.app,
                        host=args.host,
                        port=args.port,
                        name=args.name,
                        advertise=args.advertise,
                        redis_url=redis.url if redis else None,
                        redis_files=redis.files if redis else RedisFiles(),
                        fleet=args.fleet,
                        audience=args.audience,
                        state_ttl=args.state_ttl,
                        drain_timeout=args.drain_timeout,
                        drain_linger=args.drain_linger,
                        session_idle=args.session_idle,
                        allowed_hosts=tuple(args.allowed_host),
                        allowed_origins=tuple(args.allowed_origin),
                        heartbeat_interval=args.heartbeat,
                        heartbeat_ttl=args.heartbeat_ttl,
                        redis_deadline=args.redis_deadline,
                        redis_failover_wait=args.redis_failover_wait,
                        once_memory_limit=args.once_memory_limit,
                        tasks_redelivery=args.tasks_redelivery,
                        tasks_concurrency=args.tasks_concurrency,
                        tasks_deadline=args.tasks_deadline,
                    )
                )
            except KeyRingError as exc:
                raise UsageError(f"no valid key ring: {exc}") from None
        elif args.command == "router":
            router_redis = _redis(args)
            assert router_redis is not None  # --redis is required
            if args.redis_pool_wait >= args.redis_deadline:
                # A lookup's deadline would cut its pool wait short, and a full
                # pool would be taken for Redis down.
                parser.error(
                    f"--redis-pool-wait ({args.redis_pool_wait:g}) must be below "
                    f"--redis-deadline ({args.redis_deadline:g})"
                )
            from mcpfleet.router.proxy import run_router

            run_router(
                RouterConfig(
                    redis_url=router_redis.url,
                    redis_files=router_redis.files,
                    host=args.host,
                    port=args.port,
                    fleet=args.fleet,
                    session_ttl=args.session_ttl,
                    session_cap=args.session_cap,
                    redis_deadline=args.redis_deadline,
                    graceful_timeout=args.graceful_timeout,
                    drain_linger=args.drain_linger,
                    max_body_bytes=args.max_body_bytes,
                    max_header_bytes=args.max_header_bytes,
                    header_timeout=args.header_timeout,
                    body_timeout=args.body_timeout,
                    max_connections=args.max_connections,
                    redis_pool_size=args.redis_pool_size,
                    redis_pool_wait=args.redis_pool_wait,
                    unknown_session_ttl=args.unknown_session_ttl,
                    allowed_hosts=tuple(args.allowed_host),
                    allowed_origins=tuple(args.allowed_origin),
                )
            )
        elif args.command == "keys":
            cmd_keys(args.action, args.dir, args.force)
        elif args.command == "dev":
            cmd_dev(args.replicas, args.port, args.app, args.workdir)
        elif args.command == "demo":
            from mcpfleet.dev.demo import run_demo

            asyncio.run(run_demo(args.url, args.era))
        elif args.command == "selftest":
            from mcpfleet.selftest import selftest

            return asyncio.run(selftest(args.url))
        else:
            plugin = next(p for p in command_plugins() if args.command in p.COMMANDS)
            return int(plugin.run(args))
    except (UsageError, AppLoadError) as exc:
        print(f"mcpfleet: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
