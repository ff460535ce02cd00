"""``mcpfleet router``: the sticky router in front of a fleet's replicas."""

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
from mcpfleet.config import ROUTER_FLAGS, RouterConfig

COMMANDS = ("router",)


def add_parsers(sub: Any) -> None:
    """``router``'s flags, made from their table (:data:`mcpfleet.config.ROUTER_FLAGS`)."""
    add_flags(sub.add_parser("router", help="run the sticky router"), ROUTER_FLAGS)


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
    from mcpfleet.router.process import run_router

    run_router(config)
    return 0
