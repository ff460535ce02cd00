"""The once-ledger's decisions, without Redis: claims, replays, races, outages, bounds."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fastmcp import FastMCP
from fastmcp.exceptions import ToolError
from fastmcp.tools.base import ToolResult

from mcpfleet.contract import RedisKeys
from mcpfleet.once import (
    ONCE_META_KEY,
    Confirmed,
    FlowUnavailable,
    LedgerUnavailable,
    MemoryLedger,
    OnceOutcome,
    Record,
    RedisLedger,
    install_ledger,
    new_flow_id,
    run_once,
    settle,
    valid_flow_id,
)

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class DownLedger:
    async def claim(self, flow: str, record: Record, ttl: float) -> Record | None:
        raise LedgerUnavailable("connection refused")

    async def confirm(self, flow: str, mine: Record, lifetime: float, replied: float) -> Any:
        raise LedgerUnavailable("connection refused")

    async def store(self, flow: str, record: Record, ttl: float) -> None:
        raise LedgerUnavailable("connection refused")

    async def release(self, flow: str, mine: Record) -> bool:
        raise LedgerUnavailable("connection refused")

    async def get(self, flow: str) -> Record | None:
        raise LedgerUnavailable("connection refused")

    async def alive(self, replica: str, boot: str) -> bool:
        raise LedgerUnavailable("connection refused")


def app_with(ledger: Any, **kw: Any) -> tuple[FastMCP[Any], list[OnceOutcome]]:
    app: FastMCP[Any] = FastMCP("once-unit")
    seen: list[OnceOutcome] = []
    install_ledger(app, ledger, token_ttl=60, replica="r0", observe=seen.append, **kw)
    return app, seen


async def convert(value: Any) -> ToolResult:
    """As a tool with a wrapped str output schema converts its value."""
    return ToolResult(content=str(value), structured_content={"result": value})


def counting(runs: list[int], text: str = "charged", delay: float = 0.0) -> Any:
    async def finish() -> ToolResult:
        runs.append(1)
        if delay:
            await asyncio.sleep(delay)
        return ToolResult(content=text, structured_content={"result": text})

    return finish


def test_flow_ids_are_128_random_bits_in_url_safe_text() -> None:
    ids = {new_flow_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(valid_flow_id(i) and len(i) == 22 for i in ids)
    for bad in ("", "x" * 21, "x" * 23, "a/b" + "x" * 19, None, 7):
        assert not valid_flow_id(bad)


def test_the_ledger_key_is_scoped_to_the_fleet() -> None:
    assert RedisKeys("blue").once("abc") == "mcpfleet:blue:once:abc"
    rules = RedisKeys("blue").acl_rules("replica")
    assert "~mcpfleet:blue:once:*" in rules and "+get" in rules and "+set" in rules


def test_a_record_round_trips_and_a_bad_one_is_refused() -> None:
    rec = Record("done", "r1", result={"content": []})
    assert Record.from_json(rec.to_json()) == rec
    for raw in ("{", '{"s": "odd"}', '{"s": "done", "result": 3}', "[]"):
        with pytest.raises(LedgerUnavailable):
            Record.from_json(raw)


async def test_the_first_final_round_claims_and_a_replay_returns_the_stored_result() -> None:
    app, seen = app_with(MemoryLedger())
    runs: list[int] = []
    flow = new_flow_id()
    first = await run_once(app, flow, counting(runs), convert)
    assert first.meta is None
    replay = await run_once(app, flow, counting(runs, "other"), convert)
    assert runs == [1]
    assert replay.meta == {ONCE_META_KEY: {"replayed": True}}
    assert replay.content == first.content
    assert replay.structured_content == first.structured_content
    assert seen == [OnceOutcome.CLAIMED, OnceOutcome.REPLAYED]


async def test_a_plain_value_is_kept_as_is_and_converted_by_the_tool_for_a_replay() -> None:
    app, _ = app_with(MemoryLedger())
    converted: list[Any] = []

    async def tool_convert(value: Any) -> ToolResult:
        converted.append(value)
        return await convert(value)

    async def finish() -> str:
        return "Purchased tea"

    flow = new_flow_id()
    assert await run_once(app, flow, finish, tool_convert) == "Purchased tea"
    assert converted == [], "the original round converts nothing itself"
    replay = await run_once(app, flow, finish, tool_convert)
    assert converted == ["Purchased tea"]
    assert replay.structured_content == {"result": "Purchased tea"}
    assert replay.meta == {ONCE_META_KEY: {"replayed": True}}


async def test_two_racing_final_rounds_run_finish_once() -> None:
    app, seen = app_with(MemoryLedger())
    runs: list[int] = []
    flow = new_flow_id()
    results = await asyncio.gather(
        *(run_once(app, flow, counting(runs, delay=0.05), convert) for _ in range(5))
    )
    assert runs == [1]
    assert all(r.structured_content == {"result": "charged"} for r in results)
    assert seen.count(OnceOutcome.CLAIMED) == 1 and seen.count(OnceOutcome.REPLAYED) == 4


async def test_a_replay_gives_up_waiting_for_a_slow_claimer_with_a_retryable_error() -> None:
    app, seen = app_with(MemoryLedger(), wait=0.1)
    started, release = asyncio.Event(), asyncio.Event()

    async def slow_finish() -> ToolResult:
        started.set()
        await release.wait()
        return ToolResult(content="charged")

    flow = new_flow_id()
    slow = asyncio.ensure_future(run_once(app, flow, slow_finish, convert))
    await asyncio.wait_for(started.wait(), 5)
    with pytest.raises(FlowUnavailable) as err:
        await run_once(app, flow, slow_finish, convert)
    assert err.value.reason is OnceOutcome.PENDING
    release.set()
    await slow
    assert seen == [OnceOutcome.CLAIMED, OnceOutcome.PENDING]
    replay = await run_once(app, flow, slow_finish, convert)
    assert replay.meta == {ONCE_META_KEY: {"replayed": True}}


async def test_an_unreachable_ledger_fails_closed_and_runs_nothing() -> None:
    app, seen = app_with(DownLedger())
    runs: list[int] = []
    with pytest.raises(FlowUnavailable) as err:
        await run_once(app, new_flow_id(), counting(runs), convert)
    assert isinstance(err.value, ToolError)
    assert err.value.reason is OnceOutcome.UNAVAILABLE
    assert runs == [] and seen == [OnceOutcome.UNAVAILABLE]


async def test_a_result_over_the_bound_is_not_kept_and_its_replay_says_so() -> None:
    app, seen = app_with(MemoryLedger(), result_limit=200)
    runs: list[int] = []
    flow = new_flow_id()
    first = await run_once(app, flow, counting(runs, "x" * 500), convert)
    assert first.structured_content == {"result": "x" * 500}
    replay = await run_once(app, flow, counting(runs), convert)
    assert runs == [1]
    assert replay.is_error and "larger than the ledger keeps (200)" in str(replay.content)
    assert seen[-1] is OnceOutcome.UNKEPT


async def test_a_finish_that_raised_is_not_run_again() -> None:
    app, _ = app_with(MemoryLedger())
    runs: list[int] = []

    async def broken() -> ToolResult:
        runs.append(1)
        raise ToolError("card declined")

    flow = new_flow_id()
    with pytest.raises(ToolError):
        await run_once(app, flow, broken, convert)
    replay = await run_once(app, flow, broken, convert)
    assert runs == [1]
    assert replay.is_error and "already ran once and failed: card declined" in str(replay.content)


async def test_the_memory_ledger_expires_claims_and_refuses_when_full() -> None:
    clock = Clock()
    ledger = MemoryLedger(capacity=2, clock=clock)
    assert await ledger.claim("a", Record("running"), 10) is None
    assert await ledger.claim("b", Record("running"), 10) is None
    with pytest.raises(LedgerUnavailable):
        await ledger.claim("c", Record("running"), 10)
    assert (await ledger.claim("a", Record("running"), 10)) == Record("running")
    clock.now += 11
    assert await ledger.claim("c", Record("running"), 10) is None
    assert len(ledger) == 1, "expired claims were pruned"


def test_install_ledger_refuses_a_ttl_that_would_expire_claims_early() -> None:
    with pytest.raises(ValueError, match="token_ttl"):
        install_ledger(FastMCP("x"), MemoryLedger(), token_ttl=0)


async def test_an_app_nobody_configured_keeps_its_flows_in_a_ledger_of_its_own() -> None:
    """Without install_ledger, an app's once-flows use an in-process ledger held by the
    app itself: a replay is still a replay, and another app's state is never shared."""
    from mcpfleet.once import ledger_for

    app, other = FastMCP("alone"), FastMCP("another")
    runs: list[int] = []
    flow = new_flow_id()
    await run_once(app, flow, counting(runs), convert)
    replay = await run_once(app, flow, counting(runs), convert)
    assert runs == [1] and replay.meta == {ONCE_META_KEY: {"replayed": True}}
    assert isinstance(ledger_for(app), MemoryLedger)
    assert ledger_for(app) is ledger_for(app) and ledger_for(app) is not ledger_for(other)
    await settle()


async def test_a_ledger_installed_again_keeps_the_writes_still_under_way() -> None:
    """The runtime installs Redis over the in-process ledger at start: a result being
    stored through the first is still held, and settled, after the swap."""
    from mcpfleet.once._flows import flows_of

    class Slow(MemoryLedger):
        def __init__(self) -> None:
            super().__init__()
            self.stored = asyncio.Event()

        async def store(self, flow: str, record: Record, lifetime: float) -> None:
            await asyncio.sleep(0.05)
            await super().store(flow, record, lifetime)
            self.stored.set()

    slow = Slow()
    app, _ = app_with(slow)
    await run_once(app, new_flow_id(), counting([]), convert)
    assert len(flows_of(app).background) == 1
    install_ledger(app, MemoryLedger(), token_ttl=60)
    assert len(flows_of(app).background) == 1
    await settle()
    assert slow.stored.is_set() and not flows_of(app).background


class RetriedReply:
    """A Redis client whose first reply to each SET is lost and the command sent again,
    as redis-py does on a timeout by default: the write lands, and the caller gets
    the answer of the second execution (``SET NX GET`` then returns what the first wrote)."""

    def __init__(self) -> None:
        self.data: dict[str, str] = {}
        self.sets = 0

    async def set(
        self, key: str, value: str, nx: bool = False, get: bool = False, xx: bool = False,
        px: int | None = None,
    ) -> str | bool | None:  # fmt: skip
        for _ in range(2):  # the lost reply, then the retry
            self.sets += 1
            old = self.data.get(key)
            if (nx and old is None) or (xx and old is not None) or not (nx or xx):
                self.data[key] = value
        return old if get else True

    async def get(self, key: str) -> str | None:
        return self.data.get(key)

    async def eval(self, script: str, numkeys: int, key: str, *args: Any) -> int:
        """The confirm and release scripts, as Redis runs them (the lease is never short)."""
        held = self.data.get(key)
        if "PTTL" in script:
            if held is None:
                return -2
            if held == args[1]:
                return 1
            if held != args[0]:
                return 0
            self.data[key] = args[1]
            return 1
        if held in (args[0], args[1]):
            del self.data[key]
            return 1
        return 0


async def test_a_claim_sent_again_after_a_lost_reply_is_still_the_claim() -> None:
    """The retried ``SET NX GET`` finds the record its first execution wrote: that is
    this round's own claim (its token), so finish runs, once, and a real replay later
    still gets the stored result."""
    client = RetriedReply()
    app, seen = app_with(RedisLedger(client, RedisKeys("f")), wait=0.1)
    runs: list[int] = []
    flow = new_flow_id()
    first = await run_once(app, flow, counting(runs), convert)
    assert runs == [1] and first.meta is None
    assert client.sets >= 2, "the claim was sent twice"
    await settle()
    replay = await run_once(app, flow, counting(runs, "other"), convert)
    assert runs == [1]
    assert replay.meta == {ONCE_META_KEY: {"replayed": True}}
    assert seen == [OnceOutcome.CLAIMED, OnceOutcome.REPLAYED]


def test_a_confirmed_claim_outlives_the_flows_end_whatever_this_replicas_ttl() -> None:
    from mcpfleet.once import CLOCK_MARGIN, claim_lifetime

    # Sealed by a 600 s replica at t=1000, claimed at t=1010 by a 5 s replica.
    assert claim_lifetime(5, 1600.0, 1010.0) == 590 + CLOCK_MARGIN
    # An envelope without an end (an older replica): this replica's TTL.
    assert claim_lifetime(5, None, 1010.0) == 5 + CLOCK_MARGIN
    assert claim_lifetime(600, 1005.0, 1010.0) == 600 + CLOCK_MARGIN


class DeadClaimer(MemoryLedger):
    async def alive(self, replica: str, boot: str) -> bool:
        return replica != "gone"


async def test_a_replay_of_a_flow_whose_claimer_died_in_finish_is_outcome_unknown() -> None:
    from mcpfleet.once import FlowOutcomeUnknown

    ledger = DeadClaimer()
    app, seen = app_with(ledger, wait=2.0)
    flow = new_flow_id()
    await ledger.claim(flow, Record("running", "gone", claim="x", finishing=True), 60)
    runs: list[int] = []
    with pytest.raises(FlowOutcomeUnknown):
        await run_once(app, flow, counting(runs), convert)
    assert runs == [] and seen == [OnceOutcome.UNKNOWN]


async def test_an_unconfirmed_claim_of_a_dead_claimer_blocks_only_for_its_lease() -> None:
    clock = Clock()
    ledger = MemoryLedger(clock=clock)
    app, _ = app_with(ledger, wait=0.2)
    flow = new_flow_id()
    await ledger.claim(flow, Record("running", "gone", claim="x"), 5)
    runs: list[int] = []
    with pytest.raises(FlowUnavailable):
        await run_once(app, flow, counting(runs), convert)
    clock.now += 5.1  # the lease ran out
    await run_once(app, flow, counting(runs), convert)
    assert runs == [1]


async def test_a_claim_that_landed_after_its_round_gave_up_is_released() -> None:
    class LateLedger(MemoryLedger):
        """The claim times out for the caller, but lands (a stalled Redis resumes)."""

        async def claim(self, flow: str, record: Record, lease: float) -> Record | None:
            await super().claim(flow, record, lease)
            raise LedgerUnavailable("no answer within 1s")

    ledger = LateLedger()
    app, _ = app_with(ledger)
    flow = new_flow_id()
    with pytest.raises(FlowUnavailable):
        await run_once(app, flow, counting([]), convert)
    assert await ledger.get(flow) is not None
    await settle()
    assert await ledger.get(flow) is None, "the late claim was released"


async def test_a_confirmation_later_than_its_deadline_runs_nothing() -> None:
    client = RetriedReply()
    ledger = RedisLedger(client, RedisKeys("f"), deadline=1.0)
    mine = Record("running", "r0", claim="t")
    client.data[RedisKeys("f").once("flow")] = mine.to_json()
    # The claim's reply came 4.5 s ago: with a 1 s deadline the lease may be nearly out.
    import time

    from mcpfleet.once import Confirmed

    said = await ledger.confirm("flow", mine, 600, time.monotonic() - 4.5)
    assert said is Confirmed.LATE


async def test_a_full_redis_refuses_new_once_flows_with_the_retryable_error() -> None:
    ledger = RedisLedger(RetriedReply(), RedisKeys("f"), memory_limit=0.8)
    ledger.memory_share = 0.85
    ledger._memory_checked = 10**12  # no check now
    app, seen = app_with(ledger)
    with pytest.raises(FlowUnavailable) as err:
        await run_once(app, new_flow_id(), counting([]), convert)
    assert err.value.reason is OnceOutcome.FULL and "full" in str(err.value)
    assert seen == [OnceOutcome.FULL]


async def test_a_claim_a_failover_lost_before_its_confirmation_is_claimed_again() -> None:
    """The claim landed on a master that died before replicating it: the new master
    has no record, the confirmation finds it gone, and the round claims afresh."""

    class FailoverLedger(MemoryLedger):
        def __init__(self) -> None:
            super().__init__()
            self.lost = 0

        async def confirm(
            self, flow: str, mine: Record, lifetime: float, replied: float
        ) -> Confirmed:
            if not self.lost:
                self.lost += 1
                del self._entries[flow]  # the promoted replica never had it
            return await super().confirm(flow, mine, lifetime, replied)

    ledger = FailoverLedger()
    app, seen = app_with(ledger)
    runs: list[int] = []
    flow = new_flow_id()
    await run_once(app, flow, counting(runs), convert)
    assert ledger.lost == 1 and runs == [1] and seen == [OnceOutcome.CLAIMED]
    await settle()
    assert (await ledger.get(flow)).state == "done"  # type: ignore[union-attr]


async def test_a_confirmation_sent_again_after_a_lost_reply_is_still_confirmed() -> None:
    ledger = MemoryLedger()
    mine = Record("running", "r0", claim="t")
    await ledger.claim("flow", mine, 5)
    assert await ledger.confirm("flow", mine, 60, 0.0) is Confirmed.YES
    assert await ledger.confirm("flow", mine, 60, 0.0) is Confirmed.YES
    other = Record("running", "r1", claim="u")
    assert await ledger.confirm("flow", other, 60, 0.0) is Confirmed.LOST
    assert await ledger.confirm("nothing", mine, 60, 0.0) is Confirmed.GONE


async def test_a_confirmation_that_landed_after_its_round_gave_up_is_released() -> None:
    """The confirmation was applied but its reply never came (the master died after
    it): the round answers 'unavailable' and runs nothing, so the confirmed claim
    must not be left to make every resend wait for a finish that never runs."""

    class LostReply(MemoryLedger):
        async def confirm(
            self, flow: str, mine: Record, lifetime: float, replied: float
        ) -> Confirmed:
            await super().confirm(flow, mine, lifetime, replied)
            raise LedgerUnavailable("connection reset")

    ledger = LostReply()
    app, seen = app_with(ledger)
    flow = new_flow_id()
    runs: list[int] = []
    with pytest.raises(FlowUnavailable):
        await run_once(app, flow, counting(runs), convert)
    assert runs == [] and seen == [OnceOutcome.UNAVAILABLE]
    await settle()
    assert await ledger.get(flow) is None, "the confirmed claim was released"


async def test_the_redis_confirmation_is_asked_again_through_a_failover() -> None:
    """Through Sentinel a refused connection may be a failover: the confirmation is
    tried again (each try checked against its own send) until the new master answers."""

    class Moving(RetriedReply):
        def __init__(self) -> None:
            super().__init__()
            self.refused = 2
            self.connection_pool = self  # what redisconn.through_sentinel looks for

        async def get_master_address(self) -> tuple[str, int]:
            return ("127.0.0.1", 1)

        async def eval(self, script: str, numkeys: int, key: str, *args: Any) -> int:
            if "PTTL" in script and self.refused:
                self.refused -= 1
                from redis.exceptions import ConnectionError as RedisConnectionError

                raise RedisConnectionError("Connection refused")
            return await super().eval(script, numkeys, key, *args)

    import time

    client = Moving()
    ledger = RedisLedger(client, RedisKeys("f"), deadline=1.0, failover_wait=5.0)
    mine = Record("running", "r0", claim="t")
    client.data[RedisKeys("f").once("flow")] = mine.to_json()
    assert await ledger.confirm("flow", mine, 600, time.monotonic()) is Confirmed.YES
    assert client.refused == 0


async def test_claims_left_by_an_outage_are_released_by_one_task_one_at_a_time() -> None:
    """Forty rounds fail during an outage, each leaving a claim that landed: one
    background task takes them all back, never two release commands at once."""

    class Outage(MemoryLedger):
        def __init__(self) -> None:
            super().__init__()
            self.down = True
            self.running = self.most = 0

        async def claim(self, flow: str, record: Record, lease: float) -> Record | None:
            await super().claim(flow, record, lease)
            raise LedgerUnavailable("no answer within 2s")

        async def release(self, flow: str, mine: Record) -> bool:
            if self.down:
                raise LedgerUnavailable("connection refused")
            self.running += 1
            self.most = max(self.most, self.running)
            await asyncio.sleep(0)
            self.running -= 1
            return await super().release(flow, mine)

    ledger = Outage()
    app, _ = app_with(ledger)
    flows = [new_flow_id() for _ in range(40)]
    for flow in flows:
        with pytest.raises(FlowUnavailable):
            await run_once(app, flow, counting([]), convert)
    from mcpfleet.once._flows import flows_of

    assert len(flows_of(app).background) == 1, "one release task for every claim left"
    await asyncio.sleep(0.3)
    ledger.down = False
    await settle()
    assert ledger.most == 1
    assert [await ledger.get(flow) for flow in flows] == [None] * 40


async def test_the_memory_share_is_reported_with_the_limit_off_and_refuses_nothing() -> None:
    class Half(RetriedReply):
        async def info(self, section: str) -> dict[str, int]:
            return {"used_memory": 50, "maxmemory": 100}

    ledger = RedisLedger(Half(), RedisKeys("f"), memory_limit=0)
    seen: list[float] = []
    watcher = asyncio.ensure_future(ledger.watch_memory(seen.append, interval=0.01))
    try:
        while not seen:
            await asyncio.sleep(0.01)
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
    assert seen[0] == 0.5 and not ledger.full
