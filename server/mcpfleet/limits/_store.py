"""The fleet-wide counts in Redis: a rate's bucket and a cap's holdings, one key each.

Every call is one Lua script on one key (Redis keeps time: ``TIME`` inside the
script, so no two machines' clocks are ever compared), under
:meth:`RedisKeys.limit <mcpfleet.contract.RedisKeys.limit>`. A rate is a
GCRA bucket (the theoretical arrival time, in microseconds); taking several
requests' worth at once lets a replica answer the next ones from memory. A cap
is a sorted set of what the principal holds, each member scored by the time its
lease ends: a holder that is gone (a replica killed) stops renewing, and its
members stop counting when their lease passes. Counts can only over-count, and
only until then.
"""

from __future__ import annotations

from typing import Any, Final

__all__ = ["ADMIT", "RENEW", "TAKE", "CapStore", "RateStore"]

#: KEYS[1] the bucket; ARGV the emission interval (us), the burst, the requests
#: wanted. Returns one status line of three whole numbers: ``"granted wait left"``
#: (the requests granted, us until one more is allowed when none was, the requests
#: the bucket still had room for after the grant). One line, not an array of three:
#: the replica's driver reads it in one line where an array took four
#: (docs/performance.md, "The replica").
TAKE: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
local room = math.floor((now + burst * interval - tat) / interval)
if room < 1 then
  return redis.status_reply(string.format('0 %.0f 0', tat + interval - burst * interval - now))
end
local n = math.min(room, tonumber(ARGV[3]))
tat = tat + n * interval
redis.call('SET', KEYS[1], string.format('%.0f', tat), 'PX', math.ceil((tat - now) / 1000) + 1000)
return redis.status_reply(string.format('%d 0 %d', n, room - n))
"""

#: KEYS[1] the holdings; ARGV the cap, the member, its lease (ms). Returns 0 when
#: the member holds a place (new or renewed), else ms until the oldest lease ends.
ADMIT: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if not redis.call('ZSCORE', KEYS[1], ARGV[2]) then
  if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then
    local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
    return math.max(1, tonumber(first[2]) - now)
  end
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[2])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]))
return 0
"""

#: KEYS[1] the holdings; ARGV[1] the lease (ms), ARGV[2..] members held (added
#: again if Redis lost them), ARGV after the empty string: members to drop.
RENEW: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[1])
local dropping = false
for i = 2, #ARGV do
  if ARGV[i] == '' then
    dropping = true
  elseif dropping then
    redis.call('ZREM', KEYS[1], ARGV[i])
  else
    redis.call('ZADD', KEYS[1], now + lease, ARGV[i])
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) > 0 then redis.call('PEXPIRE', KEYS[1], lease) end
return redis.call('ZCARD', KEYS[1])
"""


class RateStore:
    """A rate's buckets in Redis, through a client with ``eval`` (the direct driver)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    async def take(self, key: str, rate: float, burst: int, want: int) -> tuple[int, float, int]:
        """Take up to ``want`` requests' worth from ``key``: (granted, seconds until one
        more, requests still in the bucket after the grant)."""
        interval = max(1, round(1_000_000 / rate))
        reply = await self.client.eval(TAKE, 1, key, interval, burst, want)
        granted, wait_us, left = (int(number) for number in reply.split())
        return granted, wait_us / 1_000_000, left


class CapStore:
    """A cap's holdings in Redis, through a client with ``eval``."""

    def __init__(self, client: Any) -> None:
        self.client = client

    async def admit(self, key: str, cap: int, member: str, lease: float) -> float:
        """Hold a place for ``member``: 0.0 when held, else seconds until a lease may end."""
        reply = await self.client.eval(ADMIT, 1, key, cap, member, int(lease * 1000))
        return int(reply) / 1000

    async def renew(self, key: str, held: list[str], dropped: list[str], lease: float) -> int:
        """Renew ``held`` (re-adding any Redis lost), drop ``dropped``; the count after."""
        args: list[Any] = [int(lease * 1000), *held]
        if dropped:
            args += ["", *dropped]
        return int(await self.client.eval(RENEW, 1, key, *args))
