"""``mcpfleet router``: the sticky router in front of a fleet's replicas."""

from __future__ import annotations

import argparse
from typing import Any

from mcpfleet.commands import (
    UsageError,
    add_fleet_flag,
    add_listen_flags,
    config_from_args,
    non_negative,
    positive,
    positive_int,
    redis_fields,
    redis_settings,
    redisflags,
)
from mcpfleet.config import RouterConfig

COMMANDS = ("router",)


def add_parsers(sub: Any) -> None:
    # Every default comes from the config dataclass (mcpfleet.config); each flag's
    # dest is its field's name (config_from_args).
    rtr = RouterConfig
    r = sub.add_parser("router", help="run the sticky router")
    add_listen_flags(r, rtr)
    redisflags.add_flags(r, url_help="Redis for the routing table", required=True)
    add_fleet_flag(r, rtr.fleet)
    r.add_argument(
        "--session-ttl",
        type=positive,
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
        "--refresh-interval",
        type=positive,
        default=rtr.refresh_interval,
        help="s between reads of the replica registry; a refused connection reads it"
        f" at once (default {rtr.refresh_interval})",
    )
    r.add_argument(
        "--redis-deadline",
        type=positive,
        default=rtr.redis_deadline,
        help=f"s each Redis call on a request's path may take (default {rtr.redis_deadline})",
    )
    r.add_argument(
        "--redis-failover-wait",
        type=non_negative,
        default=rtr.redis_failover_wait,
        help="s a session lookup the cache cannot answer waits for a new master through"
        f" Sentinel (default {rtr.redis_failover_wait})",
    )
    r.add_argument(
        "--graceful-timeout",
        type=positive_int,
        default=rtr.graceful_timeout,
        help="s requests and streams in flight may finish after SIGTERM"
        f" (default {rtr.graceful_timeout})",
    )
    r.add_argument(
        "--drain-linger",
        type=non_negative,
        default=rtr.drain_linger,
        help="s after SIGTERM the router still serves, answering Connection: close,"
        f" before its graceful shutdown (default {rtr.drain_linger})",
    )
    r.add_argument(
        "--rehome-sessions",
        action="store_true",
        default=rtr.rehome_sessions,
        help="re-open an idle handshake session on a live replica when its own is gone,"
        " keeping its Mcp-Session-Id (docs/rehome.md; default off)",
    )
    r.add_argument(
        "--rehome-timeout",
        type=positive,
        default=rtr.rehome_timeout,
        help=f"s a re-home may take, then 503 with Retry-After (default {rtr.rehome_timeout})",
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
        type=positive,
        default=rtr.header_timeout,
        help="s a client has to send its request line and headers; past it, 408",
    )
    r.add_argument(
        "--body-timeout",
        type=positive,
        default=rtr.body_timeout,
        help="s a client has to send its request body; past it, 408",
    )
    r.add_argument(
        "--max-connections",
        type=positive_int,
        default=rtr.max_connections,
        help="open client connections at once; past it, a JSON-RPC 503 at once "
        f"(default {rtr.max_connections})",
    )
    r.add_argument(
        "--redis-pool-size",
        type=positive_int,
        default=rtr.redis_pool_size,
        help=f"Redis connections the router opens at most (default {rtr.redis_pool_size})",
    )
    r.add_argument(
        "--redis-pool-wait",
        type=positive,
        default=rtr.redis_pool_wait,
        help="s a lookup waits for a free Redis connection, then 503 'Router busy'"
        f" (default {rtr.redis_pool_wait})",
    )
    r.add_argument(
        "--unknown-session-ttl",
        type=non_negative,
        default=rtr.unknown_session_ttl,
        help="s an id Redis does not know is answered 404 without asking again"
        f" (default {rtr.unknown_session_ttl})",
    )
    r.add_argument(
        "--allowed-host",
        dest="allowed_hosts",
        metavar="ALLOWED_HOST",
        action="append",
        default=[],
        help="a Host the fleet answers (repeatable; name:* for any port);"
        " default: loopback names when bound to loopback, else any",
    )
    r.add_argument(
        "--allowed-origin",
        dest="allowed_origins",
        metavar="ALLOWED_ORIGIN",
        action="append",
        default=[],
        help="a browser Origin allowed (repeatable; scheme://name:* for any port);"
        " default: loopback origins when bound to loopback, else none",
    )


def run(args: argparse.Namespace) -> int:
    redis = redis_settings(args)
    assert redis is not None  # --redis is required
    if args.redis_pool_wait >= args.redis_deadline:
        # A lookup's deadline would cut its pool wait short, and a full pool
        # would be taken for Redis down.
        raise UsageError(
            f"--redis-pool-wait ({args.redis_pool_wait:g}) must be below "
            f"--redis-deadline ({args.redis_deadline:g})"
        )
    config = config_from_args(RouterConfig, args, **redis_fields(redis))
    from mcpfleet.router.serve import run_router

    run_router(config)
    return 0
