"""The replica registry in Redis: replicas publish attestations, others read them.

A replica writes its :class:`~mcpfleet.contract.Attestation` under its
own key with a TTL a few heartbeats long, and adds its name to the fleet's
replica set. Readers (router, operator, tests) take the set and fetch every
record in one round trip; a name whose record expired is a replica that
stopped heart-beating, and is skipped. Reading never writes: the operator
reads attestations with a read-only Redis account. The names of dead
replicas are pruned from the set by the writers (every replica, now and
then, through :func:`prune_replicas`). No key material is ever written:
attestations carry kids.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Sequence

import redis
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from mcpfleet import redisconn
from mcpfleet.contract import HEARTBEAT_INTERVAL, HEARTBEAT_TTL, Attestation, RedisKeys
from mcpfleet.redisconn import RedisFiles, describe

__all__ = ["connect"]

log = logging.getLogger("mcpfleet.registry")

#: Redis calls on any hot or periodic path fail fast rather than hang.
REDIS_TIMEOUT = 0.5


def connect(
    url: str,
    files: RedisFiles | None = None,
    *,
    pool_size: int = redisconn.POOL_SIZE,
    pool_wait: float = redisconn.POOL_WAIT,
) -> aioredis.Redis:
    """A Redis client with short timeouts: an outage is seen at once, never waited out.

    Built by :mod:`mcpfleet.redisconn` (Sentinel, TLS, password files), on a
    bounded pool of ``pool_size`` connections a command waits ``pool_wait`` s for.
    """
    return redisconn.async_client(
        redisconn.settings(url, files),
        timeout=REDIS_TIMEOUT,
        health_check_interval=5,
        pool_size=pool_size,
        pool_wait=pool_wait,
    )


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def read_replicas(client: aioredis.Redis, keys: RedisKeys) -> dict[str, Attestation]:
    """All live replicas' attestations, by name. Raises RedisError when Redis is down.

    Read-only (SMEMBERS and MGET): a reader may hold a read-only account.
    """
    names = sorted(text(n) for n in await client.smembers(keys.replicas))
    if not names:
        return {}
    return _parse_records(names, await client.mget([keys.replica(n) for n in names]))


def read_replicas_sync(client: redis.Redis, keys: RedisKeys) -> dict[str, Attestation]:
    """:func:`read_replicas` with a blocking client (the operator's handlers run in threads)."""
    names = sorted(text(n) for n in client.smembers(keys.replicas))
    if not names:
        return {}
    return _parse_records(names, client.mget([keys.replica(n) for n in names]))


def _parse_records(names: list[str], raws: Sequence[bytes | str | None]) -> dict[str, Attestation]:
    live: dict[str, Attestation] = {}
    for name, raw in zip(names, raws, strict=True):
        if raw is None:
            continue  # stopped heart-beating; a writer prunes the name
        try:
            live[name] = Attestation.from_json(raw)
        except ValueError as exc:
            log.warning("ignoring malformed attestation of %s: %s", name, exc)
    return live


async def prune_replicas(client: aioredis.Redis, keys: RedisKeys) -> list[str]:
    """Remove from the replica set the names whose record expired; return them.

    A writer's job (it needs SREM): replicas call it every few heartbeats, so
    the set stays bounded by the live replicas plus the recently dead.
    """
    names = sorted(text(n) for n in await client.smembers(keys.replicas))
    if not names:
        return []
    pipe = client.pipeline()
    for name in names:
        pipe.exists(keys.replica(name))
    alive = await pipe.execute()
    dead = [n for n, there in zip(names, alive, strict=True) if not there]
    if dead:
        await client.srem(keys.replicas, *dead)
    return dead


#: The heartbeat on a Redis Cluster: the record written (its old value returned) and
#: the name added to the registry set, atomically, as the MULTI does elsewhere.
_PUBLISH = """
local before = redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2], 'GET')
redis.call('SADD', KEYS[2], ARGV[3])
return before
"""

#: A publisher prunes the replica set once per this many heartbeats.
PRUNE_EVERY = 10


class Publisher:
    """Heart-beats one replica's attestation into Redis until stopped."""

    def __init__(
        self,
        client: aioredis.Redis,
        keys: RedisKeys,
        snapshot: Callable[[], Attestation],
        *,
        interval: float = HEARTBEAT_INTERVAL,
        ttl: float = HEARTBEAT_TTL,
        redis_label: str = "",
        sessions: Callable[[], Iterable[str]] | None = None,
        session_ttl: float = 1800.0,
    ) -> None:
        self.client = client
        self.keys = keys
        self.snapshot = snapshot
        self.interval = interval
        self.ttl = ttl
        self.redis_label = redis_label
        self.sessions = sessions
        self.session_ttl = session_ttl
        self.healthy: bool | None = None
        self._published = False
        self._wake = asyncio.Event()

    async def publish_once(self) -> None:
        """Write the attestation; if Redis had lost it, write this replica's routes back.

        A record missing at a heartbeat after the first means Redis forgot it
        (restarted empty, failed over without it, or was away longer than the
        record's TTL): the routes of this replica's live sessions may be gone
        too, and a router that never cached one would end the session.
        """
        record = self.snapshot()
        key, ttl = self.keys.replica(record.name), int(self.ttl * 1000)
        if redisconn.on_cluster(self.client):
            # One script on the registry's slot: redis-py's asyncio cluster client
            # runs each command queued in a MULTI on a thread of its own and joins it
            # on the event loop, which hangs the process when that command must
            # first read the slot map again (after a node failed).
            before = await self.client.eval(
                _PUBLISH, 2, key, self.keys.replicas, record.to_json(), ttl, record.name
            )
        else:
            pipe = self.client.pipeline(transaction=True)
            pipe.set(key, record.to_json(), px=ttl, get=True)
            pipe.sadd(self.keys.replicas, record.name)
            before, _ = await pipe.execute()
        if before is None and self._published:
            await self.republish_sessions(record.name)
        self._published = True

    async def republish_sessions(self, name: str) -> int:
        """Write the route of every live session of this replica back (only where absent)."""
        sessions = list(self.sessions()) if self.sessions is not None else []
        if not sessions:
            return 0
        pipe = self.client.pipeline(transaction=False)
        for session in sessions:
            pipe.set(self.keys.session(session), name, px=int(self.session_ttl * 1000), nx=True)
        written = sum(map(bool, await pipe.execute()))
        log.warning(
            "Redis had lost this replica's record: wrote back %d of %d session route(s)",
            written,
            len(sessions),
        )
        return written

    async def mark_lost(self, sessions: Sequence[str], reason: str, deadline: float) -> bool:
        """Mark ``sessions`` lost (RedisKeys.session_lost, for the session TTL), so a
        re-homing router answers their next request with the 404; False if Redis
        could not take it within ``deadline`` seconds (logged)."""
        pipe = self.client.pipeline(transaction=False)
        for session in sessions:
            pipe.set(self.keys.session_lost(session), reason, px=int(self.session_ttl * 1000))
        try:
            await redisconn.within(deadline, pipe.execute())
        except (RedisError, OSError, TimeoutError) as exc:
            log.error("%d session(s) not marked lost: %s", len(sessions), describe(exc))
            return False
        return True

    def publish_soon(self) -> None:
        """Publish now (a state or ring change) rather than at the next tick."""
        self._wake.set()

    async def run(self) -> None:
        beats = 0
        while True:
            try:
                # Through Sentinel: write where the master is now, not where it was.
                moved = await redisconn.follow_master(self.client)
                await self.publish_once()
                if moved and self._published and redisconn.on_cluster(self.client):
                    # A cluster's master failed over: the routes its replica had
                    # not yet received are gone; this replica's own come back.
                    await self.republish_sessions(self.snapshot().name)
                beats += 1
                if beats % PRUNE_EVERY == 1:
                    await prune_replicas(self.client, self.keys)
                if self.healthy is not True:
                    log.info("registered in Redis %s", self.redis_label)
                self.healthy = True
            except (RedisError, OSError) as exc:
                if self.healthy is not False:
                    log.error(
                        "cannot reach Redis %s (%s); serving on, retrying every %.1fs",
                        self.redis_label,
                        describe(exc),
                        self.interval,
                    )
                self.healthy = False
            except Exception:
                # Anything else (a record that cannot be built) must not end the
                # heartbeat unseen: the replica would serve on while the routers and
                # the operator forget it. Logged with its trace once, retried as above.
                if self.healthy is not False:
                    log.exception(
                        "cannot publish this replica's record; retrying every %.1fs",
                        self.interval,
                    )
                self.healthy = False
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self.interval)

    async def withdraw(self, name: str) -> None:
        """Remove this replica's record at exit, so routers stop at once."""
        try:
            await self.client.delete(self.keys.replica(name))
            await self.client.srem(self.keys.replicas, name)
        except (RedisError, OSError):
            pass
