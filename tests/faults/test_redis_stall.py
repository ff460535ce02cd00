"""Redis stalled (SIGSTOP), refusing connections, restarted empty: every answer bounded.

Three small fleets (one replica, one router, their own Redis, the once test
app) run the three stalls at once, so the 60 s stall sets the wall time of all
three. During a stall a client sends, again and again: a once-flow's final
round, a handshake ``initialize`` through the router, a request on a session
the router has cached, and one on a session id it has never seen. Each must
be answered within the documented bound: the Redis deadline
(``--redis-deadline``, 1 s) plus the work of the replica. After ``SIGCONT``
the same final round is sent again until it completes: it must run ``finish``
exactly once, within seconds (the claim a stalled Redis applied late is
released, or expires with its short lease). The 3 s fleet then goes on with
Redis refusing connections and Redis restarted empty.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import redis

from fleetkit.apps.onceapp import EFFECTS_ENV
from fleetkit.clients.wire import initialize_body
from fleetkit.faulttable import FaultTable
from fleetkit.fleet import FleetOptions, ProcessFleet, require_redis
from mcpfleet.contract import SESSION_HEADER, RedisKeys
from mcpfleet.dev.fleet import LocalFleet
from mcpfleet.dev.wait import wait_for
from mcpfleet.redisconn import DEFAULT_DEADLINE

from .oncewire import ask, charged, count, final, retryable

#: What the docs promise: the Redis deadline plus the replica's own work.
ANSWER_BOUND = DEFAULT_DEADLINE + 1.0
#: A resend after Redis resumes completes within this (a late claim's lease is 5 s).
RECOVERY_BOUND = 10.0
STALLS = (3.0, 15.0, 60.0)
HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
PING = '{"jsonrpc":"2.0","id":7,"method":"ping"}'


@dataclass
class Figures:
    """What one fault did, counted by the scenario; checked and tabled by the test."""

    attempts: int = 0
    worst: float = 0.0
    slow: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    recovered: float = 0.0
    effects: int = 0
    notes: str = ""

    def timed(self, what: str, call: Callable[[], bool]) -> None:
        """Send one request; count it, its time, and whether its answer is the documented one."""
        start = time.monotonic()
        try:
            ok = call()
        except httpx.HTTPError as exc:
            ok = False
            what = f"{what} ({type(exc).__name__})"
        took = time.monotonic() - start
        self.attempts += 1
        self.worst = max(self.worst, took)
        if took > ANSWER_BOUND:
            self.slow.append(f"{what}: {took:.2f}s")
        if not ok:
            self.wrong.append(what)


def initialize(url: str) -> str | None:
    resp = httpx.post(url, content=initialize_body("faults"), headers=HEADERS, timeout=30)
    return resp.headers.get(SESSION_HEADER) if resp.status_code == 200 else None


def ping(url: str, session: str) -> int:
    resp = httpx.post(url, content=PING, headers={**HEADERS, SESSION_HEADER: session}, timeout=30)
    return resp.status_code


def traffic_round(lf: LocalFleet, fig: Figures, order: str, state: str, cached: str) -> None:
    """One of each request a client may send while Redis does not answer."""
    fig.timed("final round", lambda: retryable(final(lf.url, order, state)))
    fig.timed("initialize", lambda: initialize(lf.url) is not None)
    fig.timed("cached session", lambda: ping(lf.url, cached) == 200)
    # Redis cannot say whether it exists: the retryable 503, or 404 if known unknown.
    fig.timed("uncached session", lambda: ping(lf.url, uuid.uuid4().hex) in (503, 404))


def resend_until_done(lf: LocalFleet, order: str, state: str, since: float) -> float:
    wait_for(
        lambda: charged(final(lf.url, order, state), order),
        timeout=RECOVERY_BOUND + 20,
        interval=0.25,
        what=f"the final round of {order} to complete",
    )
    return time.monotonic() - since


def stall(lf: LocalFleet, effects: Path, seconds: float) -> Figures:
    fig = Figures()
    order = f"stall-{seconds:g}"
    state = ask(lf.url, order)
    cached = initialize(lf.url)
    assert cached is not None
    assert lf.redis is not None and lf.redis.popen is not None
    pid = lf.redis.popen.pid
    os.kill(pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        while True:
            traffic_round(lf, fig, order, state, cached)
            if time.monotonic() - stopped > seconds - 2 * ANSWER_BOUND:
                break
    finally:
        os.kill(pid, signal.SIGCONT)
    resumed = time.monotonic()
    fig.recovered = resend_until_done(lf, order, state, resumed)
    fig.effects = count(effects, order)
    return fig


def refused_then_empty(lf: ProcessFleet, effects: Path) -> tuple[Figures, Figures]:
    """Redis stopped (connections refused), then started again empty."""
    refused = Figures()
    order = "refused"
    state = ask(lf.url, order)
    cached = initialize(lf.url)
    assert cached is not None
    lf.stop_redis()
    try:
        for _ in range(3):
            traffic_round(lf, refused, order, state, cached)
    finally:
        lf.start_redis()
    back = time.monotonic()
    refused.recovered = resend_until_done(lf, order, state, back)
    refused.effects = count(effects, order)

    # Restarted empty: the documented at-least-once case. A finished flow's record
    # is gone, so its replay runs finish again; routes come back from the replica
    # (and the router) that know them.
    empty = Figures()
    order = "empty"
    state = ask(lf.url, order)
    assert charged(final(lf.url, order, state), order)
    session = initialize(lf.url)
    assert session is not None
    lf.stop_redis()
    lf.start_redis()
    back = time.monotonic()
    keys = RedisKeys(lf.fleet)
    client = redis.Redis(host="127.0.0.1", port=lf.redis_port, socket_timeout=2)
    try:
        wait_for(
            lambda: client.get(keys.session(session)) is not None,
            timeout=15,
            what="the session's route to be written back",
            retry_on=(redis.RedisError,),
        )
    finally:
        client.close()
    empty.recovered = time.monotonic() - back
    empty.timed("session after restart", lambda: ping(lf.url, session) == 200)
    replay = final(lf.url, order, state)
    empty.attempts += 1
    empty.effects = count(effects, order)
    empty.notes = (
        f"at-least-once: the replay after the restart ran finish again "
        f"({empty.effects} runs, replay {'charged' if charged(replay, order) else 'not charged'})"
    )
    return refused, empty


@pytest.fixture
def fleets(tmp_path: Path) -> Iterator[list[tuple[ProcessFleet, Path]]]:
    require_redis()
    made: list[tuple[ProcessFleet, Path]] = []
    for seconds in STALLS:
        effects = tmp_path / f"effects-{seconds:g}.log"
        options = FleetOptions(
            app="fleetkit.apps.onceapp:app",
            replicas=1,
            fleet=f"stall{int(seconds)}",
            env={EFFECTS_ENV: str(effects)},
        )
        lf = ProcessFleet(tmp_path / f"stall-{seconds:g}", **options.fleet_fields())
        made.append((lf, effects))
    try:
        with ThreadPoolExecutor(len(made)) as pool:
            list(pool.map(lambda pair: pair[0].start(), made))
        yield made
    finally:
        for lf, _ in made:
            lf.stop()


@pytest.mark.timeout(240)
def test_redis_stalls_answer_within_the_deadline_and_a_resend_completes_once(
    fleets: list[tuple[ProcessFleet, Path]],
    fault_table: FaultTable,
    watch_fleet: list[LocalFleet],
) -> None:
    watch_fleet.extend(lf for lf, _ in fleets)

    def run(index: int) -> list[tuple[str, Figures]]:
        lf, effects = fleets[index]
        seconds = STALLS[index]
        out = [(f"Redis SIGSTOP {seconds:g}s", stall(lf, effects, seconds))]
        if index == 0:
            refused, empty = refused_then_empty(lf, effects)
            out += [("Redis refusing connections", refused), ("Redis restarted empty", empty)]
        return out

    with ThreadPoolExecutor(len(fleets)) as pool:
        results = [item for chunk in pool.map(run, range(len(fleets))) for item in chunk]

    for fault, fig in results:
        row = fault_table.row(fault)
        row.attempts = fig.attempts
        row.worst_seconds = fig.worst
        row.lost = len(fig.wrong)
        row.double_runs = max(0, fig.effects - 1) if fault != "Redis restarted empty" else 0
        row.notes = fig.notes or f"resend completed {fig.recovered:.2f}s after Redis returned"
        print(f"{fault}: {fig.attempts} requests, worst {fig.worst:.2f}s, {row.notes}")
    for fault, fig in results:
        assert not fig.slow, f"{fault}: answers past {ANSWER_BOUND}s: {fig.slow}"
        assert not fig.wrong, f"{fault}: undocumented answers: {fig.wrong}"
        if fault == "Redis restarted empty":
            assert fig.recovered < 15
            continue
        assert fig.effects == 1, f"{fault}: finish ran {fig.effects} times"
        assert fig.recovered < RECOVERY_BOUND, f"{fault}: resend took {fig.recovered:.1f}s"
