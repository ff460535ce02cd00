"""The router's two byte parsers fed the same messages split every way, with no sockets.

The upstream response reader (:class:`mcpfleet.router.h1client._Conn`, a fake
transport) and the request reader (the router's uvicorn protocol from
:func:`mcpfleet.router.h1server.bounded_protocol`, a fake client transport that
honours ``pause_reading`` and an ASGI app that records each request) get each
message whole, split in two at every byte boundary, byte by byte, in reads of
fixed sizes, and coalesced with what follows it (an interim answer with its
final one, a response with bytes nobody asked for, pipelined requests in one
read), and must parse the same result every time: status, headers, body.

Messages: JSON answers with a Content-Length, SSE streams (chunked: several
events in one chunk, one event across many chunks; and delimited by the
close), requests with Content-Length and chunked bodies, and a GET without one.
For a stream over 4 KiB, "every byte boundary" is every boundary of each head
(and 64 bytes either side), of each place where a message meets the next or
an interim answer its final one, of the response-header bound and of the
stream's end, and one in every 997 of the rest of its bodies.

Then each bound on both sides of it and past it: response headers (interim
answers' included) at, under and over :data:`~mcpfleet.router.h1client.MAX_RESPONSE_HEADER_BYTES`,
a replica sending headers without end, request headers at, under and over the
raw bound, and large bodies with tiny headers, whole and split.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import uvicorn
from uvicorn.server import ServerState

from mcpfleet.router import h1client
from mcpfleet.router.h1client import MAX_RESPONSE_HEADER_BYTES
from mcpfleet.router.h1server import HEADER_FRAMING_ALLOWANCE, bounded_protocol

# --- how a message is split ---------------------------------------------------------

#: Read sizes every message is also fed in (each a run of equal reads).
READ_SIZES = (1, 2, 3, 7, 64, 1000, 4096, 65535, 65536, 65537, 262144)


def boundaries(stream: bytes, dense: Sequence[tuple[int, int]] = ()) -> Iterator[int]:
    """Where ``stream`` is cut in two: every byte boundary of a small one; of a large
    one, every boundary in the ``dense`` ranges (its heads, where one message
    meets the next), within 8 bytes of the response-header bound, in its last 64
    bytes, and one in every 997 of the rest."""
    size = len(stream)
    if size <= 4096:
        yield from range(1, size)
        return
    near = set(range(0, size, 997)) | set(range(size - 64, size))
    near |= set(range(MAX_RESPONSE_HEADER_BYTES - 8, MAX_RESPONSE_HEADER_BYTES + 9))
    for lo, hi in dense:
        near |= set(range(lo, hi + 1))
    yield from sorted(i for i in near if 0 < i < size)


def splits(
    stream: bytes, dense: Sequence[tuple[int, int]] = ()
) -> Iterator[tuple[str, list[bytes]]]:
    """Each way ``stream`` is fed: a name (for the failure message) and its reads."""
    yield "whole", [stream]
    for i in boundaries(stream, dense):
        yield f"cut at {i}", [stream[:i], stream[i:]]
    for n in READ_SIZES:
        if n < len(stream) and len(stream) // n <= 70_000:
            yield f"reads of {n}", [stream[i : i + n] for i in range(0, len(stream), n)]


def around(*points: int, width: int = 64) -> list[tuple[int, int]]:
    return [(p - width, p + width) for p in points]


def chunked(*parts: bytes) -> bytes:
    """A chunked body of ``parts``, one transfer chunk each."""
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


# --- the upstream response reader ------------------------------------------------------


class _Replica:
    """The replica's side of a connection, as the reader sees it: no socket (the
    transport :class:`_Client` builds on, adding the client's reads)."""

    def __init__(self) -> None:
        self.closed = False
        self.paused = False

    def write(self, data: bytes) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


@dataclass(frozen=True)
class Answer:
    """What the reader made of one response."""

    status: int
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    complete: bool
    error: str | None


@dataclass(frozen=True)
class Upstream:
    answers: tuple[Answer, ...]
    #: Whether the connection may carry another request.
    reusable: bool


def read_responses(
    reads_per_response: Sequence[Sequence[bytes]], methods: Sequence[bytes] = (), eof: bool = False
) -> Upstream:
    """One keep-alive connection: a request, then its response fed as the given
    reads (each drained the way the relay drains it), for each response in turn;
    ``eof``: the replica closes the connection after the last."""
    loop = asyncio.get_running_loop()
    conn = h1client._Conn(loop)
    replica = _Replica()
    conn.connection_made(replica)  # type: ignore[arg-type]
    answers = []
    for n, reads in enumerate(reads_per_response):
        method = methods[n] if n < len(methods) else b"POST"
        headers_done = conn.send(method, b"POST /mcp HTTP/1.1\r\n\r\n", b"{}")
        body = []
        for data in reads:
            if replica.closed:
                break
            conn.data_received(data)
            body.append(conn.take())
        if eof and n == len(reads_per_response) - 1:
            conn.connection_lost(None)
            body.append(conn.take())
        if headers_done.done():
            headers_done.exception()  # (retrieved: a failed request is an answer here)
        error = None if conn.error is None else str(conn.error)
        answers.append(
            Answer(conn.status, tuple(conn.raw_headers), b"".join(body), conn.complete, error)
        )
        if replica.closed:
            break
    return Upstream(tuple(answers), conn.reusable and not replica.closed)


def _head(status: bytes, *headers: bytes) -> bytes:
    return b"HTTP/1.1 " + status + b"\r\n" + b"".join(h + b"\r\n" for h in headers) + b"\r\n"


JSON_BODY = b'{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"ok"}]}}'
JSON = (
    _head(
        b"200 OK",
        b"date: Mon, 01 Jan 2029 00:00:00 GMT",
        b"server: uvicorn",
        b"content-type: application/json",
        b"content-length: %d" % len(JSON_BODY),
    )
    + JSON_BODY
)

EVENTS = [
    b'event: message\r\ndata: {"jsonrpc":"2.0","method":"notifications/progress"}\r\n\r\n',
    b'event: message\r\ndata: {"jsonrpc":"2.0","method":"notifications/message"}\r\n\r\n',
    b"event: message\r\ndata: "
    + b'{"jsonrpc":"2.0","id":1,"result":"'
    + b"z" * 3000
    + b'"}\r\n\r\n',
]
SSE_HEAD = _head(
    b"200 OK",
    b"content-type: text/event-stream",
    b"cache-control: no-cache, no-transform",
    b"mcp-session-id: 0123456789abcdef",
    b"transfer-encoding: chunked",
)
#: Two events in the first transfer chunk; the third across four.
SSE = SSE_HEAD + chunked(
    EVENTS[0] + EVENTS[1], EVENTS[2][:10], EVENTS[2][10:11], EVENTS[2][11:2000], EVENTS[2][2000:]
)
#: An SSE stream without framing: its end is the connection's close.
SSE_UNTIL_CLOSE = _head(
    b"200 OK", b"content-type: text/event-stream", b"connection: close"
) + b"".join(EVENTS)
#: A body larger than the room for response headers, read with its head.
LARGE_BODY = bytes(range(256)) * (100 * 4)  # 100 KiB
LARGE = _head(b"200 OK", b"content-length: %d" % len(LARGE_BODY)) + LARGE_BODY
LARGE_CHUNKED = _head(b"200 OK", b"transfer-encoding: chunked") + chunked(
    LARGE_BODY[:100_000], LARGE_BODY[100_000:]
)
INTERIM = _head(b"100 Continue") + _head(b"103 Early Hints", b"link: </a>; rel=preload") + JSON
ACCEPTED = _head(b"202 Accepted", b"content-length: 0")


def _expected(message: bytes, body: bytes) -> Answer:
    """The answer ``message`` (one final response) parses to, read whole."""
    head = message[message.rindex(b"HTTP/1.1 ") :].split(b"\r\n\r\n", 1)[0]
    lines = head.split(b"\r\n")
    return Answer(
        int(lines[0].split()[1]),
        tuple(tuple(line.split(b": ", 1)) for line in lines[1:]),  # type: ignore[misc]
        body,
        True,
        None,
    )


RESPONSES = {
    "json": (JSON, JSON_BODY, False),
    "sse chunked": (SSE, b"".join(EVENTS), False),
    "sse until close": (SSE_UNTIL_CLOSE, b"".join(EVENTS), True),
    "large content-length": (LARGE, LARGE_BODY, False),
    "large chunked": (LARGE_CHUNKED, LARGE_BODY, False),
    "interim answers then json": (INTERIM, JSON_BODY, False),
    "accepted, no body": (ACCEPTED, b"", False),
}


@pytest.mark.parametrize("kind", list(RESPONSES))
async def test_a_response_parses_the_same_however_its_bytes_arrive(kind: str) -> None:
    message, body, eof = RESPONSES[kind]
    expected = _expected(message, body)
    reusable = not eof
    heads_end = message.index(b"\r\n\r\n", message.rindex(b"HTTP/1.1 ")) + 4
    for how, reads in splits(message, [(0, heads_end + 64)]):
        got = read_responses([reads], eof=eof)
        assert got.answers == (expected,), f"{kind}, {how}"
        assert got.reusable is reusable, f"{kind}, {how}"


async def test_responses_in_turn_on_one_connection_parse_the_same_however_they_arrive() -> None:
    """A kept-alive connection: its parser goes on from one response to the next."""
    sequence = [JSON, SSE, ACCEPTED, LARGE, JSON]
    bodies = [JSON_BODY, b"".join(EVENTS), b"", LARGE_BODY, JSON_BODY]
    expected = tuple(_expected(m, b) for m, b in zip(sequence, bodies, strict=True))
    for size in (*READ_SIZES, max(map(len, sequence))):
        reads = [[m[i : i + size] for i in range(0, len(m), size)] for m in sequence]
        got = read_responses(reads)
        assert got == Upstream(expected, True), f"reads of {size}"


@pytest.mark.parametrize("kind", ["json", "sse chunked", "large content-length"])
async def test_bytes_read_with_a_response_that_nobody_asked_for_close_its_connection(
    kind: str,
) -> None:
    """The response stands, whole, its headers its own; the connection is not reused."""
    message, body, _ = RESPONSES[kind]
    stray = _head(b"200 OK", b"x-stray: 1", b"content-length: 5") + b"stray"
    stream = message + stray
    heads_end = message.index(b"\r\n\r\n") + 4
    for how, reads in splits(stream, [(0, heads_end + 64), (len(message) - 64, len(stream))]):
        if sum(map(len, reads[:-1])) >= len(message):
            continue  # the stray bytes arrive in a read of their own: the case below
        got = read_responses([reads])
        assert got.answers == (_expected(message, body),), f"{kind}, {how}"
        assert got.reusable is False, f"{kind}, {how}"
    got = read_responses([[message, stray]])
    assert got.answers == (_expected(message, body),) and got.reusable is False


# --- the response-header bound --------------------------------------------------------


def _head_of(size: int, interim: bytes = b"", body_size: int = 0) -> bytes:
    """Response heads (``interim`` first) of exactly ``size`` bytes in all, framing a
    ``body_size`` body."""
    start = interim + b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\nx-pad: " % body_size
    pad = size - len(start) - 4
    assert pad >= 0
    return start + b"p" * pad + b"\r\n\r\n"


@pytest.mark.parametrize("interim", [b"", _head(b"100 Continue")], ids=["final", "interim+final"])
@pytest.mark.parametrize("over", [-1, 0, 1])
async def test_response_headers_are_bounded_to_the_byte_and_body_bytes_never_count(
    interim: bytes, over: int
) -> None:
    body = b"b" * (MAX_RESPONSE_HEADER_BYTES + 1000)
    head = _head_of(MAX_RESPONSE_HEADER_BYTES + over, interim, len(body))
    stream = head + body
    for how, reads in splits(stream, [(0, 64), *around(len(interim), len(head))]):
        (answer,) = read_responses([reads]).answers
        if over <= 0:
            assert (answer.status, answer.body, answer.error) == (200, body, None), how
        else:
            assert answer.error == "response headers too large", how
            assert answer.body == b"", how


class _Counting:
    """A parser that counts the bytes it was fed."""

    def __init__(self, parser: Any) -> None:
        self.parser = parser
        self.fed = 0

    def feed_data(self, data: bytes) -> None:
        self.fed += len(data)
        self.parser.feed_data(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.parser, name)


@pytest.mark.parametrize("read", [100, 4096, 65536, 1 << 20])
async def test_a_replica_sending_headers_without_end_is_cut_off_at_the_bound(read: int) -> None:
    conn = h1client._Conn(asyncio.get_running_loop())
    replica = _Replica()
    conn.connection_made(replica)  # type: ignore[arg-type]
    counting = _Counting(conn.parser)
    conn.parser = counting  # type: ignore[assignment]
    headers_done = conn.send(b"POST", b"POST /mcp HTTP/1.1\r\n\r\n", b"{}")
    line = b"x-more: " + b"m" * 90 + b"\r\n"
    endless = b"HTTP/1.1 200 OK\r\n" + line * (((1 << 21) + read) // len(line))
    for i in range(0, len(endless), read):
        if replica.closed:
            break
        conn.data_received(endless[i : i + read])
    assert replica.closed and isinstance(headers_done.exception(), h1client.Broken)
    assert counting.fed <= MAX_RESPONSE_HEADER_BYTES


@pytest.mark.parametrize("size", [1 << 20, 8 << 20])
async def test_a_huge_body_with_tiny_headers_is_read_whatever_the_reads(size: int) -> None:
    body = bytes(range(256)) * (size // 256)
    message = _head(b"200 OK", b"content-length: %d" % size) + body
    for n in (size + 100, 262144, 65537, 65536, 4096):
        (answer,) = read_responses(
            [[message[i : i + n] for i in range(0, len(message), n)]]
        ).answers
        assert (answer.status, answer.complete, answer.error) == (200, True, None), n
        assert answer.body == body, n


# --- the request reader ------------------------------------------------------------


class _Client(_Replica):
    """The client's side of a connection to the router: each read delivered while
    reading is not paused (uvicorn pauses it for pipelined requests and large bodies)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.loop = loop
        self.protocol: Any = None
        self.writes: list[bytes] = []
        self.pending: collections.deque[bytes] = collections.deque()

    def send(self, reads: Sequence[bytes]) -> None:
        self.pending.extend(reads)
        self._deliver()

    def _deliver(self) -> None:
        while self.pending and not self.paused and not self.closed:
            self.protocol.data_received(self.pending.popleft())

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def resume_reading(self) -> None:
        super().resume_reading()
        self.loop.call_soon(self._deliver)

    def set_write_buffer_limits(self, *args: Any, **kwargs: Any) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        peers = {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 40000)}
        return peers.get(name, default)


Request = tuple[str, bytes, bytes, tuple[tuple[bytes, bytes], ...], bytes]


class _Recorder:
    """An ASGI app that records each request whole and answers ``200 ok``."""

    def __init__(self) -> None:
        self.seen: list[Request] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        parts = []
        while True:
            message = await receive()
            parts.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        headers = tuple((k, v) for k, v in scope["headers"])
        body = b"".join(parts)
        self.seen.append((scope["method"], scope["raw_path"], scope["query_string"], headers, body))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


async def serve_requests(reads: Sequence[bytes], expect: int, max_header_bytes: int) -> Any:
    """The router's protocol fed ``reads`` on one connection: the requests its app
    saw (waiting, bounded, for ``expect`` of them or the connection's close) and
    what the client got."""
    loop = asyncio.get_running_loop()
    app = _Recorder()
    protocol = bounded_protocol(10.0, max_header_bytes=max_header_bytes)
    config = uvicorn.Config(app, lifespan="off", http=protocol, log_level="warning")
    config.load()
    client = _Client(loop)
    server = protocol(config=config, server_state=ServerState(), app_state={}, _loop=loop)
    client.protocol = server
    server.connection_made(client)
    try:
        client.send(reads)
        deadline = loop.time() + 30
        while loop.time() < deadline and not client.closed:
            written = b"".join(client.writes)
            if b"HTTP/1.1 4" in written or (
                len(app.seen) >= expect and written.count(b"HTTP/1.1 ") >= expect
            ):
                break
            await asyncio.sleep(0)
        for _ in range(3):
            await asyncio.sleep(0)
    finally:
        server.connection_lost(None)
    return app.seen, b"".join(client.writes)


def _request(method: bytes, target: bytes, headers: Sequence[bytes], body: bytes = b"") -> bytes:
    return (
        method
        + b" "
        + target
        + b" HTTP/1.1\r\n"
        + b"".join(h + b"\r\n" for h in headers)
        + b"\r\n"
        + body
    )


CALL = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{}}}'
#: A body with blank lines in it: a chunked body's end is not the first one seen.
#: (uvicorn adds a chunked body's trailer fields to the request's headers.)
BLANKS = b"line\r\n\r\nafter a blank line\r\n\r\n\r\n0\r\n\r\n" * 3
REQUESTS: list[tuple[bytes, Request]] = [
    (
        _request(
            b"POST",
            b"/mcp",
            [b"host: r", b"content-type: application/json", b"content-length: %d" % len(CALL)],
            CALL,
        ),
        (
            "POST",
            b"/mcp",
            b"",
            (
                (b"host", b"r"),
                (b"content-type", b"application/json"),
                (b"content-length", b"%d" % len(CALL)),
            ),
            CALL,
        ),
    ),
    (
        _request(b"GET", b"/mcp?x=1", [b"host: r", b"accept: text/event-stream"]),
        ("GET", b"/mcp", b"x=1", ((b"host", b"r"), (b"accept", b"text/event-stream")), b""),
    ),
    (
        _request(
            b"POST",
            b"/mcp",
            [b"host: r", b"transfer-encoding: chunked", b"trailer: x-t"],
            chunked(BLANKS[:7], BLANKS[7:]).removesuffix(b"\r\n") + b"x-t: 1\r\n\r\n",
        ),
        (
            "POST",
            b"/mcp",
            b"",
            (
                (b"host", b"r"),
                (b"transfer-encoding", b"chunked"),
                (b"trailer", b"x-t"),
                (b"x-t", b"1"),
            ),
            BLANKS,
        ),
    ),
    (
        _request(b"POST", b"/mcp", [b"host: r", b"transfer-encoding: chunked"], chunked(CALL)),
        ("POST", b"/mcp", b"", ((b"host", b"r"), (b"transfer-encoding", b"chunked")), CALL),
    ),
]
#: A body larger than the raw header bound, whose request follows another in one read.
BIG_CALL = b'{"jsonrpc":"2.0","id":2,"params":"' + b"q" * 30_000 + b'"}'
BIG = (
    _request(b"POST", b"/mcp", [b"host: r", b"content-length: %d" % len(BIG_CALL)], BIG_CALL),
    ("POST", b"/mcp", b"", ((b"host", b"r"), (b"content-length", b"%d" % len(BIG_CALL))), BIG_CALL),
)


@pytest.mark.parametrize(
    "index", range(len(REQUESTS)), ids=["json", "get", "chunked+trailer", "chunked"]
)
async def test_a_request_parses_the_same_however_its_bytes_arrive(index: int) -> None:
    message, expected = REQUESTS[index]
    for how, reads in splits(message, [(0, len(message))]):
        seen, written = await serve_requests(reads, 1, 16 * 1024)
        assert seen == [expected], how
        assert written.count(b"HTTP/1.1 200 ") == 1, (how, written)


@pytest.mark.parametrize("order", ["small first", "large first"])
async def test_pipelined_requests_parse_the_same_however_their_bytes_arrive(order: str) -> None:
    """Every request kind back to back (and one with a body larger than the header
    bound): the end of each body and the next head share reads."""
    pairs = [*REQUESTS, BIG] if order == "small first" else [BIG, *REQUESTS]
    stream = b"".join(m for m, _ in pairs)
    expected = [e for _, e in pairs]
    small = b"".join(m for m, _ in REQUESTS)
    at = stream.index(small)
    big_head = stream.index(b"\r\n\r\n", stream.index(BIG[0])) + 4
    dense = [(at - 64, at + len(small) + 64), (big_head - 300, big_head + 64)]
    seen_splits = 0
    for how, reads in splits(stream, dense):
        seen, written = await serve_requests(reads, len(pairs), 16 * 1024)
        assert seen == expected, how
        assert written.count(b"HTTP/1.1 200 ") == len(pairs), (how, written[:300])
        seen_splits += 1
    assert seen_splits > 100


# --- the request-header bound --------------------------------------------------------

MAX_HEADER_BYTES = 16 * 1024
RAW_BOUND = MAX_HEADER_BYTES + HEADER_FRAMING_ALLOWANCE


def _request_head_of(size: int, body: bytes) -> bytes:
    start = b"POST /mcp HTTP/1.1\r\nhost: r\r\ncontent-length: %d\r\nx-pad: " % len(body)
    return start + b"p" * (size - len(start) - 4) + b"\r\n\r\n"


@pytest.mark.parametrize("over", [-1, 0, 1, 1000])
async def test_request_headers_are_bounded_to_the_byte_and_body_bytes_never_count(
    over: int,
) -> None:
    body = b"b" * 30_000
    head = _request_head_of(RAW_BOUND + over, body)
    stream = head + body + REQUESTS[0][0]
    for how, reads in splits(stream, [(0, 64), *around(len(head), len(head) + len(body))]):
        seen, written = await serve_requests(reads, 2, MAX_HEADER_BYTES)
        if over <= 0:
            assert [s[4] for s in seen] == [body, CALL], how
        else:
            assert seen == [] and written.startswith(b"HTTP/1.1 431 "), how


async def test_a_pipelined_requests_head_is_counted_from_its_first_byte() -> None:
    """A request's head that begins in the read that ended the one before is
    counted whole: past the bound it is refused, however the reads fall."""
    first = REQUESTS[0][0]
    over = _request_head_of(RAW_BOUND + 1, b"")
    for how, reads in splits(first + over, [(0, len(first) + 300)]):
        seen, written = await serve_requests(reads, 2, MAX_HEADER_BYTES)
        assert [s[4] for s in seen] == [CALL], how
        assert written.count(b"HTTP/1.1 200 ") == 1 and b"HTTP/1.1 431 " in written, how


@pytest.mark.parametrize("size", [900 * 1024, 8 << 20])
async def test_a_huge_request_body_with_tiny_headers_is_read_whatever_the_reads(size: int) -> None:
    body = b"[" + b"1," * ((size - 2) // 2) + b"1]"
    message = _request(b"POST", b"/mcp", [b"host: r", b"content-length: %d" % len(body)], body)
    for n in (len(message), 262144, 65536, 4096):
        reads = [message[i : i + n] for i in range(0, len(message), n)]
        seen, written = await serve_requests(reads, 1, MAX_HEADER_BYTES)
        assert [s[4] for s in seen] == [body], n
        assert written.startswith(b"HTTP/1.1 200 "), n
