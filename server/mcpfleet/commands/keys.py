"""``mcpfleet keys``: create or rotate a local key ring directory."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from mcpfleet.commands import UsageError

COMMANDS = ("keys",)


def add_parsers(sub: Any) -> None:
    k = sub.add_parser("keys", help="create or rotate a local key ring directory")
    k.add_argument(
        "action",
        choices=["generate", "stage", "promote", "retire", "abort", "show"],
        help="what to do to the ring",
    )
    k.add_argument("dir", type=Path, help="the key ring directory")
    k.add_argument("--force", action="store_true", help="generate over an existing ring")


def run(args: argparse.Namespace) -> int:
    from mcpfleet.keys.files import read_ring, write_ring
    from mcpfleet.keys.ring import KeyRing, KeyRingError

    action, directory = args.action, args.dir
    try:
        if action == "generate":
            if not args.force and directory.exists() and any(directory.iterdir()):
                raise UsageError(f"{directory} is not empty; pass --force to replace its ring")
            ring = KeyRing.generate()
        elif action == "show":
            ring = read_ring(directory)
            print(f"phase {ring.phase}, kids {' '.join(ring.kids)} (first seals)")
            return 0
        else:
            ring = getattr(read_ring(directory), action)()
        write_ring(directory, ring)
    except KeyRingError as exc:
        raise UsageError(str(exc)) from None
    print(f"{action}: {directory} now holds kids {' '.join(ring.kids)} ({ring.phase}; first seals)")
    return 0
