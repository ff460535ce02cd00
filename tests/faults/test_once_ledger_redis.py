"""The once ledger on a real Redis: its scripts, and a claim a failover lost.

* The confirm and release scripts as Redis runs them: a confirmation sent again
  after its reply was lost is still confirmed; a claim that is gone, another
  round's, or confirmed too late is told apart; a release takes back a claim
  as written and as confirmed (only a round that ran nothing releases).
* A claim the master acknowledged and never replicated, then the master
  SIGKILLed before the confirmation (replication held back, so the loss is
  certain, not a race): the confirmation rides through the failover, finds
  the claim gone on the promoted replica, and the round claims again. Counted:
  ``finish`` ran exactly once, the client got its answer, the result is stored
  on the new master.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from fastmcp import FastMCP
from fastmcp.tools.base import ToolResult

from fleetkit.failover import link_up, sentinel_redis
from fleetkit.faulttable import FaultTable
from fleetkit.redisrig import ADMIN, MASTER, RedisServer, secret_file
from mcpfleet import redisconn
from mcpfleet.contract import RedisKeys
from mcpfleet.dev.wait import wait_for
from mcpfleet.once import (
    Confirmed,
    OnceOutcome,
    Record,
    RedisLedger,
    install_ledger,
    new_flow_id,
    run_once,
    settle,
)

KEYS = RedisKeys("oncefailover")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    srv = RedisServer(tmp_path_factory.mktemp("onceredis")).start()
    try:
        yield srv
    finally:
        srv.stop()


def ledger_on(url: str, password_file: Path, **kw: Any) -> RedisLedger:
    """The ledger as a replica builds it: its commands direct, on the client's connections."""
    s = redisconn.settings(url, redisconn.RedisFiles(password_file=password_file))
    direct = redisconn.DirectCommands(redisconn.async_client(s, timeout=0.5))
    return RedisLedger(direct, KEYS, **kw)


async def close(client: Any) -> None:
    """The ledger's connections, the client and, through Sentinel, its connections to the
    sentinels."""
    await client.aclose()
    client = client.client
    await client.aclose()
    manager = getattr(client.connection_pool, "sentinel_manager", None)
    for sentinel in getattr(manager, "sentinels", []):
        await sentinel.aclose()


async def test_the_confirm_and_release_scripts_as_redis_runs_them(
    server: RedisServer, tmp_path: Path
) -> None:
    password = secret_file(tmp_path / "password", server.admin_password)
    ledger = ledger_on(f"redis://{ADMIN}@127.0.0.1:{server.port}/0", password)
    try:
        mine = Record("running", "r0", claim="mine")
        other = Record("running", "r1", claim="other")
        now = time.monotonic()
        assert await ledger.confirm("none", mine, 60, now) is Confirmed.GONE

        assert await ledger.claim("a", mine, 5) is None
        assert await ledger.confirm("a", mine, 60, now) is Confirmed.YES
        # The same confirmation again (its first reply lost): still confirmed.
        assert await ledger.confirm("a", mine, 60, now) is Confirmed.YES
        held = await ledger.get("a")
        assert held == replace(mine, finishing=True)
        assert await ledger.confirm("a", other, 60, now) is Confirmed.LOST
        # A round that ran nothing takes back its claim, confirmed or not.
        assert await ledger.release("a", mine) is True
        assert await ledger.get("a") is None

        assert await ledger.claim("b", mine, 5) is None
        assert await ledger.release("b", other) is False
        assert await ledger.release("b", mine) is True

        # The claim's reply came 4.5 s ago and the deadline is 2 s: the lease left
        # proves nothing about when this confirmation lands, so nothing is sent.
        assert await ledger.claim("c", mine, 0.5) is None
        assert await ledger.confirm("c", mine, 60, now - 4.5) is Confirmed.LATE
        assert await ledger.get("c") == mine
        # One that finds less lease left than an in-time one would is deleted there.
        assert await ledger.confirm("c", mine, 60, time.monotonic()) is Confirmed.LATE
        assert await ledger.get("c") is None
    finally:
        await close(ledger.client)


class _KillBeforeConfirm:
    """The ledger's client; SIGKILLs the master just before the first confirmation."""

    def __init__(self, client: Any, master: RedisServer) -> None:
        self._client = client
        self._master = master
        self.killed_at: float | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def eval(self, script: str, numkeys: int, *args: Any) -> Any:
        if "PTTL" in script and self.killed_at is None:
            self.killed_at = time.monotonic()
            await asyncio.to_thread(self._master.kill)
        return await self._client.eval(script, numkeys, *args)


@pytest.mark.timeout(120)
async def test_a_claim_the_failover_lost_is_claimed_again_and_runs_once(
    tmp_path: Path, fault_table: FaultTable
) -> None:
    with sentinel_redis(tmp_path) as (master, replica, sentinels):
        # The master goes on acknowledging writes; the replica stops getting them.
        master.hold_replication()
        wait_for(lambda: not link_up(replica), timeout=10, what="the replica to lose its link")
        password = secret_file(tmp_path / "password", master.admin_password)
        url = f"redis+sentinel://{ADMIN}@{sentinels.url_hosts}/{MASTER}/0"
        # No memory check: its INFO, sent in the background at the claim, would still
        # be waiting on the dead master when the client is closed.
        ledger = ledger_on(url, password, deadline=2.0, failover_wait=8.0, memory_limit=0)
        client = _KillBeforeConfirm(ledger.client, master)
        ledger.client = client
        said: list[Confirmed] = []
        confirm = ledger.confirm

        async def counted(*args: Any) -> Confirmed:
            said.append(await confirm(*args))
            return said[-1]

        ledger.confirm = counted  # type: ignore[method-assign]
        app: FastMCP[Any] = FastMCP("oncefailover")
        seen: list[OnceOutcome] = []
        install_ledger(app, ledger, token_ttl=60, replica="r0", observe=seen.append)
        runs: list[float] = []

        async def finish() -> ToolResult:
            runs.append(time.monotonic())
            return ToolResult(content="charged", structured_content={"result": "charged"})

        async def convert(value: Any) -> ToolResult:
            return ToolResult(content=str(value), structured_content={"result": value})

        flow = new_flow_id()
        started = time.monotonic()
        try:
            result = await run_once(app, flow, finish, convert)
            took = time.monotonic() - started
            await settle()
            with contextlib.closing(replica.admin()) as on_new:
                stored = on_new.get(KEYS.once(flow))
        finally:
            await close(client)
        row = fault_table.row("Redis master SIGKILL between a once claim and its confirmation")
        row.attempts = 1
        row.double_runs = max(0, len(runs) - 1)
        row.lost = 0 if len(runs) == 1 else 1
        row.worst_seconds = took
        row.notes = f"unreplicated claim; confirmations said {[s.value for s in said]}"
        assert client.killed_at is not None, "the master was killed before the confirmation"
        assert sentinels.master_port() == replica.port
        assert len(runs) == 1 and isinstance(result, ToolResult)
        assert said[0] in (Confirmed.GONE, Confirmed.LATE) and said[-1] is Confirmed.YES, said
        assert seen == [OnceOutcome.CLAIMED]
        assert stored is not None and b'"done"' in stored
