"""Redis reachability as the router sees it, and what counts as Redis being down.

Every Redis call of the router on a request's path or in the background ends
in :meth:`Health.ok` or :meth:`Health.fail`; the router is *degraded* (not
closed) while Redis cannot be reached, and says so on /readyz and in its
metrics. A full connection pool is this router being busy, never Redis down.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from redis.exceptions import RedisError

from mcpfleet.redisconn import describe, pool_full

log = logging.getLogger("mcpfleet.router")

#: What a Redis call of the router raises when Redis cannot answer it in time.
RedisDown = (RedisError, OSError, asyncio.TimeoutError)


@dataclass
class Health:
    """Redis reachability as the router last saw it."""

    degraded: bool = False
    since: float = 0.0
    reason: str = ""

    def fail(self, exc: BaseException) -> None:
        """Redis could not be used. A full connection pool is the router being busy,
        not Redis down: it changes nothing here (the next call tries again)."""
        if pool_full(exc):
            return
        if not self.degraded:
            log.error(
                "Redis unreachable (%s): degraded, routing from cache and the last known "
                "replica set",
                describe(exc),
            )
            self.degraded, self.since = True, time.monotonic()
        self.reason = type(exc).__name__

    def ok(self) -> None:
        if self.degraded:
            log.warning(
                "Redis reachable again after %.1fs: no longer degraded",
                time.monotonic() - self.since,
            )
        self.degraded, self.reason = False, ""
