"""``mcpfleet serve``: one replica of a FastMCP app."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from mcpfleet.commands import (
    UsageError,
    add_fleet_flag,
    add_listen_flags,
    config_from_args,
    limitflags,
    non_negative,
    non_negative_int,
    positive,
    positive_int,
    redis_fields,
    redis_settings,
    redisflags,
    share,
)
from mcpfleet.config import ReplicaConfig

COMMANDS = ("serve",)


def add_parsers(sub: Any) -> None:
    # Every default comes from the config dataclass (mcpfleet.config); each flag's
    # dest is its field's name (config_from_args).
    rep = ReplicaConfig
    s = sub.add_parser("serve", help="run one replica of a FastMCP app")
    s.add_argument("--app", default=rep.app, help="the FastMCP server, as module:attribute")
    add_listen_flags(s, rep)
    s.add_argument(
        "--keys",
        dest="keys_dir",
        metavar="KEYS",
        type=Path,
        required=True,
        help="key ring directory (a Secret volume)",
    )
    redisflags.add_flags(s, url_help="Redis for the registry (omit: standalone)")
    s.add_argument("--name", default="", help="replica name (default: $POD_NAME or host-port)")
    s.add_argument("--advertise", default="", help="URL other components reach this replica at")
    add_fleet_flag(s, rep.fleet)
    s.add_argument("--audience", default="", help="request-state audience (default: from --app)")
    s.add_argument("--state-ttl", type=positive, default=rep.state_ttl, help="token TTL, s")
    s.add_argument(
        "--drain-timeout",
        type=positive,
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
        "--drain-handover",
        action="store_true",
        default=rep.drain_handover,
        help="draining, hand idle sessions over to re-homing routers at once and wait only"
        " for requests in flight (with routers run with --rehome-sessions)",
    )
    s.add_argument(
        "--no-session-rehome",
        dest="session_rehome",
        action="store_false",
        default=rep.session_rehome,
        help="routers may not re-open this app's sessions on another replica"
        " (for an app that keeps state of its own in a session; default: they may)",
    )
    s.add_argument(
        "--session-idle",
        type=positive,
        default=rep.session_idle,
        help="s an idle handshake session lives; must equal the router's --session-ttl",
    )
    s.add_argument(
        "--heartbeat",
        dest="heartbeat_interval",
        metavar="HEARTBEAT",
        type=positive,
        default=rep.heartbeat_interval,
        help="s between two attestations in Redis",
    )
    s.add_argument(
        "--heartbeat-ttl",
        type=positive,
        default=rep.heartbeat_ttl,
        help="s an attestation lives without a heartbeat",
    )
    s.add_argument(
        "--allowed-host",
        dest="allowed_hosts",
        metavar="ALLOWED_HOST",
        action="append",
        default=[],
        help="a Host also accepted",
    )
    s.add_argument(
        "--allowed-origin",
        dest="allowed_origins",
        metavar="ALLOWED_ORIGIN",
        action="append",
        default=[],
        help="an Origin accepted",
    )
    s.add_argument(
        "--redis-deadline",
        type=positive,
        default=rep.redis_deadline,
        help=f"s each Redis call of a once-flow may take (default {rep.redis_deadline})",
    )
    s.add_argument(
        "--redis-failover-wait",
        type=non_negative,
        default=rep.redis_failover_wait,
        help="s a once-flow's claim waits for a new master through Sentinel"
        f" (default {rep.redis_failover_wait})",
    )
    s.add_argument(
        "--once-memory-limit",
        type=share,
        default=rep.once_memory_limit,
        help="share of Redis maxmemory past which new once-flows are refused and the SSE"
        f" event store writes nothing; 0: no check (default {rep.once_memory_limit})",
    )
    s.add_argument(
        "--response-mode",
        choices=("auto", "sse"),
        default=rep.response_mode,
        help="modern rounds: auto (JSON unless the request asked for progress or logs)"
        f" or sse (every round in SSE mode) (default {rep.response_mode})",
    )
    s.add_argument(
        "--tasks-redelivery",
        type=positive,
        default=rep.tasks_redelivery,
        help="s after which a task whose worker died runs again on another replica"
        f" (apps with MCP tasks; default {rep.tasks_redelivery})",
    )
    s.add_argument(
        "--tasks-concurrency",
        type=positive_int,
        default=rep.tasks_concurrency,
        help=f"tasks one replica runs at once (default {rep.tasks_concurrency})",
    )
    s.add_argument(
        "--tasks-deadline",
        type=positive,
        default=rep.tasks_deadline,
        help=f"s a task request may wait on Redis before its error (default {rep.tasks_deadline})",
    )
    s.add_argument(
        "--tasks-encrypt",
        action="store_true",
        default=rep.tasks_encrypt,
        help="encrypt stored task snapshots under keys derived from the key ring (--keys)",
    )
    s.add_argument(
        "--listen-streams",
        type=positive_int,
        default=rep.listen_streams,
        help="subscriptions/listen streams this replica serves at once; more are refused"
        f" (default {rep.listen_streams})",
    )
    s.add_argument(
        "--sse-events",
        type=non_negative_int,
        default=rep.sse_events,
        help="events kept per handshake SSE stream in Redis, so a cut stream resumes with"
        " Last-Event-ID; 0: no event store, one Redis write less per event"
        f" (default {rep.sse_events})",
    )
    s.add_argument(
        "--sse-ttl",
        type=positive,
        default=rep.sse_ttl,
        help=f"s an SSE event stays resumable (default {rep.sse_ttl:g})",
    )
    limitflags.add_flags(s, rep)


def run(args: argparse.Namespace) -> int:
    config = config_from_args(ReplicaConfig, args, **redis_fields(redis_settings(args)))
    from mcpfleet.keys.ring import KeyRingError
    from mcpfleet.replica.runtime import run_replica

    try:
        run_replica(config)
    except KeyRingError as exc:
        raise UsageError(f"no valid key ring: {exc}") from None
    return 0
