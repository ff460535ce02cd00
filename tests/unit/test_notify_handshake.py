"""mcpfleet.notify for handshake sessions, in one process: subscriptions, the per-session
queues, the event store's ids and its failure path, and priming by the session's version."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from typing import Any

import pytest
from fastmcp import FastMCP
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import ResourceUpdated, ToolsListChanged
from mcp_types import JSONRPCRequest, SubscribeRequestParams, UnsubscribeRequestParams

from mcpfleet.contract import RedisKeys
from mcpfleet.notify import FleetBus, RedisEventStore, install_sessions
from mcpfleet.notify._bus import MAX_URI
from mcpfleet.notify._eventstore import BACKOFF, MAX_STORED, digest, parse_event_id
from mcpfleet.notify._resume import SessionPrimedTransport, _sent_already, prime_by_session
from mcpfleet.notify._sessions import BUFFERED_EVENTS, MAX_SUBSCRIPTIONS, HandshakeSessions

pytestmark = pytest.mark.unit

HANDSHAKE = "2025-11-25"


class Counts:
    def __init__(self) -> None:
        self.seen: Counter[tuple[str, str]] = Counter()

    def delivered(self, kind: str) -> None:
        self.seen["delivered", kind] += 1

    def dropped(self, reason: str) -> None:
        self.seen["dropped", reason] += 1


class Connection:
    """What the sessions use of mcp's ``Connection``: the standalone channel's sends."""

    has_standalone_channel = True

    def __init__(self) -> None:
        self.exit_stack = contextlib.ExitStack()
        self.sent: list[tuple[str, str | None]] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def send_tool_list_changed(self) -> None:
        await self.gate.wait()
        self.sent.append(("tools", None))

    async def send_resource_updated(self, uri: str) -> None:
        await self.gate.wait()
        self.sent.append(("resource", uri))


class Ctx:
    """A request's context as the handlers read it: the session and its connection."""

    def __init__(self, connection: Connection, version: str = HANDSHAKE) -> None:
        self.session = type("Session", (), {"_connection": connection})()
        self.protocol_version = version


async def settled(*connections: Connection, count: int) -> None:
    async with asyncio.timeout(5):
        while sum(len(c.sent) for c in connections) < count:
            await asyncio.sleep(0.01)


async def test_updates_reach_only_subscribed_sessions_and_list_changes_reach_all() -> None:
    counts = Counts()
    sessions = HandshakeSessions(counts)
    a, b, c = Connection(), Connection(), Connection()
    await sessions.subscribe(Ctx(a), SubscribeRequestParams(uri="memo://x"))  # type: ignore[arg-type]
    await sessions.subscribe(Ctx(b), SubscribeRequestParams(uri="memo://y"))  # type: ignore[arg-type]
    await sessions.subscribe(Ctx(c), SubscribeRequestParams(uri="memo://x"))  # type: ignore[arg-type]
    await sessions.unsubscribe(Ctx(c), UnsubscribeRequestParams(uri="memo://x"))  # type: ignore[arg-type]
    assert sessions.open == 3 and sessions.subscribed("memo://x") == 1
    sessions.deliver(ResourceUpdated(uri="memo://x"))
    sessions.deliver(ToolsListChanged())
    await settled(a, b, c, count=4)
    assert a.sent == [("resource", "memo://x"), ("tools", None)]
    assert b.sent == c.sent == [("tools", None)]
    assert counts.seen == Counter({("delivered", "resource"): 1, ("delivered", "tools"): 3})
    for conn in (a, b, c):
        conn.exit_stack.close()  # the sessions close: forgotten, writers stopped
    assert sessions.open == 0


async def test_a_session_that_reads_nothing_loses_events_past_its_queue_and_no_other_does() -> None:
    counts = Counts()
    sessions = HandshakeSessions(counts)
    stuck, fine = Connection(), Connection()
    stuck.gate.clear()
    for conn in (stuck, fine):
        await sessions.subscribe(Ctx(conn), SubscribeRequestParams(uri="memo://x"))  # type: ignore[arg-type]
    extra = 10
    for _ in range(BUFFERED_EVENTS + 1 + extra):  # one is taken by the stuck writer
        sessions.deliver(ResourceUpdated(uri="memo://x"))
        await asyncio.sleep(0)  # as the bus's reader does between two messages
    await settled(fine, count=BUFFERED_EVENTS + 1 + extra)
    assert counts.seen["dropped", "slow"] == extra
    stuck.gate.set()
    await settled(stuck, fine, count=2 * (BUFFERED_EVENTS + 1) + extra)
    sessions.close()


async def test_subscriptions_are_bounded_per_session_and_in_length() -> None:
    sessions = HandshakeSessions(Counts())
    conn = Connection()
    with pytest.raises(MCPError):
        await sessions.subscribe(Ctx(conn), SubscribeRequestParams(uri="m://" + "x" * MAX_URI))  # type: ignore[arg-type]
    for n in range(MAX_SUBSCRIPTIONS):
        await sessions.subscribe(Ctx(conn), SubscribeRequestParams(uri=f"m://{n}"))  # type: ignore[arg-type]
    await sessions.subscribe(Ctx(conn), SubscribeRequestParams(uri="m://0"))  # type: ignore[arg-type]
    with pytest.raises(MCPError):
        await sessions.subscribe(Ctx(conn), SubscribeRequestParams(uri="m://one-more"))  # type: ignore[arg-type]
    sessions.close()


def test_handshake_discovery_says_resources_can_be_subscribed() -> None:
    app: FastMCP[Any] = FastMCP("subscribe-test")

    @app.resource("memo://{name}")
    def memo(name: str) -> str:
        return name

    lowlevel = app._mcp_server
    assert not lowlevel.get_capabilities(protocol_version=HANDSHAKE).resources.subscribe
    install_sessions(app, FleetBus("c", deadline=1), Counts())
    install_sessions(app, FleetBus("c", deadline=1), Counts())
    assert lowlevel.get_capabilities(protocol_version=HANDSHAKE).resources.subscribe
    assert sum(isinstance(m, HandshakeSessions) for m in lowlevel.middleware) == 1


def test_event_ids_name_their_stream_and_anything_else_is_refused() -> None:
    name = digest("8:abcdefgh:_GET_stream")
    assert len(name) == 32 and name == digest("8:abcdefgh:_GET_stream")
    assert parse_event_id(f"{name}/1700000000000-3") == (name, "1700000000000-3")
    for bad in ("", f"{name}/1-0\n", f"{name}/x-0", f"{name[:-1]}/1-0", "a" * 200, f"{name}/1"):
        assert parse_event_id(bad) is None, bad
    assert _sent_already(f"{name}/5-1", f"{name}/5-1")
    assert _sent_already(f"{name}/4-9", f"{name}/5-0")
    assert not _sent_already(f"{name}/5-2", f"{name}/5-1")
    assert not _sent_already("", f"{name}/5-1")  # not stored: always sent
    assert not _sent_already(f"{digest('other')}/1-0", f"{name}/5-1")


class FailingRedis:
    def __init__(self, hang: bool = False) -> None:
        self.calls = 0
        self.hang = hang

    async def eval(self, *args: Any) -> Any:
        self.calls += 1
        if self.hang:
            await asyncio.Event().wait()
        raise ConnectionError("refused")


@pytest.mark.parametrize("hang", [False, True], ids=["refused", "stalled"])
async def test_a_store_redis_does_not_take_answers_without_an_id_and_then_waits(
    hang: bool,
) -> None:
    counts = Counts()
    store = RedisEventStore(RedisKeys("t"), deadline=0.05, observer=counts)
    assert store.backoff == BACKOFF
    ping = JSONRPCRequest(jsonrpc="2.0", id=1, method="ping")
    assert await store.store_event("s", ping) == ""  # no Redis yet: not stored, not counted
    redis = FailingRedis(hang)
    store.attach(redis)
    assert await store.store_event("s", ping) == ""
    assert await store.store_event("s", None) == ""  # within the backoff: Redis not asked
    assert redis.calls == 1 and counts.seen["dropped", "store"] == 2
    assert await store.replay_events_after("not-an-id", _never) is None
    assert redis.calls == 1  # a hostile id never reaches Redis
    eager = RedisEventStore(RedisKeys("t"), deadline=0.05, observer=counts, backoff=0.0)
    eager.attach(redis)
    assert await eager.store_event("s", ping) == "" and await eager.store_event("s", ping) == ""
    assert redis.calls == 3  # no backoff: each write asks again


async def _never(event: Any) -> None:
    raise AssertionError(f"nothing is replayed: {event}")


def test_a_session_opened_at_2025_11_25_is_primed_whatever_a_later_header_says() -> None:
    transport = SessionPrimedTransport(mcp_session_id="s")
    assert transport._session_version(HANDSHAKE) == HANDSHAKE  # its initialize
    assert transport._session_version("2025-03-26") == HANDSHAKE
    older = SessionPrimedTransport(mcp_session_id="t")
    assert older._session_version("2025-03-26") == "2025-03-26"
    assert older._session_version("2025-11-25") == "2025-11-25"  # the header may say more


async def test_every_new_session_of_the_app_gets_the_primed_transport() -> None:
    app: FastMCP[Any] = FastMCP("prime-test")
    http_app = app.http_app(
        path="/mcp", event_store=RedisEventStore(RedisKeys("t"), deadline=1, observer=Counts())
    )
    async with http_app.router.lifespan_context(http_app):
        assert prime_by_session(http_app)
        from mcpfleet.notify._resume import _session_manager

        manager = _session_manager(http_app)
        transport = manager._admit_session(None)
        assert type(transport) is SessionPrimedTransport
        assert isinstance(transport, StreamableHTTPServerTransport)
    assert not prime_by_session(object())


async def test_a_message_over_the_stored_size_goes_out_without_an_id_and_never_to_redis() -> None:
    counts = Counts()
    store = RedisEventStore(RedisKeys("t"), deadline=1, observer=counts)
    redis = FailingRedis()
    store.attach(redis)
    big = JSONRPCRequest(jsonrpc="2.0", id=1, method="x" * MAX_STORED)
    assert await store.store_event("s", big) == ""
    assert redis.calls == 0 and counts.seen["dropped", "store"] == 1


async def test_on_an_untested_mcp_the_transport_is_left_as_mcp_made_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app: FastMCP[Any] = FastMCP("untested-mcp")
    http_app = app.http_app(path="/mcp")
    monkeypatch.setattr("mcpfleet.notify._resume.importlib.metadata.version", lambda _: "2.99.0")
    async with http_app.router.lifespan_context(http_app):
        assert not prime_by_session(http_app)


async def test_past_the_memory_limit_nothing_is_stored_and_each_event_is_counted() -> None:
    counts = Counts()
    store = RedisEventStore(RedisKeys("t"), deadline=1, observer=counts, backoff=0.0)
    redis = FailingRedis()
    full = [True]
    store.attach(redis, full=lambda: full[0])
    ping = JSONRPCRequest(jsonrpc="2.0", id=1, method="ping")
    assert await store.store_event("s", ping) == "" and await store.store_event("s", None) == ""
    assert redis.calls == 0 and counts.seen["dropped", "store"] == 2
    full[0] = False  # below the limit again: Redis is asked (and here refuses)
    assert await store.store_event("s", ping) == ""
    assert redis.calls == 1
