"""Listen streams bounded on a real fleet: per principal, per replica, per stream.

Three replicas of ``fleetkit.apps.listenapp`` behind one router, with
``--limit-listen 2`` (fleet-wide per principal) and ``--listen-streams 3``
(per replica); principals are client addresses the replicas read from
``X-Forwarded-For`` (``--trusted-hops 1``). A listener that never reads while
events flood is ended at its buffer bound, counted, and the replica's memory
stays bounded (printed); once the client reads, the stream ends with the
reason. A replica SIGKILLed under open streams: its clients see the stream end
and listen again through the router; the other replicas' streams go on and
their counts are right.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from pathlib import Path

import httpx
import pytest
import redis

from fleetkit.clients.listen import HEADERS, Listener, listen_body, listening
from fleetkit.clients.rawsession import metric_sum
from fleetkit.fleet import FleetOptions, local_fleet
from mcpfleet.contract import RedisKeys
from mcpfleet.dev.fleet import LocalFleet
from mcpfleet.dev.wait import wait_for
from mcpfleet.limits import principal_of
from mcpfleet.notify import BUFFERED_EVENTS

from .conftest import watched

pytestmark = pytest.mark.fleet

APP = "fleetkit.apps.listenapp:app"
PER_PRINCIPAL = 2
PER_REPLICA = 3
#: Events flooded at a listener that reads nothing, each a 4 KiB URI (about 20 MiB).
FLOOD = 5000
URI = "memo://" + "x" * 4000


@pytest.fixture
def fleet(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[LocalFleet]:
    args = (
        *("--limit-listen", str(PER_PRINCIPAL), "--listen-streams", str(PER_REPLICA)),
        *("--trusted-hops", "1"),
    )
    options = FleetOptions(app=APP, replica_args=args)
    with local_fleet(tmp_path, options) as lf, watched(request, lf):
        yield lf


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(10, read=None)) as client:
        yield client


def mcp_urls(lf: LocalFleet) -> list[str]:
    return [f"{m.url}/mcp" for m in lf.members.values()]


def who(n: int) -> dict[str, str]:
    """The headers of principal ``n`` (its address, as a trusted proxy wrote it)."""
    return {"x-forwarded-for": f"10.0.0.{n}"}


def peer(n: int) -> dict[str, object]:
    """What a replica reads principal ``n`` from: the router's hop and its address."""
    address = who(n)["x-forwarded-for"].encode()
    return {"client": ("127.0.0.1", 1), "headers": [(b"x-forwarded-for", address)]}


async def acked(listener: Listener) -> Listener:
    assert listener.status == 200, listener.status
    ack = await listener.next_event(5)
    assert ack.method == "notifications/subscriptions/acknowledged", ack.message
    return listener


async def refused(http: httpx.AsyncClient, url: str, n: int) -> httpx.Response:
    body = json.dumps(listen_body(1, toolsListChanged=True))
    return await http.post(url, content=body, headers={**HEADERS, **who(n)})


def metrics(lf: LocalFleet, name: str) -> str:
    return httpx.get(f"{lf.members[name].url}/metrics", timeout=5).text


async def test_a_principals_streams_are_capped_fleet_wide_and_a_replicas_streams_too(
    fleet: LocalFleet, http: httpx.AsyncClient
) -> None:
    a, b, c = mcp_urls(fleet)
    async with AsyncExitStack() as stack:

        async def listen(url: str, n: int) -> Listener:
            ctx = listening(http, url, 7, headers=who(n), toolsListChanged=True)
            return await acked(await stack.enter_async_context(ctx))

        await listen(a, 1)
        await listen(b, 1)
        third = await refused(http, c, 1)
        assert third.status_code == 429, third.text
        assert int(third.headers["retry-after"]) >= 1
        assert third.json()["error"]["data"]["limit"] == "listen", third.text
        # Another principal is not refused.
        await listen(c, 2)
    # Every stream above ended with the block: each replica gives its place back as it
    # sees its client gone, within moments (the next requests must not outrun that).
    held = RedisKeys(fleet.fleet).limit("listen", principal_of(peer(1), 1))
    with contextlib.closing(redis.Redis.from_url(fleet.redis_url)) as client:
        wait_for(lambda: client.zcard(held) == 0, timeout=5, what="the places given back")
    async with AsyncExitStack() as stack:
        for n in (1, 1):
            ctx = listening(http, c, 8, headers=who(n), toolsListChanged=True)
            await acked(await stack.enter_async_context(ctx))
        ctx = listening(http, c, 9, headers=who(3), toolsListChanged=True)
        await acked(await stack.enter_async_context(ctx))
        # Replica c serves its 3: a fourth stream, of a principal under its own cap, is refused.
        full = await refused(http, c, 4)
        assert full.status_code == 200 and full.json()["error"]["message"] == (
            "Subscription limit reached"
        ), full.text
        # Refused by the replica, the principal's place was given back: it listens on a.
        ctx = listening(http, a, 10, headers=who(4), toolsListChanged=True)
        await acked(await stack.enter_async_context(ctx))
    limited = metric_sum(metrics(fleet, "replica-2"), "mcpfleet_limited_total", limit="listen")
    assert limited == 1, limited


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def never_reading(port: int) -> socket.socket:
    """A listen stream whose client sends its request and never reads a byte."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    body = json.dumps(listen_body(1, resourceSubscriptions=[URI])).encode()
    head = "".join(f"{k}: {v}\r\n" for k, v in {**HEADERS, **who(5)}.items())
    sock.sendall(
        f"POST /mcp HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n{head}"
        f"content-length: {len(body)}\r\n\r\n".encode()
        + body
    )
    return sock


def test_a_listener_that_reads_nothing_is_ended_at_its_bound_and_memory_stays_bounded(
    fleet: LocalFleet,
) -> None:
    name, member = next(iter(fleet.members.items()))
    assert member.proc.popen is not None
    pid = member.proc.popen.pid
    sock = never_reading(member.port)
    try:
        wait_for(
            lambda: metric_sum(metrics(fleet, name), "mcpfleet_listen_streams") == 1,
            timeout=10,
            what="the stream to open",
        )
        before = rss_kib(pid)
        client = redis.Redis.from_url(fleet.redis_url)
        channel = RedisKeys(fleet.fleet).events
        started = time.monotonic()
        with client.pipeline(transaction=False) as pipe:
            for _ in range(FLOOD):
                pipe.publish(channel, json.dumps({"k": "resource", "t": time.time(), "u": URI}))
            pipe.execute()
        client.close()
        wait_for(
            lambda: (
                metric_sum(metrics(fleet, name), "mcpfleet_events_dropped_total", reason="slow")
                == 1
            ),
            timeout=30,
            what="the stream to be ended at its bound",
        )
        peak = rss_kib(pid)
        took = time.monotonic() - started
        text = metrics(fleet, name)
        delivered = metric_sum(text, "mcpfleet_events_delivered_total", kind="resource")
        flooded_mib = FLOOD * len(URI) / 2**20
        print(
            f"\nslow listener: {FLOOD} events of {len(URI)} B ({flooded_mib:.1f} MiB) flooded;"
            f" ended after {delivered:.0f} written, buffer {BUFFERED_EVENTS} events;"
            f" replica RSS {before / 1024:.1f} -> {peak / 1024:.1f} MiB"
            f" (+{(peak - before) / 1024:.1f}) in {took:.1f} s"
        )
        assert (peak - before) * 1024 < FLOOD * len(URI) / 2, "the replica held the flood"
        assert delivered < FLOOD / 2
        # The client reads at last: what was in flight, then the reason, then the end.
        assert b'"reason":"slow"' in read_to_end(sock, timeout=15)
        wait_for(
            lambda: metric_sum(metrics(fleet, name), "mcpfleet_listen_streams") == 0,
            timeout=10,
            what="the ended stream to be gone",
        )
    finally:
        sock.close()


def read_to_end(sock: socket.socket, timeout: float) -> bytes:
    """Everything the replica sends on ``sock`` until its response ends (``0\r\n\r\n``)."""
    sock.settimeout(timeout)
    data = b""
    while not data.endswith(b"0\r\n\r\n"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


async def test_a_replica_killed_under_open_streams_its_clients_listen_again_elsewhere(
    fleet: LocalFleet, http: httpx.AsyncClient
) -> None:
    names = list(fleet.members)
    urls = mcp_urls(fleet)
    async with AsyncExitStack() as stack:
        streams = []
        for i, url in enumerate(urls):
            ctx = listening(http, url, 20 + i, headers=who(10 + i), toolsListChanged=True)
            streams.append(await acked(await stack.enter_async_context(ctx)))
        fleet.members[names[0]].proc.signal(signal.SIGKILL)
        async with asyncio.timeout(10):
            await streams[0].ended.wait()
        assert not streams[1].ended.is_set() and not streams[2].ended.is_set()

        deadline = time.monotonic() + 20
        again: Listener | None = None
        while again is None and time.monotonic() < deadline:
            ctx = listening(http, fleet.url, 30, headers=who(10), toolsListChanged=True)
            candidate = await stack.enter_async_context(ctx)
            if candidate.status == 200 and candidate.replica != names[0]:
                again = await acked(candidate)
            else:
                await asyncio.sleep(0.2)
        assert again is not None, "no replica took the stream again through the router"
        for name in names[1:]:
            assert metric_sum(metrics(fleet, name), "mcpfleet_listen_streams") >= 1
        # A change still reaches every live stream, the one listened again included.
        answer = await http.post(
            urls[1],
            content=json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "tools/call",
                    "params": {
                        "name": "retool",
                        "arguments": {"name": "after_kill"},
                        "_meta": json.loads(json.dumps(listen_body(1)["params"]["_meta"])),
                    },
                }
            ),
            headers={**HEADERS, "mcp-method": "tools/call", "mcp-name": "retool", **who(40)},
        )
        assert answer.status_code == 200, answer.text
        for listener in (streams[1], streams[2], again):
            frame = await listener.next_event(5)
            assert frame.method == "notifications/tools/list_changed", frame.message
    # Nothing leaks on the replicas left: their streams' gauges are back to 0.
    for name in names[1:]:
        wait_for(
            lambda name=name: metric_sum(metrics(fleet, name), "mcpfleet_listen_streams") == 0,
            timeout=10,
            what=f"{name}'s streams to close",
        )
