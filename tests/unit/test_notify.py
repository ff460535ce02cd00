"""mcpfleet.notify in one process: the listen handler's contract, its bounds, the bus frames."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
from fastmcp import Context, FastMCP
from mcp.client import Client
from mcp.client.subscriptions import ResourceUpdated, ToolsListChanged
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import PromptsListChanged, ResourcesListChanged
from mcp_types import ToolListChangedNotification

import mcpfleet
from mcpfleet import notify
from mcpfleet.notify import FleetBus, install_notifications
from mcpfleet.notify._bus import decode, encode
from mcpfleet.notify._listen import ListenStreams

pytestmark = pytest.mark.unit

MODERN = "2026-07-28"


class Counts:
    """An observer that counts what it is told."""

    def __init__(self) -> None:
        self.seen: Counter[tuple[str, str]] = Counter()
        self.open = 0

    def published(self, kind: str) -> None:
        self.seen["published", kind] += 1

    def delivered(self, kind: str) -> None:
        self.seen["delivered", kind] += 1

    def dropped(self, reason: str) -> None:
        self.seen["dropped", reason] += 1

    def fanout(self, seconds: float) -> None:
        self.seen["fanout", ""] += 1

    def streams(self, delta: int) -> None:
        self.open += delta


def make_app() -> FastMCP[Any]:
    app: FastMCP[Any] = FastMCP("notify-test")

    @app.resource("memo://{name}")
    def memo(name: str) -> str:
        return name

    @app.tool
    async def retool(ctx: Context) -> str:
        await ctx.send_notification(ToolListChangedNotification())
        return "ok"

    @app.tool
    async def touch(uri: str) -> bool:
        return await mcpfleet.publish_resource_updated(uri)

    return app


@pytest.fixture
def counts() -> Counts:
    return Counts()


@pytest.fixture
def app(counts: Counts) -> Any:
    app = make_app()
    install_notifications(app, "mcpfleet:test:events", deadline=1.0, observer=counts)
    yield app
    notify.set_bus(None)


def test_frames_round_trip_and_anything_else_is_refused() -> None:
    for event in (
        ToolsListChanged(),
        PromptsListChanged(),
        ResourcesListChanged(),
        ResourceUpdated(uri="memo://a"),
    ):
        assert decode(encode(event, now=5.0)) == (event, 5.0)
    for junk in (b"", b"{}", b'{"k":"nope","t":1}', b'{"k":"resource","t":1}', b"[1]"):
        assert decode(junk) is None
    assert decode(b'{"k":"resource","t":1,"u":"' + b"x" * 5000 + b'"}') is None


async def test_a_listen_stream_is_acknowledged_and_gets_what_it_asked_for(
    app: Any, counts: Counts
) -> None:
    async with (
        Client(app._mcp_server, mode=MODERN) as client,
        client.listen(tools_list_changed=True) as tools,
        client.listen(resource_subscriptions=["memo://a"]) as memo,
    ):
        assert tools.honored.tools_list_changed is True
        assert memo.honored.resource_subscriptions == ["memo://a"]
        await client.call_tool("retool", {})
        result = await client.call_tool("touch", {"uri": "memo://b"})
        assert result.structured_content == {"result": True}
        await client.call_tool("touch", {"uri": "memo://a"})
        async with asyncio.timeout(2):
            assert await anext(aiter(tools)) == ToolsListChanged()
            assert await anext(aiter(memo)) == ResourceUpdated(uri="memo://a")
        assert counts.open == 2
    assert counts.open == 0
    assert counts.seen["published", "tools"] == 1
    assert counts.seen["published", "resource"] == 2
    assert counts.seen["delivered", "tools"] == 1
    assert counts.seen["delivered", "resource"] == 1


async def test_modern_discovery_says_list_changes_are_served(app: Any) -> None:
    async with Client(app._mcp_server, mode="auto") as client:
        caps = client.session.server_capabilities
        assert caps is not None and caps.tools is not None and caps.resources is not None
        assert caps.tools.list_changed and caps.resources.subscribe


def test_only_change_notifications_are_published_and_never_a_delivered_frame() -> None:
    from mcp.shared.subscriptions import event_to_notification
    from mcp_types import ResourceUpdatedNotification, ResourceUpdatedNotificationParams

    from mcpfleet.notify._listen import event_of

    assert event_of(ToolListChangedNotification()) == ToolsListChanged()
    updated = ResourceUpdatedNotification(params=ResourceUpdatedNotificationParams(uri="memo://a"))
    assert event_of(updated) == ResourceUpdated(uri="memo://a")
    frame = event_to_notification(ToolsListChanged(), {"io.modelcontextprotocol/subscriptionId": 1})
    assert event_of(frame) is None
    assert event_of(object()) is None


def test_installed_twice_the_middleware_is_replaced_not_stacked(counts: Counts) -> None:
    app = make_app()
    before = len(app._mcp_server.middleware)
    install_notifications(app, "c", deadline=1.0, observer=counts)
    install_notifications(app, "c", deadline=1.0, observer=counts)
    assert len(app._mcp_server.middleware) == before + 1
    notify.set_bus(None)


def listener_of(streams: ListenStreams) -> Any:
    return next(iter(streams.bus._listeners.values()))


async def test_a_stream_that_is_not_read_is_ended_at_its_bound(counts: Counts) -> None:
    """The handler is stuck writing (a client that reads nothing): its buffer fills,
    the stream is ended and counted, its slot freed at once."""
    bus = FleetBus("c", deadline=1.0, observer=counts)
    streams = ListenStreams(bus, counts, buffered=4)
    stuck = asyncio.Event()

    sent: list[str] = []

    class Session:
        async def send_notification(self, notification: Any, related_request_id: Any) -> None:
            sent.append(notification.method)
            if notification.method != "notifications/subscriptions/acknowledged":
                await stuck.wait()

    class Ctx:
        request_id = 7
        session = Session()

    from mcp_types import SubscriptionFilter, SubscriptionsListenRequestParams

    params = SubscriptionsListenRequestParams(
        notifications=SubscriptionFilter(tools_list_changed=True)
    )
    handler = asyncio.create_task(streams(Ctx(), params))  # type: ignore[arg-type]
    async with asyncio.timeout(2):
        while streams.open == 0:
            await asyncio.sleep(0)
    for _ in range(6):
        await bus.send(ToolsListChanged())
    assert counts.seen["dropped", "slow"] == 1
    assert streams.open == 0
    stuck.set()
    # What it held is dropped: it ends with the reason, not a result.
    with pytest.raises(MCPError) as ended:
        await asyncio.wait_for(handler, 2)
    assert ended.value.error.data == {"reason": "slow"}
    assert sent == ["notifications/subscriptions/acknowledged", "notifications/tools/list_changed"]


async def test_close_ends_every_stream_with_its_result(app: Any) -> None:
    async with (
        Client(app._mcp_server, mode=MODERN) as client,
        client.listen(tools_list_changed=True) as sub,
    ):
        handler = app._mcp_server.get_request_handler("subscriptions/listen").handler
        handler.close()
        async with asyncio.timeout(2):
            assert [e async for e in sub] == []


async def test_publishing_without_a_replica_says_so() -> None:
    notify.set_bus(None)
    assert await mcpfleet.publish_resource_updated("memo://a") is False
    with pytest.raises(ValueError):
        await mcpfleet.publish_resource_updated("")
    with pytest.raises(ValueError):
        await mcpfleet.publish_list_changed("widgets")  # type: ignore[arg-type]


def test_the_publishers_are_public_api() -> None:
    for name in ("publish_resource_updated", "publish_list_changed"):
        assert name in mcpfleet.__all__
        assert getattr(mcpfleet, name) is getattr(notify, name)


class Stalled:
    """A Redis client whose PUBLISH never answers."""

    async def publish(self, channel: str, data: bytes) -> int:
        await asyncio.Event().wait()
        return 0


async def test_a_publish_redis_does_not_take_fails_within_the_deadline(counts: Counts) -> None:
    bus = FleetBus("c", deadline=0.2, observer=counts)
    bus.attach(Stalled())
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await bus.send(ResourceUpdated(uri="memo://a")) is False
    assert loop.time() - started < 0.5
    assert counts.seen["dropped", "redis"] == 1
    assert counts.seen["published", "resource"] == 0
