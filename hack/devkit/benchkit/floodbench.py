"""``make bench``'s flood rows: one principal's refused rounds beside another's latency.

Two replicas of the JWT app of deploy/own-app (FastMCP's ``RemoteAuthProvider``
with a ``JWTVerifier``: every request that reaches the app has its token
checked) behind a router, started twice side by side: with the replicas'
default limits (50 rounds/s, burst 100 per principal) and with the limits off
(``--limit-rounds 0``). On each, bob sends a modern ``whoami`` round every
50 ms, alone, then while alice floods the same tool from 16 threads (the
flood's client on the same cores as the fleet). Printed: bob's p50/p99 alone
and during the flood, their ratio, and alice's answers: served, refused by a
replica, refused by the router from its memory of the replica's refusal
(mcpfleet.router.refused).

Nothing here asserts: a benchmark reports, tests prove behaviour
(tests/fleet/test_limits_refused.py asserts the same flood loosely).

    PYTHONPATH=hack/devkit .venv/bin/python -m benchkit.floodbench [--quick]
"""

from __future__ import annotations

import multiprocessing
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import httpx

from benchkit.table import Row, part_main
from fleetkit.clients.jwtkit import TokenIssuer
from fleetkit.clients.wire import modern_call
from fleetkit.fleet import ProcessFleet, own_app_fleet

#: bob's pace: one round every this many seconds (an Event never set: a timed pause).
BOB_EVERY = 0.05
_PACE = threading.Event()
FLOOD_THREADS = 16
#: alice's answers, by what answered: served, refused by a replica, refused by the router.
SERVED, REPLICA_429, ROUTER_429 = "served", "429 by a replica", "429 by the router"


class EventLike(Protocol):
    def is_set(self) -> bool: ...
    def set(self) -> None: ...


@dataclass
class Flood:
    """What one flood measured: bob's round times (ms), and alice's answers by kind."""

    alone: list[float] = field(default_factory=list)
    during: list[float] = field(default_factory=list)
    bob_statuses: Counter[int] = field(default_factory=Counter)
    alice: Counter[str] = field(default_factory=Counter)

    @staticmethod
    def p(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    @property
    def ratio(self) -> float:
        return statistics.median(self.during) / statistics.median(self.alone)

    def summary(self) -> str:
        return (
            f"bob p50/p99 alone {self.p(self.alone, 0.5):.1f}/{self.p(self.alone, 0.99):.1f} ms,"
            f" during alice's flood {self.p(self.during, 0.5):.1f}/"
            f"{self.p(self.during, 0.99):.1f} ms (p50 x{self.ratio:.2f});"
            f" alice's answers {dict(sorted(self.alice.items()))}"
        )


def bob_rounds(url: str, token: str, count: int, out: list[float], statuses: Counter[int]) -> None:
    """bob's ``count`` rounds, one every :data:`BOB_EVERY` s: their times (ms) to ``out``."""
    auth = {"authorization": f"Bearer {token}"}
    with httpx.Client(timeout=10) as http:
        for _ in range(count):
            started = time.perf_counter()
            answer = modern_call(url, "whoami", {}, client=http, headers=auth)
            took = time.perf_counter() - started
            out.append(took * 1000)
            statuses[answer.status] += 1
            _PACE.wait(max(0.0, BOB_EVERY - took))


def flood(url: str, alice: str, bob: str, *, rounds: int = 40) -> Flood:
    """bob's ``rounds`` alone, then again while alice floods from 16 threads (in a
    process of their own, as another client would: not in bob's interpreter)."""
    result = Flood()
    bob_rounds(url, bob, 10, [], Counter())  # warm connections and caches
    bob_rounds(url, bob, rounds, result.alone, result.bob_statuses)
    ctx = multiprocessing.get_context("spawn")
    started, stop = ctx.Event(), ctx.Event()
    counts: multiprocessing.Queue[dict[str, int]] = ctx.Queue()
    # The token goes through the process's pipe, never its arguments.
    flooder = ctx.Process(target=_flooder, args=(url, alice, started, stop, counts))
    flooder.start()
    try:
        if not started.wait(60):
            raise RuntimeError("alice's flood did not start within 60 s")
        bob_rounds(url, bob, 5, [], Counter())  # the flood under way
        bob_rounds(url, bob, rounds, result.during, result.bob_statuses)
    finally:
        stop.set()
        try:
            result.alice.update(counts.get(timeout=60))
        finally:
            flooder.join(30)
            if flooder.is_alive():
                flooder.kill()
    return result


def _flooder(
    url: str,
    token: str,
    started: EventLike,
    stop: EventLike,
    counts: multiprocessing.Queue[dict[str, int]],
) -> None:
    """alice's 16 threads, each sending ``whoami`` rounds back to back until ``stop``;
    her answers by kind to ``counts``."""
    lock = threading.Lock()
    total: Counter[str] = Counter()
    auth = {"authorization": f"Bearer {token}"}

    def flooding() -> None:
        seen: Counter[str] = Counter()
        with httpx.Client(timeout=10) as http:
            while not stop.is_set():
                answer = modern_call(url, "whoami", {}, client=http, headers=auth)
                if answer.status != 429:
                    seen[SERVED if answer.status == 200 else str(answer.status)] += 1
                else:
                    seen[ROUTER_429 if answer.replica is None else REPLICA_429] += 1
        with lock:
            total.update(seen)

    threads = [threading.Thread(target=flooding) for _ in range(FLOOD_THREADS)]
    for t in threads:
        t.start()
    started.set()
    for t in threads:
        t.join()
    counts.put(dict(total))


#: The replicas' default limits, given explicitly (a test fleet's are off by default).
DEFAULT_LIMITS = ("--limit-sessions", "100", "--limit-rounds", "50", "--limit-burst", "100")


@contextmanager
def jwt_fleet(
    workdir: Path,
    issuer: TokenIssuer,
    replica_args: tuple[str, ...] = (),
    router_args: tuple[str, ...] = (),
) -> Iterator[ProcessFleet]:
    """:func:`fleetkit.fleet.own_app_fleet` with the replicas' default limits, then
    ``replica_args``."""
    with own_app_fleet(
        workdir, issuer, replica_args=(*DEFAULT_LIMITS, *replica_args), router_args=router_args
    ) as lf:
        yield lf


#: The two fleets, side by side: the replicas' default limits, and the rounds rate off.
CONFIGS = {"limits on (50/s, burst 100)": (), "limits off": ("--limit-rounds", "0")}


def flood_rows(quick: bool) -> list[Row]:
    rounds = 20 if quick else 60
    issuer = TokenIssuer()
    rows: list[Row] = []
    for name, args in CONFIGS.items():
        with (
            tempfile.TemporaryDirectory(prefix="floodbench-") as tmp,
            jwt_fleet(Path(tmp), issuer, args) as lf,
        ):
            got = flood(lf.url, issuer.token("alice"), issuer.token("bob"), rounds=rounds)
        alone, during = got.p(got.alone, 0.5), got.p(got.during, 0.5)
        rows.append(
            (
                f"bob's round p50 alone / during a 16-thread flood, {name}",
                f"{alone:.1f} / {during:.1f} ms",
                f"x{got.ratio:.2f}",
                f"p99 {got.p(got.alone, 0.99):.1f} / {got.p(got.during, 0.99):.1f} ms;"
                f" bob's statuses {dict(got.bob_statuses)}",
            )
        )
        total = sum(got.alice.values()) or 1
        rows.append(
            (
                f"alice's flood, {name}",
                f"{total} rounds",
                f"{got.alice[ROUTER_429] / total:.0%} refused at the router",
                ", ".join(f"{k} {v}" for k, v in sorted(got.alice.items())),
            )
        )
    return rows


if __name__ == "__main__":
    part_main("flood", __doc__, flood_rows, "20 rounds of bob's per phase (a smoke run)")
