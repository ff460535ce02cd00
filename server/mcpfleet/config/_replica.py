"""``mcpfleet serve``'s flags: one replica's table, in ``--help``'s order.

Each flag's default is its :class:`ReplicaConfig` field's, unless the row names one.
"""

from __future__ import annotations

from pathlib import Path

from mcpfleet.config._configs import POD_IP_ENV, POD_NAME_ENV, ReplicaConfig
from mcpfleet.config._limits import LIMIT_SETTINGS
from mcpfleet.config._settings import Flags, RedisFlags, Setting
from mcpfleet.config._shared import (
    ALLOWED_HOST,
    ALLOWED_ORIGIN,
    FLEET,
    HOST,
    PORT,
    REDIS_DEADLINE,
    REDIS_FAILOVER_WAIT,
)
from mcpfleet.config._types import non_negative_int, positive, positive_int, share

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
