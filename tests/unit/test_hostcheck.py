"""The replica's Host/Origin guard answers as FastMCP's own does, its verdict kept or not."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from fastmcp.server.http import HostOriginGuardMiddleware
from starlette.types import Message, Receive, Scope, Send

from mcpfleet.replica.hostcheck import KeptHostGuard

pytestmark = pytest.mark.unit

SERVERS = [("127.0.0.1", 8000), ("10.0.0.7", 8000), ("0.0.0.0", 8000), ("::1", 8000), None]
HOSTS = [
    None,
    "",
    "127.0.0.1:8000",
    "localhost",
    "LOCALHOST:9",
    "[::1]:8000",
    "10.0.0.7:8000",
    "replica.mcp.svc",
    "evil.example.com",
    "evil.example.com:8000",
]
ORIGINS = [
    None,
    "http://127.0.0.1:8000",
    "http://localhost",
    "https://replica.mcp.svc",
    "http://evil.example.com",
    "null",
    "http://10.0.0.7:8000/",
]
SETTINGS = [
    (None, None),
    (["replica.mcp.svc", "*.example.com"], None),
    (None, ["https://replica.mcp.svc"]),
    (["*"], ["*"]),
]


def _scope(
    server: tuple[str, int] | None, scheme: str, host: str | None, origin: str | None
) -> Scope:
    headers = [(b"content-type", b"application/json")]
    if host is not None:
        headers.append((b"host", host.encode("latin-1")))
    if origin is not None:
        headers.append((b"origin", origin.encode("latin-1")))
    headers.append((b"host", b"second.example.com"))  # only the first Host counts
    return {
        "type": "http",
        "method": "POST",
        "path": "/mcp",
        "scheme": scheme,
        "server": server,
        "headers": headers,
        "query_string": b"",
    }


async def _answer(app: object, scope: Scope) -> tuple[int, bytes]:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)  # type: ignore[operator]
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], body


async def _ok(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"served"})


@pytest.mark.parametrize("hosts,origins", SETTINGS)
def test_every_verdict_equals_fastmcps_guard_kept_or_not(
    hosts: list[str] | None, origins: list[str] | None
) -> None:
    async def run() -> tuple[int, int]:
        theirs = HostOriginGuardMiddleware(
            _ok, allowed_hosts=hosts, allowed_origins=origins, mode="auto"
        )
        ours = KeptHostGuard(_ok, allowed_hosts=hosts, allowed_origins=origins)
        cases = list(itertools.product(SERVERS, ["http", "https"], HOSTS, ORIGINS))
        refused = 0
        for _ in range(2):  # the second pass answers from what the first kept
            for server, scheme, host, origin in cases:
                scope = _scope(server, scheme, host, origin)
                expected = await _answer(theirs, scope)
                assert await _answer(ours, scope) == expected, (server, scheme, host, origin)
                refused += expected[0] != 200
        return len(ours.kept), refused

    kept, refused = asyncio.run(run())
    # Both kinds of verdict were exercised (every value is allowed under "*").
    assert kept > 0 and (refused > 0 or hosts == ["*"])


def test_a_refused_request_is_never_kept_and_the_kept_set_is_bounded() -> None:
    async def run() -> None:
        guard = KeptHostGuard(_ok, limit=3)
        loopback = ("127.0.0.1", 8000)
        status, body = await _answer(guard, _scope(loopback, "http", "evil.example.com", None))
        assert (status, body) == (421, b"Misdirected Request")
        status, body = await _answer(
            guard, _scope(loopback, "http", "127.0.0.1:8000", "http://evil.example.com")
        )
        assert (status, body) == (403, b"Forbidden Origin")
        assert guard.kept == set()
        for port in range(10):
            assert (await _answer(guard, _scope(loopback, "http", f"127.0.0.1:{port}", None)))[
                0
            ] == 200
        assert len(guard.kept) == 3
        # Past the bound, a refusal is still FastMCP's guard answering.
        status, _ = await _answer(guard, _scope(loopback, "http", "evil.example.com", None))
        assert status == 421

    asyncio.run(run())


def test_a_non_http_scope_goes_straight_through() -> None:
    seen: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope["type"])

    async def nothing() -> Message:
        return {}

    async def drop(message: Message) -> None:
        return None

    asyncio.run(KeptHostGuard(app)({"type": "lifespan"}, nothing, drop))
    assert seen == ["lifespan"]
