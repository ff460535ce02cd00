"""The limiter's next lease taken ahead, on a real Redis: rounds under the rate do not wait on it.

A principal's rounds are answered from a lease of its fleet-wide bucket
(:mod:`mcpfleet.limits`); the round that spends a lease asks Redis for the next one
and goes on. Checked against a real ``redis-server`` through the replica's own
driver (:class:`mcpfleet.redisconn.DirectCommands`), counting the scripts Redis
itself ran (``INFO commandstats``):

* 20 rounds at 50/s (leases of 5): 5 scripts, the fifth the lease taken ahead;
* Redis SIGSTOPped once that lease is in: its 5 rounds are answered from memory
  (no check fails); the round after them waits for the lease asked for ahead, one
  deadline at most, then the replica's own bucket answers (one failure counted),
  and the rounds after it pay nothing while Redis is left alone;
* after SIGCONT the stalled script runs once (it was sent, and is not sent again),
  and the rounds go to Redis again once the backoff is over.

When a lease is not taken ahead (near a principal's limit, a lease of one round) and
how a refusal is held: ``tests/unit/test_limits.py``.
"""

from __future__ import annotations

import asyncio
import secrets
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from fleetkit.faulttable import FaultTable
from fleetkit.redisrig import ADMIN, RedisServer, secret_file
from mcpfleet import redisconn
from mcpfleet.contract import RedisKeys
from mcpfleet.limits import REDIS_BACKOFF, Limiter, LimitRules, Rate
from mcpfleet.registry import connect

pytestmark = pytest.mark.faults

DEADLINE = 0.3


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    srv = RedisServer(tmp_path_factory.mktemp("leaseredis")).start()
    try:
        yield srv
    finally:
        srv.stop()


class Observer:
    """Counts the checks that fell back to the replica's memory."""

    def __init__(self) -> None:
        self.fallbacks: list[str] = []

    def limited(self, limit: str, tool: str) -> None: ...

    def failed(self, limit: str) -> None:
        self.fallbacks.append(limit)


@pytest.fixture
async def limiter(server: RedisServer, tmp_path: Path) -> AsyncIterator[tuple[Limiter, Observer]]:
    """A limiter on ``server`` through the replica's driver, as ``mcpfleet serve`` builds it."""
    password = secret_file(tmp_path / "password", server.admin_password)
    pooled = connect(f"redis://{ADMIN}@127.0.0.1:{server.port}/0", redisconn.RedisFiles(password))
    direct = redisconn.DirectCommands(pooled)
    observer = Observer()
    lim = Limiter(
        LimitRules(rounds=Rate(50, 100)),
        RedisKeys("lease-" + secrets.token_hex(4)),
        observer=observer,
        deadline=DEADLINE,
    )
    lim.attach(direct)
    try:
        yield lim, observer
    finally:
        await lim.aclose()
        await direct.aclose()
        await pooled.aclose()


def scripts_run(server: RedisServer) -> int:
    admin = server.admin()
    try:
        return int(admin.info("commandstats").get("cmdstat_eval", {}).get("calls", 0))
    finally:
        admin.close()


async def lease_in(lim: Limiter) -> None:
    """Until no lease is on its way (bounded: each has the limiter's deadline)."""
    for _ in range(200):
        if not lim.leases_on_their_way:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("a lease still on its way after 2 s")


@pytest.mark.timeout(60)
async def test_rounds_under_the_rate_are_answered_from_leases_taken_ahead_even_with_redis_stopped(
    server: RedisServer, limiter: tuple[Limiter, Observer], fault_table: FaultTable
) -> None:
    lim, observer = limiter
    assert server.proc is not None
    row = fault_table.row("Redis SIGSTOP under the limits' next lease, taken ahead")
    before = scripts_run(server)
    for _ in range(20):
        assert await lim.round("p") is None
        await lease_in(lim)
    assert scripts_run(server) - before == 5, "4 leases of 5, and the next taken ahead"
    server.proc.signal(signal.SIGSTOP)
    try:
        for _ in range(5):  # the lease taken ahead: no round asks Redis
            started = time.monotonic()
            assert await lim.round("p") is None
            row.answered(started)
        assert observer.fallbacks == [], "no round waited on the stopped Redis"
        started = time.monotonic()
        assert await lim.round("p") is None  # waits for the lease asked for ahead, then local
        waited = row.answered(started)
        assert observer.fallbacks == ["rounds"]
        for _ in range(3):  # Redis left alone: the replica's own bucket, at once
            started = time.monotonic()
            assert await lim.round("p") is None
            row.answered(started)
        assert observer.fallbacks == ["rounds"]
    finally:
        server.proc.signal(signal.SIGCONT)
    # The script sent during the stall runs once Redis resumes, once: it is not sent again.
    for _ in range(100):
        if scripts_run(server) - before == 6:
            break
        await asyncio.sleep(0.02)
    assert scripts_run(server) - before == 6
    await asyncio.sleep(REDIS_BACKOFF)
    for _ in range(5):  # Redis asked again: a lease, and once it is spent the next ahead
        assert await lim.round("p") is None
        await lease_in(lim)
    row.attempts = 34
    row.notes = (
        f"the round after the lease taken ahead waited {waited:.2f} s (deadline {DEADLINE} s);"
        " the rounds before it and after it none; the stalled script ran once, on SIGCONT"
    )
    assert DEADLINE * 0.8 <= waited < DEADLINE + 1.0
    assert scripts_run(server) - before == 8 and observer.fallbacks == ["rounds"]
