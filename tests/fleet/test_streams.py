"""Streams through the router: long, unbuffered, torn down when either side leaves."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Iterator

import httpx
import pytest

from fleetkit.clients.wire import MODERN, MODERN_META
from fleetkit.fleet import FleetOptions, local_fleet
from mcpfleet.dev.fleet import LocalFleet
from mcpfleet.dev.wait import wait_for
from mcpfleet.fleetclient import connect

from .conftest import shared

STREAM_APP = "fleetkit.apps.streamapp:app"


@pytest.fixture(scope="module")
def stream_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFleet]:
    workdir = tmp_path_factory.mktemp("streams")
    with local_fleet(workdir, FleetOptions(replicas=2, app=STREAM_APP)) as lf, shared(lf):
        yield lf


@pytest.mark.timeout(180)
async def test_a_minute_long_stream_arrives_complete_in_order_and_unbuffered(
    stream_fleet: LocalFleet,
) -> None:
    count, interval = 13, 5.0  # 60 s of events, 5 s apart
    arrivals: list[tuple[float, float]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        arrivals.append((time.monotonic(), progress))

    started = time.monotonic()
    async with connect(stream_fleet.url, "handshake", timeout=120) as client:
        result = await client.call_tool(
            "ticker", {"count": count, "interval": interval}, progress_handler=on_progress
        )
    elapsed = time.monotonic() - started
    assert str(result.data) == f"ticked {count} times"
    assert elapsed >= 60
    assert [p for _, p in arrivals] == [float(i) for i in range(1, count + 1)]
    # Unbuffered: each event reached the client when it was sent, not at the end.
    first = arrivals[0][0] - started
    assert first < 5, f"the first event took {first:.1f}s to arrive"
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(arrivals)]
    assert min(gaps) > interval * 0.6 and max(gaps) < interval * 1.6, gaps


def _inflight(lf: LocalFleet) -> dict[str, int]:
    return {n: a.inflight for n, a in lf.attestations().items()}


async def test_a_client_leaving_mid_stream_tears_the_upstream_request_down(
    stream_fleet: LocalFleet,
) -> None:
    """No session, no DELETE: only the closed connection tells the fleet the client left."""
    lf = stream_fleet
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "hold", "arguments": {"seconds": 45}, "_meta": MODERN_META},
    }
    headers = {
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": MODERN,
        "mcp-method": "tools/call",
        "mcp-name": "hold",
    }

    async def held_call() -> None:
        async with httpx.AsyncClient(timeout=60) as http:
            await http.post(lf.url, content=json.dumps(body), headers=headers)

    call = asyncio.create_task(held_call())
    await asyncio.to_thread(
        wait_for,
        lambda: sum(_inflight(lf).values()) >= 1,
        timeout=10,
        what="the held request to reach a replica",
        retry_on=(Exception,),
    )
    call.cancel()  # closes the client's connection mid-request
    with pytest.raises(asyncio.CancelledError):
        await call
    await asyncio.to_thread(
        wait_for,
        lambda: sum(_inflight(lf).values()) == 0,
        timeout=15,
        what="every replica to drop the abandoned request",
        retry_on=(Exception,),
    )
    status = httpx.get(lf.url.replace("/mcp", "/readyz"), timeout=2).json()
    assert status["serving"] == 2
