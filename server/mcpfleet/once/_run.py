"""A final round run once: claim, confirm, finish, store; or replay what was stored."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

from fastmcp import FastMCP
from fastmcp.exceptions import ToolError
from fastmcp.tools.base import ToolResult

from mcpfleet import tracing
from mcpfleet.once import _errors as errors
from mcpfleet.once._errors import FlowOutcomeUnknown, FlowUnavailable
from mcpfleet.once._flows import OnceFlows, Release, flows_of
from mcpfleet.once._ledger import (
    CLAIM_LEASE,
    Confirmed,
    LedgerFull,
    LedgerUnavailable,
    OnceOutcome,
    Record,
    claim_lifetime,
)
from mcpfleet.once._results import dump, error_result, marked, restored, storable

log = logging.getLogger("mcpfleet.once")

#: How long a release keeps trying to take back a claim that may land late.
RELEASE_FOR: Final = 120.0


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
    b = flows_of(app)
    deadline = time.monotonic() + b.wait
    while True:
        mine = Record("running", b.replica, claim=secrets.token_urlsafe(12), boot=b.boot)
        held = await _claim(b, flow, mine)
        if held is None or held.claim == mine.claim:
            lifetime = await _confirm(b, flow, mine, end, deadline)
            if lifetime is not None:
                break
            continue
        # Another round holds the flow: its result, or a wait for it, or a free claim.
        record = await _await_other(b, flow, held, deadline)
        if record is not None:
            return await _answer_replay(b, record, convert)
        # The other claim expired or was released: claim again (bounded by the wait).

    b.seen(OnceOutcome.CLAIMED)
    return await _finish(b, flow, finish, convert, lifetime)


async def _claim(b: OnceFlows, flow: str, mine: Record) -> Record | None:
    """Claim ``flow`` for this round: None (taken) or the record another round holds."""
    try:
        with tracing.child("mcpfleet.once.claim"):
            return await b.ledger.claim(flow, mine, CLAIM_LEASE)
    except LedgerFull as exc:
        log.warning("once: flow not claimed, the ledger is full: %s", exc)
        b.seen(OnceOutcome.FULL)
        raise FlowUnavailable(errors.FULL, OnceOutcome.FULL) from None
    except LedgerUnavailable as exc:
        log.warning("once: flow not claimed, the ledger is unavailable: %s", exc)
        # The claim may land once Redis answers again: take it back then.
        _release_later(b, flow, mine)
        b.seen(OnceOutcome.UNAVAILABLE)
        raise FlowUnavailable(errors.UNAVAILABLE, OnceOutcome.UNAVAILABLE) from None


async def _confirm(
    b: OnceFlows, flow: str, mine: Record, end: float | None, deadline: float
) -> float | None:
    """Confirm this round's claim: the claim's lifetime (``finish`` may run), or None to
    claim again; raises :class:`FlowUnavailable` when neither can be done now."""
    replied = time.monotonic()
    lifetime = claim_lifetime(b.token_ttl, end, time.time())
    try:
        with tracing.child("mcpfleet.once.confirm"):
            said = await b.ledger.confirm(flow, mine, lifetime, replied)
            tracing.note("mcpfleet.once.confirmed", said.value)
    except LedgerUnavailable as exc:
        log.warning("once: claim not confirmed, the ledger is unavailable: %s", exc)
        _release_later(b, flow, mine)
        b.seen(OnceOutcome.UNAVAILABLE)
        raise FlowUnavailable(errors.UNAVAILABLE, OnceOutcome.UNAVAILABLE) from None
    if said is Confirmed.YES:
        return lifetime
    if said is Confirmed.LOST:
        log.warning("once: claim not confirmed (another round holds it): nothing run")
        b.seen(OnceOutcome.PENDING)
        raise FlowUnavailable(errors.PENDING, OnceOutcome.PENDING)
    # Late, or gone (a failover lost the claim): nothing ran. A late claim is
    # taken back; the flow is claimed afresh while the round's wait lasts.
    if said is Confirmed.LATE:
        _release_later(b, flow, mine)
    if time.monotonic() >= deadline:
        log.warning("once: claim not confirmed (%s): nothing run", said.value)
        b.seen(OnceOutcome.UNAVAILABLE)
        raise FlowUnavailable(errors.UNAVAILABLE, OnceOutcome.UNAVAILABLE)
    log.info("once: claim %s before its confirmation: claiming again", said.value)
    return None


async def _finish(
    b: OnceFlows,
    flow: str,
    finish: Callable[[], Awaitable[Any]],
    convert: Callable[[Any], Awaitable[ToolResult]],
    lifetime: float,
) -> Any:
    """Run ``finish`` under the confirmed claim and keep its end (off the answer's path)."""
    try:
        value = await finish()
    except Exception as exc:
        message = str(exc) if isinstance(exc, ToolError) else f"{type(exc).__name__}"
        _keep(b, flow, Record("failed", b.replica, message=message), lifetime)
        raise
    stored = storable(value)
    if stored is None:
        value = await convert(value)
        stored = {"tool_result": dump(value)}
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


def _keep(b: OnceFlows, flow: str, record: Record, lifetime: float) -> None:
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
                with tracing.child("mcpfleet.once.store"):
                    await b.ledger.store(flow, record, lifetime)
                return
            except LedgerUnavailable as exc:
                if time.monotonic() + pause >= give_up:
                    log.error("once: result of a finished flow never stored: %s", exc)
                    return
                log.warning("once: result of a finished flow not stored yet: %s", exc)
            await asyncio.sleep(pause)
            pause = min(pause * 2, 2.0)

    b.start(store())


def _release_later(b: OnceFlows, flow: str, mine: Record) -> None:
    """Take back, in the background, a claim this round may have made without knowing.

    A command sent to a stalled Redis runs when it resumes: the claim lands
    after its round already answered "unavailable". One task per app's
    once-flows releases every such claim, one command at a time: an outage
    that failed a thousand rounds leaves a thousand claims to release, never a
    thousand tasks polling Redis (and taking the pool's connections from the
    request path) the moment it answers again.
    """
    b.releases[mine.claim] = Release(flow, mine, time.monotonic() + RELEASE_FOR)
    if b.releaser is None or b.releaser.done():
        b.releaser = b.start(_releaser(b))


async def _releaser(b: OnceFlows) -> None:
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


async def _await_other(b: OnceFlows, flow: str, held: Record, deadline: float) -> Record | None:
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
                        b.seen(OnceOutcome.UNKNOWN)
                        raise FlowOutcomeUnknown(errors.UNKNOWN)
                    break
        if now >= deadline:
            b.seen(OnceOutcome.PENDING)
            raise FlowUnavailable(errors.PENDING, OnceOutcome.PENDING)
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.2)
        with contextlib.suppress(LedgerUnavailable):
            record = await b.ledger.get(flow)
    return record


async def _answer_replay(
    b: OnceFlows, record: Record, convert: Callable[[Any], Awaitable[ToolResult]]
) -> ToolResult:
    """A replay's answer: the stored result, marked; or why there is none."""
    if record.state == "done" and record.result is not None:
        b.seen(OnceOutcome.REPLAYED)
        kept = record.result
        if "raw" in kept:
            return marked(await convert(kept["raw"]))
        return marked(restored(kept.get("tool_result") or {}))
    b.seen(OnceOutcome.UNKEPT)
    if record.state == "failed":
        return error_result(f"This action already ran once and failed: {record.message}")
    return error_result(
        f"This action already ran once; its result cannot be shown again: {record.message}."
    )
