"""Fan-out of notifications to many ``subscriptions/listen`` streams over a fleet.

Three replicas of ``fleetkit.apps.listenapp`` (limits off: one client holds every
stream), a thousand listen streams opened straight on the replicas in turn (a
third on each), each asking for ``tools/list_changed``. Then, one at a time,
``retool`` is called on the first replica: the tool-list change goes on the
fleet's channel in Redis and every replica writes it to each of its streams. For
each event the client notes when each stream's frame arrived, from the moment it
sent the call (so the figure includes the tool call itself), and waits for all of
them before the next event. The replicas' CPU (every thread's, ``/proc/<pid>/task/
*/schedstat``) is read around the events and divided by events x streams.

The client reads every stream in one process: on a 2-core machine it shares the
cores with the replicas, so the latencies are an upper bound of what the fleet
alone would show. Nothing here asserts: a benchmark reports, tests prove behaviour.

    PYTHONPATH=hack/devkit .venv/bin/python -m benchkit.listenbench [--quick]
"""

from __future__ import annotations

import asyncio
import math
import shutil
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path

import httpx

from benchkit.roundcost import cpu_ns
from benchkit.table import Row, part_main
from fleetkit.clients.listen import Listener, listening
from fleetkit.clients.wire import modern_call
from fleetkit.fleet import DEVKIT_DIR
from mcpfleet.dev.fleet import LocalFleet

STREAMS, QUICK_STREAMS = 1000, 90
EVENTS, QUICK_EVENTS = 20, 3
REPLICAS = 3
#: How long one event may take to reach every stream before the run gives up.
EVENT_DEADLINE = 60.0


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by the nearest rank."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    rank = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[rank]


def fanout_rows(
    latencies: list[float], last: list[float], cpu: int, events: int, streams: int
) -> list[Row]:
    """The rows of one run: ``latencies`` (s) of every delivery, ``last`` (s) the
    slowest stream's of each event, ``cpu`` (ns) the replicas' over the events."""
    per = cpu / 1e3 / (events * streams)
    p50, p99 = quantile(latencies, 0.5) * 1e3, quantile(latencies, 0.99) * 1e3
    note = f"{streams} streams over {REPLICAS} replicas, {events} events"
    return [
        (
            "listen fan-out, call sent -> frame at each stream",
            f"p50 {p50:.1f} ms / p99 {p99:.1f} ms",
            "",
            note,
        ),
        (
            "listen fan-out, call sent -> frame at the last stream",
            f"p50 {quantile(last, 0.5) * 1e3:.1f} ms / max {max(last) * 1e3:.1f} ms",
            "",
            "per event: when every stream had it",
        ),
        (
            "replicas' CPU per event per listen stream",
            f"{per:.1f} us",
            "",
            f"{cpu / 1e6 / events:.1f} ms per event over the {REPLICAS} replicas",
        ),
    ]


async def _open(
    http: httpx.AsyncClient, stack: AsyncExitStack, urls: list[str], n: int
) -> list[Listener]:
    opened: list[Listener] = []
    for i in range(n):
        listener = await stack.enter_async_context(
            listening(http, urls[i % len(urls)], 100 + i, toolsListChanged=True)
        )
        ack = await listener.next_event(EVENT_DEADLINE)
        if ack.method != "notifications/subscriptions/acknowledged":
            raise RuntimeError(f"listen stream {i}: {ack.message}")
        opened.append(listener)
    return opened


def _retool(url: str, name: str) -> None:
    answer = modern_call(url, "retool", {"name": name})
    if answer.status != 200 or answer.error is not None:
        raise RuntimeError(f"retool: {answer.status} {answer.body}")


async def _arrivals(listeners: list[Listener], sent: float) -> list[float]:
    async def one(listener: Listener) -> float:
        frame = await listener.next_event(EVENT_DEADLINE)
        if frame.method != "notifications/tools/list_changed":
            raise RuntimeError(f"listen stream: unexpected {frame.message}")
        return frame.at - sent

    return list(await asyncio.gather(*(one(listener) for listener in listeners)))


async def _measure(urls: list[str], pids: list[int], streams: int, events: int) -> list[Row]:
    timeout = httpx.Timeout(10, read=None)
    limits = httpx.Limits(max_connections=streams + 10, max_keepalive_connections=10)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as http, AsyncExitStack() as stack:
        opened = await _open(http, stack, urls, streams)
        await asyncio.to_thread(_retool, urls[0], "warm")
        await _arrivals(opened, time.monotonic())
        latencies: list[float] = []
        last: list[float] = []
        before = sum(cpu_ns(pid) for pid in pids)
        for e in range(events):
            sent = time.monotonic()
            call = asyncio.create_task(asyncio.to_thread(_retool, urls[0], f"t{e}"))
            got = await _arrivals(opened, sent)
            await call
            latencies += got
            last.append(max(got))
        cpu = sum(cpu_ns(pid) for pid in pids) - before
    return fanout_rows(latencies, last, cpu, events, streams)


def listen_rows(quick: bool) -> list[Row]:
    """The fan-out rows, from a fleet started and stopped here."""
    streams, events = (QUICK_STREAMS, QUICK_EVENTS) if quick else (STREAMS, EVENTS)
    work = Path(tempfile.mkdtemp(prefix="mcpfleet-listenbench-"))
    lf = LocalFleet(
        work / "fleet",
        replicas=REPLICAS,
        routers=0,
        fleet="listenbench",
        app="fleetkit.apps.listenapp:app",
        extra_env={"PYTHONPATH": str(DEVKIT_DIR)},
        replica_args=["--listen-streams", str(streams)],
        limits=False,
    )
    try:
        lf.start()
        members = [lf.members[f"replica-{i}"] for i in range(REPLICAS)]
        urls = [f"{m.url}/mcp" for m in members]
        pids = [m.proc.popen.pid for m in members if m.proc.popen is not None]
        return asyncio.run(_measure(urls, pids, streams, events))
    finally:
        lf.stop()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    part_main("listen fan-out", __doc__, listen_rows, "90 streams, 3 events (a smoke run)")


if __name__ == "__main__":
    main()
