"""The replica's heartbeat outlives a record it cannot build (a real redis-server)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import pytest
from redis import asyncio as aioredis

from fleetkit.redisrig import ADMIN, RedisServer
from mcpfleet.contract import Attestation, RedisKeys
from mcpfleet.registry import Publisher


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    srv = RedisServer(tmp_path_factory.mktemp("heartbeat-redis")).start()
    try:
        yield srv
    finally:
        srv.stop()


async def test_a_record_that_fails_to_build_is_retried_and_published_once_it_builds(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    keys = RedisKeys("heartbeat")
    calls = 0

    def snapshot() -> Attestation:
        nonlocal calls
        calls += 1
        if calls <= 2:
            raise AttributeError("a count the record reads is not there yet")
        return Attestation("replica-0", "127.0.0.1:1", "serving", ("k1",), heartbeat=0.0)

    admin = server.admin()
    client = aioredis.Redis(
        host="127.0.0.1", port=server.port, username=ADMIN, password=server.admin_password
    )
    publisher = Publisher(client, keys, snapshot, interval=0.05, redis_label="test")
    task = asyncio.create_task(publisher.run())
    try:
        async with asyncio.timeout(10):
            while admin.get(keys.replica("replica-0")) is None:
                await asyncio.sleep(0.02)  # polling Redis for the record, bounded above
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await client.aclose()
        admin.close()
    assert calls >= 3
    assert publisher.healthy is True
    failures = [r for r in caplog.records if "cannot publish this replica's record" in r.message]
    assert len(failures) == 1, "logged once, not at every retry"
