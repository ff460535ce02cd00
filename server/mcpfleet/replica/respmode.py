"""Which response mode answers each request: JSON for a modern round that cannot stream.

mcp answers a modern (2026-07-28) POST in one of two ways, chosen per session
manager (``json_response``). SSE mode runs the handler as a sibling task in a
task group, beside a task watching for the client's disconnect, behind a
memory stream, so that a notification the handler emits can open an event
stream; a handler that emits nothing is answered as JSON anyway. JSON mode
runs the handler in the request's own task and writes one JSON body: none of
that machinery, which cost a guard round about a tenth of the replica's CPU.

On the modern era a request can only be streamed to if it asked for it: the
server sends progress only for a request whose ``_meta`` carries a
``progressToken``, and log messages only at the level its ``_meta`` names
(``io.modelcontextprotocol/logLevel``; absent, the server must not send any);
``subscriptions/listen`` is a stream by definition. So the choice is **per
request**, by what the request carries, and no tool needs marking:

* a modern POST to the MCP path whose body names none of ``progressToken``,
  ``logLevel`` and ``subscriptions/listen`` (and has no ``\\u`` escape that
  could spell one) goes to the app built in JSON mode, with a watch (from 50 ms on) that
  cancels its handler when the client goes away (the spec's cancellation,
  which SSE mode's sibling task gave);
* everything else (handshake-era requests and sessions, a modern request that
  may stream, a body over mcp's size limit, any other path or method) goes to
  the app as FastMCP built it, unchanged.

The body is read (bounded by mcp's own limit) to decide, then handed on as
it arrived; the whole body is also left in the scope (:data:`BODY`), where the
limits gate behind (mcpfleet.replica.limitgate) takes it instead of reading it
a second time. A custom notification a tool sends on a request that asked for
neither progress nor logs is dropped in JSON mode, as mcp's JSON mode drops
it; such an app gets every round in SSE mode with ``--response-mode sse``.
"""

from __future__ import annotations

import asyncio
from typing import Final

from mcp.server.streamable_http_manager import DEFAULT_MAX_REQUEST_BODY_SIZE
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mcpfleet.jsonbody import may_be_escaped

__all__ = ["BODY", "STREAM_MARKERS", "WATCH_AFTER", "ResponseModes", "may_stream"]

_VERSION_HEADER: Final = b"mcp-protocol-version"
_LENGTH_HEADER: Final = b"content-length"
#: Seconds a JSON-mode handler runs before a task starts watching for its client's
#: disconnect (:func:`_cancelled_on_disconnect`).
WATCH_AFTER: Final = 0.05
#: Bytes whose presence in a modern request's body means it may be streamed to
#: (a ``\\u`` escape too: :func:`may_stream`).
STREAM_MARKERS: Final = (b"progressToken", b"logLevel", b"subscriptions/listen")
#: The scope key holding a request's whole body once :class:`ResponseModes` read it
#: (a complete body within the limit; absent otherwise): the layers behind take it
#: from here. What the app reads through ``receive`` is the same body.
BODY: Final = "mcpfleet.body"


def may_stream(body: bytes) -> bool:
    """Whether a modern request may receive notifications on its response (pure).

    Conservative: a false "yes" only costs the request SSE mode's machinery;
    a "no" is safe because a JSON key or method name in the body appears
    there as written, unless escaped (any ``\\u`` counts as a yes).
    """
    for marker in STREAM_MARKERS:
        if marker in body:
            return True
    return may_be_escaped(body)


def _modern(scope: Scope) -> bool:
    """mcp's own rule: a protocol version header naming no handshake version."""
    for key, value in scope["headers"]:
        if key == _VERSION_HEADER:
            return value.decode("latin-1") not in HANDSHAKE_PROTOCOL_VERSIONS
    return False


def _declared_length(scope: Scope) -> int | None:
    for key, value in scope["headers"]:
        if key == _LENGTH_HEADER:
            try:
                return int(value)
            except ValueError:
                return None
    return None


class ResponseModes:
    """ASGI: modern rounds that cannot stream to ``json_app``; everything else to ``app``.

    Both apps are the same FastMCP server's ``http_app`` (same middleware,
    auth and routes), built in SSE and in JSON mode. See the module docstring.
    """

    def __init__(
        self,
        app: ASGIApp,
        json_app: ASGIApp,
        path: str,
        limit: int = DEFAULT_MAX_REQUEST_BODY_SIZE,
    ) -> None:
        self.app = app
        self.json_app = json_app
        self.path = path
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] != "POST"
            or scope["path"] != self.path
            or not _modern(scope)
        ):
            await self.app(scope, receive, send)
            return
        declared = _declared_length(scope)
        if declared is not None and declared > self.limit:
            await self.app(scope, receive, send)  # mcp answers 413
            return
        read: list[Message] = []
        size, complete = 0, False
        while not complete and size <= self.limit:
            message = await receive()
            read.append(message)
            if message["type"] != "http.request":
                break  # the client went away while sending
            size += len(message.get("body", b""))
            complete = not message.get("more_body", False)
        replay = _Replay(read, receive)
        if not complete or size > self.limit:
            await self.app(scope, replay, send)
            return
        body = b"".join(m.get("body", b"") for m in read)
        scope[BODY] = body
        if may_stream(body):
            await self.app(scope, replay, send)
            return
        await _cancelled_on_disconnect(self.json_app, scope, replay, receive, send)


class _Replay:
    """A ``receive`` that gives back the messages already read, then the client's."""

    def __init__(self, read: list[Message], receive: Receive) -> None:
        self._read = read
        self._receive = receive

    async def __call__(self) -> Message:
        if self._read:
            return self._read.pop(0)
        return await self._receive()


async def _cancelled_on_disconnect(
    app: ASGIApp, scope: Scope, replay: Receive, receive: Receive, send: Send
) -> None:
    """Run ``app`` in this task; cancel it if the client disconnects before the answer.

    The body was read whole, so the client's ``receive`` now only says
    ``http.disconnect`` (the client went away, or the response completed):
    one task waits for it. A cancel that lands is the client's doing: the
    request ends quietly, with nothing to answer and no one to answer.

    The watch starts only once the handler has run :data:`WATCH_AFTER` seconds
    (a timer, not a task, until then): most rounds are answered sooner, and
    never pay for a task. A client that left earlier is seen as soon as the
    watch starts (the server remembers the disconnect), so a handler still
    running is cancelled at most :data:`WATCH_AFTER` after its client left.
    """
    task = asyncio.current_task()
    assert task is not None
    answered = False
    gone = False
    watcher: asyncio.Task[None] | None = None

    async def watch() -> None:
        nonlocal gone
        message = await receive()
        if message["type"] == "http.disconnect" and not answered:
            gone = True
            task.cancel()

    def start_watch() -> None:
        nonlocal watcher
        if not answered:
            watcher = asyncio.ensure_future(watch())

    async def tracked_send(message: Message) -> None:
        nonlocal answered
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            answered = True
        await send(message)

    timer = asyncio.get_running_loop().call_later(WATCH_AFTER, start_watch)
    try:
        await app(scope, replay, tracked_send)
    except asyncio.CancelledError:
        if gone and task.uncancel() == 0:
            return
        raise
    finally:
        timer.cancel()
        if watcher is not None:
            watcher.cancel()  # never awaited: a cancelled task needs no one to collect it
