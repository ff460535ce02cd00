"""The router's session table against a scripted Redis client: batching, negative cache,
and a full pool told apart from a Redis that is down."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.asyncio import BlockingConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError

from mcpfleet import redisconn
from mcpfleet.contract import RedisKeys
from mcpfleet.router.health import Health
from mcpfleet.router.route import SessionRoute
from mcpfleet.router.table import LookupSource, SessionTable

KEYS = RedisKeys("unit")


class ScriptedRedis:
    """Answers MGET from ``known``, or raises ``fail``; counts the calls."""

    def __init__(self, known: dict[str, bytes], fail: BaseException | None = None) -> None:
        self.known = known
        self.fail = fail
        self.mgets: list[int] = []

    async def mget(self, keys: list[str]) -> list[bytes | None]:
        self.mgets.append(len(keys))
        await asyncio.sleep(0)
        if self.fail is not None:
            raise self.fail
        return [self.known.get(k) for k in keys]


def _table(client: ScriptedRedis, health: Health) -> SessionTable:
    fake: Any = client
    return SessionTable(fake, KEYS, health, ttl=60, negative_ttl=2)


async def test_concurrent_lookups_share_one_mget_and_unknown_ids_are_remembered() -> None:
    client = ScriptedRedis({KEYS.session("live"): b"replica-0"})
    table = _table(client, Health())
    ids = ["live", *(f"unknown-{i}" for i in range(99))]
    results = await asyncio.gather(*(table.lookup(s) for s in ids))
    assert results[0] == (SessionRoute("replica-0"), LookupSource.REDIS)
    assert all(r == (None, LookupSource.MISS) for r in results[1:])
    assert client.mgets == [100], "one round trip for the whole burst"
    again = await table.lookup("unknown-7")
    assert again == (None, LookupSource.MISS_CACHED)
    assert client.mgets == [100]


def _pool_timeout() -> RedisConnectionError:
    try:
        raise RedisConnectionError("No connection available.") from TimeoutError()
    except RedisConnectionError as exc:
        return exc


async def test_a_full_pool_answers_busy_and_is_not_redis_down() -> None:
    health = Health()
    table = _table(ScriptedRedis({}, fail=_pool_timeout()), health)
    assert await table.lookup("some-id") == (None, LookupSource.BUSY)
    assert not health.degraded


async def test_redis_down_answers_unknown_and_marks_degraded() -> None:
    health = Health()
    table = _table(ScriptedRedis({}, fail=RedisConnectionError("Connection refused")), health)
    assert await table.lookup("some-id") == (None, LookupSource.UNKNOWN)
    assert health.degraded


@pytest.mark.parametrize(
    ("exc", "full"),
    [
        (_pool_timeout(), True),
        (RedisConnectionError("Connection refused"), False),
        (TimeoutError(), False),
    ],
)
def test_pool_full_is_only_the_pools_own_wait(exc: BaseException, full: bool) -> None:
    assert redisconn.pool_full(exc) is full


async def test_the_asyncio_client_pool_is_bounded_and_blocking() -> None:
    client = redisconn.async_client(
        redisconn.settings("redis://127.0.0.1:1/0"), timeout=0.5, pool_size=7, pool_wait=0.25
    )
    pool = client.connection_pool
    assert isinstance(pool, BlockingConnectionPool)
    assert (pool.max_connections, pool.timeout) == (7, 0.25)
    await client.aclose()


async def test_the_sentinel_client_pool_is_bounded_and_blocking() -> None:
    client = redisconn.async_client(
        redisconn.settings("redis+sentinel://127.0.0.1:1/mymaster/0"),
        timeout=0.5,
        pool_size=9,
        pool_wait=0.5,
    )
    pool = client.connection_pool
    assert isinstance(pool, BlockingConnectionPool)
    assert (pool.max_connections, pool.timeout) == (9, 0.5)
    assert hasattr(pool, "get_master_address"), "still Sentinel's pool"
    await client.aclose()


async def test_a_unix_socket_url_keeps_its_connection_class_in_the_bounded_pool() -> None:
    from redis.asyncio.connection import UnixDomainSocketConnection

    client = redisconn.async_client(
        redisconn.settings("unix:///tmp/nowhere.sock?db=2"), timeout=0.5, pool_size=3
    )
    pool = client.connection_pool
    assert isinstance(pool, BlockingConnectionPool) and pool.max_connections == 3
    assert pool.connection_class is UnixDomainSocketConnection
    assert pool.connection_kwargs["path"] == "/tmp/nowhere.sock"
    await client.aclose()
