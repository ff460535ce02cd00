"""The router's per-request path, in one event loop with no sockets: the router's own
uvicorn protocol fed a client's request, the upstream a pooled connection whose
replica answers on a later turn.

What it pins: a proxied round leaves no reference cycle behind (the cyclic
collector used to find ~34 objects per request), a whole answer leaves in one
write even when the replica's head and body arrive apart, and the read of a
request body that has arrived whole is known to be unable to wait (read from
the installed uvicorn's response cycle: this fails if uvicorn changes it).
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from uvicorn.server import ServerState

from mcpfleet.config import RouterConfig
from mcpfleet.contract import Attestation
from mcpfleet.router import h1client
from mcpfleet.router.h1server import body_arrived, bounded_protocol
from mcpfleet.router.proxy import Router
from mcpfleet.router.replicas import merge_registry

ANSWER = b'{"jsonrpc":"2.0","id":1,"result":{"resultType":"input_required","inputRequests":{}}}'
ANSWER_HEAD = (
    b"HTTP/1.1 200 OK\r\nserver: uvicorn\r\ncontent-type: application/json\r\n"
    b"content-length: %d\r\n\r\n" % len(ANSWER)
)
BODY = (
    b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"confirm_purchase",'
    b'"arguments":{"item":"tea","amount_eur":2}}}'
)
HEAD = (
    b"POST /mcp HTTP/1.1\r\nhost: 127.0.0.1:8000\r\ncontent-type: application/json\r\n"
    b"accept: application/json, text/event-stream\r\nmcp-protocol-version: 2026-07-28\r\n"
    b"mcp-method: tools/call\r\nmcp-name: confirm_purchase\r\ncontent-length: %d\r\n\r\n"
    % len(BODY)
)
ADDRESS = "http://10.0.0.1:8000"


class _Transport:
    """Enough of an asyncio transport for uvicorn's protocol and the router's h1client."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_write_buffer_limits(self, *args: Any, **kwargs: Any) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        peers = {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 40000)}
        return peers.get(name, default)


class _Replica(_Transport):
    """The upstream side: each request is answered on later turns, the head and the
    body in two parts (as uvicorn writes them)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, conn: h1client._Conn) -> None:
        super().__init__()
        self.loop, self.conn = loop, conn

    def write(self, data: bytes) -> None:
        super().write(data)
        self.loop.call_soon(self.conn.data_received, ANSWER_HEAD)
        self.loop.call_later(0.01, self.conn.data_received, ANSWER)


@pytest.fixture
def rig() -> Iterator[tuple[Router, type[Any], uvicorn.Config, ServerState]]:
    router = Router(RouterConfig(redis_url="redis://127.0.0.1:1/0", fleet="path"))
    router.view.state = merge_registry(
        router.view.state,
        {
            "r0": Attestation(
                name="r0", address=ADDRESS, state="serving", kids=("k",), heartbeat=time.time()
            )
        },
        time.monotonic(),
        missing_grace=10,
        absent_limit=10,
    )
    protocol = bounded_protocol(10.0)
    config = uvicorn.Config(router, lifespan="off", http=protocol, log_level="warning")
    config.load()
    yield router, protocol, config, ServerState()


class _Connection:
    """One client keep-alive connection to the router, and its replica's."""

    def __init__(self, rig: tuple[Router, type[Any], uvicorn.Config, ServerState]) -> None:
        router, protocol, config, state = rig
        loop = asyncio.get_running_loop()
        router.loop = loop
        conn = h1client._Conn(loop)
        conn.connection_made(_Replica(loop, conn))  # type: ignore[arg-type]
        router.upstream.pool.put(ADDRESS, conn)
        self.client = _Transport()
        self.server = protocol(config=config, server_state=state, app_state={}, _loop=loop)
        self.server.connection_made(self.client)

    async def rounds(self, count: int) -> list[list[bytes]]:
        """``count`` rounds one after the other: the writes the client got for each."""
        answers = []
        for _ in range(count):
            self.client.writes = []
            self.server.data_received(HEAD + BODY)
            for _ in range(500):
                if any(b"inputRequests" in w for w in self.client.writes):
                    break
                await asyncio.sleep(0.002)
            await asyncio.sleep(0)  # the round's end: its task done, its timers set
            answers.append(self.client.writes)
        return answers

    def close(self) -> None:
        self.server.connection_lost(None)


async def test_a_round_through_the_router_leaves_no_reference_cycle(
    rig: tuple[Router, type[Any], uvicorn.Config, ServerState],
) -> None:
    connection = _Connection(rig)
    await connection.rounds(2)  # first-use objects (caches, metric children) out of the way
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        answers = await connection.rounds(10)
        gc.collect()
        left = [type(o).__qualname__ for o in gc.garbage]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        connection.close()
    assert all(any(b"inputRequests" in w for w in writes) for writes in answers)
    assert left == [], f"objects only the cyclic collector frees: {sorted(set(left))}"


async def test_a_whole_answer_leaves_in_one_write_when_its_head_and_body_arrive_apart(
    rig: tuple[Router, type[Any], uvicorn.Config, ServerState],
) -> None:
    connection = _Connection(rig)
    (writes,) = await connection.rounds(1)
    connection.close()
    assert len(writes) == 1, writes
    assert writes[0].startswith(b"HTTP/1.1 200 ") and writes[0].endswith(ANSWER)


async def test_body_arrived_reads_the_installed_uvicorns_cycle(
    rig: tuple[Router, type[Any], uvicorn.Config, ServerState],
) -> None:
    _, protocol, config, state = rig
    seen: list[bool] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(body_arrived(receive))
        while (await receive()).get("more_body"):
            pass
        seen.append(body_arrived(receive))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    config = uvicorn.Config(app, lifespan="off", http=protocol, log_level="warning")
    config.load()
    loop = asyncio.get_running_loop()
    client = _Transport()
    server = protocol(config=config, server_state=state, app_state={}, _loop=loop)
    server.connection_made(client)
    server.data_received(HEAD + BODY[:10])  # the body still coming when the app starts
    await asyncio.sleep(0.01)
    server.data_received(BODY[10:])
    await asyncio.sleep(0.01)
    server.data_received(HEAD + BODY)  # the next request: whole before the app starts
    await asyncio.sleep(0.01)
    server.connection_lost(None)
    assert seen == [False, True, True, True]
    assert body_arrived(lambda: None) is False, "not uvicorn's receive: unknown, so False"
