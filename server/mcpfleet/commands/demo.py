"""``mcpfleet demo``: book a flight through a fleet and show where each round lands."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

COMMANDS = ("demo",)


def add_parsers(sub: Any) -> None:
    m = sub.add_parser("demo", help="book a flight through a fleet and show where rounds land")
    m.add_argument("--url", default="http://127.0.0.1:8000/mcp", help="the fleet's MCP endpoint")
    m.add_argument(
        "--era",
        choices=["modern", "handshake"],
        default="modern",
        help="the protocol era the client speaks",
    )


def run(args: argparse.Namespace) -> int:
    from mcpfleet.dev.booking import run_demo

    asyncio.run(run_demo(args.url, args.era))
    return 0
