"""Modern rounds that cannot stream are answered in JSON mode; the rest as FastMCP serves them."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastmcp import Context, FastMCP
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fleetkit.clients.wire import MODERN, MODERN_META, initialize_body, response_body
from mcpfleet.replica.respmode import (
    WATCH_AFTER,
    ResponseModes,
    _cancelled_on_disconnect,
    may_stream,
)

HEADERS = {
    "content-type": "application/json",
    "accept": "application/json, text/event-stream",
    "mcp-protocol-version": MODERN,
    "mcp-method": "tools/call",
    "mcp-name": "count",
}


def _app() -> FastMCP[Any]:
    app = FastMCP("respmode-test")

    @app.tool
    async def count(n: int, ctx: Context) -> str:
        for i in range(n):
            await ctx.report_progress(i + 1, n)
        return f"counted {n}"

    return app


@contextlib.asynccontextmanager
async def _served() -> AsyncIterator[httpx.AsyncClient]:
    """Both apps of one server, as the replica builds them, with their lifespans."""
    app = _app()
    sse, json_app = app.http_app(path="/mcp"), app.http_app(path="/mcp", json_response=True)
    modes = ResponseModes(sse, json_app, "/mcp")
    async with (
        sse.router.lifespan_context(sse),
        json_app.router.lifespan_context(json_app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=modes), base_url="http://127.0.0.1"
        ) as http,
    ):
        yield http


def _call(n: int, meta: dict[str, Any] | None = None) -> str:
    params = {"name": "count", "arguments": {"n": n}, "_meta": {**MODERN_META, **(meta or {})}}
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params})


@pytest.mark.parametrize(
    ("body", "streams"),
    [
        (b'{"params":{"_meta":{"progressToken":1}}}', True),
        (b'{"params":{"_meta":{"io.modelcontextprotocol/logLevel":"info"}}}', True),
        (b'{"method":"subscriptions/listen"}', True),
        (b'{"params":{"_meta":{"\\u0070rogressToken":1}}}', True),
        (_call(2).encode(), False),
    ],
)
def test_a_modern_request_may_stream_only_if_its_body_asks_for_notifications(
    body: bytes, streams: bool
) -> None:
    assert may_stream(body) is streams


async def test_a_round_that_asked_for_nothing_is_answered_in_json_mode() -> None:
    """Only JSON mode serves a client that accepts JSON alone (SSE mode answers 406)."""
    async with _served() as http:
        resp = await http.post(
            "/mcp", content=_call(3), headers={**HEADERS, "accept": "application/json"}
        )
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    assert response_body(resp)["result"]["content"][0]["text"] == "counted 3"


async def test_a_round_with_a_progress_token_still_streams_its_progress() -> None:
    async with _served() as http:
        resp = await http.post("/mcp", content=_call(3, {"progressToken": "p"}), headers=HEADERS)
        refused = await http.post(
            "/mcp",
            content=_call(3, {"progressToken": "p"}),
            headers={**HEADERS, "accept": "application/json"},
        )
    assert resp.headers["content-type"].startswith("text/event-stream")
    assert resp.text.count('"notifications/progress"') == 3
    assert response_body(resp)["result"]["content"][0]["text"] == "counted 3"
    assert refused.status_code == 406  # SSE mode, as FastMCP serves by default


async def test_handshake_era_requests_go_to_the_app_as_fastmcp_built_it() -> None:
    async with _served() as http:
        resp = await http.post(
            "/mcp",
            content=initialize_body("respmode-test"),
            headers={**HEADERS, "mcp-protocol-version": "2025-11-25"},
        )
    assert resp.status_code == 200
    assert resp.headers.get("mcp-session-id")


async def test_a_client_that_goes_away_cancels_the_handler_in_json_mode() -> None:
    """SSE mode's sibling task cancelled a handler whose client left; JSON mode runs it
    in the request's task, so the watch does the same, and the request ends quietly."""
    gone = asyncio.Event()
    seen: list[str] = []

    async def slow(scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    async def client_receive() -> Message:
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        raise AssertionError("nothing is answered to a client that left")

    async def replay() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    running = asyncio.create_task(
        _cancelled_on_disconnect(slow, {"type": "http"}, replay, client_receive, send)
    )
    await asyncio.sleep(0.01)
    gone.set()
    await asyncio.wait_for(running, 5)
    assert seen == ["cancelled"]
    assert not running.cancelled()


async def test_an_answered_request_is_not_cancelled_by_the_end_of_its_response() -> None:
    """The client's receive says ``http.disconnect`` once the response completed too."""
    done = asyncio.Event()
    sent: list[Message] = []

    async def quick(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}", "more_body": False})
        done.set()
        await asyncio.sleep(0.01)  # the watch runs now, and must not cancel

    async def client_receive() -> Message:
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    async def replay() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    await _cancelled_on_disconnect(quick, {"type": "http"}, replay, client_receive, send)
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]


async def test_a_round_answered_before_the_watch_starts_never_reads_the_client() -> None:
    """The watch is a timer until :data:`WATCH_AFTER`: a quick round makes no task and
    never calls the client's ``receive``; a slow one does, once."""
    reads: list[str] = []

    async def client_receive() -> Message:
        reads.append("receive")
        await asyncio.sleep(30)
        return {"type": "http.disconnect"}

    async def replay() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        pass

    def answering_after(seconds: float) -> ASGIApp:
        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            await asyncio.sleep(seconds)
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"{}", "more_body": False})

        return app

    await _cancelled_on_disconnect(
        answering_after(0), {"type": "http"}, replay, client_receive, send
    )
    await asyncio.sleep(WATCH_AFTER * 2)
    assert reads == []
    slow = answering_after(WATCH_AFTER * 3)
    await _cancelled_on_disconnect(slow, {"type": "http"}, replay, client_receive, send)
    assert reads == ["receive"]


async def test_a_json_mode_round_of_a_real_app_is_cancelled_when_its_client_leaves() -> None:
    """Through FastMCP's and mcp's JSON mode: the tool sees the cancellation, nothing is
    answered, and the request ends quietly (uvicorn would log anything it raised)."""
    app = FastMCP("respmode-cancel")
    started, cancelled = asyncio.Event(), asyncio.Event()

    @app.tool
    async def wait() -> str:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "waited"

    sse, json_app = app.http_app(path="/mcp"), app.http_app(path="/mcp", json_response=True)
    modes = ResponseModes(sse, json_app, "/mcp")
    params = {"name": "wait", "arguments": {}, "_meta": MODERN_META}
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params})
    headers = {**HEADERS, "mcp-name": "wait", "host": "127.0.0.1"}
    scope: Scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/mcp",
        "raw_path": b"/mcp",
        "root_path": "",
        "query_string": b"",
        "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    messages: list[Message] = [{"type": "http.request", "body": body.encode()}]

    async def receive() -> Message:
        if messages:
            return messages.pop(0)
        await started.wait()
        return {"type": "http.disconnect"}

    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    async with sse.router.lifespan_context(sse), json_app.router.lifespan_context(json_app):
        await asyncio.wait_for(modes(scope, receive, send), 5)
    assert cancelled.is_set()
    assert sent == []
