"""``mcpfleet router``'s flags: the sticky router's table, in ``--help``'s order.

Each flag's default is its :class:`RouterConfig` field's, unless the row names one.
"""

from __future__ import annotations

from mcpfleet.config._configs import RouterConfig
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
from mcpfleet.config._types import non_negative, positive, positive_int

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
