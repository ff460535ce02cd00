"""The once ledger's direct commands (:class:`mcpfleet.redisconn.DirectCommands`) on a real Redis.

The claim and its confirmation go through connections of their own, used
without redis-py's ``execute_command``. What that must not lose, checked
against a real ``redis-server`` with an ACL user and a password file:

* the replies are redis-py's, for every command the ledger sends (scripts by
  ``EVAL``: the replica's ACL user may not run ``EVALSHA``);
* an error reply raises, and the connection serves the next command;
* Redis SIGSTOPped mid-command: the reply later than the socket timeout
  raises a timeout, a caller's own deadline cancels the command, and after
  SIGCONT every command gets its own reply (a connection left with a reply
  unread is never used again as it is);
* at most ``size`` connections: a command that finds them all busy fails as a
  full pool does, after ``wait``;
* a Redis restarted under an idle connection: the next command is sent again
  on a new connection (the client's one retry on a connection error).
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeout

from fleetkit.faulttable import FaultTable
from fleetkit.redisrig import ADMIN, RedisServer, secret_file
from mcpfleet import redisconn
from mcpfleet.registry import connect

#: A script that returns its argument, and one Redis refuses to run.
ECHO = "return ARGV[1]"
BROKEN = "return redis.call('NOSUCHCOMMAND')"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    srv = RedisServer(tmp_path_factory.mktemp("directredis")).start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
async def client(server: RedisServer, tmp_path: Path) -> AsyncIterator[redisconn.DirectCommands]:
    """The replica's client for ``server`` (as ``mcpfleet serve`` builds it), used directly."""
    password = secret_file(tmp_path / "password", server.admin_password)
    pooled = connect(f"redis://{ADMIN}@127.0.0.1:{server.port}/0", redisconn.RedisFiles(password))
    direct = redisconn.DirectCommands(pooled, size=2, wait=0.3)
    try:
        yield direct
    finally:
        await direct.aclose()
        await pooled.aclose()


def _clients(server: RedisServer) -> int:
    """Connections Redis holds from the admin user (the test's own admin connection included)."""
    admin = server.admin()
    try:
        listed = admin.client_list()
        return sum(1 for c in listed if c.get("user") == ADMIN)
    finally:
        admin.close()


@pytest.fixture
def stopped(server: RedisServer) -> Iterator[None]:
    """Redis SIGSTOPped for the test's body (SIGCONT whatever happens)."""
    assert server.proc is not None
    yield
    server.proc.signal(signal.SIGCONT)


async def test_replies_are_redis_pys_for_every_command_the_ledger_sends(
    client: redisconn.DirectCommands,
) -> None:
    pooled = client.client
    assert await client.set("d:a", "one", nx=True, get=True, px=5000) is None
    assert await client.set("d:a", "two", nx=True, get=True, px=5000) == b"one"
    assert await pooled.get("d:a") == b"one"
    assert await client.set("d:a", "three", xx=True, px=5000) == b"OK"
    assert await client.get("d:a") == await pooled.get("d:a") == b"three"
    assert await client.set("d:none", "x", xx=True, px=5000) is None
    assert 0 < await pooled.pttl("d:a") <= 5000
    assert await client.get("d:none") is None
    assert await client.eval(ECHO, 0, "x") == b"x"
    assert await client.eval("return 7", 1, "d:a") == 7
    assert (await client.info("server"))["redis_version"]


async def test_an_error_reply_raises_and_the_connection_serves_the_next_command(
    client: redisconn.DirectCommands,
) -> None:
    with pytest.raises(ResponseError):
        await client.eval(BROKEN, 0)
    assert await client.set("d:after", "ok", nx=True, get=True, px=5000) is None
    assert await client.get("d:after") == b"ok"


@pytest.mark.timeout(60)
async def test_a_stalled_redis_times_out_and_every_later_reply_is_its_own(
    server: RedisServer, client: redisconn.DirectCommands, stopped: None, fault_table: FaultTable
) -> None:
    """SIGSTOP mid-command: one command runs into the socket timeout (0.5 s), one into its
    caller's deadline (0.2 s); both were sent and run when Redis resumes. Then ten
    pairs of commands sent at once, each pair's key read back: every reply its own."""
    assert server.proc is not None
    row = fault_table.row("Redis SIGSTOP under the once ledger's direct commands")
    await client.set("d:s0", "v0", px=60_000)
    server.proc.signal(signal.SIGSTOP)
    started = time.monotonic()
    with pytest.raises(RedisTimeout):
        await client.set("d:late1", "late1", nx=True, get=True, px=60_000)
    timed_out = time.monotonic() - started
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await redisconn.within(0.2, client.get("d:s0"))
    cancelled = time.monotonic() - started
    server.proc.signal(signal.SIGCONT)
    wrong = 0
    for i in range(10):
        a, b = await asyncio.gather(
            client.set(f"d:k{i}", f"v{i}", nx=True, get=True, px=60_000),
            client.get("d:s0"),
        )
        got = await client.get(f"d:k{i}")
        wrong += (a is not None) + (b != b"v0") + (got != f"v{i}".encode())
    row.attempts = 32
    row.lost = wrong
    row.worst_seconds = max(timed_out, cancelled)
    row.notes = f"socket timeout after {timed_out:.2f}s, caller's deadline after {cancelled:.2f}s"
    assert 0.4 <= timed_out < 1.0 and 0.15 <= cancelled < 0.5
    assert wrong == 0, "a command read another command's reply"
    # The command sent before the stall ran when Redis resumed (it was not sent twice).
    assert await client.get("d:late1") == b"late1"


@pytest.mark.timeout(60)
async def test_all_connections_busy_fails_as_a_full_pool_not_as_redis_down(
    server: RedisServer, client: redisconn.DirectCommands, stopped: None
) -> None:
    assert server.proc is not None
    await asyncio.gather(client.get("d:warm1"), client.get("d:warm2"))
    server.proc.signal(signal.SIGSTOP)
    busy = [asyncio.ensure_future(client.get(f"d:busy{i}")) for i in range(2)]
    await asyncio.sleep(0.05)
    started = time.monotonic()
    with pytest.raises(Exception) as waited:
        await client.get("d:third")
    assert redisconn.pool_full(waited.value), repr(waited.value)
    assert 0.25 <= time.monotonic() - started < 0.45
    server.proc.signal(signal.SIGCONT)
    await asyncio.gather(*busy, return_exceptions=True)
    # Both connections are back (dropped ones reconnect): two commands at once again.
    assert await asyncio.gather(client.get("d:warm1"), client.get("d:warm2")) == [None, None]
    assert len(client._idle) == 2


@pytest.mark.timeout(60)
async def test_a_restarted_redis_is_asked_again_on_a_new_connection(
    server: RedisServer, client: redisconn.DirectCommands
) -> None:
    """The idle connection is closed by the restart; the command is not lost to it."""
    await client.set("d:before", "x", px=60_000)
    server.stop()
    server.start()
    assert await client.set("d:restarted", "y", nx=True, get=True, px=60_000) is None
    assert await client.get("d:restarted") == b"y"


async def test_closing_drops_every_idle_connection(
    server: RedisServer, client: redisconn.DirectCommands
) -> None:
    before = _clients(server)
    await asyncio.gather(client.get("d:c1"), client.get("d:c2"))
    assert _clients(server) >= before + 1
    await client.aclose()
    assert client._idle == []
    deadline = time.monotonic() + 5
    while _clients(server) > before and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert _clients(server) <= before
