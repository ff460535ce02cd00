"""The limits per principal without I/O: rules, principals, the limiter over a stand-in store."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from mcpfleet.contract import RedisKeys
from mcpfleet.limits import (
    LEASE_LIFE,
    Limiter,
    LimitRules,
    PrincipalRule,
    Rate,
    RulesError,
    RulesWatcher,
    address_of,
    load_rules,
    parse_rules,
    principal_of,
)
from mcpfleet.limits._limiter import batch_of

pytestmark = pytest.mark.unit

BASE = LimitRules(sessions=3, rounds=Rate(10, 20))


def test_a_file_goes_over_the_flags_field_by_field() -> None:
    rules = parse_rules(
        {
            "rounds": {"rate": 5},
            "tools": {"slow": {"rate": 1, "burst": 2}},
            "principals": {"p1": {"sessions": 9, "rounds": {"burst": 50}}},
        },
        BASE,
    )
    assert rules.sessions == 3 and rules.rounds == Rate(5, 20)
    assert rules.tool_rate("slow") == Rate(1, 2) and rules.tool_rate("other") is None
    assert rules.sessions_for("p1") == 9 and rules.sessions_for("p2") == 3
    assert rules.rounds_for("p1") == Rate(5, 50)
    assert rules.rounds_for("p2") == Rate(5, 20)


@pytest.mark.parametrize(
    ("doc", "names"),
    [
        ({"session": 1}, "unknown field 'session'"),
        ({"sessions": -1}, "sessions: must be a finite number >= 0"),
        ({"sessions": 1.5}, "sessions: must be a whole number"),
        ({"rounds": {"rate": "fast"}}, "rounds.rate: expected a number"),
        ({"rounds": 5}, "rounds: expected an object"),
        ({"tools": {"t": {"rate": 1, "burst": True}}}, "tools.t.burst: expected a number"),
        ({"principals": {"": {}}}, "principals: an entry with an empty name"),
        ([], "limits: expected an object"),
    ],
)
def test_a_wrong_field_is_named(doc: Any, names: str) -> None:
    with pytest.raises(RulesError, match=names.replace("(", r"\(").replace(".", r"\.")):
        parse_rules(doc, BASE)


def test_a_file_that_is_not_json_says_where(tmp_path: Path) -> None:
    path = tmp_path / "limits.json"
    path.write_text('{"sessions": 1,\n nope}')
    with pytest.raises(RulesError, match=r"not JSON .* line 2"):
        load_rules(path, BASE)
    path.write_text("  \n")
    assert load_rules(path, BASE) == BASE
    with pytest.raises(RulesError, match="limits file"):
        load_rules(tmp_path / "missing.json", BASE)


def test_the_watcher_keeps_the_rules_in_force_when_the_file_turns_bad(tmp_path: Path) -> None:
    path = tmp_path / "limits.json"
    path.write_text(json.dumps({"sessions": 7}))
    applied: list[LimitRules] = []
    watcher = RulesWatcher(path, BASE, applied.append)
    assert watcher.check() and applied[-1].sessions == 7
    assert not watcher.check(), "an unchanged file is not read again"
    path.write_text("{broken")
    assert not watcher.check() and len(applied) == 1
    path.write_text(json.dumps({"sessions": 8, "rounds": {"rate": 1}}))
    assert watcher.check() and applied[-1] == LimitRules(sessions=8, rounds=Rate(1, 20))


def scope(peer: str, *forwarded: str, user: Any = None) -> dict[str, Any]:
    headers = [(b"x-forwarded-for", f.encode()) for f in forwarded]
    out: dict[str, Any] = {"type": "http", "client": (peer, 5000), "headers": headers}
    if user is not None:
        out["user"] = user
    return out


def test_the_address_is_read_through_the_trusted_hops_only() -> None:
    # No hop trusted: the peer, whatever the header says.
    assert address_of(scope("10.0.0.9", "6.6.6.6"), 0) == "10.0.0.9"
    # The router is the one hop: the entry it appended, never the client's own entries.
    assert address_of(scope("10.0.0.9", "6.6.6.6", "203.0.113.5"), 1) == "203.0.113.5"
    assert address_of(scope("10.0.0.9", "6.6.6.6, 7.7.7.7, 203.0.113.5"), 1) == "203.0.113.5"
    # An ingress in front of the router: two hops.
    assert address_of(scope("10.0.0.9", "1.1.1.1, 198.51.100.2", "10.0.0.3"), 2) == "198.51.100.2"
    # Fewer entries than hops: the leftmost (the client came through fewer proxies).
    assert address_of(scope("10.0.0.9"), 2) == "10.0.0.9"


def test_unauthenticated_principals_are_hashed_addresses_or_one_shared() -> None:
    one = principal_of(scope("10.0.0.9", "203.0.113.5"), 1)
    assert one.startswith("addr-") and "203.0.113.5" not in one
    assert principal_of(scope("10.0.0.8", "203.0.113.5"), 1) == one
    assert principal_of(scope("10.0.0.9", "203.0.113.6"), 1) != one
    assert principal_of(scope("10.0.0.9", "203.0.113.5"), 1, "shared") == "shared"


class Store:
    """A stand-in for Redis with ``eval``: a count of calls, a bucket per key, able to fail,
    and to hold its answers until ``held`` is set."""

    def __init__(self) -> None:
        self.calls = 0
        self.fail: BaseException | None = None
        self.granted: dict[str, int] = {}
        self.room = 1000
        self.holdings: dict[str, set[str]] = {}
        self.held: asyncio.Event | None = None

    async def eval(self, script: str, numkeys: int, key: str, *args: Any) -> Any:
        self.calls += 1
        if self.held is not None:
            await self.held.wait()
        if self.fail is not None:
            raise self.fail
        if "ZADD" in script and "ADMIT" not in script and "dropping" not in script:
            cap, member = int(args[0]), str(args[1])
            held = self.holdings.setdefault(key, set())
            if member not in held and len(held) >= cap:
                return 5000
            held.add(member)
            return 0
        if "dropping" in script:
            held = self.holdings.setdefault(key, set())
            members = [str(a) for a in args[1:]]
            cut = members.index("") if "" in members else len(members)
            held |= set(members[:cut])
            held -= set(members[cut + 1 :])
            return len(held)
        want = int(args[2])
        n = min(want, self.room - self.granted.get(key, 0))
        if n <= 0:
            return b"0 250000 0"
        self.granted[key] = self.granted.get(key, 0) + n
        return f"{n} 0 {self.room - self.granted[key]}".encode()


class Fallbacks:
    """An observer of the limiter that keeps the limits whose checks fell back to memory."""

    def __init__(self, failures: list[str]) -> None:
        self.failures = failures

    def limited(self, limit: str, tool: str) -> None: ...

    def failed(self, limit: str) -> None:
        self.failures.append(limit)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def limiter(rules: LimitRules, store: Store, clock: Clock) -> Limiter:
    lim = Limiter(rules, RedisKeys("t"), deadline=0.5, clock=clock)
    lim.attach(store)
    return lim


def test_rounds_are_answered_from_a_lease_and_a_refusal_is_held_in_memory() -> None:
    store, clock = Store(), Clock()
    lim = limiter(LimitRules(rounds=Rate(100, 200)), store, clock)

    async def run() -> None:
        for _ in range(10):  # a lease of ten: a tenth of a second of 100/s
            assert await lim.round("p") is None
        assert store.calls == 1
        store.room = 10
        refusal = await lim.round("p")
        assert refusal is not None and refusal.limit == "rounds" and refusal.retry_seconds == 1
        calls = store.calls
        assert await lim.round("p") is not None and store.calls == calls, "refused from memory"
        clock.now += 0.3
        store.room = 1000
        assert await lim.round("p") is None

    asyncio.run(run())


def test_a_flows_answer_round_after_its_user_thought_finds_the_lease_its_asking_round_took() -> (
    None
):
    store, clock = Store(), Clock()
    lim = limiter(LimitRules(rounds=Rate(50, 100)), store, clock)

    async def run() -> None:
        assert await lim.round("p") is None  # the asking round takes a lease of 5
        clock.now += 20.0  # the user answers
        assert await lim.round("p") is None
        assert store.calls == 1
        clock.now += LEASE_LIFE  # a lease past its life is not used
        assert await lim.round("p") is None
        assert store.calls == 2

    asyncio.run(run())


def test_a_spent_lease_s_successor_is_taken_while_the_round_runs_and_found_by_the_next() -> None:
    store, clock = Store(), Clock()
    lim = limiter(LimitRules(rounds=Rate(50, 100)), store, clock)

    async def run() -> None:
        for _ in range(5):  # a lease of 5
            assert await lim.round("p") is None
        assert store.calls == 1 and lim.leases_on_their_way == 1
        await asyncio.sleep(0)  # the round that spent it goes on; the next lease comes in
        assert store.calls == 2 and lim.leases_on_their_way == 0
        store.held = asyncio.Event()  # Redis would now make a round wait
        for _ in range(4):
            assert await lim.round("p") is None
        assert store.calls == 2, "the next lease's rounds are answered from memory"
        store.held.set()

    asyncio.run(run())


def test_rounds_that_find_the_next_lease_on_its_way_wait_for_it_and_share_it() -> None:
    store, clock = Store(), Clock()
    lim = limiter(LimitRules(rounds=Rate(50, 100)), store, clock)

    async def run() -> None:
        for _ in range(5):
            assert await lim.round("p") is None
        store.held = asyncio.Event()
        await asyncio.sleep(0)  # the next lease asked for: Redis holds its answer
        waiting = [asyncio.ensure_future(lim.round("p")) for _ in range(3)]
        await asyncio.sleep(0.01)
        assert not any(w.done() for w in waiting)
        store.held.set()
        assert await asyncio.gather(*waiting) == [None, None, None]
        assert store.calls == 2, "the three rounds took one lease between them"
        assert await lim.round("p") is None and await lim.round("p") is None
        await asyncio.sleep(0)
        assert store.calls == 3, "and once they spent it, the next was asked for"

    asyncio.run(run())


def test_a_lease_is_taken_ahead_only_while_the_bucket_has_one_to_spare() -> None:
    """Near its limit a principal's leases are taken as its rounds come, so none sits ahead
    on one replica while the bucket is empty for another; a lease ahead that the bucket
    refuses holds its refusal in memory."""
    store, clock = Store(), Clock()
    store.room = 10
    lim = limiter(LimitRules(rounds=Rate(50, 100)), store, clock)

    async def run() -> None:
        for _ in range(5):  # a lease of 5, 5 left: the next is taken ahead
            assert await lim.round("p") is None
        await asyncio.sleep(0)
        assert store.calls == 2
        for _ in range(5):  # that lease left nothing: none ahead
            assert await lim.round("p") is None
        await asyncio.sleep(0)
        assert store.calls == 2 and lim.leases_on_their_way == 0
        refusal = await lim.round("p")  # asks Redis itself: refused
        assert refusal is not None and refusal.retry_seconds == 1 and store.calls == 3
        assert await lim.round("p") is not None and store.calls == 3, "refused from memory"
        clock.now += 0.3
        store.room = 1000
        for _ in range(5):
            assert await lim.round("p") is None
        store.room = sum(store.granted.values())  # drained by another replica
        await asyncio.sleep(0)  # the lease ahead: refused
        assert store.calls == 5
        assert await lim.round("p") is not None and store.calls == 5, "refused from memory"

    asyncio.run(run())


def test_a_lease_of_one_round_is_never_taken_ahead() -> None:
    store, clock = Store(), Clock()
    lim = limiter(LimitRules(rounds=Rate(10, 100)), store, clock)  # a tenth of 10/s: one

    async def run() -> None:
        for calls in range(1, 4):
            assert await lim.round("p") is None
            await asyncio.sleep(0)
            assert store.calls == calls and lim.leases_on_their_way == 0

    asyncio.run(run())


def test_a_stalled_redis_under_the_next_lease_costs_one_deadline_then_the_local_bucket() -> None:
    store, clock = Store(), Clock()
    failures: list[str] = []
    observer = Fallbacks(failures)

    lim = Limiter(
        LimitRules(rounds=Rate(50, 100)),
        RedisKeys("t"),
        observer=observer,
        deadline=0.05,
        clock=clock,
    )
    lim.attach(store)

    async def run() -> None:
        for _ in range(4):
            assert await lim.round("p") is None
        store.held = asyncio.Event()  # stalled: never answers
        assert await lim.round("p") is None  # spends the lease; the next is asked for
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await lim.round("p") is None  # waits for it: the deadline, then local
        assert 0.04 <= loop.time() - started < 1.0
        assert failures == ["rounds"]
        calls = store.calls
        for _ in range(2):  # Redis left alone: the local bucket answers at once
            assert await lim.round("p") is None
        assert store.calls == calls and failures == ["rounds"]

    asyncio.run(run())


def test_leases_on_their_way_are_given_up_when_the_limiter_closes() -> None:
    store, clock = Store(), Clock()
    lim = limiter(LimitRules(rounds=Rate(50, 100)), store, clock)

    async def run() -> None:
        for _ in range(5):  # a lease of 5, spent: the next asked for
            assert await lim.round("p") is None
        store.held = asyncio.Event()
        await asyncio.sleep(0)
        assert lim.leases_on_their_way == 1
        await lim.aclose()
        assert lim.leases_on_their_way == 0

    asyncio.run(run())


class Bucket:
    """The TAKE script's GCRA (mcpfleet.limits._store), on the test's clock."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.tat: dict[str, float] = {}

    async def eval(self, script: str, numkeys: int, key: str, *args: Any) -> Any:
        now = self.clock.now * 1e6
        interval, burst, want = (int(a) for a in args)
        tat = max(self.tat.get(key, 0.0), now)
        room = int((now + burst * interval - tat) // interval)
        if room < 1:
            return f"0 {int(tat + interval - burst * interval - now)} 0".encode()
        n = min(room, want)
        self.tat[key] = tat + n * interval
        return f"{n} 0 {room - n}".encode()


def test_leases_however_long_they_live_never_let_a_principal_past_its_bucket_and_a_lease_each() -> (
    None
):
    """Three replicas, one principal sending bursts at random times for 10 minutes: in
    every window the rounds allowed are at most the bucket's (burst + rate x window)
    plus one lease per replica."""
    import random

    clock = Clock()
    bucket = Bucket(clock)
    rate = Rate(50, 100)
    replicas = [Limiter(LimitRules(rounds=rate), RedisKeys("t"), clock=clock) for _ in range(3)]
    for lim in replicas:
        lim.attach(bucket)
    rng = random.Random(7)
    allowed: list[float] = []

    async def run() -> None:
        start = clock.now
        while clock.now - start < 600:
            clock.now += rng.choice([0.001, 0.01, 0.2, 3.0, 40.0])
            for _ in range(rng.choice([1, 5, 60, 300])):
                if await rng.choice(replicas).round("p") is None:
                    allowed.append(clock.now)
                clock.now += rng.choice([0.0, 0.0005, 0.005])

    asyncio.run(run())
    lease = batch_of(rate)
    assert len(allowed) > 2000
    for window in (0.0, 0.05, 0.5, 5.0, 60.0):
        worst, j = 0, 0
        for i, t in enumerate(allowed):
            while allowed[j] < t - window:
                j += 1
            worst = max(worst, i - j + 1)
        bound = rate.burst + rate.rate * window + len(replicas) * lease
        assert worst <= bound, f"{worst} rounds allowed within {window} s, bound {bound}"


def test_redis_failing_falls_back_to_a_local_bucket_and_leaves_redis_alone_a_while() -> None:
    store, clock = Store(), Clock()
    failures: list[str] = []
    observer = Fallbacks(failures)

    lim = Limiter(LimitRules(rounds=Rate(1, 3)), RedisKeys("t"), observer=observer, clock=clock)
    lim.attach(store)
    store.fail = ConnectionError("down")

    async def run() -> list[bool]:
        return [await lim.round("p") is None for _ in range(5)]

    allowed = asyncio.run(run())
    assert allowed == [True, True, True, False, False], "the burst of 3, then refused locally"
    assert failures == ["rounds"] and store.calls == 1, "Redis is left alone after a failure"
    clock.now += 1.5
    store.fail = None
    assert asyncio.run(lim.round("p")) is None and store.calls == 2


def test_a_tool_of_its_own_is_refused_on_its_tighter_rate() -> None:
    store, clock = Store(), Clock()
    lim = limiter(LimitRules(rounds=Rate(100, 200), tools={"slow": Rate(1, 1)}), store, clock)

    async def run() -> None:
        assert await lim.round("p", "slow") is None
        store.room = 1  # the tool's bucket in the stand-in holds one
        refusal = await lim.round("p", "slow")
        assert refusal is not None and "'slow'" in refusal.message
        assert await lim.round("p", "fast") is None

    asyncio.run(run())


def test_sessions_hold_places_fleet_wide_and_give_them_back() -> None:
    store, clock = Store(), Clock()
    lim = limiter(LimitRules(sessions=2), store, clock)

    async def run() -> None:
        for sid in ("s1", "s2"):
            refusal, pending = await lim.admit_session("p")
            assert refusal is None and pending is not None
            lim.session_opened(sid, "p")
            await lim.settle("p", pending, sid)
        refusal, pending = await lim.admit_session("p")
        assert refusal is not None and refusal.limit == "sessions" and pending is None
        assert (await lim.admit_session("q"))[0] is None, "another principal is not refused"
        await lim.renew_sessions({"s1"})  # s2 ended (idle, DELETE): its place goes back
        key = RedisKeys("t").limit("sessions", "p")
        assert store.holdings[key] == {"s1"}
        assert (await lim.admit_session("p"))[0] is None

    asyncio.run(run())


def test_with_redis_down_a_replica_still_holds_the_cap_for_its_own_sessions() -> None:
    store, clock = Store(), Clock()
    lim = limiter(LimitRules(sessions=2), store, clock)
    store.fail = TimeoutError()
    lim.session_opened("s1", "p")
    lim.session_opened("s2", "p")

    async def run() -> None:
        refusal, _ = await lim.admit_session("p")
        assert refusal is not None, "two sessions here: the cap holds without Redis"
        refusal, pending = await lim.admit_session("q")
        assert refusal is None and pending is None, "failed open, counted"

    asyncio.run(run())


def test_listen_streams_hold_places_fleet_wide_given_back_when_each_ends() -> None:
    store, clock = Store(), Clock()
    lim = limiter(LimitRules(listen=2), store, clock)
    key = RedisKeys("t").limit("listen", "p")

    async def run() -> None:
        places = []
        for _ in range(2):
            refusal, place = await lim.admit_listen("p")
            assert refusal is None and place is not None
            places.append(place)
        refusal, place = await lim.admit_listen("p")
        assert refusal is not None and refusal.limit == "listen" and place is None
        assert refusal.retry_seconds >= 1 and "2 listen" in refusal.message
        assert (await lim.admit_listen("q"))[0] is None, "another principal is not refused"
        await lim.release_listen(places[0])
        assert store.holdings[key] == {places[1]}
        refusal, again = await lim.admit_listen("p")
        assert refusal is None and again is not None
        await lim.renew_sessions(set())
        assert store.holdings[key] == {places[1], again}, "open streams' places are renewed"

    asyncio.run(run())


def test_listen_streams_past_the_cap_of_other_replicas_are_refused_here() -> None:
    """The count is fleet-wide: places another replica holds count here too."""
    store, clock = Store(), Clock()
    lim = limiter(LimitRules(listen=1), store, clock)
    store.holdings[RedisKeys("t").limit("listen", "p")] = {"listen-elsewhere"}

    async def run() -> None:
        refusal, place = await lim.admit_listen("p")
        assert refusal is not None and place is None

    asyncio.run(run())


def test_with_redis_down_listen_places_are_counted_here_and_no_limit_holds_nothing() -> None:
    store, clock = Store(), Clock()
    lim = limiter(LimitRules(listen=1, principals={"vip": PrincipalRule(listen=0)}), store, clock)
    store.fail = TimeoutError()

    async def run() -> None:
        refusal, place = await lim.admit_listen("p")
        assert refusal is None and place is not None, "failed open, counted here"
        refusal, _ = await lim.admit_listen("p")
        assert refusal is not None, "one stream here: the cap holds without Redis"
        await lim.release_listen(place)
        assert (await lim.admit_listen("vip")) == (None, None)

    asyncio.run(run())


def test_the_listen_limit_is_read_from_the_file_and_per_principal() -> None:
    rules = parse_rules({"listen": 4, "principals": {"p1": {"listen": 40}}}, BASE)
    assert rules.listen_for("p1") == 40 and rules.listen_for("p2") == 4 and rules.any
    with pytest.raises(RulesError, match="listen: must be a whole number"):
        parse_rules({"listen": 1.5}, BASE)


# --- the replica's gate: who a round counts against, and the round from the lease ------


def test_the_gate_counts_each_round_against_principal_of_its_request_remembered_or_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Peers, forwarded chains and tokens in turn, past the gate's memory of addresses:
    every round is counted against what :func:`principal_of` makes of it."""
    from mcp.server.auth.provider import AccessToken

    from mcpfleet.limits import CURRENT_PRINCIPAL
    from mcpfleet.replica import limitgate

    monkeypatch.setattr(limitgate, "MAX_ADDRESS_PRINCIPALS", 4)
    seen: list[str | None] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(CURRENT_PRINCIPAL.get())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    store, clock = Store(), Clock()
    gate = limitgate.LimitGate(app, limiter(LimitRules(rounds=Rate(1000, 2000)), store, clock))

    class User:
        def __init__(self, subject: str) -> None:
            self.access_token = AccessToken(token="t", client_id="c", scopes=[], subject=subject)

    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {}})
    requests: list[dict[str, Any]] = []
    for i in range(12):
        headers = [(b"x-forwarded-for", f"203.0.113.{i % 5}, 10.0.0.{i % 3}".encode())]
        if i % 4 == 0:
            headers.append((b"x-forwarded-for", b"198.51.100.7"))
        scope = {"type": "http", "method": "POST", "path": "/mcp", "headers": headers}
        scope["client"] = (f"10.1.0.{i % 2}", 4000)
        if i % 6 == 5:
            scope["user"] = User(f"user-{i}")
        requests.append(scope)

    async def receive() -> Any:
        return {"type": "http.request", "body": body.encode(), "more_body": False}

    async def send(message: Any) -> None: ...

    async def run() -> None:
        for scope in requests * 2:
            await gate(scope, receive, send)

    asyncio.run(run())
    assert seen == [principal_of(scope, 1) for scope in requests * 2]
    assert len(set(seen)) > 5 and len(gate._principals) <= 4


def test_a_round_from_the_lease_is_taken_without_a_coroutine_and_round_decides_the_rest() -> None:
    store, clock = Store(), Clock()
    lim = limiter(LimitRules(rounds=Rate(50, 100)), store, clock)
    assert lim.round_from_lease("p") is False, "no lease held yet"

    async def run() -> None:
        assert await lim.round("p") is None  # a lease of 5, one round of it taken
        assert [lim.round_from_lease("p") for _ in range(4)] == [True] * 4
        assert lim.round_from_lease("p") is False, "spent: the next is on its way"
        await asyncio.sleep(0)
        assert lim.round_from_lease("p") is True and store.calls == 2
        clock.now += LEASE_LIFE
        assert lim.round_from_lease("p") is False, "lapsed"

    asyncio.run(run())
    lim.set_rules(LimitRules(rounds=Rate(50, 100), tools={"slow": Rate(1, 1)}))
    assert lim.round_from_lease("p") is False, "rates per tool: round decides"
    lim.set_rules(LimitRules(rounds=Rate(0, 0)))
    assert lim.round_from_lease("p") is True, "no rate"


def test_the_gate_takes_the_body_the_response_mode_choice_left_and_reads_nothing() -> None:
    """A body in the scope (:data:`mcpfleet.replica.respmode.BODY`) decides the round, and
    the app behind gets the ``receive`` the gate was given, unread; without one the gate
    reads the body itself and hands it on as it came."""
    from mcpfleet.replica import limitgate
    from mcpfleet.replica.respmode import BODY

    request = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "t"}}
    wire = json.dumps(request).encode()
    passed: list[tuple[Any, bytes]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        read_before = len(reads)
        message = await receive()
        passed.append((receive, read_before, message.get("body", b"")))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    clock = Clock()
    rules = LimitRules(rounds=Rate(1, 1))  # one round, then refused
    lim = Limiter(rules, RedisKeys("t"), clock=clock)
    lim.attach(Bucket(clock))
    gate = limitgate.LimitGate(app, lim)
    reads: list[bytes] = []

    async def receive() -> Any:
        reads.append(wire)
        return {"type": "http.request", "body": wire, "more_body": False}

    statuses: list[int] = []

    async def send(message: Any) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    def scope(body: bytes | None) -> dict[str, Any]:
        each: dict[str, Any] = {"type": "http", "method": "POST", "path": "/mcp"}
        each |= {"headers": [], "client": ("10.1.0.1", 4000)}
        if body is not None:
            each[BODY] = body
        return each

    async def run() -> None:
        await gate(scope(wire), receive, send)
        # A notification in the scope is not a round: passed on, the rate untouched.
        await gate(scope(b'{"jsonrpc":"2.0","method":"notifications/initialized"}'), receive, send)
        await gate(scope(wire), receive, send)  # over the rate: refused from the scope's body
        await gate(scope(None), receive, send)  # none in the scope: read here, refused too

    asyncio.run(run())
    assert statuses == [200, 200, 429, 429]
    # The app got the client's own receive, nothing read before it: the gate read nothing.
    assert passed == [(receive, 0, wire), (receive, 1, wire)]
    assert len(reads) == 3, "two reads by the app, one by the gate (no body in the scope)"


def test_a_replicas_gate_reads_no_body_the_response_mode_choice_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the replica's whole stack (limits at their defaults, in memory without
    Redis), a modern round's body is read once, in front; the gate behind FastMCP's own
    middleware finds it in the same scope."""
    from starlette.testclient import TestClient

    from fleetkit.clients.wire import MODERN_META, initialize_body
    from mcpfleet.config import ReplicaConfig
    from mcpfleet.keys.files import write_ring
    from mcpfleet.keys.ring import KeyRing
    from mcpfleet.replica import limitgate
    from mcpfleet.replica.process import build_asgi
    from mcpfleet.replica.runtime import Replica

    read_here: list[int] = []
    original = limitgate._read_body

    async def counted(receive: Any) -> Any:
        read_here.append(1)
        return await original(receive)

    monkeypatch.setattr(limitgate, "_read_body", counted)
    write_ring(tmp_path / "keys", KeyRing.generate())
    replica = Replica(ReplicaConfig(keys_dir=tmp_path / "keys"), KeyRing.generate())
    assert replica.limiter.rules.any, "limits on, as a user gets them"
    headers = {
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": "2026-07-28",
        "mcp-method": "tools/list",
    }
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": MODERN_META}}
    with TestClient(build_asgi(replica)) as http:
        answer = http.post("/mcp", json=body, headers=headers)
        assert answer.status_code == 200, answer.text
        assert "tools" in answer.json()["result"]
        assert read_here == []
        handshake = {**headers, "mcp-protocol-version": "2025-11-25", "mcp-method": "initialize"}
        assert http.post("/mcp", content=initialize_body("t"), headers=handshake).status_code == 200
        assert read_here == [1], "a handshake request, not read in front: the gate reads it"
