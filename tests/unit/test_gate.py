"""The replica gate, in process: header, health, session bookkeeping and drain."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.server import ServerState

from mcpfleet.answers import send_whole
from mcpfleet.replica.gate import GateState, ReplicaGate


async def fake_mcp(scope: Scope, receive: Receive, send: Send) -> None:
    """Opens a session on a sessionless POST, answers 200 otherwise."""
    headers = dict(scope["headers"])
    extra = []
    if scope["method"] == "POST" and b"mcp-session-id" not in headers:
        extra.append((b"mcp-session-id", b"s-new"))
    await send({"type": "http.response.start", "status": 200, "headers": extra})
    await send({"type": "http.response.body", "body": b"{}"})


def client(state: GateState) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=ReplicaGate(fake_mcp, state))
    return httpx.AsyncClient(transport=transport, base_url="http://replica")


async def test_every_response_names_the_replica_and_sessions_are_learned() -> None:
    state = GateState(name="r7")
    async with client(state) as http:
        opened = await http.post("/mcp", content=b"{}")
        assert opened.headers["x-mcpfleet-replica"] == "r7"
        assert set(state.sessions) == {"s-new"}
        assert state.inflight == 0
        await http.delete("/mcp", headers={"mcp-session-id": "s-new"})
    assert state.sessions == {}


async def test_draining_refuses_new_work_but_serves_owned_sessions() -> None:
    state = GateState(name="r1")
    async with client(state) as http:
        await http.post("/mcp", content=b"{}")
        state.draining = True
        ready = await http.get("/readyz")
        assert ready.status_code == 503 and ready.json()["status"] == "draining"
        assert (await http.get("/healthz")).status_code == 200
        new = await http.post("/mcp", content=b"{}")
        assert new.status_code == 503
        assert new.headers["x-mcpfleet-draining"] == "1" and new.headers["retry-after"] == "1"
        stranger = await http.post("/mcp", content=b"{}", headers={"mcp-session-id": "other"})
        assert stranger.status_code == 503
        owned = await http.post("/mcp", content=b"{}", headers={"mcp-session-id": "s-new"})
        assert owned.status_code == 200


def test_idle_sessions_are_forgotten_and_idle_means_no_request_and_no_session() -> None:
    state = GateState(name="r", session_idle=10)
    state.sessions = {"old": 0.0, "fresh": 95.0}
    assert state.live_sessions(now=100.0) == 1 and set(state.sessions) == {"fresh"}
    assert not state.idle(now=100.0), "an open session holds the drain"
    assert state.idle(now=106.0), "until it idles out"
    state.inflight = 1
    assert not state.idle(now=106.0)
    state.inflight, state.streams = 0, 3
    assert state.idle(now=106.0), "listening GET streams never hold a drain"


async def test_a_listening_get_counts_as_a_stream_not_a_request_in_flight() -> None:
    state = GateState(name="r2")
    seen: list[tuple[int, int]] = []

    async def listening(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append((state.streams, state.inflight))
        await fake_mcp(scope, receive, send)

    transport = httpx.ASGITransport(app=ReplicaGate(listening, state))
    async with httpx.AsyncClient(transport=transport, base_url="http://replica") as http:
        await http.get("/mcp", headers={"mcp-session-id": "s-1"})
        await http.post("/mcp", content=b"{}", headers={"mcp-session-id": "s-1"})
    assert seen == [(1, 0), (0, 1)]
    assert (state.streams, state.inflight) == (0, 0)


async def test_handover_refuses_idle_sessions_but_serves_sessions_with_a_request_in_flight() -> (
    None
):
    import asyncio

    release = asyncio.Event()
    entered = asyncio.Event()

    async def slow_mcp(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] == "POST" and dict(scope["headers"]).get(b"x-hold"):
            entered.set()
            await release.wait()
        await fake_mcp(scope, receive, send)

    state = GateState(name="r1")
    transport = httpx.ASGITransport(app=ReplicaGate(slow_mcp, state))
    async with httpx.AsyncClient(transport=transport, base_url="http://replica") as http:
        await http.post("/mcp", content=b"{}")
        state.sessions["s-busy"] = state.sessions["s-new"]
        held = asyncio.create_task(
            http.post("/mcp", content=b"{}", headers={"mcp-session-id": "s-busy", "x-hold": "1"})
        )
        await asyncio.wait_for(entered.wait(), 5)
        state.draining, state.handover = True, True
        idle = await http.post("/mcp", content=b"{}", headers={"mcp-session-id": "s-new"})
        assert idle.status_code == 503 and idle.headers["x-mcpfleet-draining"] == "1"
        busy = await http.post("/mcp", content=b"{}", headers={"mcp-session-id": "s-busy"})
        assert busy.status_code == 200, "a session with work in flight is still served"
        release.set()
        assert (await held).status_code == 200
    assert state.busy == {} and state.inflight == 0


async def test_an_opened_session_names_the_apps_rehome_opt_out_and_no_principal_without_auth() -> (
    None
):
    state = GateState(name="r1", rehome=False)
    async with client(state) as http:
        opened = await http.post("/mcp", content=b"{}")
    assert opened.headers["x-mcpfleet-rehome"] == "0"
    assert "x-mcpfleet-principal" not in opened.headers


@asynccontextmanager
async def uvicorn_on_loopback(app: ASGIApp) -> AsyncIterator[int]:
    """``app`` served by the installed uvicorn's HTTP protocol (the one the replica
    runs) on a loopback port, without a Server's signal handlers."""
    config = uvicorn.Config(app, lifespan="off", log_level="critical", access_log=False)
    config.load()
    state = ServerState()
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = await loop.create_server(
        lambda: config.http_protocol_class(config=config, server_state=state, app_state={}),
        sock=sock,
    )
    try:
        yield sock.getsockname()[1]
    finally:
        for connection in list(state.connections):
            connection.shutdown()
        server.close()
        await asyncio.wait_for(server.wait_closed(), 5)


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, bytes] | None:
    """One HTTP/1.1 answer with a Content-Length, or None when the connection ends."""
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    except asyncio.IncompleteReadError:
        return None
    lines = head.decode("latin-1").split("\r\n")
    fields = dict(line.lower().split(": ", 1) for line in lines[1:] if line)
    body = await asyncio.wait_for(reader.readexactly(int(fields["content-length"])), 5)
    return int(lines[0].split()[1]), body


@pytest.mark.parametrize("after", ["raises", "starts-again"])
async def test_a_request_queued_behind_one_that_fails_after_its_answer_is_still_answered(
    after: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The router queues a request on a keep-alive connection as soon as the previous
    answer is whole. An app that fails after that answer (raising, or, like mcp's
    transport when a session ends under its finished SSE answer, starting a 500 on it)
    made uvicorn close the connection and lose the queued request; the gate keeps it."""

    async def finished_then_fails(scope: Scope, receive: Receive, send: Send) -> None:
        await send_whole(send, 200, b"{}")
        if scope["path"] == "/fails":
            if after == "starts-again":
                await send({"type": "http.response.start", "status": 500, "headers": []})
            raise RuntimeError("the session ended under the request")

    state = GateState(name="r1")
    request = b"POST %s HTTP/1.1\r\nhost: replica\r\ncontent-length: 2\r\n\r\n{}"
    with caplog.at_level(logging.WARNING, logger="mcpfleet.replica"):
        async with uvicorn_on_loopback(ReplicaGate(finished_then_fails, state)) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request % b"/fails" + request % b"/mcp")
            first, second = await read_answer(reader), await read_answer(reader)
            writer.close()
            await writer.wait_closed()
    assert first == (200, b"{}")
    assert second == (200, b"{}"), "the request queued behind it was lost with the connection"
    assert (state.inflight, state.busy) == (0, {})
    warned = [r.getMessage() for r in caplog.records if r.name == "mcpfleet.replica"]
    assert any("after its response was whole" in m for m in warned), warned


async def test_an_app_failing_before_its_answer_is_whole_still_fails_the_request() -> None:
    """Only a whole answer lets the gate keep the connection: an app raising mid-answer
    is uvicorn's to handle (it closes the connection: the client sees the answer cut)."""

    async def fails_midway(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{", "more_body": True})
        raise RuntimeError("midway")

    transport = httpx.ASGITransport(app=ReplicaGate(fails_midway, GateState(name="r1")))
    async with httpx.AsyncClient(transport=transport, base_url="http://replica") as http:
        with pytest.raises(RuntimeError, match="midway"):
            await http.post("/mcp", content=b"{}")
