"""The flags of the limits per principal (:mod:`mcpfleet.limits`).

``serve``'s table ends with them, and ``mcpfleet dev`` passes them on to its
replicas (:mod:`mcpfleet.commands.limitflags`).
"""

from __future__ import annotations

from pathlib import Path

from mcpfleet.config._settings import Setting
from mcpfleet.config._types import non_negative, non_negative_int

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
