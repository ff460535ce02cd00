"""``mcpfleet selftest``: both eras through a fleet (the chart's ``helm test``)."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

COMMANDS = ("selftest",)


def add_parsers(sub: Any) -> None:
    t = sub.add_parser(
        "selftest",
        help="both eras through a fleet: initialize and tools/list, or an auth app's 401",
    )
    t.add_argument("url", help="the fleet's MCP endpoint, e.g. http://mcpfleet-router/mcp")


def run(args: argparse.Namespace) -> int:
    from mcpfleet.selftest import selftest

    return asyncio.run(selftest(args.url))
