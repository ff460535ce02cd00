"""Notifications across the fleet: ``subscriptions/listen`` on every replica, one bus in Redis.

Three replicas of ``fleetkit.apps.listenapp`` behind one router. A listen
stream is opened on each replica directly and through the router; a change
made by a tool on one replica reaches every stream that asked for it, once,
tagged with the stream's own request id; a replica that drains ends its
streams; with Redis stopped, publishing is bounded and counted.
"""

from __future__ import annotations

import asyncio
import signal
import statistics
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleetkit.clients.listen import SUBSCRIPTION_ID, Listener, listening
from fleetkit.clients.rawsession import metric_sum
from fleetkit.clients.wire import MODERN, modern_call
from fleetkit.fleet import FleetOptions, local_fleet
from mcpfleet.dev.fleet import LocalFleet
from mcpfleet.dev.wait import wait_for

from .conftest import shared, watched

pytestmark = pytest.mark.fleet

APP = "fleetkit.apps.listenapp:app"
#: Seconds within which an event published on one replica must reach every stream.
BOUND = 2.0
#: Rounds of the fan-out measurement (each a list change seen by every stream).
ROUNDS = 30
#: The replicas' Redis deadline (the default), which a publish must not outlive.
DEADLINE = 2.0


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFleet]:
    with local_fleet(tmp_path_factory.mktemp("listen"), FleetOptions(app=APP)) as lf, shared(lf):
        yield lf


def urls(lf: LocalFleet) -> list[str]:
    """Each replica's MCP endpoint, then the router's."""
    return [f"{m.url}/mcp" for m in lf.members.values()] + [lf.url]


_CALLS = httpx.Client(timeout=10)


async def call(url: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """A modern ``tools/call``, on one kept connection per replica."""
    answer = await asyncio.to_thread(modern_call, url, tool, arguments, client=_CALLS)
    assert answer.status == 200 and answer.error is None, answer.body
    return answer.result


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(10, read=None)) as client:
        yield client


async def open_streams(
    stack: AsyncExitStack, http: httpx.AsyncClient, targets: list[str], **notifications: Any
) -> list[Listener]:
    """One stream per target, each acknowledged first (checked) with its own request id."""
    streams = []
    for i, url in enumerate(targets):
        listener = await stack.enter_async_context(listening(http, url, 100 + i, **notifications))
        assert listener.status == 200, listener.status
        ack = await listener.next_event(BOUND)
        assert ack.method == "notifications/subscriptions/acknowledged", ack.message
        assert ack.message is not None
        params = ack.message["params"]
        assert params["_meta"][SUBSCRIPTION_ID] == 100 + i
        assert params["notifications"] == notifications, params
        streams.append(listener)
    return streams


async def test_a_tool_list_change_reaches_every_stream_once(
    fleet: LocalFleet, http: httpx.AsyncClient
) -> None:
    """Six streams (each replica directly, three through the router); ``retool`` run on each
    replica in turn: every stream gets exactly one ``tools/list_changed`` per change."""
    targets = urls(fleet)
    replicas, router = targets[:-1], targets[-1]
    async with AsyncExitStack() as stack:
        streams = await open_streams(
            stack, http, [*replicas, router, router, router], toolsListChanged=True
        )
        assert {s.replica for s in streams[:3]} == set(fleet.members)
        latencies, calls = [], []
        for n in range(ROUNDS):
            started = time.monotonic()
            await call(replicas[n % 3], "retool", {"name": f"added_{n}"})
            calls.append(time.monotonic() - started)
            for stream in streams:
                frame = await stream.next_event(BOUND)
                assert frame.method == "notifications/tools/list_changed", frame.message
                assert frame.message is not None
                assert frame.message["params"]["_meta"][SUBSCRIPTION_ID] == stream.request_id
                latencies.append(frame.at - started)
        await asyncio.sleep(0.5)  # long past the fan-out: anything more would be a duplicate
        assert all(s.pending_events() == [] for s in streams)
    cuts = statistics.quantiles(latencies, n=100)
    print(
        f"\nfan-out, tools/call sent to frame read on each of {len(streams)} streams, "
        f"{len(latencies)} deliveries: p50 {cuts[49] * 1000:.1f} ms, p99 {cuts[98] * 1000:.1f} ms"
        f" (the tools/call round trip alone: p50 {statistics.median(calls) * 1000:.1f} ms)"
    )
    assert max(latencies) < BOUND


async def test_resources_updated_reaches_only_the_streams_that_asked(
    fleet: LocalFleet, http: httpx.AsyncClient
) -> None:
    targets = urls(fleet)
    async with AsyncExitStack() as stack:
        a, b = await open_streams(
            stack, http, targets[:2], resourceSubscriptions=["memo://a", "memo://c"]
        )
        (other,) = await open_streams(stack, http, [targets[2]], resourceSubscriptions=["memo://b"])
        (tools,) = await open_streams(stack, http, [targets[3]], toolsListChanged=True)
        result = await call(targets[2], "touch", {"uri": "memo://a"})
        assert result["structuredContent"] == {"result": True}, result
        for stream in (a, b):
            frame = await stream.next_event(BOUND)
            assert frame.method == "notifications/resources/updated", frame.message
            assert frame.message is not None
            assert frame.message["params"]["uri"] == "memo://a"
            assert frame.message["params"]["_meta"][SUBSCRIPTION_ID] == stream.request_id
        await asyncio.sleep(0.5)
        assert [s.pending_events() for s in (a, b, other, tools)] == [[], [], [], []]


async def test_the_official_client_listens_through_the_router(fleet: LocalFleet) -> None:
    """mcp's own client (``Client.listen``) hears a change made on another replica."""
    from mcp.client import Client
    from mcp.client.subscriptions import ToolsListChanged

    async with (
        Client(fleet.url, mode=MODERN) as client,
        client.listen(tools_list_changed=True) as sub,
    ):
        assert sub.honored.tools_list_changed is True
        first = next(iter(fleet.members.values()))
        await call(f"{first.url}/mcp", "retool", {"name": "by_official_client"})
        async with asyncio.timeout(BOUND):
            event = await anext(aiter(sub))
        assert isinstance(event, ToolsListChanged)


@pytest.fixture
def own_fleet(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[LocalFleet]:
    with local_fleet(tmp_path, FleetOptions(app=APP)) as lf, watched(request, lf):
        yield lf


async def test_a_draining_replica_ends_its_streams(
    own_fleet: LocalFleet, http: httpx.AsyncClient
) -> None:
    """An idle stream gets mcp's keep-alive comment; a drain ends the stream with its
    result frame (the graceful close); the client listens again through the router."""
    lf = own_fleet
    name, member = next(iter(lf.members.items()))
    async with AsyncExitStack() as stack:
        (stream,) = await open_streams(stack, http, [f"{member.url}/mcp"], toolsListChanged=True)
        ping = await stream.next(20.0)
        assert ping.message is None and ping.comment.startswith(":"), ping
        lf.drain(name)
        last = await stream.next_event(5.0)
        assert last.message is not None and last.message.get("id") == stream.request_id, last
        assert last.message["result"]["_meta"][SUBSCRIPTION_ID] == stream.request_id
        async with asyncio.timeout(5.0):
            await stream.ended.wait()
        (again,) = await open_streams(stack, http, [lf.url], toolsListChanged=True)
        assert again.replica != name


async def test_redis_stopped_publishing_is_bounded_and_counted(
    own_fleet: LocalFleet, http: httpx.AsyncClient
) -> None:
    """Redis SIGSTOPped: ``touch`` answers False within the Redis deadline, the drop is
    counted, the streams stay open; Redis resumed, delivery resumes."""
    lf = own_fleet
    assert lf.redis is not None
    targets = urls(lf)
    members = list(lf.members.values())
    async with AsyncExitStack() as stack:
        streams = await open_streams(stack, http, targets[:3], resourceSubscriptions=["memo://x"])
        lf.redis.signal(signal.SIGSTOP)
        try:
            started = time.monotonic()
            result = await call(targets[0], "touch", {"uri": "memo://x"})
            took = time.monotonic() - started
            assert result["structuredContent"] == {"result": False}, result
            # Refused by the client's socket timeout or the deadline, whichever first.
            assert took < DEADLINE + 0.5, took
            metrics = httpx.get(f"{members[0].url}/metrics").text
            assert metric_sum(metrics, "mcpfleet_events_dropped_total", reason="redis") == 1
            print(f"\npublish with Redis stopped: answered False after {took:.2f} s")
            assert not any(s.ended.is_set() for s in streams)
        finally:
            lf.redis.signal(signal.SIGCONT)
        assert not any(s.ended.is_set() for s in streams)
        wait_for(
            lambda: (
                modern_call(targets[1], "touch", {"uri": "memo://x"}).result.get(
                    "structuredContent"
                )
                == {"result": True}
            ),
            timeout=10,
            what="a publish once Redis is back",
        )
        for stream in streams:
            frame = await stream.next_event(BOUND)
            assert frame.method == "notifications/resources/updated", frame.message
