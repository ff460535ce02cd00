"""The fleet's events on handshake-era sessions, and SSE streams that resume.

Three replicas of ``fleetkit.apps.listenapp`` behind one router. A 2025-11-25
session's GET stream hears a list change made on another replica; a
``resources/updated`` reaches the sessions subscribed to its URI, whichever
replica published it, and no other; a GET stream cut (the client's
connection dropped, the router SIGKILLed and started again) resumes with
``Last-Event-ID`` and gets every event once, in order; the event store's
bounds hold in the fleet's Redis; with Redis stopped, a session still gets
its answers, without ids, within the Redis deadline.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp_types import JSONRPCRequest

from fleetkit.clients.rawsession import RawSession, metric_sum
from fleetkit.clients.ssestream import Event, GetStream, get_stream
from fleetkit.clients.wire import modern_call
from fleetkit.fleet import FleetOptions, local_fleet
from mcpfleet.contract import RedisKeys
from mcpfleet.dev.fleet import LocalFleet
from mcpfleet.dev.wait import wait_for
from mcpfleet.notify import RETRY_MS, RedisEventStore
from mcpfleet.notify._eventstore import parse_event_id
from mcpfleet.registry import connect

from .conftest import shared, watched

pytestmark = pytest.mark.fleet

APP = "fleetkit.apps.listenapp:app"
#: Seconds within which an event published on one replica must reach a session.
BOUND = 5.0
#: The replicas' Redis deadline (the default).
DEADLINE = 2.0

_CALLS = httpx.Client(timeout=10)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFleet]:
    with local_fleet(tmp_path_factory.mktemp("sse"), FleetOptions(app=APP)) as lf, shared(lf):
        yield lf


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(10, read=None)) as client:
        yield client


def replica_urls(lf: LocalFleet) -> dict[str, str]:
    return {name: f"{m.url}/mcp" for name, m in lf.members.items()}


async def modern(url: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """A modern ``tools/call`` (any replica may serve it), its result checked."""
    answer = await asyncio.to_thread(modern_call, url, tool, arguments, client=_CALLS)
    assert answer.status == 200 and answer.error is None, answer.body
    return answer.result


async def touch(url: str, uri: str) -> None:
    result = await modern(url, "touch", {"uri": uri})
    assert result["structuredContent"] == {"result": True}, result


async def session(http: httpx.AsyncClient, url: str, *subscribed: str) -> RawSession:
    """A 2025-11-25 session at ``url``, subscribed to each URI of ``subscribed``."""
    s = RawSession(url, http)
    await s.open("sse-client")
    for uri in subscribed:
        resp = await s.request("resources/subscribe", {"uri": uri})
        assert resp.status_code == 200 and '"result":{}' in resp.text, resp.text
    return s


async def opened(stack: AsyncExitStack, http: httpx.AsyncClient, s: RawSession) -> GetStream:
    """The session's GET stream, open, its priming event read (checked)."""
    stream = await stack.enter_async_context(get_stream(http, s))
    assert stream.status == 200, stream.status
    primer = await stream.next(BOUND)
    assert primer.message is None and primer.id and primer.retry == RETRY_MS, primer
    return stream


def uris(events: list[Event]) -> list[str]:
    out = []
    for event in events:
        assert event.method == "notifications/resources/updated", event.message
        assert event.message is not None
        out.append(event.message["params"]["uri"])
    return out


async def test_a_list_change_on_another_replica_reaches_a_handshake_get_stream(
    fleet: LocalFleet, http: httpx.AsyncClient
) -> None:
    """A session through the router; ``retool`` run on each other replica directly: its GET
    stream gets ``tools/list_changed`` for each, with an event id."""
    s = await session(http, fleet.url)
    others = [url for name, url in replica_urls(fleet).items() if name != s.replica]
    async with AsyncExitStack() as stack:
        stream = await opened(stack, http, s)
        assert stream.replica == s.replica
        for n, url in enumerate(others):
            await modern(url, "retool", {"name": f"handshake_{n}"})
            event = await stream.next_message(BOUND)
            assert event.method == "notifications/tools/list_changed", event.message
            assert event.id and parse_event_id(event.id), event.id


async def test_resources_updated_reaches_only_the_subscribed_sessions_on_any_replica(
    fleet: LocalFleet, http: httpx.AsyncClient
) -> None:
    """Sessions on each replica and one through the router; ``memo://watched`` touched on
    another replica: the two subscribed sessions get it; the session subscribed elsewhere
    and the one that unsubscribed do not (their next event is the list change that
    followed: each session's events come in the bus's one order)."""
    urls = list(replica_urls(fleet).values())
    watching = await session(http, urls[0], "memo://watched")
    routed = await session(http, fleet.url, "memo://watched", "memo://else")
    elsewhere = await session(http, urls[1], "memo://else")
    left = await session(http, urls[2], "memo://watched")
    resp = await left.request("resources/unsubscribe", {"uri": "memo://watched"})
    assert resp.status_code == 200 and '"result":{}' in resp.text, resp.text
    async with AsyncExitStack() as stack:
        streams = [await opened(stack, http, s) for s in (watching, routed, elsewhere, left)]
        await touch(urls[1], "memo://watched")
        await modern(urls[2], "retool", {"name": "after_watched"})
        for stream in streams[:2]:
            first = await stream.next_message(BOUND)
            assert uris([first]) == ["memo://watched"]
        for stream in streams:
            change = await stream.next_message(BOUND)
            assert change.method == "notifications/tools/list_changed", change.message


async def test_a_stream_cut_by_the_client_resumes_with_last_event_id_without_loss(
    fleet: LocalFleet, http: httpx.AsyncClient
) -> None:
    """Ten updates read; the connection dropped; ten more published while it is cut,
    then twenty more published while the client resumes: the resumed stream gets the
    thirty, once each, in order, with growing ids."""
    names = [f"memo://seq/{n}" for n in range(40)]
    s = await session(http, fleet.url, *names)
    urls = list(replica_urls(fleet).values())
    async with get_stream(http, s) as first:
        await first.next(BOUND)
        for n in range(10):
            await touch(urls[n % 3], names[n])
        got = [await first.next_message(BOUND) for _ in range(10)]
        assert uris(got) == names[:10]
        resume_from = first.last_id
    assert resume_from is not None
    for n in range(10, 20):
        await touch(urls[n % 3], names[n])

    async def more() -> None:
        for n in range(20, 40):
            await touch(urls[n % 3], names[n])

    publishing = asyncio.create_task(more())
    async with get_stream(http, s, resume_from) as resumed:
        assert resumed.status == 200, resumed.status
        got = [await resumed.next_message(BOUND) for _ in range(30)]
        await publishing
        await asyncio.sleep(0.5)  # long past the fan-out: anything more is a duplicate
        extra = resumed.pending_messages()
    assert uris(got) == names[10:40]
    assert extra == []
    assert_growing_ids([*got])


def assert_growing_ids(events: list[Event]) -> None:
    order = []
    for event in events:
        parsed = parse_event_id(event.id or "")
        assert parsed is not None, event.id
        ms, seq = parsed[1].split("-")
        order.append((int(ms), int(seq)))
    assert order == sorted(order) and len(set(order)) == len(order), order


async def test_a_stream_cut_by_a_router_killed_resumes_through_it_restarted(
    fleet: LocalFleet, http: httpx.AsyncClient
) -> None:
    """The router SIGKILLed under an open GET stream; events published while it is down
    reach the session's owner; the router started again, the client resumes with
    ``Last-Event-ID`` through it: the events come, once each, in order."""
    names = [f"memo://cut/{n}" for n in range(12)]
    s = await session(http, fleet.url, *names)
    urls = list(replica_urls(fleet).values())
    router = fleet.router_procs[0]
    async with get_stream(http, s) as first:
        await first.next(BOUND)
        for n in range(4):
            await touch(urls[n % 3], names[n])
        assert uris([await first.next_message(BOUND) for _ in range(4)]) == names[:4]
        router.signal(signal.SIGKILL)
        assert router.wait(10) is not None
        async with asyncio.timeout(BOUND):
            await first.ended.wait()
        resume_from = first.last_id
    for n in range(4, 12):
        await touch(urls[n % 3], names[n])
    router.start(fleet.env())
    wait_for(lambda: router_answers(fleet), timeout=30, what="the router to serve again")
    async with get_stream(http, s, resume_from) as resumed:
        assert resumed.status == 200 and resumed.replica == s.replica
        got = [await resumed.next_message(BOUND) for _ in range(8)]
        await asyncio.sleep(0.5)
        extra = resumed.pending_messages()
    assert uris(got) == names[4:]
    assert extra == []
    assert_growing_ids(got)


def router_answers(lf: LocalFleet) -> bool:
    try:
        return httpx.get(lf.url.removesuffix("/mcp") + "/readyz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


class Drops:
    """The event store's observer: what it lost, by reason."""

    def __init__(self) -> None:
        self.reasons: list[str] = []

    def dropped(self, reason: str) -> None:
        self.reasons.append(reason)


async def stored(store: RedisEventStore, stream: str, n: int) -> list[str]:
    """``n`` events stored on ``stream`` (pings, told apart by their ids); their ids."""
    ids = []
    for k in range(n):
        ping = JSONRPCRequest(jsonrpc="2.0", id=k, method="ping")
        ids.append(await store.store_event(stream, ping))
    assert all(ids), ids
    return ids


async def replayed(store: RedisEventStore, after: str) -> tuple[str | None, list[Any]]:
    got: list[Any] = []

    async def keep(event: Any) -> None:
        got.append(event.message.id)

    return await store.replay_events_after(after, keep), got


async def test_the_event_store_keeps_the_last_events_of_a_stream_within_their_ttl(
    fleet: LocalFleet,
) -> None:
    """In the fleet's Redis, the store's own bounds, small: three events per stream, one
    second. Past the count, the oldest are gone (a resume from one replays nothing); past
    the TTL, every one is (and the key); a hostile id never reaches Redis."""
    keys = RedisKeys(fleet.fleet)
    client = connect(fleet.redis_url)
    drops = Drops()
    store = RedisEventStore(keys, deadline=DEADLINE, observer=drops, events=3, ttl=1.0)
    store.attach(client)
    try:
        ids = await stored(store, "scope:_GET_stream", 5)
        assert await replayed(store, ids[0]) == (None, [])  # trimmed by count
        assert await replayed(store, ids[2]) == ("scope:_GET_stream", [3, 4])
        assert await replayed(store, ids[4]) == ("scope:_GET_stream", [])
        name = parse_event_id(ids[4])
        assert name is not None
        assert await client.xlen(keys.sse(name[0])) == 3
        await asyncio.sleep(1.2)  # past the TTL
        assert await replayed(store, ids[3]) == (None, [])
        assert await client.exists(keys.sse(name[0])) == 0
        for hostile in ("", "x" * 200, f"{name[0]}/1-0\nretry: 0", "../../etc"):
            assert await replayed(store, hostile) == (None, [])
        assert drops.reasons == []
    finally:
        await client.aclose()


def event_ids(text: str) -> list[str]:
    """The non-empty ids of the SSE events of an answer."""
    ids = [ln.partition(":")[2].strip() for ln in text.splitlines() if ln.startswith("id:")]
    return [i for i in ids if i]


@pytest.fixture
def own_fleet(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[LocalFleet]:
    with local_fleet(tmp_path, FleetOptions(app=APP, replicas=2)) as lf, watched(request, lf):
        yield lf


async def test_redis_stopped_a_session_gets_its_answers_without_ids_within_the_deadline(
    own_fleet: LocalFleet, http: httpx.AsyncClient
) -> None:
    """Redis SIGSTOPped: a session's request is answered within the Redis deadline (the
    priming and answer events carry no resumable id), the events not stored are counted;
    Redis resumed, stored ids come back."""
    lf = own_fleet
    assert lf.redis is not None
    s = await session(http, lf.url)
    member = lf.members[s.replica]
    lf.redis.signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        resp = await s.ping()
        took = time.monotonic() - started
        assert resp.status_code == 200 and '"result":{}' in resp.text, resp.text
        # One stored write waits out the deadline; the next ones are not tried.
        assert took < DEADLINE + 1.0, took
        assert event_ids(resp.text) == [], resp.text
        metrics = httpx.get(f"{member.url}/metrics").text
        assert metric_sum(metrics, "mcpfleet_events_dropped_total", reason="store") >= 1
        print(f"\nping with Redis stopped: answered after {took:.2f} s, events without ids")
    finally:
        lf.redis.signal(signal.SIGCONT)

    def stored_again() -> bool:
        text = asyncio.run_coroutine_threadsafe(s.ping(), loop).result(10).text
        return len(event_ids(text)) == 2  # the priming event's and the answer's

    loop = asyncio.get_running_loop()
    await asyncio.to_thread(wait_for, stored_again, timeout=10, what="ids once Redis is back")


async def test_the_owner_killed_a_resume_gets_the_404_and_its_events_expire_unread(
    own_fleet: LocalFleet, http: httpx.AsyncClient
) -> None:
    """The session's owner SIGKILLed: the client's resume through the router gets the
    owner-gone 404 (it initializes again); the events its stream stored stay in Redis
    only until their TTL."""
    lf = own_fleet
    s = await session(http, lf.url, "memo://gone")
    other = next(url for name, url in replica_urls(lf).items() if name != s.replica)
    async with get_stream(http, s) as first:
        await first.next(BOUND)
        await touch(other, "memo://gone")
        await first.next_message(BOUND)
        resume_from = first.last_id
        owner = lf.members[s.replica].proc
        owner.signal(signal.SIGKILL)
        assert owner.wait(10) is not None
    assert resume_from is not None
    async with get_stream(http, s, resume_from) as resumed:
        assert resumed.status == 404, resumed.status
    parsed = parse_event_id(resume_from)
    assert parsed is not None
    client = connect(lf.redis_url)
    try:
        ttl = await client.pttl(RedisKeys(lf.fleet).sse(parsed[0]))
    finally:
        await client.aclose()
    assert 0 < ttl <= 600_000, ttl


async def _xadds(lf: LocalFleet) -> int:
    """``XADD`` calls the fleet's Redis has served (its ``INFO commandstats``)."""
    client = connect(lf.redis_url)
    try:
        stats = await client.info("commandstats")
    finally:
        await client.aclose()
    return int(stats.get("cmdstat_xadd", {}).get("calls", 0))


async def test_sse_events_0_turns_the_store_off_answers_carry_no_ids_and_write_nothing(
    tmp_path: Path, http: httpx.AsyncClient
) -> None:
    """``--sse-events 0``: a handshake session's answers come as SSE without ids, a
    priming event or a retry field; Redis serves no ``XADD``; nothing is counted lost."""
    options = FleetOptions(app=APP, replicas=1, replica_args=("--sse-events", "0"))
    with local_fleet(tmp_path, options) as lf:
        s = await session(http, lf.url, "memo://off")
        before = await _xadds(lf)
        for _ in range(5):
            resp = await s.ping()
            assert resp.status_code == 200 and '"result":{}' in resp.text, resp.text
            assert event_ids(resp.text) == [], resp.text
            assert "retry:" not in resp.text, resp.text
        async with get_stream(http, s) as stream:
            assert stream.status == 200, stream.status
            await touch(replica_urls(lf)["replica-0"], "memo://off")
            event = await stream.next(BOUND)
            assert uris([event]) == ["memo://off"] and not event.id, event
        # A resume asked for anyway: a new stream, live (nothing is replayed); 409, as
        # for any second GET stream, until the replica has seen the first one go.
        async with AsyncExitStack() as stack:
            limit = time.monotonic() + BOUND
            while True:
                resumed = await stack.enter_async_context(
                    get_stream(http, s, "0123456789abcdef0123456789abcdef/1-0")
                )
                if resumed.status != 409 or time.monotonic() > limit:
                    break
                await stack.aclose()
                await asyncio.sleep(0.1)
            assert resumed.status == 200, resumed.status
            await touch(replica_urls(lf)["replica-0"], "memo://off")
            event = await resumed.next(BOUND)
            assert uris([event]) == ["memo://off"] and not event.id, event
        assert await _xadds(lf) == before
        metrics = httpx.get(f"{lf.members['replica-0'].url}/metrics").text
        assert metric_sum(metrics, "mcpfleet_events_dropped_total", reason="store") == 0


async def test_sse_events_and_sse_ttl_bound_each_stream_in_redis(
    tmp_path: Path, http: httpx.AsyncClient
) -> None:
    """``--sse-events 2 --sse-ttl 5``: a GET stream sent four events keeps the last two in
    Redis, for five seconds; a resume from the older kept one replays the newer."""
    options = FleetOptions(
        app=APP, replicas=1, replica_args=("--sse-events", "2", "--sse-ttl", "5")
    )
    with local_fleet(tmp_path, options) as lf:
        s = await session(http, lf.url, "memo://bounded")
        async with AsyncExitStack() as stack:
            stream = await opened(stack, http, s)
            sent = []
            for _ in range(4):
                await touch(replica_urls(lf)["replica-0"], "memo://bounded")
                sent.append(await stream.next_message(BOUND))
        assert all(e.id for e in sent), sent
        parsed = parse_event_id(sent[-1].id)
        assert parsed is not None
        client = connect(lf.redis_url)
        try:
            key = RedisKeys(lf.fleet).sse(parsed[0])
            assert await client.xlen(key) == 2
            assert 0 < await client.pttl(key) <= 5_000
        finally:
            await client.aclose()
        async with get_stream(http, s, sent[-2].id) as resumed:
            assert resumed.status == 200, resumed.status
            again = await resumed.next_message(BOUND)
            assert again.id == sent[-1].id and uris([again]) == ["memo://bounded"]
