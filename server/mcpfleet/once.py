"""Exactly-once final rounds: the fleet-wide ledger of guard flows that ended.

On the modern era every round of a guard flow is an independent request, and
the sealed ``request_state`` that carries a flow's answers is a bearer token:
a client (or a proxy retrying for it) may send the final round again, to any
replica. Principal, TTL and request binding do not make a token single-use;
the spec leaves one-time actions to the server. ``ask_then(..., once=True)``
enforces them here:

* the flow's first round mints a flow id (128 random bits) into the sealed
  envelope, so every later round of the flow names it and nobody can forge one;
* when the flow ends, the replica **claims** the flow id in the fleet's ledger
  before ``finish`` runs: one atomic ``SET key running NX GET PX ttl`` in Redis,
  which either takes the claim or returns who holds it, in one round trip;
* the claimer runs ``finish``, answers, and stores the result with the claim
  (bounded in size; the store is off the answer's path, so a final round costs
  one Redis round trip; a JSON value such as a ``str`` is kept as it is and
  converted by the tool only for a replay, so the original pays no conversion);
* a replay of the final round, on any replica, returns that stored
  result, marked in its ``_meta`` (:data:`ONCE_META_KEY`), without running
  ``finish``; a replay racing the claimer waits (bounded) for the result, or
  gets a retryable error;
* a ledger that cannot be asked (Redis down) fails the round closed with a
  retryable JSON-RPC error (:class:`FlowUnavailable`): ``finish`` never runs
  unclaimed.

The claim lives at least as long as any token of the flow can (the replicas'
token TTL, plus a margin for clocks), so no token can outlive its claim and run
``finish`` a second time. Semantics are at most once: a replica that dies
between claiming and storing leaves the flow ``running`` until the claim
expires, and its replays get the retryable error; the user starts a new flow.

Standalone (no Redis), :class:`MemoryLedger` does the same job for one process.
The ledger holds no keys or credentials: a claim is a state, a replica name and
the tool's result.
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
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final, Literal, Protocol

from fastmcp import FastMCP
from fastmcp.exceptions import ToolError
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from fastmcp.tools.base import ToolResult
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolRequestParams, ContentBlock, TextContent
from pydantic import TypeAdapter

from mcpfleet.contract import LABEL_PREFIX, RedisKeys

__all__ = [
    "DEFAULT_RESULT_LIMIT",
    "ONCE_META_KEY",
    "FlowUnavailable",
    "Ledger",
    "LedgerUnavailable",
    "MemoryLedger",
    "OnceMiddleware",
    "OnceOutcome",
    "Record",
    "RedisLedger",
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
#: Added to the token TTL for the claim's lifetime: replicas' clocks differ a little.
CLOCK_MARGIN: Final = 60.0
#: The JSON-RPC error code of :class:`FlowUnavailable` (implementation-defined range).
RETRY_CODE: Final = -32000

_FLOW_BYTES = 16
_FLOW_ID = re.compile(r"^[A-Za-z0-9_-]{22}$")
_CONTENT = TypeAdapter(list[ContentBlock])


def new_flow_id() -> str:
    """A fresh flow id: 128 random bits, URL-safe base64 (22 characters)."""
    return secrets.token_urlsafe(_FLOW_BYTES)


def valid_flow_id(value: object) -> bool:
    return isinstance(value, str) and _FLOW_ID.match(value) is not None


class OnceOutcome(StrEnum):
    """What the ledger said about one final round; the values label ``mcpfleet_once_total``."""

    #: This round took the claim and ran ``finish``.
    CLAIMED = "claimed"
    #: A replay: the stored result was returned, ``finish`` did not run.
    REPLAYED = "replayed"
    #: The ledger could not be asked (or is full): the retryable error, nothing ran.
    UNAVAILABLE = "unavailable"
    #: A replay racing the claimer gave up waiting for its result: the retryable error.
    PENDING = "pending"
    #: A replay of a flow whose result was too large to keep, or whose claimer died.
    UNKEPT = "unkept"


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
    #: lost and which the Redis client sent again (redis-py retries a command on a
    #: timeout) finds its own record: the token says it is its own, not another's.
    claim: str = ""

    def to_json(self) -> str:
        data: dict[str, Any] = {"s": self.state, "r": self.replica}
        if self.result is not None:
            data["result"] = self.result
        if self.message:
            data["m"] = self.message
        if self.claim:
            data["c"] = self.claim
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
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise LedgerUnavailable(f"unreadable ledger record: {exc}") from None


class LedgerUnavailable(Exception):
    """The ledger could not be asked or written (Redis down, refused, full)."""


class Ledger(Protocol):
    """Where claims and results live: Redis for a fleet, memory for one process."""

    async def claim(self, flow: str, record: Record, ttl: float) -> Record | None:
        """Take the claim (return None) or return the record already there; atomic."""
        ...

    async def store(self, flow: str, record: Record, ttl: float) -> None:
        """Replace the claimer's record with the final one (only the claimer calls this)."""
        ...

    async def get(self, flow: str) -> Record | None: ...


class MemoryLedger:
    """A process's own ledger (standalone replicas, in-memory clients, tests).

    Bounded: expired entries are pruned on every claim, and at ``capacity`` live
    entries a new claim is refused (:class:`LedgerUnavailable`) rather than an
    old one evicted, which would let its flow run again.
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

    async def claim(self, flow: str, record: Record, ttl: float) -> Record | None:
        held = self._live(flow)
        if held is not None:
            return held
        if len(self._entries) >= self.capacity:
            now = self._clock()
            for key in [k for k, (exp, _) in self._entries.items() if exp <= now]:
                del self._entries[key]
            if len(self._entries) >= self.capacity:
                raise LedgerUnavailable(f"the in-process ledger is full ({self.capacity} flows)")
        self._entries[flow] = (self._clock() + ttl, record)
        return None

    async def store(self, flow: str, record: Record, ttl: float) -> None:
        if self._live(flow) is not None:
            self._entries[flow] = (self._clock() + ttl, record)

    async def get(self, flow: str) -> Record | None:
        return self._live(flow)


class RedisLedger:
    """The fleet's ledger in its Redis, under :meth:`RedisKeys.once` (``SET``/``GET`` only)."""

    def __init__(self, client: Any, keys: RedisKeys) -> None:
        self.client = client
        self.keys = keys

    async def claim(self, flow: str, record: Record, ttl: float) -> Record | None:
        try:
            held = await self.client.set(
                self.keys.once(flow), record.to_json(), nx=True, get=True, px=_ms(ttl)
            )
        except Exception as exc:  # any failure to ask means: not claimed
            raise LedgerUnavailable(f"Redis: {type(exc).__name__}: {exc}") from None
        return None if held is None else Record.from_json(held)

    async def store(self, flow: str, record: Record, ttl: float) -> None:
        try:
            await self.client.set(self.keys.once(flow), record.to_json(), xx=True, px=_ms(ttl))
        except Exception as exc:
            raise LedgerUnavailable(f"Redis: {type(exc).__name__}: {exc}") from None

    async def get(self, flow: str) -> Record | None:
        try:
            raw = await self.client.get(self.keys.once(flow))
        except Exception as exc:
            raise LedgerUnavailable(f"Redis: {type(exc).__name__}: {exc}") from None
        return None if raw is None else Record.from_json(raw)


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


class FlowUnavailable(ToolError):
    """The final round of a once-flow cannot be served now; the client may send it again.

    Raised before ``finish`` runs (nothing happened). :class:`OnceMiddleware`
    (installed by ``mcpfleet serve``) turns it into a JSON-RPC error with code
    :data:`RETRY_CODE` and ``data = {"retryable": true, "retryAfterSeconds": 1,
    "reason": ...}``; without it, FastMCP answers it as a tool error with the
    same message.
    """

    def __init__(self, message: str, reason: OnceOutcome) -> None:
        super().__init__(message)
        self.reason = reason


class OnceMiddleware(Middleware):
    """Answers :class:`FlowUnavailable` as a retryable JSON-RPC error, not a tool result."""

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


@dataclass
class _Binding:
    ledger: Ledger
    ttl: float
    replica: str
    observe: Callable[[OnceOutcome], None] | None
    result_limit: int
    wait: float


_ATTR = "_mcpfleet_once_ledger"
#: The ledger of apps no replica runtime configured: one per process.
_PROCESS_LEDGER = MemoryLedger()
#: The claim lifetime where no replica runtime told the token TTL (mcp's default TTL is shorter).
_DEFAULT_TTL = 600.0 + CLOCK_MARGIN


def install_ledger(
    app: FastMCP[Any],
    ledger: Ledger,
    *,
    token_ttl: float,
    replica: str = "",
    observe: Callable[[OnceOutcome], None] | None = None,
    result_limit: int = DEFAULT_RESULT_LIMIT,
    wait: float = DEFAULT_WAIT,
) -> None:
    """Make ``app``'s once-flows use ``ledger``; claims live ``token_ttl`` plus a margin."""
    if token_ttl <= 0:
        raise ValueError(f"token_ttl must be positive, got {token_ttl}")
    binding = _Binding(ledger, token_ttl + CLOCK_MARGIN, replica, observe, result_limit, wait)
    setattr(app, _ATTR, binding)
    if not any(isinstance(mw, OnceMiddleware) for mw in app.middleware):
        app.add_middleware(OnceMiddleware())


def ledger_for(app: FastMCP[Any]) -> Ledger:
    """The ledger ``app``'s once-flows use (the process's own unless one was installed)."""
    return _binding(app).ledger


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


async def run_once(
    app: FastMCP[Any],
    flow: str,
    finish: Callable[[], Awaitable[Any]],
    convert: Callable[[Any], Awaitable[ToolResult]],
) -> Any:
    """Run ``finish`` once for ``flow`` across every replica that shares the app's ledger.

    Returns ``finish``'s value (this round claimed the flow), or the stored
    result of an earlier final round as a ``ToolResult`` marked as replayed.
    ``convert`` turns a value into the tool's ``ToolResult`` (as FastMCP does
    with what a tool returns); it runs for replays, and for values that are
    neither JSON nor a ``ToolResult``. Raises :class:`FlowUnavailable` when it
    can do neither now.
    """
    b = _binding(app)

    def seen(outcome: OnceOutcome) -> None:
        if b.observe is not None:
            b.observe(outcome)

    mine = Record("running", b.replica, claim=secrets.token_urlsafe(12))
    try:
        held = await b.ledger.claim(flow, mine, b.ttl)
    except LedgerUnavailable as exc:
        log.warning("once: flow not claimed, the ledger is unavailable: %s", exc)
        seen(OnceOutcome.UNAVAILABLE)
        raise FlowUnavailable(
            "This action cannot be confirmed right now (the fleet's ledger is unavailable); "
            "nothing was done. Send the same request again.",
            OnceOutcome.UNAVAILABLE,
        ) from None
    if held is not None and held != mine:
        return await _replay(b, flow, held, seen, convert)

    seen(OnceOutcome.CLAIMED)
    try:
        value = await finish()
    except Exception as exc:
        message = str(exc) if isinstance(exc, ToolError) else f"{type(exc).__name__}"
        _keep(b, flow, Record("failed", b.replica, message=message))
        raise
    stored = _storable(value)
    if stored is None:
        value = await convert(value)
        stored = {"tool_result": _dump(value)}
    size = len(json.dumps(stored, separators=(",", ":")))
    if size > b.result_limit:
        reason = f"the result ({size} bytes) was larger than the ledger keeps ({b.result_limit})"
        _keep(b, flow, Record("unkept", b.replica, message=reason))
    else:
        _keep(b, flow, Record("done", b.replica, result=stored))
    return value


#: Stores under way: held so that none is collected before it ran.
_STORING: set[asyncio.Task[None]] = set()


def _keep(b: _Binding, flow: str, record: Record) -> None:
    """Store the flow's end off the answer's path: the claim was the one round trip it waits.

    A replay arriving before the store landed finds the claim ``running`` and
    waits for it (bounded), so it still gets the stored result.
    """

    async def store() -> None:
        try:
            await b.ledger.store(flow, record, b.ttl)
        except LedgerUnavailable as exc:
            # The action ran; its claim stays "running": a replay is refused, never rerun.
            log.warning("once: result of a finished flow not stored: %s", exc)

    task = asyncio.ensure_future(store())
    _STORING.add(task)
    task.add_done_callback(_STORING.discard)


async def settle() -> None:
    """Wait until every result this process is storing has been stored (or failed to)."""
    while _STORING:
        await asyncio.gather(*list(_STORING), return_exceptions=True)


async def _replay(
    b: _Binding,
    flow: str,
    held: Record,
    seen: Callable[[OnceOutcome], None],
    convert: Callable[[Any], Awaitable[ToolResult]],
) -> ToolResult:
    record: Record | None = held
    deadline = time.monotonic() + b.wait
    delay = 0.02
    while record is not None and record.state == "running" and time.monotonic() < deadline:
        # Another round of this flow is running finish right now (or died doing it).
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.2)
        with contextlib.suppress(LedgerUnavailable):
            record = await b.ledger.get(flow)
    if record is None or record.state == "running":
        seen(OnceOutcome.PENDING)
        raise FlowUnavailable(
            "This action is being completed by another request; send the same request again "
            "to get its result.",
            OnceOutcome.PENDING,
        )
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
