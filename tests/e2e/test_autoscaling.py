"""The elastic fleet on kind: KEDA and a real HPA scale the replicas on the fleet's own metrics.

What docs/autoscaling.md tells a user to do, for real: KEDA (built here from the
pin in hack/tools/keda) and a Prometheus scraping the replicas, then the chart
with ``server.autoscaling.mcp`` on. Its ScaledObject's Prometheus triggers read
``mcpfleet_replica_sessions`` and ``mcpfleet_listen_streams``; KEDA's metrics
API feeds the HorizontalPodAutoscaler KEDA made; the HPA scales the Deployment;
the operator keeps each replica Pod's ``controller.kubernetes.io/pod-deletion-cost``
at what it holds, so the ReplicaSet removes the emptiest.

The tests run in order on one release: idle handshake sessions ramp the fleet out
to ``maxReplicas``; a scale-in keeps every session (re-homing on) and a paused
elicitation, which completes once after it; listen streams (no CPU at all) scale
it out and back. A watcher records every replica Pod's deletion cost each half
second, so each removal is checked against the costs the ReplicaSet saw. The last
test prints the table: signal, replicas before and after, the times, the rounds
failed (a modern-era asking round every half second throughout) and the sessions
lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from fleetkit.clients.listen import Listener, listening
from fleetkit.clients.rawsession import RawSession
from fleetkit.clients.wire import modern_call
from fleetkit.cluster import autoscaler
from fleetkit.cluster.chartfleet import ChartFleet, ready
from fleetkit.cluster.controlplane import wait_for
from fleetkit.cluster.providers import Cluster
from mcpfleet_examples.app import WEEKLY_REPORT

pytestmark = pytest.mark.timeout(1500)

NAMESPACE = "mcpfleet-autoscale"
MIN_REPLICAS, MAX_REPLICAS = 2, 4
#: Each replica's session cap at the routers; the sessions target is 40% of it.
SESSION_CAP = 10
SESSION_FRACTION = 0.4
SESSION_TARGET = SESSION_CAP * SESSION_FRACTION
#: Each replica's listen streams; the listen target is half of them.
LISTEN_STREAMS = 4
LISTEN_FRACTION = 0.5
LISTEN_TARGET = LISTEN_STREAMS * LISTEN_FRACTION
#: KEDA reads Prometheus every 5 s; the HPA acts every 15 s (the controller
#: manager's default); a new replica is Ready a few seconds after it starts.
POLLING = 5
#: A scale-out completes within this many seconds of the signal going over target.
SCALE_OUT_BOUND = 90.0
#: The scale-in waits 20 s of lower signal, then removes one Pod each 10 s.
SCALE_DOWN_WINDOW = 20
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"

VALUES: dict[str, Any] = {
    "server": {
        "listenStreams": LISTEN_STREAMS,
        "autoscaling": {
            "enabled": True,
            "minReplicas": MIN_REPLICAS,
            "maxReplicas": MAX_REPLICAS,
            "behavior": {
                "scaleUp": {"stabilizationWindowSeconds": 0},
                "scaleDown": {
                    "stabilizationWindowSeconds": SCALE_DOWN_WINDOW,
                    "policies": [{"type": "Pods", "value": 1, "periodSeconds": 10}],
                },
            },
            "mcp": {
                "enabled": True,
                "sessionCapFraction": SESSION_FRACTION,
                "roundsInFlight": 0,
                "listenStreamsFraction": LISTEN_FRACTION,
                "tasksRunningFraction": 0,
                "tasksQueuedPerReplica": 0,
                "refusedInitializePerSecond": 0,
                "cpu": False,
                "pollingInterval": POLLING,
            },
        },
    },
    "router": {"sessionCap": SESSION_CAP, "rehomeSessions": True},
}


# --------------------------------------------------------------------------- what the fleet did


@dataclass
class Removal:
    """A replica Pod the ReplicaSet chose to delete, and the costs it chose among."""

    pod: str
    at: float
    cost: int
    others: dict[str, int]


@dataclass
class Watcher:
    """The release's replica Pods every half second: Ready ones, deletion costs, removals."""

    release: ChartFleet
    costs: dict[str, int] = field(default_factory=dict)
    ready_pods: list[str] = field(default_factory=list)
    ready_at: dict[int, float] = field(default_factory=dict)
    #: (when, how many Ready) at each change of the count.
    history: list[tuple[float, int]] = field(default_factory=list)
    removals: list[Removal] = field(default_factory=list)
    terminating: set[str] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self) -> None:
        while not self._stop.wait(0.5):
            with contextlib.suppress(Exception):
                self._look()

    def _look(self) -> None:
        pods = self.release.pods("server")
        now = time.monotonic()
        with self._lock:
            live = {p.metadata.name: p for p in pods}
            for name, pod in live.items():
                if pod.metadata.deletion_timestamp is not None and name not in self.terminating:
                    self.terminating.add(name)
                    # What the ReplicaSet saw: the costs of the last look before it deleted.
                    before = dict(self.costs)
                    self.removals.append(
                        Removal(
                            name,
                            now,
                            before.get(name, _cost(pod)),
                            {n: c for n, c in before.items() if n != name and n in live},
                        )
                    )
            self.costs = {
                name: _cost(pod)
                for name, pod in live.items()
                if pod.metadata.deletion_timestamp is None
            }
            self.ready_pods = sorted(n for n, p in live.items() if ready(p))
            count = len(self.ready_pods)
            if not self.history or self.history[-1][1] != count:
                self.history.append((now, count))
            if not any(p.metadata.deletion_timestamp for p in pods):
                self.ready_at.setdefault(count, now)
            for other in list(self.ready_at):
                if other != count:
                    self.ready_at.pop(other)

    def ready_count(self) -> int:
        with self._lock:
            return len(self.ready_pods)

    def settled_at(self, replicas: int, timeout: float) -> float:
        """When exactly ``replicas`` were Ready, none terminating (waits for it)."""
        return float(
            wait_for(
                lambda: self.ready_at.get(replicas),
                timeout=timeout,
                interval=0.5,
                what=f"{replicas} Ready replicas, none terminating",
            )
        )

    def first_above(self, replicas: int, since: float) -> float | None:
        """When more than ``replicas`` were first Ready after ``since``."""
        with self._lock:
            return next((t for t, n in self.history if t >= since and n > replicas), None)

    def removals_since(self, since: float) -> list[Removal]:
        with self._lock:
            return [r for r in self.removals if r.at >= since]

    def stop(self) -> None:
        self._stop.set()


def _cost(pod: Any) -> int:
    return int((pod.metadata.annotations or {}).get(DELETION_COST, "0"))


@dataclass
class Prober:
    """A modern-era asking round every half second (any replica may answer it)."""

    url: str
    sent: int = 0
    failed: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        with httpx.Client(timeout=10) as http:
            while not self._stop.wait(0.5):
                self.sent += 1
                try:
                    answer = modern_call(
                        self.url, "book_flight", {"destination": "Oslo"}, client=http
                    )
                except httpx.HTTPError as exc:
                    self.failed.append(f"{type(exc).__name__}: {exc}")
                    continue
                if answer.status != 200 or answer.result.get("resultType") != "input_required":
                    self.failed.append(f"{answer.status}: {answer.body}")

    def stop(self) -> None:
        self._stop.set()


@dataclass
class Row:
    signal: str
    before: int
    after: int
    out_s: float
    in_s: float
    rounds_failed: int
    sessions_lost: int


@dataclass
class Autoscaled:
    release: ChartFleet
    watcher: Watcher
    prober: Prober
    rows: list[Row] = field(default_factory=list)
    #: What the first test leaves for the second: sessions kept through the scale-in.
    sessions: list[RawSession] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.release.url

    def prometheus(self, query: str) -> float:
        host, port = self.release.cluster.reach(
            autoscaler.PROMETHEUS_NAMESPACE, autoscaler.PROMETHEUS_SERVICE, 9090
        )
        resp = httpx.get(f"http://{host}:{port}/api/v1/query", params={"query": query}, timeout=10)
        resp.raise_for_status()
        result = resp.json()["data"]["result"]
        return sum(float(r["value"][1]) for r in result)


@pytest.fixture(scope="module")
def fleet(e2e_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Autoscaled]:
    if e2e_cluster.provider != "kind":
        pytest.skip("KEDA and its Prometheus are loaded into kind's nodes: the kind provider only")
    built = autoscaler.images()
    release = ChartFleet(
        e2e_cluster, NAMESPACE, tmp_path_factory.mktemp("autoscale"), values=VALUES
    )
    try:
        autoscaler.install_keda(e2e_cluster, built)
        autoscaler.install_prometheus(e2e_cluster, built, [(NAMESPACE, release.fullname)])
        release.install()
        watcher = Watcher(release)
        prober = Prober(release.url)
        threads = [threading.Thread(target=t.run, daemon=True) for t in (watcher, prober)]
        for t in threads:
            t.start()
        try:
            yield Autoscaled(release, watcher, prober)
        finally:
            watcher.stop()
            prober.stop()
            for t in threads:
                t.join(15)
    finally:
        with contextlib.suppress(Exception):
            release.uninstall()
        autoscaler.uninstall(e2e_cluster, built)


def _check_removals(removals: list[Removal]) -> None:
    """Each removed Pod cost no more than any Pod left beside it."""
    for r in removals:
        assert all(r.cost <= c for c in r.others.values()), (
            f"{r.pod} (cost {r.cost}) removed while {r.others} stayed"
        )


async def _open(url: str, http: httpx.AsyncClient) -> tuple[RawSession | None, int]:
    session = RawSession(url, http)
    try:
        await session.open("autoscale")
    except httpx.HTTPStatusError as exc:
        return None, exc.response.status_code
    return session, 200


async def _end(session: RawSession) -> None:
    resp = await session.http.delete(
        session.url,
        headers={"mcp-session-id": session.session, "mcp-protocol-version": "2025-11-25"},
    )
    assert resp.status_code in (200, 202, 204), resp.text


# --------------------------------------------------------------------------- the scenarios


def test_idle_sessions_scale_the_fleet_out_with_no_initialize_refused(fleet: Autoscaled) -> None:
    """One idle handshake session every 3 s, to 24: past 40% of the session cap per
    replica the HPA adds replicas, up to 4, before any replica is at its cap."""
    w = fleet.watcher
    w.settled_at(MIN_REPLICAS, timeout=300)
    failed_before = len(fleet.prober.failed)
    total, every = 24, 3.0

    async def ramp() -> tuple[list[RawSession], list[int], dict[int, float]]:
        sessions: list[RawSession] = []
        statuses: list[int] = []
        # When the sessions first went over target at each replica count.
        over: dict[int, float] = {}
        http = httpx.AsyncClient(timeout=30)
        for _ in range(total):
            session, status = await _open(fleet.url, http)
            statuses.append(status)
            if session is not None:
                sessions.append(session)
            replicas = w.ready_count()
            if replicas < MAX_REPLICAS and len(sessions) > SESSION_TARGET * replicas * 1.1:
                over.setdefault(replicas, time.monotonic())
            await asyncio.sleep(every)
        # The sessions stay open; the next test talks on them with a client of its own.
        await http.aclose()
        return sessions, statuses, over

    sessions, statuses, over = asyncio.run(ramp())
    fleet.sessions = sessions
    start = min(over.values())
    reached = w.settled_at(MAX_REPLICAS, timeout=SCALE_OUT_BOUND + 60)
    steps = {
        f"{n}->{n + 1}": round((w.first_above(n, t) or reached) - t, 1)
        for n, t in sorted(over.items())
    }
    print(
        f"\nsessions ramp: {total} sessions, one each {every} s;"
        f" seconds from over target to scaled out: {steps}"
    )
    assert statuses == [200] * total, f"initialize refused: {statuses}"
    assert all(step <= SCALE_OUT_BOUND for step in steps.values()), steps
    fleet.rows.append(
        Row(
            "sessions (out)",
            MIN_REPLICAS,
            MAX_REPLICAS,
            round(reached - start, 1),
            0.0,
            len(fleet.prober.failed) - failed_before,
            0,
        )
    )


def test_a_scale_in_removes_the_emptiest_replicas_and_keeps_every_session(
    fleet: Autoscaled,
) -> None:
    """Sessions closed down to 8 (4 + 3 + 1 + 0 across the replicas, one of the 4
    paused in a handshake ``ctx.elicit()``): the HPA wants 2; the ReplicaSet removes
    the Pods that hold least, the 1 session is re-homed, and the elicitation answered
    after the scale-in completes its tool exactly once."""
    w = fleet.watcher
    sessions = fleet.sessions
    assert len(sessions) >= 20
    by_replica: dict[str, list[RawSession]] = {}
    for s in sessions:
        by_replica.setdefault(s.replica, []).append(s)
    assert len(by_replica) == MAX_REPLICAS, {r: len(v) for r, v in by_replica.items()}
    ranked = sorted(by_replica, key=lambda r: -len(by_replica[r]))
    keep = dict(zip(ranked, (4, 3, 1, 0), strict=True))
    kept = [s for r in ranked for s in by_replica[r][: keep[r]]]
    closing = [s for s in sessions if s not in kept]
    failed_before = len(fleet.prober.failed)
    purchases_before = fleet.prometheus(_FINAL_PURCHASES)

    async def scenario() -> tuple[list[int], list[dict[str, Any]], float, float]:
        http = httpx.AsyncClient(timeout=30)
        for s in sessions:
            s.http = http
        paused = await kept[0].start_elicitation(
            "confirm_purchase", {"item": "tea", "amount_eur": 3}
        )
        try:
            signal_low = time.monotonic()
            for s in closing:
                await _end(s)
            done = await asyncio.to_thread(w.settled_at, MIN_REPLICAS, 300.0)
            # The sessions kept, the re-homed one included, answer on their own ids.
            pings = [(await s.ping()).status_code for s in kept[1:]]
            answer = await kept[0].answer(paused.request_id, {"value": True})
            assert answer.status_code in (200, 202), answer.text
            results = await paused.finished(60)
        finally:
            await paused.aclose()
        for s in kept:
            await _end(s)
        await http.aclose()
        return pings, results, signal_low, done

    since = time.monotonic()
    pings, results, signal_low, done = asyncio.run(scenario())
    removals = w.removals_since(since)
    print(
        f"\nscale-in: kept {keep} sessions per replica; removed "
        + ", ".join(
            f"{r.pod} (cost {r.cost}, others {sorted(r.others.values())})" for r in removals
        )
        + f"; {done - signal_low:.1f} s from the sessions' close to {MIN_REPLICAS} replicas"
    )
    assert len(removals) == MAX_REPLICAS - MIN_REPLICAS, removals
    _check_removals(removals)
    assert {r.pod for r in removals} == {ranked[2], ranked[3]}
    lost = sum(1 for p in pings if p != 200)
    assert pings == [200] * (len(kept) - 1), pings
    assert len(results) == 1, results
    assert "Purchased tea" in str(results[0].get("result")), results
    wait_for(
        lambda: fleet.prometheus(_FINAL_PURCHASES) >= purchases_before + 1,
        timeout=30,
        interval=1,
        what="the purchase's final round in Prometheus",
    )
    time.sleep(2 * autoscaler.SCRAPE_SECONDS)
    assert fleet.prometheus(_FINAL_PURCHASES) == purchases_before + 1
    fleet.rows.append(
        Row(
            "sessions (in, 1 paused elicitation)",
            MAX_REPLICAS,
            MIN_REPLICAS,
            0.0,
            round(done - signal_low, 1),
            len(fleet.prober.failed) - failed_before,
            lost,
        )
    )


#: Final rounds of confirm_purchase on every replica that ever ran, removed ones too.
_FINAL_PURCHASES = (
    'sum(max_over_time(mcpfleet_rounds_total{component="confirm_purchase",kind="final"}[30m]))'
)


def test_listen_streams_scale_the_fleet_out_and_back(
    fleet: Autoscaled, capsys: pytest.CaptureFixture[str]
) -> None:
    """Listen streams use no CPU: 6 of them, one each 3 s, past half of
    ``--listen-streams`` per replica, add a replica; closed, it goes again."""
    w = fleet.watcher
    start_at = w.settled_at(MIN_REPLICAS, timeout=300)
    assert start_at
    failed_before = len(fleet.prober.failed)
    count = 6
    wanted = math.ceil(count / LISTEN_TARGET)

    async def scenario() -> tuple[list[Listener], float, float, float]:
        async with httpx.AsyncClient(timeout=30) as http, contextlib.AsyncExitStack() as stack:
            listeners: list[Listener] = []
            over = 0.0
            for i in range(count):
                listeners.append(
                    await stack.enter_async_context(
                        listening(http, fleet.url, 500 + i, resourceSubscriptions=[WEEKLY_REPORT])
                    )
                )
                if not over and len(listeners) > LISTEN_TARGET * MIN_REPLICAS * 1.1:
                    over = time.monotonic()
                await asyncio.sleep(3)
            out = await asyncio.to_thread(w.settled_at, wanted, SCALE_OUT_BOUND + 60)
            low = time.monotonic()
        back = await asyncio.to_thread(w.settled_at, MIN_REPLICAS, 300.0)
        return listeners, over, out - over, back - low

    since = time.monotonic()
    listeners, _, out_s, in_s = asyncio.run(scenario())
    removals = w.removals_since(since)
    print(
        f"\nlisten ramp: {count} streams -> {wanted} replicas in {out_s:.1f} s, back to "
        f"{MIN_REPLICAS} in {in_s:.1f} s; removed "
        + ", ".join(
            f"{r.pod} (cost {r.cost}, others {sorted(r.others.values())})" for r in removals
        )
    )
    assert [ln.status for ln in listeners] == [200] * count
    assert out_s <= SCALE_OUT_BOUND
    _check_removals(removals)
    fleet.rows.append(
        Row(
            "listen streams",
            MIN_REPLICAS,
            wanted,
            round(out_s, 1),
            round(in_s, 1),
            len(fleet.prober.failed) - failed_before,
            0,
        )
    )
    with capsys.disabled():  # the table is in every run's log, passed or not
        _print_table(fleet)
    assert fleet.prober.failed == [], fleet.prober.failed[:5]


def _print_table(fleet: Autoscaled) -> None:
    header = (
        "signal",
        "replicas before",
        "replicas after",
        "scale out (s)",
        "scale in (s)",
        "rounds failed",
        "sessions lost",
    )
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in fleet.rows:
        cells = (
            r.signal,
            r.before,
            r.after,
            r.out_s or "-",
            r.in_s or "-",
            r.rounds_failed,
            r.sessions_lost,
        )
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    print(f"\n{fleet.prober.sent} asking rounds sent throughout\n" + "\n".join(lines))
