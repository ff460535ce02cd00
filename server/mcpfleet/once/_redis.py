"""The fleet's ledger in its Redis: claims, confirmations and results, each call bounded.

The claim is one ``SET NX GET PX``; the confirmation and the release are Lua
scripts, so that checking a claim is still this round's and changing it is
one step in Redis.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, Final

from mcpfleet import redisconn
from mcpfleet.contract import Attestation, RedisKeys
from mcpfleet.once._ledger import (
    CLAIM_LEASE,
    Confirmed,
    LedgerFull,
    LedgerUnavailable,
    Record,
    boot_of,
)

log = logging.getLogger("mcpfleet.once")

#: New once-flows are refused while Redis uses more than this share of its maxmemory.
DEFAULT_MEMORY_LIMIT: Final = 0.8
#: How often (seconds) a replica asks Redis how full it is (in the background).
MEMORY_CHECK_INTERVAL: Final = 1.0

#: KEYS[1] the flow; ARGV: the claim as written, the confirmed record, its lifetime
#: (ms), the least lease (ms) an in-time confirmation still finds. 1 confirmed (also
#: when an earlier try of this confirmation landed and its reply was lost), 0 not
#: ours, -1 ours but late (deleted), -2 not there.
_CONFIRM = """
local held = redis.call('GET', KEYS[1])
if not held then return -2 end
if held == ARGV[2] then return 1 end
if held ~= ARGV[1] then return 0 end
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[4]) then
  redis.call('DEL', KEYS[1])
  return -1
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
"""
#: KEYS[1] the flow; ARGV the claim as written and as confirmed: deleted if still
#: exactly either (only a round that did not run ``finish`` releases).
_RELEASE = """
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] or held == ARGV[2] then return redis.call('DEL', KEYS[1]) end
return 0
"""

_CONFIRMED: Final = {1: Confirmed.YES, -1: Confirmed.LATE, -2: Confirmed.GONE}


class RedisLedger:
    """The fleet's ledger in its Redis, under :meth:`RedisKeys.once`.

    Every call has a deadline (``deadline``, seconds); the claim and its
    confirmation ride through a Sentinel failover for up to ``failover_wait`` seconds
    (:func:`mcpfleet.redisconn.ride_through`). Commands: SET (NX GET PX / XX
    PX), GET, EVAL (confirm, release), and INFO (memory, in the background).
    """

    def __init__(
        self,
        client: Any,
        keys: RedisKeys,
        *,
        deadline: float = redisconn.DEFAULT_DEADLINE,
        failover_wait: float = redisconn.DEFAULT_FAILOVER_WAIT,
        memory_limit: float = DEFAULT_MEMORY_LIMIT,
    ) -> None:
        self.client = client
        self.keys = keys
        self.deadline = deadline
        self.failover_wait = failover_wait
        self.memory_limit = memory_limit
        #: Redis's used_memory / maxmemory at the last check (0 when unbounded).
        self.memory_share = 0.0
        self._memory_checked = 0.0
        self._memory_task: asyncio.Task[None] | None = None

    @property
    def full(self) -> bool:
        return 0 < self.memory_limit <= self.memory_share

    async def _call(self, step: Callable[[], Awaitable[Any]], *, ride: bool = False) -> Any:
        try:
            if ride:
                return await redisconn.ride_through(
                    self.client, step, deadline=self.deadline, failover_wait=self.failover_wait
                )
            return await redisconn.within(self.deadline, step())
        except Exception as exc:  # any failure to ask means: not done
            if "OOM" in str(exc):
                raise LedgerFull(f"Redis is out of memory: {exc}") from None
            what = str(exc) or f"no answer within {self.deadline:g}s"
            raise LedgerUnavailable(f"Redis: {type(exc).__name__}: {what}") from None

    def _check_memory(self, *, always: bool = False) -> None:
        """Ask Redis how full it is, now and then, off the request's path (with no limit,
        only when ``always``: the watcher reports the share whatever the limit)."""
        now = time.monotonic()
        if self.memory_limit <= 0 and not always:
            return
        if now - self._memory_checked < MEMORY_CHECK_INTERVAL:
            return
        if self._memory_task is not None and not self._memory_task.done():
            return
        self._memory_checked = now

        async def check() -> None:
            try:
                info = await redisconn.within(self.deadline, self.client.info("memory"))
            except Exception as exc:
                log.debug("once: Redis memory not checked: %s", exc)
                return
            used, limit = int(info.get("used_memory", 0)), int(info.get("maxmemory", 0))
            was_full = self.full
            self.memory_share = used / limit if limit else 0.0
            if self.full and not was_full:
                log.error(
                    "once: Redis uses %.0f%% of its maxmemory (limit %.0f%%): new once-flows "
                    "are refused until results expire",
                    100 * self.memory_share,
                    100 * self.memory_limit,
                )
            elif was_full and not self.full:
                log.warning("once: Redis memory below the limit again: once-flows accepted")

        self._memory_task = asyncio.ensure_future(check())

    async def watch_memory(
        self, observe: Callable[[float], None], interval: float = MEMORY_CHECK_INTERVAL
    ) -> None:
        """Read Redis's memory every ``interval`` seconds until cancelled; report the share."""
        while True:
            self._memory_checked = 0.0
            self._check_memory(always=True)
            if self._memory_task is not None:
                await asyncio.gather(self._memory_task, return_exceptions=True)
            observe(self.memory_share)
            await asyncio.sleep(interval)

    async def claim(self, flow: str, record: Record, lease: float) -> Record | None:
        self._check_memory()
        if self.full:
            raise LedgerFull(
                f"Redis uses {100 * self.memory_share:.0f}% of its maxmemory "
                f"(once-flows stop at {100 * self.memory_limit:.0f}%)"
            )
        key, value = self.keys.once(flow), record.to_json()
        held = await self._call(
            lambda: self.client.set(key, value, nx=True, get=True, px=_ms(lease)), ride=True
        )
        return None if held is None else Record.from_json(held)

    async def confirm(self, flow: str, mine: Record, lifetime: float, replied: float) -> Confirmed:
        # Confirmed in time means: applied before this try's deadline. Applied later,
        # the lease left is below what it was at the claim's reply minus the time
        # since plus the deadline: Redis's own TTL is the clock, none is compared.
        # Each try (riding through a failover) is checked against its own send.
        key = self.keys.once(flow)
        claimed, confirmed = mine.to_json(), replace(mine, finishing=True).to_json()

        async def step() -> Any:
            least = CLAIM_LEASE - (time.monotonic() - replied) - self.deadline
            if least <= 0:
                return -1  # too late to send: nothing sent, the caller releases
            args = (claimed, confirmed, _ms(lifetime), _ms(least))
            return await self.client.eval(_CONFIRM, 1, key, *args)

        said = await self._call(step, ride=True)
        return _CONFIRMED.get(int(said), Confirmed.LOST)

    async def store(self, flow: str, record: Record, lifetime: float) -> None:
        key, value = self.keys.once(flow), record.to_json()
        await self._call(lambda: self.client.set(key, value, xx=True, px=_ms(lifetime)))

    async def release(self, flow: str, mine: Record) -> bool:
        key, value = self.keys.once(flow), mine.to_json()
        confirmed = replace(mine, finishing=True).to_json()
        return bool(await self._call(lambda: self.client.eval(_RELEASE, 1, key, value, confirmed)))

    async def get(self, flow: str) -> Record | None:
        key = self.keys.once(flow)
        raw = await self._call(lambda: self.client.get(key))
        return None if raw is None else Record.from_json(raw)

    async def alive(self, replica: str, boot: str) -> bool:
        key = self.keys.replica(replica)
        raw = await self._call(lambda: self.client.get(key))
        if raw is None:
            return False
        try:
            return boot_of(Attestation.from_json(raw).started) == boot or not boot
        except ValueError:
            return True  # unreadable: not proof of death


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))
