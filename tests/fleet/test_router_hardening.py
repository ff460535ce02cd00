"""Router hardening: hostile bodies and headers, stale pooled connections, broken streams.

The router runs in-process (httpx's ASGI transport) against a real redis-server
and, where a replica must misbehave in a precise way, a scripted fake replica
speaking raw HTTP/1.1 on 127.0.0.1. The broken-stream case needs a real router
process under uvicorn and a real replica killed mid-stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import redis

from fleetkit.clients.wire import initialize_body
from fleetkit.fleet import FleetOptions, local_fleet, require_redis
from mcpfleet.contract import ROUTER_ERROR_HEADER, Attestation, RedisKeys
from mcpfleet.dev.fleet import LocalFleet
from mcpfleet.dev.ports import free_port
from mcpfleet.dev.wait import wait_for
from mcpfleet.router.proxy import Router, RouterConfig

from .conftest import watched

FLEET = "hardening"
KEYS = RedisKeys(FLEET)
JSON_HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = require_redis()
    port = free_port()
    workdir = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", str(workdir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=1)

    def pong() -> bool:
        with contextlib.suppress(redis.RedisError):
            return bool(client.ping())
        return False

    try:
        wait_for(pong, timeout=15, what="redis-server to answer", retry_on=(Exception,))
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        client.close()
        proc.terminate()
        proc.wait(10)


class FakeReplica:
    """A scripted replica speaking raw HTTP/1.1. With ``die_after=1`` it answers the first
    request on a connection, then resets the connection on the next one and stops
    listening: a process that died between two requests."""

    def __init__(self, die_after: int | None = 1) -> None:
        self.die_after = die_after
        self.reset_next = False
        self.requests = 0
        self.heads: list[bytes] = []
        self.server: asyncio.Server | None = None
        self.port = 0
        self._writers: list[asyncio.StreamWriter] = []

    async def __aenter__(self) -> FakeReplica:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        for writer in self._writers:
            writer.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            await reader.readexactly(length)
            self.requests += 1
            self.heads.append(head.lower())
            if self.reset_next:
                self.reset_next = False
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()  # RST after reading: the outcome is unknown
                return
            if self.die_after is not None and self.requests > self.die_after:
                assert self.server is not None
                self.server.close()  # a fresh connection is now refused
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()  # RST: the request was never processed
                return
            body = b'{"jsonrpc":"2.0","id":1,"result":{}}'
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
            )
            await writer.drain()


@contextlib.asynccontextmanager
async def in_process_router(
    redis_url: str, refresh_interval: float | None = None
) -> AsyncIterator[tuple[Router, httpx.AsyncClient]]:
    config = RouterConfig(redis_url=redis_url, fleet=FLEET)
    if refresh_interval is not None:
        config.refresh_interval = refresh_interval
    router = Router(config)
    await router.startup()
    transport = httpx.ASGITransport(app=router)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as http:
            yield router, http
    finally:
        await router.shutdown()


def _register(redis_url: str, name: str, address: str, session: str | None = None) -> None:
    client = redis.Redis.from_url(redis_url)
    record = Attestation(
        name=name, address=address, state="serving", kids=(), heartbeat=time.time()
    )
    client.set(KEYS.replica(name), record.to_json(), ex=60)
    client.sadd(KEYS.replicas, name)
    if session is not None:
        client.set(KEYS.session(session), name, ex=60)
    client.close()


def _deregister(redis_url: str, *names: str) -> None:
    client = redis.Redis.from_url(redis_url)
    for name in names:
        client.delete(KEYS.replica(name))
        client.srem(KEYS.replicas, name)
    client.close()


def _registered(redis_url: str) -> list[str]:
    client = redis.Redis.from_url(redis_url)
    try:
        return [n.decode() for n in client.smembers(KEYS.replicas)]  # type: ignore[union-attr]
    finally:
        client.close()


def _session_known(redis_url: str, session: str) -> bool:
    client = redis.Redis.from_url(redis_url)
    try:
        return bool(client.exists(KEYS.session(session)))
    finally:
        client.close()


async def test_a_deeply_nested_body_gets_a_json_rpc_parse_error_not_a_500(redis_url: str) -> None:
    async with in_process_router(redis_url) as (_, http):
        resp = await http.post("/mcp", content=b"[" * 1100 + b"]" * 1100, headers=JSON_HEADERS)
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == -32700
    assert resp.headers[ROUTER_ERROR_HEADER] == "1"


async def test_two_session_ids_are_refused_before_any_lookup_and_drop_nothing(
    redis_url: str,
) -> None:
    _register(redis_url, "dup-owner", "http://127.0.0.1:9", session="session-a")
    _register(redis_url, "dup-other", "http://127.0.0.1:9", session="session-b")
    async with in_process_router(redis_url) as (router, http):
        resp = await http.post(
            "/mcp",
            content=b"{}",
            headers=[
                ("content-type", "application/json"),
                ("mcp-session-id", "session-a"),
                ("mcp-session-id", "session-b"),
            ],
        )
        joined = await http.post(
            "/mcp", content=b"{}", headers={"mcp-session-id": "session-a,session-b"}
        )
        assert router.metrics.lookups.labels("redis")._value.get() == 0, "no lookup was made"
    assert resp.status_code == 400 and joined.status_code == 400
    assert "Mcp-Session-Id" in resp.json()["error"]["message"]
    assert _session_known(redis_url, "session-a") and _session_known(redis_url, "session-b")


async def test_a_reset_pooled_connection_to_a_dead_owner_gets_404_at_once(redis_url: str) -> None:
    """The first request leaves a keep-alive connection in the pool; the owner then reads
    the second and dies. It is not sent again; the owner refuses connections: 404."""
    async with FakeReplica() as fake:
        _register(redis_url, "pooled", f"http://127.0.0.1:{fake.port}", session="pooled-session")
        async with in_process_router(redis_url) as (_, http):
            headers = {**JSON_HEADERS, "mcp-session-id": "pooled-session"}
            first = await http.post("/mcp", content=b"{}", headers=headers)
            assert first.status_code == 200
            second = await http.post("/mcp", content=b"{}", headers=headers)
    assert fake.requests == 2, "the second request reached the stale connection"
    assert second.status_code == 404, second.text
    assert second.json()["error"]["message"] == "Session not found"
    assert not _session_known(redis_url, "pooled-session")


async def test_a_request_a_replica_read_before_dying_is_answered_502_never_resent(
    redis_url: str,
) -> None:
    """Two replicas that each read a request, then reset the connection: one request
    reaches one of them, and the client gets the router's 502."""
    _deregister(redis_url, *_registered(redis_url))  # earlier tests' replicas are gone
    async with FakeReplica(die_after=0) as one, FakeReplica(die_after=0) as two:
        _register(redis_url, "reader-1", f"http://127.0.0.1:{one.port}")
        _register(redis_url, "reader-2", f"http://127.0.0.1:{two.port}")
        async with in_process_router(redis_url) as (_, http):
            resp = await http.post("/mcp", content=b"{}", headers=JSON_HEADERS)
    _deregister(redis_url, "reader-1", "reader-2")
    assert one.requests + two.requests == 1, "the request was sent again"
    assert resp.status_code == 502, resp.text
    assert resp.headers[ROUTER_ERROR_HEADER] == "1"
    assert "retry-after" not in resp.headers
    assert "may have run" in resp.json()["error"]["message"]


async def test_a_reset_connection_to_a_live_owner_gets_502_and_keeps_the_session(
    redis_url: str,
) -> None:
    """The owner read the request and reset the connection, but still takes new ones:
    the outcome is unknown (502), the session is not dropped."""
    async with FakeReplica(die_after=0) as fake:
        assert fake.server is not None
        _register(redis_url, "alive", f"http://127.0.0.1:{fake.port}", session="alive-session")
        async with in_process_router(redis_url) as (_, http):
            headers = {**JSON_HEADERS, "mcp-session-id": "alive-session"}
            fake.die_after = None  # the reset below leaves the listener open
            fake.reset_next = True
            resp = await http.post("/mcp", content=b"{}", headers=headers)
    _deregister(redis_url, "alive")
    assert fake.requests == 1
    assert resp.status_code == 502, resp.text
    assert _session_known(redis_url, "alive-session")


async def test_a_client_cannot_set_the_headers_only_fleet_components_set(
    redis_url: str,
) -> None:
    """X-Mcpfleet-Replica (and the draining and router-error marks) never reach a replica."""
    forged = {
        "x-mcpfleet-replica": "replica-0",
        "x-mcpfleet-draining": "1",
        "x-mcpfleet-router-error": "1",
    }
    async with FakeReplica(die_after=None) as fake:
        _register(redis_url, "spoofed", f"http://127.0.0.1:{fake.port}", session="spoof-session")
        async with in_process_router(redis_url) as (_, http):
            resp = await http.post(
                "/mcp",
                content=b"{}",
                headers={**JSON_HEADERS, **forged, "mcp-session-id": "spoof-session"},
            )
    assert resp.status_code == 200 and fake.requests == 1
    for name in forged:
        assert name.encode() not in fake.heads[0], f"{name} reached the replica"
    assert b"mcp-session-id: spoof-session" in fake.heads[0], "the rest was forwarded"


@pytest.fixture
def crash_fleet(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LocalFleet]:
    with (
        local_fleet(tmp_path, FleetOptions(replicas=2, app="fleetkit.apps.streamapp:app")) as lf,
        watched(request, lf),
    ):
        yield lf


def test_a_replica_crash_mid_stream_breaks_the_clients_stream(crash_fleet: LocalFleet) -> None:
    lf = crash_fleet
    with httpx.Client(timeout=30) as http:
        init = http.post(lf.url, content=initialize_body("crash-test"), headers=JSON_HEADERS)
        session = init.headers["mcp-session-id"]
        owner = init.headers["x-mcpfleet-replica"]
        headers = {**JSON_HEADERS, "mcp-session-id": session, "mcp-protocol-version": "2025-11-25"}
        http.post(
            lf.url,
            content=json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            headers=headers,
        )
        call = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {
                "name": "ticker",
                "arguments": {"count": 20, "interval": 1.0},
                "_meta": {"progressToken": "t"},
            },
        }
        events: list[str] = []
        with (
            pytest.raises(httpx.RemoteProtocolError),
            http.stream("POST", lf.url, content=json.dumps(call), headers=headers) as resp,
        ):
            assert resp.status_code == 200
            for line in resp.iter_lines():
                if line.startswith("data:") and line[5:].strip():  # not the priming event
                    events.append(line)
                    if len(events) == 1:
                        lf.members[owner].proc.signal(signal.SIGKILL)
    assert events and all('"result"' not in e for e in events), "the call never finished"


def test_router_made_errors_are_marked_and_redirects_lead_back_through_the_router(
    crash_fleet: LocalFleet,
) -> None:
    lf = crash_fleet
    with httpx.Client(timeout=10) as http:
        made_here = http.post(lf.url, content=b"not json", headers=JSON_HEADERS)
        proxied = http.post(lf.url, content=initialize_body("marks"), headers=JSON_HEADERS)
        slash = http.post(lf.url + "/", content=initialize_body("slash"), headers=JSON_HEADERS)
        deep = http.post(lf.url, content=b"[" * 1100 + b"]" * 1100, headers=JSON_HEADERS)
    assert deep.status_code == 400, deep.text
    assert deep.json()["error"]["code"] == -32700
    assert made_here.status_code == 400 and made_here.headers[ROUTER_ERROR_HEADER] == "1"
    assert proxied.status_code == 200 and ROUTER_ERROR_HEADER not in proxied.headers
    for resp in (made_here, proxied, slash):
        assert len(resp.headers.get_list("date")) == 1, resp.headers
        assert len(resp.headers.get_list("server")) <= 1, resp.headers
    if slash.is_redirect:
        location = slash.headers["location"]
        assert location.startswith("/"), f"a replica address leaked: {location}"


@pytest.fixture(scope="module")
def impatient_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFleet]:
    """A router that gives clients one second for headers and one for a body."""
    with local_fleet(
        tmp_path_factory.mktemp("impatient"),
        FleetOptions(
            replicas=1,
            app="fleetkit.apps.streamapp:app",
            router_args=("--header-timeout", "1", "--body-timeout", "1"),
        ),
    ) as lf:
        yield lf


def _raw(lf: LocalFleet) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", lf.router_ports[0]), timeout=15)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize("trickle", [False, True], ids=["silent", "trickling"])
def test_slow_headers_get_408_and_the_connection_closed(
    impatient_fleet: LocalFleet, trickle: bool
) -> None:
    with _raw(impatient_fleet) as sock:
        started = time.monotonic()
        if trickle:
            sock.sendall(b"POST /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\n")
            with contextlib.suppress(OSError):  # the router may close while we trickle
                for i in range(40):
                    sock.sendall(f"x-slow-{i}: 1\r\n".encode())
                    time.sleep(0.1)  # a slow client, on purpose
        answer = _read_all(sock)
        waited = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"x-mcpfleet-router-error: 1" in answer.lower()
    assert waited < 10, "closed at the header deadline, not when the client gave up"


def test_a_stalled_body_gets_a_json_rpc_408(impatient_fleet: LocalFleet) -> None:
    with _raw(impatient_fleet) as sock:
        sock.sendall(
            b"POST /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            b"content-length: 100\r\n\r\n" + b'{"jsonrpc":'
        )
        answer = _read_all(sock)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), head
    assert json.loads(body)["error"]["message"] == "Request body not received in time"


async def test_a_stream_outlives_the_header_and_body_deadlines(
    impatient_fleet: LocalFleet,
) -> None:
    from mcpfleet.fleetclient import connect

    async with connect(impatient_fleet.url, "handshake", timeout=30) as client:
        result = await client.call_tool("ticker", {"count": 4, "interval": 1.0})
    assert str(result.data) == "ticked 4 times"


def _router_in_flight(lf: LocalFleet) -> float:
    text = httpx.get(f"http://127.0.0.1:{lf.router_ports[0]}/metrics", timeout=5).text
    (line,) = [
        ln for ln in text.splitlines() if ln.startswith("mcpfleet_router_requests_in_flight ")
    ]
    return float(line.split()[1])


async def test_the_routers_requests_in_flight_count_an_open_stream_until_it_ends(
    impatient_fleet: LocalFleet,
) -> None:
    """What router.autoscaling.mcp scales the routers on: a streaming tool call is in
    flight for as long as its stream lasts, and nothing is once it ended."""
    from mcpfleet.fleetclient import connect

    assert await asyncio.to_thread(_router_in_flight, impatient_fleet) == 0
    async with connect(impatient_fleet.url, "handshake", timeout=30) as client:
        call = asyncio.create_task(client.call_tool("ticker", {"count": 3, "interval": 1.0}))
        await asyncio.sleep(1.5)
        during = await asyncio.to_thread(_router_in_flight, impatient_fleet)
        assert str((await call).data) == "ticked 3 times"
    await asyncio.to_thread(
        wait_for,
        lambda: _router_in_flight(impatient_fleet) == 0,
        timeout=10,
        what="the router's requests in flight back to 0",
    )
    assert during >= 1


@pytest.mark.parametrize(
    ("headers", "refusal"),
    [
        ({"host": "evil.example.com", "origin": "http://evil.example.com"}, "Host not allowed"),
        ({"origin": "http://evil.example.com"}, "Origin not allowed"),
    ],
)
def test_dns_rebinding_is_refused_with_403(
    impatient_fleet: LocalFleet, headers: dict[str, str], refusal: str
) -> None:
    with httpx.Client(timeout=10) as http:
        resp = http.post(
            impatient_fleet.url,
            content=initialize_body("rebinding"),
            headers={**JSON_HEADERS, **headers},
        )
        fine = http.post(
            impatient_fleet.url, content=initialize_body("local"), headers=JSON_HEADERS
        )
    assert resp.status_code == 403, resp.text
    assert resp.json()["error"]["message"] == f"Forbidden: {refusal}"
    assert fine.status_code == 200


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"host": "evil.example.com", "origin": "http://evil.example.com"}, 421),
        ({"origin": "http://evil.example.com"}, 403),
    ],
)
def test_a_replica_reached_directly_refuses_rebinding_too(
    impatient_fleet: LocalFleet, headers: dict[str, str], status: int
) -> None:
    """Defence in depth: FastMCP's own guard, on at every replica (421 Host, 403 Origin)."""
    direct = impatient_fleet.members["replica-0"].url + "/mcp"
    with httpx.Client(timeout=10) as http:
        hostile = http.post(
            direct, content=initialize_body("rebinding"), headers={**JSON_HEADERS, **headers}
        )
        local = {**JSON_HEADERS, "origin": "http://localhost:6274"}
        fine = http.post(direct, content=initialize_body("local"), headers=local)
    assert hostile.status_code == status, hostile.text
    assert fine.status_code == 200


class CutReplica:
    """Answers every request with a Content-Length it does not keep: ``cut`` bytes of the
    body, then the connection closes (a replica that crashed mid-answer)."""

    BODY = b'{"jsonrpc":"2.0","id":1,"result":{"text":"' + b"x" * 200 + b'"}}'

    def __init__(self, cut: int | None) -> None:
        self.cut = cut
        self.server: asyncio.Server | None = None
        self.port = 0

    async def __aenter__(self) -> CutReplica:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                await reader.readexactly(length)
                sent = self.BODY if self.cut is None else self.BODY[: self.cut]
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b"content-length: " + str(len(self.BODY)).encode() + b"\r\n\r\n" + sent
                )
                await writer.drain()
                if self.cut is not None:
                    break
        writer.close()


async def _asgi_post(router: Router, session: str) -> list[dict[str, object]]:
    """One POST straight through the router's ASGI interface; every message it sent back."""
    headers = {**JSON_HEADERS, "mcp-session-id": session, "host": "127.0.0.1:8000"}
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/mcp",
        "raw_path": b"/mcp",
        "query_string": b"",
        "root_path": "",
        "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8000),
    }
    body_sent = False
    messages: list[dict[str, object]] = []

    async def receive() -> dict[str, object]:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": b"{}", "more_body": False}
        await asyncio.Event().wait()  # the client stays: no disconnect
        raise AssertionError("unreachable")

    async def send(message: dict[str, object]) -> None:
        messages.append(message)

    await router(scope, receive, send)  # type: ignore[arg-type]
    return messages


async def test_an_answer_with_a_content_length_is_relayed_whole_in_one_message(
    redis_url: str,
) -> None:
    async with CutReplica(cut=None) as fake:
        _register(redis_url, "whole", f"http://127.0.0.1:{fake.port}", session="whole-session")
        async with in_process_router(redis_url) as (router, _):
            messages = await _asgi_post(router, "whole-session")
    start, *bodies = messages
    assert start["type"] == "http.response.start" and start["status"] == 200
    assert bodies == [{"type": "http.response.body", "body": CutReplica.BODY, "more_body": False}]


async def test_an_answer_cut_short_of_its_content_length_is_left_unfinished(
    redis_url: str,
) -> None:
    """The client must see a broken response (uvicorn aborts it), never a normal end."""
    async with CutReplica(cut=40) as fake:
        _register(redis_url, "cut", f"http://127.0.0.1:{fake.port}", session="cut-session")
        async with in_process_router(redis_url) as (router, _):
            messages = await _asgi_post(router, "cut-session")
            broke = router.metrics.requests.labels("sticky", "upstream_broke")._value.get()
    assert messages[0]["type"] == "http.response.start"
    assert not any(m.get("more_body") is False for m in messages[1:]), messages
    assert broke == 1


@pytest.fixture(scope="module")
def crowded_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFleet]:
    """A router that holds at most two client connections at once."""
    with local_fleet(
        tmp_path_factory.mktemp("crowded"),
        FleetOptions(replicas=1, router_args=("--max-connections", "2", "--header-timeout", "60")),
    ) as lf:
        yield lf


def test_connections_past_the_limit_get_a_json_rpc_503_at_once(crowded_fleet: LocalFleet) -> None:
    port = crowded_fleet.router_ports[0]
    held = [socket.create_connection(("127.0.0.1", port), timeout=15) for _ in range(2)]
    try:
        # Two idle connections fill the router: a third is answered and closed
        # before it sends a byte, without waiting for any header deadline.
        with _raw(crowded_fleet) as sock:
            started = time.monotonic()
            answer = _read_all(sock)
            waited = time.monotonic() - started
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503"), head
        assert b"retry-after: 1" in head.lower()
        assert b"x-mcpfleet-router-error: 1" in head.lower()
        assert json.loads(body)["error"]["message"] == "Router at its connection limit; retry"
        assert waited < 5
        # A held connection still works: the limit refuses new ones, not these.
        held[0].sendall(b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n")
        assert _read_all(held[0]).startswith(b"HTTP/1.1 200")
    finally:
        for sock in held:
            sock.close()

    # Once they are gone, new clients are served again.
    def served() -> bool:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200

    assert wait_for(
        served, timeout=10, what="the router to serve again", retry_on=(httpx.HTTPError,)
    )


def test_max_connections_must_be_a_positive_integer() -> None:
    for bad in ("0", "-3", "many"):
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "mcpfleet.cli",
                "router",
                "--redis",
                "redis://127.0.0.1:1/0",
                "--max-connections",
                bad,
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert proc.returncode == 2, proc.stderr
        assert "--max-connections" in proc.stderr


async def test_an_owner_registered_after_the_last_refresh_is_looked_up_not_declared_gone(
    redis_url: str,
) -> None:
    """Another router placed a session on a replica that registered after this router's
    last refresh (a new pod in a rolling update): the session is routed, not answered 404
    and dropped."""
    # No periodic refresh during the test: only the lookup can find the newcomer.
    async with (
        FakeReplica(die_after=None) as fake,
        in_process_router(redis_url, refresh_interval=3600) as (router, http),
    ):
        assert not router.view.knows("newcomer")
        _register(redis_url, "newcomer", f"http://127.0.0.1:{fake.port}", session="fresh")
        headers = {**JSON_HEADERS, "mcp-session-id": "fresh"}
        answers = await asyncio.gather(
            *(http.post("/mcp", content=b"{}", headers=headers) for _ in range(3))
        )
    assert [a.status_code for a in answers] == [200, 200, 200], [a.text for a in answers]
    assert fake.requests == 3
    assert _session_known(redis_url, "fresh")
