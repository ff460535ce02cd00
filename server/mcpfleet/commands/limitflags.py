"""The flags of the limits per principal (``mcpfleet serve``): defaults from ReplicaConfig.

A number 0 turns its limit off. The limits file (``--limits-file``, JSON,
mcpfleet.limits) sets the same and more (per tool, per principal) over them,
and is read again when it changes.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from mcpfleet.commands import non_negative, non_negative_int


def add_flags(s: argparse.ArgumentParser, rep: Any) -> None:
    """The limit flags of ``serve``; each flag's dest is its ReplicaConfig field."""
    s.add_argument(
        "--limit-sessions",
        type=non_negative_int,
        default=rep.limit_sessions,
        help="handshake sessions one principal holds at once, fleet-wide; 0: no limit"
        f" (default {rep.limit_sessions})",
    )
    s.add_argument(
        "--limit-listen",
        type=non_negative_int,
        default=rep.limit_listen,
        help="subscriptions/listen streams one principal holds open at once, fleet-wide;"
        f" 0: no limit (default {rep.limit_listen})",
    )
    s.add_argument(
        "--limit-rounds",
        type=non_negative,
        default=rep.limit_rounds,
        help="requests per second one principal sends (initialize included), fleet-wide;"
        " 0: no limit"
        f" (default {rep.limit_rounds:g})",
    )
    s.add_argument(
        "--limit-burst",
        type=non_negative_int,
        default=rep.limit_burst,
        help=f"requests one principal may send at once past its rate (default {rep.limit_burst})",
    )
    s.add_argument(
        "--limit-tasks",
        type=non_negative_int,
        default=rep.limit_tasks,
        help="MCP tasks one principal holds queued or running, fleet-wide; 0: no cap"
        f" (default {rep.limit_tasks})",
    )
    s.add_argument(
        "--limit-tasks-running",
        type=non_negative_int,
        default=rep.limit_tasks_running,
        help="tasks of one principal the fleet's workers run at once (the rest wait while"
        f" other principals' run); 0: no share (default {rep.limit_tasks_running})",
    )
    _principal_flags(s, rep)


def _principal_flags(s: argparse.ArgumentParser, rep: Any) -> None:
    """The limits file and who a request counts against."""
    s.add_argument(
        "--limits-file",
        type=Path,
        default=rep.limits_file,
        help="a JSON file of limits over these flags (per tool, per principal), read again"
        " when it changes (a ConfigMap's key)",
    )
    s.add_argument(
        "--trusted-hops",
        type=non_negative_int,
        default=rep.trusted_hops,
        help="proxies in front of this replica (the router is one) whose X-Forwarded-For"
        f" entries name an unauthenticated client (default {rep.trusted_hops}: the peer)",
    )
    s.add_argument(
        "--anonymous-principal",
        choices=("address", "shared"),
        default=rep.anonymous_principal,
        help="unauthenticated requests count per client address, or all as one principal"
        f" (default {rep.anonymous_principal})",
    )
