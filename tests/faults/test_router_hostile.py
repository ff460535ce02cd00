"""Hostile input at the router: bursts of unknown session ids, huge header lines, odd paths.

One fleet (two replicas of the fault app, two routers) serves the module. Live
sessions are opened through the second router, so the first has not cached
them: during a burst, their lookups queue for Redis with the burst's.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fleetkit.faultapp import EFFECTS_ENV
from fleetkit.fleet import FleetOptions, local_fleet
from mcpfleet.dev.fleet import LocalFleet

from .conftest import FaultTable
from .routerkit import open_session

LIVE = 20


@pytest.fixture(scope="module")
def hostile_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFleet]:
    workdir = tmp_path_factory.mktemp("hostile")
    options = FleetOptions(
        replicas=2,
        routers=2,
        app="fleetkit.faultapp:app",
        env={EFFECTS_ENV: str(workdir / "effects.log")},
    )
    with local_fleet(workdir / "fleet", options) as lf:
        yield lf


async def _raw(port: int, head: bytes, body: bytes = b"") -> tuple[int, bytes]:
    """One request on its own connection: the status and the whole response."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head + body)
        await writer.drain()
        data = await reader.read()
    finally:
        writer.close()
    status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else 0
    return status, data


def _post_head(session: str, body: bytes) -> bytes:
    return (
        b"POST /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n"
        b"content-type: application/json\r\naccept: application/json, text/event-stream\r\n"
        b"mcp-protocol-version: 2025-11-25\r\n"
        b"mcp-session-id: " + session.encode() + b"\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n\r\n"
    )


def _router_metric(port: int, name: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.parametrize("burst", [500, 2000])
def test_a_burst_of_unknown_session_ids_gets_404s_and_every_live_session_answers(
    hostile_fleet: LocalFleet, fault_table: FaultTable, burst: int
) -> None:
    lf = hostile_fleet
    row = fault_table.row(f"burst: {burst} random session ids + {LIVE} live sessions")
    with httpx.Client(timeout=30) as http:
        live = [open_session(http, lf.router_url(1), f"live-{i}")[0] for i in range(LIVE)]
    port = lf.router_ports[0]
    body = json.dumps({"jsonrpc": "2.0", "id": 5, "method": "tools/list"}).encode()

    async def burst_and_live() -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
        async def timed(session: str) -> tuple[int, float]:
            started = time.monotonic()
            status, _ = await _raw(port, _post_head(session, body), body)
            return status, time.monotonic() - started

        unknown = [timed(secrets.token_hex(16)) for _ in range(burst)]
        known = [timed(s) for s in live]
        # The live sessions' requests go in the middle of the burst.
        mixed = unknown[: burst // 2] + known + unknown[burst // 2 :]
        results = await asyncio.gather(*mixed)
        half = burst // 2
        return [*results[:half], *results[half + LIVE :]], list(results[half : half + LIVE])

    unknown, known = asyncio.run(burst_and_live())
    row.attempts = burst + LIVE
    row.worst_seconds = max(t for _, t in unknown + known)
    unknown_statuses = Counter(s for s, _ in unknown)
    known_statuses = Counter(s for s, _ in known)
    row.lost = burst - unknown_statuses[404] + LIVE - known_statuses[200]
    degraded = _router_metric(port, "mcpfleet_router_degraded")
    row.notes = (
        f"unknown ids: {dict(unknown_statuses)}; live: {dict(known_statuses)}; "
        f"worst live {max(t for _, t in known):.2f}s; degraded={degraded:.0f}"
    )
    assert known_statuses == {200: LIVE}, row.notes
    assert unknown_statuses == {404: burst}, row.notes
    assert degraded == 0, "a full pool is not Redis down"
    ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).json()
    assert ready["degraded"] is False


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")
