"""What the limits per principal cost a round as a user gets them, in their two parts.

A replica at its defaults checks every round against its principal's rate
(:mod:`mcpfleet.limits`): the limits gate runs on every round, and every
:func:`~mcpfleet.limits._limiter.batch_of` rounds of a principal (5 at the
default 50/s) one lease is taken from Redis. In this process, taking turns:

* **the gate** (:class:`mcpfleet.replica.limitgate.LimitGate`) on a round whose
  lease is held, against a bare ASGI pass-through: CPU per request, with the
  headers ``make bench``'s client sends and the body in the scope as the
  response-mode choice leaves it. No Redis: the leases come from a stand-in
  (a lease of 200 rounds, so nearly every round is answered from memory);
* **one lease taken from Redis**: the limiter's script (:data:`mcpfleet.limits._store.TAKE`)
  through the replica's driver (:class:`mcpfleet.redisconn.DirectCommands` over
  :func:`mcpfleet.registry.connect`'s client) on the Redis ``--redis`` names,
  which the caller starts: CPU and wall time per call, and the CPU a round at
  the default rate (a call per lease).

Nothing here asserts::

    PYTHONPATH=hack/devkit .venv/bin/python -m benchkit.limitcost --redis redis://127.0.0.1:PORT/0
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from starlette.types import ASGIApp

from benchkit import inprocess
from benchkit.roundapp import TOOL
from benchkit.roundcost import _body
from mcpfleet.config import ReplicaConfig
from mcpfleet.contract import RedisKeys
from mcpfleet.limits import Limiter, LimitRules, Rate
from mcpfleet.limits._limiter import batch_of
from mcpfleet.limits._store import RateStore
from mcpfleet.replica.limitgate import LimitGate
from mcpfleet.replica.respmode import BODY

KEY = "mcpfleet-bench:limitcost"
#: The headers :mod:`benchkit.inprocess` sends, and those its ``call`` and httpx add.
_HEADERS = [
    *inprocess._HEADERS,
    (b"x-forwarded-for", b"10.0.0.1"),
    (b"content-length", b"300"),
    (b"user-agent", b"python-httpx/0.28.1"),
    (b"accept-encoding", b"gzip, deflate"),
]


class _Leases:
    """A stand-in for Redis with ``eval``: every lease of 200 rounds granted."""

    async def eval(self, *_args: Any) -> bytes:
        return b"200 0 4000"


async def _nothing(scope: Any, receive: Any, send: Any) -> None:
    return None


async def _nowhere(message: Any) -> None:
    return None


async def _passed(scope: Any, receive: Any, send: Any) -> None:
    await _nothing(scope, receive, send)


async def gate_us(requests: int, reps: int) -> tuple[float, float]:
    """(CPU us per request through the gate, through a bare pass-through), medians."""
    limiter = Limiter(LimitRules(rounds=Rate(2000, 4000)), RedisKeys("bench"))
    limiter.attach(_Leases())
    gate = LimitGate(_nothing, limiter)
    body = _body(TOOL)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    measured: dict[str, list[float]] = {"gate": [], "bare": []}
    for rep in range(reps):
        turns: list[tuple[str, ASGIApp]] = [("gate", gate), ("bare", _passed)]
        for name, app in turns if rep % 2 else turns[::-1]:
            started = time.process_time()
            for _ in range(requests):
                scope: dict[str, Any] = {"type": "http", "method": "POST", "path": "/mcp"}
                scope |= {"headers": _HEADERS, "client": ("127.0.0.1", 5000), BODY: body}
                await app(scope, receive, _nowhere)
            measured[name].append((time.process_time() - started) / requests * 1e6)
    return statistics.median(measured["gate"]), statistics.median(measured["bare"])


async def lease_us(url: str, calls: int, reps: int) -> tuple[float, float]:
    """(CPU us, wall us) per lease taken from the Redis at ``url``, medians."""
    from mcpfleet import redisconn
    from mcpfleet.registry import connect

    client = connect(url)
    store = RateStore(redisconn.DirectCommands(client))
    cpu: list[float] = []
    wall: list[float] = []
    try:
        for _ in range(50):  # connected, warm
            await store.take(KEY, 1e6, 10**9, 5)
        for _ in range(reps):
            started, started_wall = time.process_time(), time.perf_counter()
            for _ in range(calls):
                await store.take(KEY, 1e6, 10**9, 5)
            cpu.append((time.process_time() - started) / calls * 1e6)
            wall.append((time.perf_counter() - started_wall) / calls * 1e6)
        await client.delete(KEY)
    finally:
        await client.aclose()
    return statistics.median(cpu), statistics.median(wall)


async def run(url: str | None, requests: int, calls: int, reps: int) -> None:
    gate, bare = await gate_us(requests, reps)
    print(f"the gate, a lease held:  {gate - bare:6.1f} us CPU a round ({gate:.1f} vs {bare:.1f})")
    if url is None:
        print("one lease from Redis:    (give --redis URL)")
        return
    defaults = ReplicaConfig(keys_dir=Path("/nonexistent"))
    rate = Rate(defaults.limit_rounds, defaults.limit_burst)
    batch = batch_of(rate)
    cpu, wall = await lease_us(url, calls, reps)
    print(f"one lease from Redis:    {cpu:6.1f} us CPU, {wall:.1f} us wall a call")
    print(
        f"at the default {rate.rate:g}/s:   {cpu / batch:6.1f} us CPU a round "
        f"(a lease of {batch} rounds); with the gate {gate - bare + cpu / batch:.1f} us"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", help="a Redis URL (a redis-server of yours)")
    parser.add_argument("--requests", type=int, default=20_000, help="through the gate, a rep")
    parser.add_argument("--calls", type=int, default=2_000, help="leases from Redis, a rep")
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    import uvloop

    uvloop.run(run(args.redis, args.requests, args.calls, args.reps))


if __name__ == "__main__":
    main()
