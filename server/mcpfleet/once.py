"""Exactly-once final rounds: the fleet-wide ledger of guard flows that ended.

On the modern era every round of a guard flow is an independent request, and
the sealed ``request_state`` that carries a flow's answers is a bearer token:
a client (or a proxy retrying for it) may send the final round again, to any
replica. Principal, TTL and request binding do not make a token single-use;
the spec leaves one-time actions to the server. ``ask_then(..., once=True)``
enforces them here:

* the flow's first round mints a flow id (128 random bits) into the sealed
  envelope, with the flow's **end** (the first round's time plus the sealing
  replica's token TTL): every later round names both, nobody can forge them,
  and no round of the flow is served after its end;
* when the flow ends, the replica **claims** the flow id in the fleet's ledger:
  one atomic ``SET key running NX GET PX lease`` in Redis, which either takes
  the claim or returns who holds it. The claim is a short **lease**
  (:data:`CLAIM_LEASE`): a claim that never leads to ``finish`` (Redis
  stalled and applied it late, the claimer died, the round failed) blocks
  resends for seconds, not for the token's lifetime;
* just before ``finish`` runs, the claimer **confirms** the claim: one script
  that checks the claim is still its own (its random token) and was confirmed
  within the call's deadline of the claim's reply (the lease's remaining time
  says so: no clocks compared), then marks it ``finishing`` and extends it to
  the flow's end plus a margin. The claim then outlives every token of the
  flow, whatever TTL each replica was started with. A confirmation that came
  too late deletes the claim instead;
* the claimer runs ``finish``, answers, and stores the result with the claim
  (bounded in size, retried until stored; off the answer's path);
* a replay of the final round, on any replica, returns that stored result,
  marked in its ``_meta`` (:data:`ONCE_META_KEY`), without running
  ``finish``; a replay racing the claimer waits (bounded) for the result;
* a replay that finds ``finishing`` left by a claimer that is no longer in
  the registry (it died between starting ``finish`` and storing the result)
  gets :class:`FlowOutcomeUnknown`: a distinct, non-retryable JSON-RPC error
  (:data:`OUTCOME_UNKNOWN_CODE`). The fleet cannot know whether the side
  effect happened; it never runs it a second time;
* a ledger that cannot be asked (Redis down, stalled past the deadline, or a
  Sentinel failover longer than its wait) fails the round closed with a
  retryable JSON-RPC error (:class:`FlowUnavailable`): ``finish`` never runs
  unclaimed. A claim that may have landed anyway is released in the
  background once Redis answers again. The claim and its confirmation ride
  through a Sentinel failover; a claim the failover lost (written to the old
  master, never replicated) is found gone at the confirmation and claimed
  again while the round's wait lasts;
* a Redis near its ``maxmemory`` (the share :data:`DEFAULT_MEMORY_LIMIT`)
  refuses new once-flows with the retryable "ledger is full" error rather
  than filling the memory heartbeats and routes need.

Semantics are at most once. Standalone (no Redis), :class:`MemoryLedger` does
the same job for one process. The ledger holds no keys or credentials: a claim
is a state, a replica name and the tool's result.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Final, Literal, Protocol

from fastmcp import FastMCP
from fastmcp.exceptions import ToolError
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from fastmcp.tools.base import ToolResult
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolRequestParams, ContentBlock, TextContent
from pydantic import TypeAdapter

from mcpfleet import redisconn
from mcpfleet.contract import LABEL_PREFIX, Attestation, RedisKeys

__all__ = [
    "CLAIM_LEASE",
    "DEFAULT_MEMORY_LIMIT",
    "DEFAULT_RESULT_LIMIT",
    "ONCE_META_KEY",
    "OUTCOME_UNKNOWN_CODE",
    "FlowOutcomeUnknown",
    "FlowUnavailable",
    "Ledger",
    "LedgerFull",
    "LedgerUnavailable",
    "MemoryLedger",
    "OnceMiddleware",
    "OnceOutcome",
    "Record",
    "RedisLedger",
    "claim_lifetime",
    "flow_end",
    "install_ledger",
    "ledger_for",
    "new_flow_id",
    "run_once",
    "settle",
    "valid_flow_id",
]

log = logging.getLogger("mcpfleet.once")

#: The ``_meta`` key of a result returned from the ledger instead of by ``finish``.
ONCE_META_KEY: Final = f"{LABEL_PREFIX}/once"
#: Stored results larger than this (bytes of JSON) are not kept; a replay says so.
DEFAULT_RESULT_LIMIT: Final = 64 * 1024
#: How long a replay waits for a racing claimer's result before the retryable error.
DEFAULT_WAIT: Final = 5.0
#: Added to the flow's end for the claim's lifetime: replicas' clocks differ a little.
CLOCK_MARGIN: Final = 60.0
#: Seconds a claim lives before it is confirmed: what a claim that never led to
#: ``finish`` costs its resends at most.
CLAIM_LEASE: Final = 5.0
#: New once-flows are refused while Redis uses more than this share of its maxmemory.
DEFAULT_MEMORY_LIMIT: Final = 0.8
#: How often (seconds) a replica asks Redis how full it is (in the background).
MEMORY_CHECK_INTERVAL: Final = 1.0
#: The JSON-RPC error code of :class:`FlowUnavailable` (implementation-defined range).
RETRY_CODE: Final = -32000
#: The JSON-RPC error code of :class:`FlowOutcomeUnknown`: not retryable.
OUTCOME_UNKNOWN_CODE: Final = -32001

_FLOW_BYTES = 16
_FLOW_ID = re.compile(r"^[A-Za-z0-9_-]{22}$")
_CONTENT = TypeAdapter(list[ContentBlock])


def new_flow_id() -> str:
    """A fresh flow id: 128 random bits, URL-safe base64 (22 characters)."""
    return secrets.token_urlsafe(_FLOW_BYTES)


def valid_flow_id(value: object) -> bool:
    return isinstance(value, str) and _FLOW_ID.match(value) is not None


def claim_lifetime(token_ttl: float, end: float | None, now: float) -> float:
    """How long a confirmed claim must live (pure): past every token of the flow.

    ``end`` is the flow's end as its first round sealed it (wall clock, from
    whichever replica sealed it, with its own TTL); a round after the end is
    refused, so no token of the flow reaches the claim later. A flow sealed
    without an end (an older replica) is covered by this replica's TTL. The
    margin absorbs clock differences between replicas.
    """
    left = token_ttl if end is None else max(token_ttl, end - now)
    return left + CLOCK_MARGIN


class OnceOutcome(StrEnum):
    """What the ledger said about one final round; the values label ``mcpfleet_once_total``."""

    #: This round took the claim and ran ``finish``.
    CLAIMED = "claimed"
    #: A replay: the stored result was returned, ``finish`` did not run.
    REPLAYED = "replayed"
    #: The ledger could not be asked: the retryable error, nothing ran.
    UNAVAILABLE = "unavailable"
    #: Redis is near its maxmemory: the retryable error, nothing ran.
    FULL = "full"
    #: A replay racing the claimer gave up waiting for its result: the retryable error.
    PENDING = "pending"
    #: A replay of a flow whose result was too large to keep, or that failed.
    UNKEPT = "unkept"
    #: A replay of a flow whose claimer died after starting ``finish``: outcome unknown.
    UNKNOWN = "unknown"


RecordState = Literal["running", "done", "failed", "unkept"]


@dataclass(frozen=True)
class Record:
    """One flow's entry in the ledger (JSON in Redis): a state, a replica, the tool's result.

    Never a key or a credential, nor the user's answers; the result is what the
    tool answered (the app's own data), kept until the claim expires.
    """

    state: RecordState
    replica: str = ""
    #: ``done``: the tool result (content, structured content, meta, is_error).
    result: dict[str, Any] | None = None
    #: ``failed``: the error ``finish`` raised; ``unkept``: why the result was not kept.
    message: str = ""
    #: ``running``: a random token of the claiming round. A claim whose reply was
    #: lost and which was sent again finds its own record: the token says so.
    claim: str = ""
    #: ``running``: the claimer's incarnation (its attestation's start time), so a
    #: replay can tell a claimer that died and came back from one still running.
    boot: str = ""
    #: ``running``: the claim was confirmed and ``finish`` may have started.
    finishing: bool = False

    def to_json(self) -> str:
        data: dict[str, Any] = {"s": self.state, "r": self.replica}
        if self.result is not None:
            data["result"] = self.result
        if self.message:
            data["m"] = self.message
        if self.claim:
            data["c"] = self.claim
        if self.boot:
            data["b"] = self.boot
        if self.finishing:
            data["f"] = 1
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> Record:
        try:
            data = json.loads(raw)
            state = data["s"]
            if state not in ("running", "done", "failed", "unkept"):
                raise ValueError(state)
            result = data.get("result")
            if result is not None and not isinstance(result, dict):
                raise ValueError("result")
            return cls(
                state,
                str(data.get("r", "")),
                result,
                str(data.get("m", "")),
                str(data.get("c", "")),
                str(data.get("b", "")),
                bool(data.get("f", False)),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise LedgerUnavailable(f"unreadable ledger record: {exc}") from None


class LedgerUnavailable(Exception):
    """The ledger could not be asked or written (Redis down, stalled, refused)."""


class LedgerFull(LedgerUnavailable):
    """Redis is near its maxmemory: new once-flows are refused until results expire."""


class Confirmed(StrEnum):
    """What confirming a claim said."""

    #: Still this round's, in time: it is now ``finishing``; ``finish`` may run.
    YES = "yes"
    #: No longer this round's (expired, taken over): nothing runs here.
    LOST = "lost"
    #: This round's, but confirmed later than its deadline: deleted, nothing runs.
    LATE = "late"
    #: Not there at all (its lease ran out, or a failover lost an unreplicated write):
    #: nobody holds the flow, so the round may claim it again.
    GONE = "gone"


class Ledger(Protocol):
    """Where claims and results live: Redis for a fleet, memory for one process."""

    async def claim(self, flow: str, record: Record, lease: float) -> Record | None:
        """Take the claim for ``lease`` seconds (return None) or return the record there."""
        ...

    async def confirm(self, flow: str, mine: Record, lifetime: float, replied: float) -> Confirmed:
        """Mark ``mine`` finishing and make it live ``lifetime`` seconds, if it is still mine
        and this is in time (``replied``: when the claim's reply came, time.monotonic);
        :attr:`Confirmed.GONE` when nothing holds the flow any more."""
        ...

    async def store(self, flow: str, record: Record, lifetime: float) -> None:
        """Replace the claimer's record with the final one (only the claimer calls this)."""
        ...

    async def release(self, flow: str, mine: Record) -> bool:
        """Delete the claim if it is still exactly ``mine``, as claimed or as confirmed (only a
        round that did not run ``finish`` releases); True if deleted."""
        ...

    async def get(self, flow: str) -> Record | None: ...

    async def alive(self, replica: str, boot: str) -> bool:
        """Whether the claimer ``replica`` (incarnation ``boot``) is still in the fleet."""
        ...


class MemoryLedger:
    """A process's own ledger (standalone replicas, in-memory clients, tests).

    Bounded: expired entries are pruned on every claim, and at ``capacity`` live
    entries a new claim is refused (:class:`LedgerFull`) rather than an old one
    evicted, which would let its flow run again. Its claimer is this process,
    alive by definition.
    """

    def __init__(
        self, capacity: int = 100_000, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.capacity = capacity
        self._clock = clock
        self._entries: dict[str, tuple[float, Record]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def _live(self, flow: str) -> Record | None:
        entry = self._entries.get(flow)
        if entry is None:
            return None
        expires, record = entry
        if expires <= self._clock():
            del self._entries[flow]
            return None
        return record

    async def claim(self, flow: str, record: Record, lease: float) -> Record | None:
        held = self._live(flow)
        if held is not None:
            return held
        if len(self._entries) >= self.capacity:
            now = self._clock()
            for key in [k for k, (exp, _) in self._entries.items() if exp <= now]:
                del self._entries[key]
            if len(self._entries) >= self.capacity:
                raise LedgerFull(f"the in-process ledger is full ({self.capacity} flows)")
        self._entries[flow] = (self._clock() + lease, record)
        return None

    async def confirm(self, flow: str, mine: Record, lifetime: float, replied: float) -> Confirmed:
        held, confirmed = self._live(flow), replace(mine, finishing=True)
        if held is None:
            return Confirmed.GONE
        if held not in (mine, confirmed):
            return Confirmed.LOST
        self._entries[flow] = (self._clock() + lifetime, confirmed)
        return Confirmed.YES

    async def store(self, flow: str, record: Record, lifetime: float) -> None:
        if self._live(flow) is not None:
            self._entries[flow] = (self._clock() + lifetime, record)

    async def release(self, flow: str, mine: Record) -> bool:
        if self._live(flow) in (mine, replace(mine, finishing=True)):
            del self._entries[flow]
            return True
        return False

    async def get(self, flow: str) -> Record | None:
        return self._live(flow)

    async def alive(self, replica: str, boot: str) -> bool:
        return True


#: KEYS[1] the flow; ARGV: the claim as written, the confirmed record, its lifetime
#: (ms), the least lease (ms) an in-time confirmation still finds. 1 confirmed (also
#: when an earlier try of this confirmation landed and its reply was lost), 0 not
#: ours, -1 ours but late (deleted), -2 not there.
_CONFIRM = """
local held = redis.call('GET', KEYS[1])
if not held then return -2 end
if held == ARGV[2] then return 1 end
if held ~= ARGV[1] then return 0 end
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[4]) then
  redis.call('DEL', KEYS[1])
  return -1
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
"""
#: KEYS[1] the flow; ARGV the claim as written and as confirmed: deleted if still
#: exactly either (only a round that did not run ``finish`` releases).
_RELEASE = """
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] or held == ARGV[2] then return redis.call('DEL', KEYS[1]) end
return 0
"""

_CONFIRMED: Final = {1: Confirmed.YES, -1: Confirmed.LATE, -2: Confirmed.GONE}


class RedisLedger:
    """The fleet's ledger in its Redis, under :meth:`RedisKeys.once`.

    Every call has a deadline (``deadline``, seconds); the claim and its
    confirmation ride through a Sentinel failover for up to ``failover_wait`` seconds
    (:func:`mcpfleet.redisconn.ride_through`). Commands: SET (NX GET PX / XX
    PX), GET, EVAL (confirm, release), and INFO (memory, in the background).
    """

    def __init__(
        self,
        client: Any,
        keys: RedisKeys,
        *,
        deadline: float = redisconn.DEFAULT_DEADLINE,
        failover_wait: float = redisconn.DEFAULT_FAILOVER_WAIT,
        memory_limit: float = DEFAULT_MEMORY_LIMIT,
    ) -> None:
        self.client = client
        self.keys = keys
        self.deadline = deadline
        self.failover_wait = failover_wait
        self.memory_limit = memory_limit
        #: Redis's used_memory / maxmemory at the last check (0 when unbounded).
        self.memory_share = 0.0
        self._memory_checked = 0.0
        self._memory_task: asyncio.Task[None] | None = None

    @property
    def full(self) -> bool:
        return 0 < self.memory_limit <= self.memory_share

    async def _call(self, step: Callable[[], Awaitable[Any]], *, ride: bool = False) -> Any:
        try:
            if ride:
                return await redisconn.ride_through(
                    self.client, step, deadline=self.deadline, failover_wait=self.failover_wait
                )
            return await redisconn.within(self.deadline, step())
        except Exception as exc:  # any failure to ask means: not done
            if "OOM" in str(exc):
                raise LedgerFull(f"Redis is out of memory: {exc}") from None
            what = str(exc) or f"no answer within {self.deadline:g}s"
            raise LedgerUnavailable(f"Redis: {type(exc).__name__}: {what}") from None

    def _check_memory(self, *, always: bool = False) -> None:
        """Ask Redis how full it is, now and then, off the request's path (with no limit,
        only when ``always``: the watcher reports the share whatever the limit)."""
        now = time.monotonic()
        if self.memory_limit <= 0 and not always:
            return
        if now - self._memory_checked < MEMORY_CHECK_INTERVAL:
            return
        if self._memory_task is not None and not self._memory_task.done():
            return
        self._memory_checked = now

        async def check() -> None:
            try:
                info = await redisconn.within(self.deadline, self.client.info("memory"))
            except Exception as exc:
                log.debug("once: Redis memory not checked: %s", exc)
                return
            used, limit = int(info.get("used_memory", 0)), int(info.get("maxmemory", 0))
            was_full = self.full
            self.memory_share = used / limit if limit else 0.0
            if self.full and not was_full:
                log.error(
                    "once: Redis uses %.0f%% of its maxmemory (limit %.0f%%): new once-flows "
                    "are refused until results expire",
                    100 * self.memory_share,
                    100 * self.memory_limit,
                )
            elif was_full and not self.full:
                log.warning("once: Redis memory below the limit again: once-flows accepted")

        self._memory_task = asyncio.ensure_future(check())

    async def watch_memory(
        self, observe: Callable[[float], None], interval: float = MEMORY_CHECK_INTERVAL
    ) -> None:
        """Read Redis's memory every ``interval`` seconds until cancelled; report the share."""
        while True:
            self._memory_checked = 0.0
            self._check_memory(always=True)
            if self._memory_task is not None:
                await asyncio.gather(self._memory_task, return_exceptions=True)
            observe(self.memory_share)
            await asyncio.sleep(interval)

    async def claim(self, flow: str, record: Record, lease: float) -> Record | None:
        self._check_memory()
        if self.full:
            raise LedgerFull(
                f"Redis uses {100 * self.memory_share:.0f}% of its maxmemory "
                f"(once-flows stop at {100 * self.memory_limit:.0f}%)"
            )
        key, value = self.keys.once(flow), record.to_json()
        held = await self._call(
            lambda: self.client.set(key, value, nx=True, get=True, px=_ms(lease)), ride=True
        )
        return None if held is None else Record.from_json(held)

    async def confirm(self, flow: str, mine: Record, lifetime: float, replied: float) -> Confirmed:
        # Confirmed in time means: applied before this try's deadline. Applied later,
        # the lease left is below what it was at the claim's reply minus the time
        # since plus the deadline: Redis's own TTL is the clock, none is compared.
        # Each try (riding through a failover) is checked against its own send.
        key = self.keys.once(flow)
        claimed, confirmed = mine.to_json(), replace(mine, finishing=True).to_json()

        async def step() -> Any:
            least = CLAIM_LEASE - (time.monotonic() - replied) - self.deadline
            if least <= 0:
                return -1  # too late to send: nothing sent, the caller releases
            args = (claimed, confirmed, _ms(lifetime), _ms(least))
            return await self.client.eval(_CONFIRM, 1, key, *args)

        said = await self._call(step, ride=True)
        return _CONFIRMED.get(int(said), Confirmed.LOST)

    async def store(self, flow: str, record: Record, lifetime: float) -> None:
        key, value = self.keys.once(flow), record.to_json()
        await self._call(lambda: self.client.set(key, value, xx=True, px=_ms(lifetime)))

    async def release(self, flow: str, mine: Record) -> bool:
        key, value = self.keys.once(flow), mine.to_json()
        confirmed = replace(mine, finishing=True).to_json()
        return bool(await self._call(lambda: self.client.eval(_RELEASE, 1, key, value, confirmed)))

    async def get(self, flow: str) -> Record | None:
        key = self.keys.once(flow)
        raw = await self._call(lambda: self.client.get(key))
        return None if raw is None else Record.from_json(raw)

    async def alive(self, replica: str, boot: str) -> bool:
        key = self.keys.replica(replica)
        raw = await self._call(lambda: self.client.get(key))
        if raw is None:
            return False
        try:
            return _boot(Attestation.from_json(raw).started) == boot or not boot
        except ValueError:
            return True  # unreadable: not proof of death


def _boot(started: float) -> str:
    return f"{started:.6f}"


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


class FlowUnavailable(ToolError):
    """The final round of a once-flow cannot be served now; the client may send it again.

    Raised before ``finish`` runs (nothing happened). :class:`OnceMiddleware`
    (installed by ``mcpfleet serve``) turns it into a JSON-RPC error with code
    :data:`RETRY_CODE` and ``data = {"retryable": true, "retryAfterSeconds": 1,
    "reason": ...}`` (``unavailable``, ``full`` or ``pending``); without it,
    FastMCP answers it as a tool error with the same message.
    """

    def __init__(self, message: str, reason: OnceOutcome) -> None:
        super().__init__(message)
        self.reason = reason


class FlowOutcomeUnknown(ToolError):
    """The flow's ``finish`` started on a replica that died before storing its result.

    The fleet cannot know whether the side effect happened, and never runs it
    again: answered as a JSON-RPC error with code :data:`OUTCOME_UNKNOWN_CODE`
    and ``data = {"retryable": false, "reason": "unknown"}``; the user checks
    (their order history, say) before starting a new flow.
    """


class OnceMiddleware(Middleware):
    """Answers :class:`FlowUnavailable` and :class:`FlowOutcomeUnknown` as JSON-RPC errors."""

    async def on_call_tool(
        self,
        context: MiddlewareContext[CallToolRequestParams],
        call_next: CallNext[CallToolRequestParams, ToolResult],
    ) -> ToolResult:
        try:
            return await call_next(context)
        except FlowUnavailable as exc:
            data = {"retryable": True, "retryAfterSeconds": 1, "reason": exc.reason.value}
            raise MCPError(RETRY_CODE, str(exc), data) from None
        except FlowOutcomeUnknown as exc:
            data = {"retryable": False, "reason": OnceOutcome.UNKNOWN.value}
            raise MCPError(OUTCOME_UNKNOWN_CODE, str(exc), data) from None


@dataclass
class _Binding:
    ledger: Ledger
    #: The token TTL of this replica (seconds): a flow started here ends this long after.
    token_ttl: float
    replica: str
    observe: Callable[[OnceOutcome], None] | None
    result_limit: int
    wait: float
    boot: str = ""
    #: Claims to take back (by claim token), and the one task that does it for all.
    releases: dict[str, _Release] = field(default_factory=dict)
    releaser: asyncio.Task[None] | None = None


@dataclass
class _Release:
    flow: str
    mine: Record
    give_up: float
    #: Since when Redis has answered without the claim being there.
    answered_since: float | None = None


_ATTR = "_mcpfleet_once_ledger"
#: The ledger of apps no replica runtime configured: one per process.
_PROCESS_LEDGER = MemoryLedger()
#: The token TTL where no replica runtime told it.
_DEFAULT_TTL = 600.0


def install_ledger(
    app: FastMCP[Any],
    ledger: Ledger,
    *,
    token_ttl: float,
    replica: str = "",
    observe: Callable[[OnceOutcome], None] | None = None,
    result_limit: int = DEFAULT_RESULT_LIMIT,
    wait: float = DEFAULT_WAIT,
    boot: str | float = "",
) -> None:
    """Make ``app``'s once-flows use ``ledger``; flows started here end ``token_ttl`` later.

    ``boot`` is this replica's incarnation (its attestation's ``started``): a
    replay elsewhere tells from it that this process died mid-``finish``.
    """
    if token_ttl <= 0:
        raise ValueError(f"token_ttl must be positive, got {token_ttl}")
    incarnation = _boot(boot) if isinstance(boot, float) else boot
    binding = _Binding(ledger, token_ttl, replica, observe, result_limit, wait, incarnation)
    setattr(app, _ATTR, binding)
    if not any(isinstance(mw, OnceMiddleware) for mw in app.middleware):
        app.add_middleware(OnceMiddleware())


def ledger_for(app: FastMCP[Any]) -> Ledger:
    """The ledger ``app``'s once-flows use (the process's own unless one was installed)."""
    return _binding(app).ledger


def flow_end(app: FastMCP[Any], now: float | None = None) -> float:
    """The end (wall clock) of a once-flow whose first round ``app`` serves now."""
    return (time.time() if now is None else now) + _binding(app).token_ttl


def _binding(app: FastMCP[Any]) -> _Binding:
    binding = getattr(app, _ATTR, None)
    if isinstance(binding, _Binding):
        return binding
    return _Binding(_PROCESS_LEDGER, _DEFAULT_TTL, "", None, DEFAULT_RESULT_LIMIT, DEFAULT_WAIT)


def _dump(result: ToolResult) -> dict[str, Any]:
    return {
        "content": [block.model_dump(mode="json", by_alias=True) for block in result.content],
        "structured_content": result.structured_content,
        "meta": result.meta,
        "is_error": result.is_error,
    }


def _restored(stored: dict[str, Any]) -> ToolResult:
    return ToolResult(
        content=_CONTENT.validate_python(stored.get("content") or []),
        structured_content=stored.get("structured_content"),
        meta=stored.get("meta"),
        is_error=bool(stored.get("is_error")),
    )


def _marked(result: ToolResult) -> ToolResult:
    """``result`` as a replay: the stored answer, said so in its ``_meta``."""
    meta = dict(result.meta or {})
    meta[ONCE_META_KEY] = {"replayed": True}
    return ToolResult(
        content=result.content,
        structured_content=result.structured_content,
        meta=meta,
        is_error=result.is_error,
    )


def _error_result(message: str) -> ToolResult:
    return ToolResult(
        content=[TextContent(type="text", text=message)],
        meta={ONCE_META_KEY: {"replayed": True}},
        is_error=True,
    )


def _storable(value: Any) -> dict[str, Any] | None:
    """What the ledger keeps of ``finish``'s value without converting it, if it can.

    JSON data (a ``str`` above all) is kept as is: a replay converts it with the
    tool, exactly as FastMCP converted the original, so the final round pays
    no conversion of its own. A ``ToolResult`` is kept as its wire fields.
    """
    if isinstance(value, ToolResult):
        return {"tool_result": _dump(value)}
    if isinstance(value, str | int | float | bool) or value is None:
        return {"raw": value}
    if isinstance(value, list | dict):
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            return None
        return {"raw": value}
    return None


_UNAVAILABLE = (
    "This action cannot be confirmed right now (the fleet's ledger is unavailable); "
    "nothing was done. Send the same request again."
)
_FULL = (
    "This action cannot be confirmed right now (the fleet's ledger is full); "
    "nothing was done. Send the same request again later."
)
_PENDING = (
    "This action is being completed by another request; send the same request again "
    "to get its result."
)
_UNKNOWN = (
    "The outcome of this action is unknown: the server completing it stopped before it "
    "could record the result. It will not be run again; check whether it took effect "
    "before starting it anew."
)


async def run_once(
    app: FastMCP[Any],
    flow: str,
    finish: Callable[[], Awaitable[Any]],
    convert: Callable[[Any], Awaitable[ToolResult]],
    *,
    end: float | None = None,
) -> Any:
    """Run ``finish`` once for ``flow`` across every replica that shares the app's ledger.

    Returns ``finish``'s value (this round claimed the flow), or the stored
    result of an earlier final round as a ``ToolResult`` marked as replayed.
    ``convert`` turns a value into the tool's ``ToolResult`` (as FastMCP does
    with what a tool returns); it runs for replays, and for values that are
    neither JSON nor a ``ToolResult``. ``end`` is the flow's end as sealed in
    its envelope (wall clock): the claim outlives it. Raises
    :class:`FlowUnavailable` when it can do neither now, and
    :class:`FlowOutcomeUnknown` when an earlier round's ``finish`` started on a
    replica that died before storing its result.
    """
    b = _binding(app)

    def seen(outcome: OnceOutcome) -> None:
        if b.observe is not None:
            b.observe(outcome)

    deadline = time.monotonic() + b.wait
    while True:
        mine = Record("running", b.replica, claim=secrets.token_urlsafe(12), boot=b.boot)
        try:
            held = await b.ledger.claim(flow, mine, CLAIM_LEASE)
        except LedgerFull as exc:
            log.warning("once: flow not claimed, the ledger is full: %s", exc)
            seen(OnceOutcome.FULL)
            raise FlowUnavailable(_FULL, OnceOutcome.FULL) from None
        except LedgerUnavailable as exc:
            log.warning("once: flow not claimed, the ledger is unavailable: %s", exc)
            # The claim may land once Redis answers again: take it back then.
            _release_later(b, flow, mine)
            seen(OnceOutcome.UNAVAILABLE)
            raise FlowUnavailable(_UNAVAILABLE, OnceOutcome.UNAVAILABLE) from None
        if held is None or held.claim == mine.claim:
            replied = time.monotonic()
            lifetime = claim_lifetime(b.token_ttl, end, time.time())
            try:
                said = await b.ledger.confirm(flow, mine, lifetime, replied)
            except LedgerUnavailable as exc:
                log.warning("once: claim not confirmed, the ledger is unavailable: %s", exc)
                _release_later(b, flow, mine)
                seen(OnceOutcome.UNAVAILABLE)
                raise FlowUnavailable(_UNAVAILABLE, OnceOutcome.UNAVAILABLE) from None
            if said is Confirmed.YES:
                break
            if said is Confirmed.LOST:
                log.warning("once: claim not confirmed (another round holds it): nothing run")
                seen(OnceOutcome.PENDING)
                raise FlowUnavailable(_PENDING, OnceOutcome.PENDING)
            # Late, or gone (a failover lost the claim): nothing ran. A late claim is
            # taken back; the flow is claimed afresh while the round's wait lasts.
            if said is Confirmed.LATE:
                _release_later(b, flow, mine)
            if time.monotonic() >= deadline:
                log.warning("once: claim not confirmed (%s): nothing run", said.value)
                seen(OnceOutcome.UNAVAILABLE)
                raise FlowUnavailable(_UNAVAILABLE, OnceOutcome.UNAVAILABLE)
            log.info("once: claim %s before its confirmation: claiming again", said.value)
            continue
        # Another round holds the flow: its result, or a wait for it, or a free claim.
        record = await _await_other(b, flow, held, deadline)
        if record is not None:
            return await _answer_replay(b, record, seen, convert)
        # The other claim expired or was released: claim again (bounded by the wait).

    seen(OnceOutcome.CLAIMED)
    try:
        value = await finish()
    except Exception as exc:
        message = str(exc) if isinstance(exc, ToolError) else f"{type(exc).__name__}"
        _keep(b, flow, Record("failed", b.replica, message=message), lifetime)
        raise
    stored = _storable(value)
    if stored is None:
        value = await convert(value)
        stored = {"tool_result": _dump(value)}
    size = len(json.dumps(stored, separators=(",", ":")))
    if size > b.result_limit:
        reason = f"the result ({size} bytes) was larger than the ledger keeps ({b.result_limit})"
        _keep(b, flow, Record("unkept", b.replica, message=reason), lifetime)
    elif getattr(b.ledger, "full", False):
        reason = "the fleet's ledger was full"
        _keep(b, flow, Record("unkept", b.replica, message=reason), lifetime)
    else:
        _keep(b, flow, Record("done", b.replica, result=stored), lifetime)
    return value


#: Background ledger writes under way: held so that none is collected before it ran.
_STORING: set[asyncio.Task[None]] = set()


def _background(coro: Awaitable[None]) -> asyncio.Task[None]:
    task = asyncio.ensure_future(coro)
    _STORING.add(task)
    task.add_done_callback(_STORING.discard)
    return task


def _keep(b: _Binding, flow: str, record: Record, lifetime: float) -> None:
    """Store the flow's end off the answer's path, retried until stored (or the claim is gone).

    A replay arriving before the store landed finds the claim ``finishing`` and
    waits for it (bounded), so it still gets the stored result; while Redis is
    down, the store is retried, so the result lands when it returns.
    """

    async def store() -> None:
        give_up = time.monotonic() + lifetime
        pause = 0.1
        while True:
            try:
                await b.ledger.store(flow, record, lifetime)
                return
            except LedgerUnavailable as exc:
                if time.monotonic() + pause >= give_up:
                    log.error("once: result of a finished flow never stored: %s", exc)
                    return
                log.warning("once: result of a finished flow not stored yet: %s", exc)
            await asyncio.sleep(pause)
            pause = min(pause * 2, 2.0)

    _background(store())


#: How long a release keeps trying to take back a claim that may land late.
RELEASE_FOR: Final = 120.0


def _release_later(b: _Binding, flow: str, mine: Record) -> None:
    """Take back, in the background, a claim this round may have made without knowing.

    A command sent to a stalled Redis runs when it resumes: the claim lands
    after its round already answered "unavailable". One task per ledger binding
    releases every such claim, one command at a time: an outage that failed a
    thousand rounds leaves a thousand claims to release, never a thousand tasks
    polling Redis (and taking the pool's connections from the request path) the
    moment it answers again.
    """
    b.releases[mine.claim] = _Release(flow, mine, time.monotonic() + RELEASE_FOR)
    if b.releaser is None or b.releaser.done():
        b.releaser = _background(_releaser(b))


async def _releaser(b: _Binding) -> None:
    """Release each pending claim until it is deleted, or Redis has answered for a second
    without it being there (a late command runs as Redis resumes), or
    :data:`RELEASE_FOR` passed; the lease bounds the rest. Redis not answering
    pauses the round (every pending claim waits for the next)."""
    while b.releases:
        for token, item in list(b.releases.items()):
            now = time.monotonic()
            if now >= item.give_up:
                del b.releases[token]
                continue
            try:
                if await b.ledger.release(item.flow, item.mine):
                    log.info("once: a claim that did not lead to finish was released")
                    del b.releases[token]
                    continue
            except LedgerUnavailable:
                for pending in b.releases.values():
                    pending.answered_since = None
                break
            now = time.monotonic()
            item.answered_since = item.answered_since or now
            if now - item.answered_since >= 1.0:
                del b.releases[token]
        await asyncio.sleep(0.25)


async def settle() -> None:
    """Wait until every result this process is storing has been stored (or failed to)."""
    while _STORING:
        await asyncio.gather(*list(_STORING), return_exceptions=True)


async def _await_other(b: _Binding, flow: str, held: Record, deadline: float) -> Record | None:
    """Wait (until ``deadline``) for another round's claim to end; its final record, or None
    if it went away (expired or released: the flow may be claimed again).

    Raises :class:`FlowOutcomeUnknown` when that round's claimer died after
    starting ``finish``, :class:`FlowUnavailable` (pending) past the deadline.
    """
    record: Record | None = held
    delay = 0.02
    checked = 0.0
    while record is not None and record.state == "running":
        now = time.monotonic()
        if record.finishing and now - checked >= 0.5:
            checked = now
            with contextlib.suppress(LedgerUnavailable):
                if not await b.ledger.alive(record.replica, record.boot):
                    # Its claimer died after it may have started finish. Read once more:
                    # the result may have landed just before it died.
                    with contextlib.suppress(LedgerUnavailable):
                        record = await b.ledger.get(flow)
                    if record is not None and record.state == "running":
                        _seen(b, OnceOutcome.UNKNOWN)
                        raise FlowOutcomeUnknown(_UNKNOWN)
                    break
        if now >= deadline:
            _seen(b, OnceOutcome.PENDING)
            raise FlowUnavailable(_PENDING, OnceOutcome.PENDING)
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.2)
        with contextlib.suppress(LedgerUnavailable):
            record = await b.ledger.get(flow)
    return record


def _seen(b: _Binding, outcome: OnceOutcome) -> None:
    if b.observe is not None:
        b.observe(outcome)


async def _answer_replay(
    b: _Binding,
    record: Record,
    seen: Callable[[OnceOutcome], None],
    convert: Callable[[Any], Awaitable[ToolResult]],
) -> ToolResult:
    if record.state == "done" and record.result is not None:
        seen(OnceOutcome.REPLAYED)
        kept = record.result
        if "raw" in kept:
            return _marked(await convert(kept["raw"]))
        return _marked(_restored(kept.get("tool_result") or {}))
    seen(OnceOutcome.UNKEPT)
    if record.state == "failed":
        return _error_result(f"This action already ran once and failed: {record.message}")
    return _error_result(
        f"This action already ran once; its result cannot be shown again: {record.message}."
    )
