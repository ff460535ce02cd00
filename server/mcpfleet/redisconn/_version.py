"""The Redis server's version, checked at a process's start: the commands
mcpfleet needs came with :data:`MIN_VERSION`."""

from __future__ import annotations

import logging
from typing import Any

from mcpfleet.redisconn._clients import within

log = logging.getLogger("mcpfleet.redis")

#: The oldest Redis the components work with: ``SET ... NX GET`` (the once
#: ledger's claim) and ``PEXPIRE ... GT`` came with 7.0.
MIN_VERSION = (7, 0)


def version_error(info: dict[str, Any]) -> str | None:
    """Why the Redis server that answered ``INFO server`` is too old, or None (pure)."""
    raw = str(info.get("redis_version", ""))
    try:
        found = tuple(int(part) for part in raw.split(".")[:2])
    except ValueError:
        return None  # a fork that names its version otherwise: let it try
    if len(found) == 2 and found < MIN_VERSION:
        need = ".".join(map(str, MIN_VERSION))
        return (
            f"Redis {raw} is too old: mcpfleet needs Redis {need} or newer "
            "(SET NX GET for once-flows, PEXPIRE GT)"
        )
    return None


class RedisTooOld(RuntimeError):
    """The fleet's Redis lacks a command mcpfleet needs; the message says which version."""


async def check_version(client: Any, deadline: float) -> None:
    """Refuse to start on a Redis older than 7.0; a Redis that does not answer is let be.

    An unreachable Redis is an outage the replica and the router serve through
    (they retry in the background); a Redis that answers with too old a
    version would fail every once-flow's claim and the routes' expiry
    updates, so the process says so at start and exits.
    """
    try:
        info = await within(deadline, client.info("server"))
    except Exception as exc:
        log.warning("Redis version not checked (%s): it is checked again at the next start", exc)
        return
    problem = version_error(info)
    if problem is not None:
        log.error("%s", problem)
        raise RedisTooOld(problem)
