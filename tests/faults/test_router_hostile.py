"""Hostile input at the router: bursts of unknown session ids, huge header lines, odd paths.

One fleet (two replicas of the fault app, two routers) serves the module. Live
sessions are opened through the second router, so the first has not cached
them: during a burst, their lookups queue for Redis with the burst's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Iterator
from pathlib import Path

import httpx
import pytest

from fleetkit.apps.faultapp import EFFECTS_ENV
from fleetkit.faulttable import FaultTable
from fleetkit.fleet import FleetOptions, ProcessFleet, local_fleet

from .routerkit import open_session

LIVE = 20


@pytest.fixture(scope="module")
def hostile_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessFleet]:
    workdir = tmp_path_factory.mktemp("hostile")
    options = FleetOptions(
        replicas=2,
        routers=2,
        app="fleetkit.apps.faultapp:app",
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
        with contextlib.suppress(OSError):
            await writer.wait_closed()
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
    hostile_fleet: ProcessFleet, fault_table: FaultTable, burst: int
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


async def _huge_header(port: int, size: int) -> tuple[int, float]:
    """One request whose one header line is ``size`` bytes: the status the router
    answered (0 if none) and how long that took."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = time.monotonic()

    async def send() -> None:
        writer.write(b"POST /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\nx-huge: ")
        chunk = b"a" * (1 << 16)
        with contextlib.suppress(OSError):
            for _ in range(size // len(chunk)):
                writer.write(chunk)
                await writer.drain()
            writer.write(b"\r\n\r\n")
            await writer.drain()

    sender = asyncio.ensure_future(send())
    try:
        head = b""
        with contextlib.suppress(OSError):
            head = await asyncio.wait_for(reader.readuntil(b"\r\n"), timeout=30)
        took = time.monotonic() - started
    finally:
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError, OSError):
            await sender
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/1.1 ") else 0
    return status, took


async def _probe_while(
    port: int, pid: int, work: Awaitable[list[tuple[int, float]]]
) -> tuple[list[tuple[int, float]], float, int]:
    """Run ``work`` while polling /healthz and the router's RSS: (work's result,
    the slowest /healthz, the peak RSS in KiB)."""
    worst, peak = 0.0, _rss_kib(pid)
    done = asyncio.Event()

    async def probe() -> None:
        nonlocal worst, peak
        async with httpx.AsyncClient(timeout=30) as http:
            while not done.is_set():
                started = time.monotonic()
                await http.get(f"http://127.0.0.1:{port}/healthz")
                worst = max(worst, time.monotonic() - started)
                peak = max(peak, _rss_kib(pid))
                await asyncio.sleep(0.02)

    prober = asyncio.ensure_future(probe())
    try:
        result = await work
    finally:
        done.set()
        await prober
    return result, worst, peak


@pytest.mark.parametrize("megabytes", [1, 8, 64])
def test_a_huge_header_line_gets_431_at_once_and_costs_the_router_nothing(
    hostile_fleet: ProcessFleet, fault_table: FaultTable, megabytes: int
) -> None:
    lf = hostile_fleet
    port, pid = lf.router_ports[0], lf.router_procs[0].popen.pid  # type: ignore[union-attr]
    row = fault_table.row(f"header line of {megabytes} MB, 8 at once")
    before = _rss_kib(pid)

    async def eight() -> list[tuple[int, float]]:
        return list(await asyncio.gather(*(_huge_header(port, megabytes << 20) for _ in range(8))))

    answers, healthz, peak = asyncio.run(_probe_while(port, pid, eight()))
    row.attempts = len(answers)
    row.worst_seconds = max(t for _, t in answers)
    row.lost = sum(1 for s, _ in answers if s != 431)
    row.notes = (
        f"router RSS {before // 1024} -> peak {peak // 1024} MiB; worst /healthz {healthz:.3f}s"
    )
    assert [s for s, _ in answers] == [431] * 8, row.notes
    assert row.worst_seconds < 2.0, row.notes
    assert healthz < 0.5, row.notes
    assert peak - before < 32 * 1024, row.notes


REPLICA_ENDPOINTS = ("metrics", "readyz", "healthz")
TRICKS = (
    "/./{}",
    "/mcp/../{}",
    "/mcp/./../{}",
    "//{}",
    "/%2e/{}",
    "/mcp/%2e%2e/{}",
    "/mcp/%2E%2E/{}",
    "/mcp%2f..%2f{}",
    "/.well-known/oauth-x/../../{}",
)


def _get_head(target: str, host: str = "host: 127.0.0.1\r\n") -> bytes:
    return f"GET {target} HTTP/1.1\r\n{host}connection: close\r\n\r\n".encode()


def _router_made(data: bytes) -> bool:
    return b"\r\nx-mcpfleet-router-error: 1\r\n" in data.lower()


def test_no_replica_endpoint_is_reachable_through_the_router_in_any_spelling(
    hostile_fleet: ProcessFleet, fault_table: FaultTable
) -> None:
    lf = hostile_fleet
    port = lf.router_ports[0]
    row = fault_table.row("dot-segment and escaped paths to replica endpoints")
    targets = [t.format(e) for t in TRICKS for e in REPLICA_ENDPOINTS]

    async def send_all() -> list[tuple[int, bytes]]:
        return list(await asyncio.gather(*(_raw(port, _get_head(t)) for t in targets)))

    started = time.monotonic()
    answers = asyncio.run(send_all())
    row.answered(started)
    row.attempts = len(targets)
    leaked = [
        (t, s)
        for t, (s, data) in zip(targets, answers, strict=True)
        if s != 404 or not _router_made(data)
    ]
    row.lost = len(leaked)
    row.notes = f"{len(TRICKS)} spellings x {REPLICA_ENDPOINTS}: 404 from the router"
    assert not leaked, leaked


def test_odd_requests_get_the_json_rpc_error_shape_from_the_router(
    hostile_fleet: ProcessFleet,
) -> None:
    port = hostile_fleet.router_ports[0]
    twice = "host: 127.0.0.1\r\nhost: evil.example\r\n"
    cases = {
        "GET *": (_get_head("*"), 400),
        "two Host headers": (_get_head("/mcp", host=twice), 400),
        "a malformed header line": (b"GET /mcp HTTP/1.1\r\nno colon here\r\n\r\n", 400),
        "a malformed request line": (b"GET /mcp HTTP/9\x00\r\n\r\n", 400),
    }

    async def send_all() -> list[tuple[int, bytes]]:
        return list(await asyncio.gather(*(_raw(port, head) for head, _ in cases.values())))

    for (name, (_, status)), (got, data) in zip(
        cases.items(), asyncio.run(send_all()), strict=True
    ):
        assert got == status, (name, data[:300])
        assert _router_made(data), (name, data[:300])
        body = json.loads(data.split(b"\r\n\r\n", 1)[1])
        assert body["jsonrpc"] == "2.0" and body["error"]["code"] == -32600, (name, body)
