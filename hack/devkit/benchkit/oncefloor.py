"""What the once targets stand against: the cost of the Redis round trips a once-flow must make.

A once-flow's final round makes three Redis round trips: the claim, its
confirmation (both before ``finish`` may run) and the result's store (after
it, off the answer's path); see docs/performance.md, "Known limits, and why". This
measures one such round trip, in this process, against the fleet's Redis,
three ways taking turns:

* **the floor**: a bare asyncio protocol writing one pre-encoded RESP command
  and awaiting its reply: nothing a client library does (no pool, no
  encoding, no deadline, no parsing beyond the line end). No asyncio client
  can spend less CPU or wait less per round trip on this machine;
* **redis-py, through the pool**: the same command through the replica's
  redis-py client (:func:`mcpfleet.registry.connect`: the blocking pool, the
  socket timeout), as the ledger sent its commands before it had its own;
* **redis-py, direct**: the same command through
  :class:`mcpfleet.redisconn.DirectCommands` over that client, as the ledger
  sends it now (the client's own connections, used directly).

So the table says how much of what ``once=True`` adds is the round trips
themselves (three times the floor), how much is the client library, and how
much is the ledger's own work. Nothing here asserts.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable

from mcpfleet import redisconn
from mcpfleet.registry import connect

Row = tuple[str, str, str, str]

#: Round trips a once-flow makes: in all, and on the answer's path.
ONCE_ROUND_TRIPS, ON_THE_ANSWERS_PATH = 3, 2
KEY = "mcpfleet-bench:oncefloor"
#: The claim's shape: SET key value NX GET PX 5000 (answered by the value held).
COMMAND = ("SET", KEY, "x" * 96, "NX", "GET", "PX", "5000")


def _resp(args: tuple[str, ...]) -> bytes:
    out = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        data = arg.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


class _Bare(asyncio.Protocol):
    """One command in flight at a time; a reply ends with CRLF (a bulk string: two lines)."""

    def __init__(self) -> None:
        self.waiter: asyncio.Future[bytes] | None = None
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        done = self.buf.startswith(b"$-1\r\n") or (
            self.buf.startswith(b"$") and self.buf.count(b"\r\n") >= 2
        )
        if done and self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(self.buf)
            self.buf = b""


async def _measure(port: int, trips: int, turns: int) -> dict[str, list[tuple[float, float]]]:
    loop = asyncio.get_running_loop()
    transport, bare = await loop.create_connection(_Bare, "127.0.0.1", port)
    packed = _resp(COMMAND)

    async def bare_trip() -> None:
        bare.waiter = loop.create_future()
        transport.write(packed)
        await bare.waiter

    client = connect(f"redis://127.0.0.1:{port}/0")
    direct = redisconn.DirectCommands(client)

    async def pooled_trip() -> None:
        await client.set(KEY, COMMAND[2], nx=True, get=True, px=5000)

    async def direct_trip() -> None:
        await direct.set(KEY, COMMAND[2], nx=True, get=True, px=5000)

    ways: dict[str, Callable[[], Awaitable[None]]] = {
        "bare asyncio protocol": bare_trip,
        "redis-py, through the pool": pooled_trip,
        "redis-py, direct (the ledger's)": direct_trip,
    }
    seen: dict[str, list[tuple[float, float]]] = {name: [] for name in ways}
    try:
        for trip in ways.values():  # warm up: connections, code paths
            for _ in range(200):
                await trip()
        for _ in range(turns):
            for name, trip in ways.items():
                cpu, wall = time.process_time(), time.perf_counter()
                for _ in range(trips):
                    await trip()
                seen[name].append(
                    (
                        (time.process_time() - cpu) / trips * 1e6,
                        (time.perf_counter() - wall) / trips * 1e6,
                    )
                )
        await client.delete(KEY)
    finally:
        await direct.aclose()
        await client.aclose()
        transport.close()
    return seen


def floor_rows(redis_port: int, quick: bool = False) -> list[Row]:
    """The rows: CPU and wall time per round trip, and what three (two on the path) come to."""
    trips, turns = (500, 3) if quick else (2000, 5)
    seen = asyncio.run(_measure(redis_port, trips, turns))
    rows: list[Row] = []
    for name, samples in seen.items():
        cpu = statistics.median(s[0] for s in samples)
        wall = statistics.median(s[1] for s in samples)
        rows.append(
            (
                f"once floor: one Redis round trip, {name}",
                f"{cpu:.0f} us CPU, {wall:.0f} us wall",
                f"x{ONCE_ROUND_TRIPS} = {ONCE_ROUND_TRIPS * cpu:.0f} us CPU; "
                f"x{ON_THE_ANSWERS_PATH} = {ON_THE_ANSWERS_PATH * wall / 1e3:.2f} ms wall",
                f"this process, the fleet's Redis; median of {turns} x {trips}, taking turns",
            )
        )
    return rows
