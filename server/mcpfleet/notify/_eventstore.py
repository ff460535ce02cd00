"""Resumable SSE streams: mcp's ``EventStore`` kept in the fleet's Redis, bounded.

A handshake-era session's SSE streams (each POST's answer, the session's GET
stream) carry event ids when the transport has an event store: a client whose
stream was cut (the network, a router restarted) opens a GET with
``Last-Event-ID`` and the owner replays what came after. The transport stores
every message before it writes it, so what a cut connection never carried is
in the store, and the replay sends it.

:class:`RedisEventStore` keeps each SSE stream as one Redis stream
(:meth:`mcpfleet.contract.RedisKeys.sse`, the key named by a digest of the
transport's stream id, which is the session's random scope and the request's
id), bounded two ways, both in one Lua script per write on that one key (a
Cluster's single slot):

* by count: ``XADD ... MAXLEN`` keeps the last :data:`EVENTS_PER_STREAM`;
* by size: a message over :data:`MAX_STORED` is not stored (it goes out live
  without an id, counted ``store``): a large answer is not kept in Redis;
* in time: entries older than :data:`EVENT_TTL` are trimmed (``XTRIM MINID``)
  at every write, a stream expires that long after its last write, and a
  replay from an id older than that finds nothing.

An event id is ``<digest>/<Redis entry id>``: a replay finds its stream from
the id alone, and an id that is not of that form (hostile input) is refused
before Redis is asked. A replay from an id that is gone (trimmed, expired) or
unknown replays nothing: the SDK then answers the GET with an empty stream;
nothing already delivered is repeated and nothing is invented.

Redis past the replica's memory limit (``--once-memory-limit``, read once a
second, as the once ledger reads it): nothing is stored, each event counted
``store`` and sent live without an id, so the store never takes the memory
the fleet's routes and heartbeats need.

Redis away or slower than the deadline (the Redis deadline, at most
:data:`STORE_WAIT`): a write is not stored, logged and
counted (``mcpfleet_events_dropped_total{reason="store"}``), and for
:data:`BACKOFF` seconds after it no write is tried (each would make its
message wait out the deadline): those events go out live without an id
(the client's ``Last-Event-ID`` stays on the last stored one); the priming
event of a stream opened then carries an empty id (not resumable). Never an
exception into the transport: its message router would stop, and the session
with it.

FastMCP wraps the store per transport (``SessionScopedEventStore``: a random
scope per session, so one session can never replay another's stream). The
scope lives in the owner's memory: the owner is the only replica that can
replay a stream, and the router routes the GET there by its session id.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from collections.abc import Callable
from typing import Any, Final, Protocol

from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp_types import JSONRPCMessage
from pydantic import TypeAdapter, ValidationError

from mcpfleet.contract import RedisKeys

log = logging.getLogger("mcpfleet.notify")

#: Events kept per SSE stream; a client that resumes from an older one gets nothing.
EVENTS_PER_STREAM: Final = 1000
#: Seconds an event stays resumable (and a stream lives after its last event).
EVENT_TTL: Final = 600
#: Milliseconds a client waits before it reconnects a cut stream (the SSE ``retry`` field).
RETRY_MS: Final = 1000
#: Largest message stored (bytes of JSON); a larger one goes out live without an id.
MAX_STORED: Final = 256 * 1024
#: Longest ``Last-Event-ID`` looked at.
MAX_EVENT_ID: Final = 96
#: Seconds a write or a replay waits for Redis at most (under the Redis deadline): a
#: stream's first event waits for its priming event's write, so an outage costs each
#: new stream this much once per :data:`BACKOFF`, not the whole Redis deadline.
STORE_WAIT: Final = 0.25
#: Seconds after a failed write during which events are not stored (Redis is not
#: asked, and no message waits out the deadline again until then).
BACKOFF: Final = 1.0

_ID: Final = re.compile(r"([0-9a-f]{32})/([0-9]{1,20}-[0-9]{1,20})")
_MESSAGE: TypeAdapter[JSONRPCMessage] = TypeAdapter(JSONRPCMessage)

#: KEYS[1] the stream; ARGV: count, ttl (ms), the stream id, the message ("" primes).
_STORE: Final = """
local id = redis.call('XADD', KEYS[1], 'MAXLEN', ARGV[1], '*', 's', ARGV[3], 'm', ARGV[4])
local ms = tonumber(string.match(id, '^(%d+)'))
redis.call('XTRIM', KEYS[1], 'MINID', tostring(ms - tonumber(ARGV[2])))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return id
"""

#: KEYS[1] the stream; ARGV: the last entry id seen, ttl (ms). That entry and every
#: one after it, or false when it is gone (trimmed, expired) or was never there.
_REPLAY: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ms = tonumber(string.match(ARGV[1], '^(%d+)'))
if ms < now - tonumber(ARGV[2]) then return false end
local rows = redis.call('XRANGE', KEYS[1], ARGV[1], '+')
if #rows == 0 or rows[1][1] ~= ARGV[1] then return false end
return rows
"""


class StoreObserver(Protocol):
    """Who counts what the store loses (the replica's metrics)."""

    def dropped(self, reason: str) -> None: ...


def digest(stream_id: str) -> str:
    """The name of a transport's stream in Redis (its id is client-chosen in part)."""
    return hashlib.sha256(stream_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def parse_event_id(event_id: str) -> tuple[str, str] | None:
    """The stream digest and Redis entry id of one of our event ids, or None (pure)."""
    if not isinstance(event_id, str) or len(event_id) > MAX_EVENT_ID:
        return None
    found = _ID.fullmatch(event_id)
    return (found.group(1), found.group(2)) if found else None


def _never() -> bool:
    return False


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisEventStore(EventStore):
    """mcp's ``EventStore`` over the fleet's Redis (module docstring).

    Stores nothing until :meth:`attach` gives it a client (the replica's
    lifespan, once Redis answered); before that, events go out without ids.
    """

    def __init__(
        self,
        keys: RedisKeys,
        *,
        deadline: float,
        observer: StoreObserver,
        events: int = EVENTS_PER_STREAM,
        ttl: float = EVENT_TTL,
        backoff: float = BACKOFF,
    ) -> None:
        if events < 1 or ttl <= 0:
            raise ValueError("an event store keeps at least one event for a positive time")
        self.keys = keys
        self.deadline = min(deadline, STORE_WAIT)
        self.observer = observer
        self.events = events
        self.ttl_ms = int(ttl * 1000)
        self.backoff = backoff
        self._redis: Any = None
        #: Until when (monotonic) writes are not tried, after a failed one.
        self._quiet_until = 0.0
        self._full: Callable[[], bool] = _never

    def attach(self, client: Any, full: Callable[[], bool] | None = None) -> None:
        """Store through ``client`` (an asyncio Redis client) from now on; while
        ``full()`` says Redis is past the replica's memory limit, store nothing."""
        self._redis = client
        self._full = full or _never

    def detach(self) -> None:
        self._redis = None

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        """Store ``message`` (None: the stream's priming event); its id, or ``""`` if
        Redis did not take it within the deadline (counted; the event goes out live)."""
        client = self._redis
        if client is None:
            return ""
        if time.monotonic() < self._quiet_until or self._full():
            self.observer.dropped("store")
            return ""
        name = digest(stream_id)
        body = "" if message is None else message.model_dump_json(by_alias=True, exclude_unset=True)
        if len(body) > MAX_STORED:
            self.observer.dropped("store")
            return ""
        try:
            async with asyncio.timeout(self.deadline):
                entry = await client.eval(
                    _STORE, 1, self.keys.sse(name), self.events, self.ttl_ms, stream_id, body
                )
        except Exception as exc:  # any driver's error, or the deadline
            self._quiet_until = time.monotonic() + self.backoff
            self.observer.dropped("store")
            log.warning("sse: an event was not stored (%s); not resumable", type(exc).__name__)
            return ""
        return f"{name}/{_text(entry)}"

    async def replay_events_after(
        self, last_event_id: EventId, send_callback: EventCallback
    ) -> StreamId | None:
        """Send every event stored after ``last_event_id``, in order; the stream's id,
        or None when that id is not ours, is gone, or Redis did not answer."""
        parsed = parse_event_id(last_event_id)
        client = self._redis
        if parsed is None or client is None:
            return None
        name, entry = parsed
        try:
            async with asyncio.timeout(self.deadline):
                rows = await client.eval(_REPLAY, 1, self.keys.sse(name), entry, self.ttl_ms)
        except Exception as exc:  # any driver's error, or the deadline
            log.warning("sse: a stream could not be replayed (%s)", type(exc).__name__)
            return None
        if not rows:
            return None
        return await self._send(name, rows, send_callback)

    async def _send(
        self, name: str, rows: list[Any], send_callback: EventCallback
    ) -> StreamId | None:
        """Send the events of ``rows`` after the first (the client's last); the stream's id."""
        stream_id = ""
        for n, (row_id, fields) in enumerate(rows):
            values = {_text(k): _text(v) for k, v in zip(fields[::2], fields[1::2], strict=True)}
            stream_id = stream_id or values.get("s", "")
            body = values.get("m", "")
            if n == 0 or not body:
                continue  # the client's last event, or a priming event (an id, no message)
            try:
                message = _MESSAGE.validate_json(body)
            except ValidationError:
                log.warning("sse: a stored event is not a message; skipped")
                continue
            await send_callback(EventMessage(message, f"{name}/{_text(row_id)}"))
        return stream_id or None
