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
    """A stand-in for Redis with ``eval``: a count of calls, a bucket per key, able to fail."""

    def __init__(self) -> None:
        self.calls = 0
        self.fail: BaseException | None = None
        self.granted: dict[str, int] = {}
        self.room = 1000
        self.holdings: dict[str, set[str]] = {}

    async def eval(self, script: str, numkeys: int, key: str, *args: Any) -> Any:
        self.calls += 1
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
            return [0, 250_000]
        self.granted[key] = self.granted.get(key, 0) + n
        return [n, 0]


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
            return [0, int(tat + interval - burst * interval - now)]
        n = min(room, want)
        self.tat[key] = tat + n * interval
        return [n, 0]


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

    class Observer:
        def limited(self, limit: str, tool: str) -> None: ...

        def failed(self, limit: str) -> None:
            failures.append(limit)

    lim = Limiter(LimitRules(rounds=Rate(1, 3)), RedisKeys("t"), observer=Observer(), clock=clock)
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
