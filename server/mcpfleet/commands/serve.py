"""``mcpfleet serve``: one replica of a FastMCP app."""

from __future__ import annotations

import argparse
from typing import Any

from mcpfleet.commands import (
    UsageError,
    add_flags,
    config_from_args,
    redis_fields,
    redis_settings,
)
from mcpfleet.config import REPLICA_FLAGS, ReplicaConfig

COMMANDS = ("serve",)


def add_parsers(sub: Any) -> None:
    """``serve``'s flags, made from their table (:data:`mcpfleet.config.REPLICA_FLAGS`)."""
    add_flags(sub.add_parser("serve", help="run one replica of a FastMCP app"), REPLICA_FLAGS)


def run(args: argparse.Namespace) -> int:
    config = config_from_args(ReplicaConfig, args, **redis_fields(redis_settings(args)))
    from mcpfleet.keys.ring import KeyRingError
    from mcpfleet.replica.process import run_replica

    try:
        run_replica(config)
    except KeyRingError as exc:
        raise UsageError(f"no valid key ring: {exc}") from None
    return 0
