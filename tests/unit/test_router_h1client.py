"""The router's HTTP/1.1 client (mcpfleet.router.h1client) against scripted servers on 127.0.0.1.

What the router's fault semantics rest on: nothing sent when connecting fails,
"may have been read" once written, bounded response headers, pooled
connections reused only while young, bodies whole or streamed, and a closed
response closing its connection (the replica sees its client leave).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from mcpfleet.router.h1client import MAX_RESPONSE_HEADER_BYTES, Broken, ConnectFailed, Pool

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Server:
    """A TCP server whose every connection runs ``handler``; counts connections."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.closed = asyncio.Event()
        self.requests: list[bytes] = []
        self.got_request = asyncio.Event()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer)
        finally:
            writer.close()

    async def read_request(self, reader: asyncio.StreamReader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        request = head + await reader.readexactly(length)
        self.requests.append(request)
        self.got_request.set()
        return request


@contextlib.asynccontextmanager
async def serving(handler: Callable[[Server], Handler]) -> AsyncIterator[tuple[Server, str]]:
    server = Server(lambda r, w: asyncio.sleep(0))
    server.handler = handler(server)
    srv = await asyncio.start_server(server._serve, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        yield server, f"http://127.0.0.1:{port}"
    finally:
        srv.close()


def _ok(body: bytes = b"{}") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)


def answering(*responses: bytes) -> Callable[[Server], Handler]:
    """Answers each request on a connection with the next of ``responses``, keeping it open."""

    def handler(server: Server) -> Handler:
        async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
                for response in responses:
                    await server.read_request(reader)
                    writer.write(response)
                    await writer.drain()
                await reader.read()

        return run

    return handler


async def _post(pool: Pool, address: str, body: bytes = b"{}") -> bytes:
    resp = await pool.request(address, b"POST", b"/mcp", b"x-test: 1\r\n", body)
    try:
        return await resp.read()
    finally:
        resp.release()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def test_a_refused_connect_sent_nothing() -> None:
    pool = Pool(connect_timeout=2.0, idle_seconds=5.0)
    with pytest.raises(ConnectFailed):
        await _post(pool, f"http://127.0.0.1:{_free_port()}")


async def test_the_request_carries_host_length_and_the_given_headers() -> None:
    async with serving(answering(_ok(b'{"a":1}'))) as (server, address):
        pool = Pool(2.0, 5.0)
        assert await _post(pool, address, b'{"x":2}') == b'{"a":1}'
        pool.close()
    request = server.requests[0]
    assert request.startswith(b"POST /mcp HTTP/1.1\r\n")
    assert f"host: {address.removeprefix('http://')}\r\n".encode() in request
    assert b"x-test: 1\r\n" in request and b"content-length: 7\r\n" in request
    assert request.endswith(b'\r\n\r\n{"x":2}')


async def test_a_connection_read_then_closed_is_broken_not_refused() -> None:
    def handler(server: Server) -> Handler:
        async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.read_request(reader)

        return run

    async with serving(handler) as (server, address):
        with pytest.raises(Broken):
            await _post(Pool(2.0, 5.0), address)
    assert len(server.requests) == 1


async def test_a_pooled_connection_is_reused_only_while_young() -> None:
    async with serving(answering(_ok(), _ok(), _ok())) as (server, address):
        pool = Pool(2.0, idle_seconds=0.2)
        await _post(pool, address)
        await _post(pool, address)
        assert server.connections == 1, "a young idle connection is reused"
        await asyncio.sleep(0.3)
        await _post(pool, address)
        assert server.connections == 2, "an old idle connection is not"
        pool.close()


async def test_a_connection_the_replica_closed_is_not_reused() -> None:
    async with serving(
        answering(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}")
    ) as (
        server,
        address,
    ):
        pool = Pool(2.0, 5.0)
        await _post(pool, address)
        with contextlib.suppress(Broken):
            await _post(pool, address)
        assert server.connections == 2
        pool.close()


async def test_response_headers_past_the_bound_break_the_request() -> None:
    huge = b"HTTP/1.1 200 OK\r\nx-big: " + b"a" * (MAX_RESPONSE_HEADER_BYTES + 10)
    async with serving(answering(huge)) as (_, address):
        with pytest.raises(Broken):
            await _post(Pool(2.0, 5.0), address)


async def test_interim_answers_are_skipped() -> None:
    async with serving(answering(b"HTTP/1.1 100 Continue\r\n\r\n" + _ok(b"[1]"))) as (_, address):
        assert await _post(Pool(2.0, 5.0), address) == b"[1]"


async def test_a_head_answer_has_no_body_whatever_its_length_says() -> None:
    async with serving(answering(b"HTTP/1.1 405 No\r\ncontent-length: 10\r\n\r\n")) as (_, address):
        pool = Pool(2.0, 5.0)
        resp = await pool.request(address, b"HEAD", b"/mcp", b"", b"")
        assert resp.status == 405 and await resp.read() == b""
        resp.release()


async def test_a_stream_arrives_chunk_by_chunk_and_closing_it_closes_the_connection() -> None:
    left = asyncio.Event()

    def handler(server: Server) -> Handler:
        async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            writer.write(b"5\r\nfirst\r\n")
            await writer.drain()
            if await reader.read() == b"":
                left.set()

        return run

    async with serving(handler) as (_, address):
        resp = await Pool(2.0, 5.0).request(address, b"POST", b"/mcp", b"", b"{}")
        assert resp.content_length is None
        chunks = resp.iter_chunks()
        assert await anext(chunks) == b"first"
        resp.close()
        await asyncio.wait_for(left.wait(), 5)


async def test_a_stream_broken_midway_raises() -> None:
    def handler(server: Server) -> Handler:
        async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
            await writer.drain()

        return run

    async with serving(handler) as (_, address):
        resp = await Pool(2.0, 5.0).request(address, b"POST", b"/mcp", b"", b"{}")
        got = []
        with pytest.raises(Broken):
            async for chunk in resp.iter_chunks():
                got.append(chunk)
        assert got == [b"first"]
        resp.close()


async def test_cancelling_the_wait_for_headers_closes_the_connection() -> None:
    left = asyncio.Event()

    def handler(server: Server) -> Handler:
        async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.read_request(reader)
            if await reader.read() == b"":
                left.set()

        return run

    async with serving(handler) as (server, address):
        waiting = asyncio.ensure_future(
            Pool(2.0, 5.0).request(address, b"POST", b"/mcp", b"", b"{}")
        )
        await asyncio.wait_for(server.got_request.wait(), 5)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await asyncio.wait_for(left.wait(), 5)


async def test_a_repeated_response_header_reads_as_its_first_value() -> None:
    twice = b"HTTP/1.1 200 OK\r\nx-a: one\r\nX-A: two\r\ncontent-length: 0\r\n\r\n"
    async with serving(answering(twice)) as (_, address):
        pool = Pool(2.0, 5.0)
        resp = await pool.request(address, b"POST", b"/mcp", b"", b"{}")
        assert resp.headers.get("X-A") == "one"
        assert [k for k, _ in resp.raw_headers] == [b"x-a", b"X-A", b"content-length"]
        resp.close()


async def test_the_sweep_closes_old_idle_connections_and_forgets_their_address() -> None:
    async with serving(answering(_ok())) as (_, address):
        pool = Pool(2.0, idle_seconds=0.0)
        await _post(pool, address)
        assert pool._idle[address]
        pool._sweep()
        assert address not in pool._idle and address not in pool._hosts
        pool.close()


@pytest.mark.parametrize("size", [65 * 1024, 256 * 1024, 1 << 20, 8 << 20])
async def test_a_body_written_with_its_head_in_one_write_is_read_whole(size: int) -> None:
    """The replica writes head and body at once: however the kernel splits them
    into reads, body bytes never count against the response-header bound."""
    body = bytes(range(256)) * (size // 256)
    rounds = 5
    async with serving(answering(*[_ok(body)] * rounds)) as (server, address):
        pool = Pool(2.0, 5.0)
        for _ in range(rounds):
            assert await _post(pool, address) == body
        assert server.connections == 1, "each response left its connection reusable"
        pool.close()
