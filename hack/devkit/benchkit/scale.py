"""``make bench-scale``: the fleet's cost curve, one dimension grown at a time.

One fleet on this machine (redis-server, 3 ``mcpfleet serve`` replicas of the
example app, routers added as the run goes; limits per principal off, as the
bench's one client stands for many users) and, in turn:

* **routers** 1 -> 2 -> 4: Redis commands per second from the background alone
  (an idle window of one prune cycle, ``INFO commandstats`` deltas), less the
  replicas' own background measured before any router started, per router;
* **sessions** 1k -> 10k -> 100k routes in Redis: 1,000 real idle handshake
  sessions first (the replicas' and the router's RSS per session); then routes
  to stand-in owners written straight into Redis (``RedisKeys.session``, the
  route's TTL), as many routers' sessions would be. At each step: Redis memory
  per route (``used_memory`` delta / routes written), a second router's CPU per
  sticky request whose owner it has cached (wrk ``ping`` on 64 real sessions)
  and per sticky request it must look up (the first for each of 100 fresh real
  sessions), and Redis commands per such request;
* **replicas in the registry** 3 -> 30 -> 300: stand-in attestations written as
  replicas write theirs (``Attestation``, ``RedisKeys.replica``), serving, each
  at the address of a real replica, so a round the router sends to a stand-in
  is answered. Per step: a router's CPU per registry read (idle CPU over the
  reads of the window: one per ``refresh_interval``), the registry's bytes per
  read, Redis background commands/s, the pick's cost (``ReplicaView.serving`` and
  ``pick_stateless`` in this process), and the router's and the replicas' CPU
  per modern round (wrk, 8 connections);
* **Redis commands per round by path** (initialize, sticky, modern round,
  once-flows, listen streams, limits on: :mod:`benchkit.scalepaths`), and what
  one Redis master sustains of each (``redis-benchmark`` GET/SET on this
  machine): the first limit.

CPU is every thread's, from ``/proc/<pid>/task/*/schedstat`` (nanoseconds:
``/proc/<pid>/stat``'s clock ticks are too coarse for 100 requests). Each step
prints its cost per unit, the ratio to the first step and a verdict
(:mod:`benchkit.scalecurve`). Nothing here asserts: a benchmark reports.
docs/sizing.md is written from this table.

    PYTHONPATH=hack/devkit .venv/bin/python -m benchkit.scale [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import httpx
import redis

from benchkit.loadgen import run_wrk
from benchkit.roundcost import cpu_ns
from benchkit.scalecurve import (
    Curve,
    PathCost,
    breakdown,
    curve_rows,
    first_limit,
    path_rows,
    per_unit,
    total,
)
from benchkit.scalepaths import (
    limits_paths,
    listen_paths,
    once_paths,
    redis_capacity,
    store_paths,
)
from benchkit.sessionbench import command_calls, rss_bytes
from benchkit.table import Row, render
from fleetkit.clients.wire import initialize_body
from mcpfleet.config import SESSION_IDLE, RouterConfig
from mcpfleet.contract import HEARTBEAT_INTERVAL, Attestation, RedisKeys
from mcpfleet.dev.fleet import LocalFleet, Proc, mcpfleet_argv
from mcpfleet.dev.ports import free_port
from mcpfleet.dev.wait import wait_for
from mcpfleet.registry import PRUNE_EVERY
from mcpfleet.router.decisions import pick_stateless, place_session
from mcpfleet.router.health import Health
from mcpfleet.router.replicas import ReplicaView, ViewState

ROUTER_STEPS = (1, 2, 4)
SESSION_STEPS = (1_000, 10_000, 100_000)
REPLICA_STEPS = (3, 30, 300)
#: Fresh real sessions per sessions step: each one's first request on the second router.
COLD = 100
#: Real sessions per step pinged through the second router with its owner cached.
WARM = 64
REFRESH = RouterConfig(redis_url="").refresh_interval
#: Seconds of each background window: one prune cycle of every replica (a replica
#: checks every name in the registry once per PRUNE_EVERY heartbeats of 1 s), so
#: each window holds one prune of each, whatever the phase.
PRUNE_CYCLE = PRUNE_EVERY * HEARTBEAT_INTERVAL
HANDSHAKE_HEADERS = {
    "content-type": "application/json",
    "accept": "application/json, text/event-stream",
    "mcp-protocol-version": "2025-11-25",
}
PING = json.dumps({"jsonrpc": "2.0", "id": 3, "method": "ping"})


@dataclass
class Run:
    """The fleet under measurement and what the run gathered."""

    lf: LocalFleet
    rclient: redis.Redis
    keys: RedisKeys
    quick: bool
    curves: list[Curve] = field(default_factory=list)
    paths: list[PathCost] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    #: Redis commands/s of the fleet at rest, subtracted from the paths' counts.
    background: dict[str, float] = field(default_factory=dict)
    #: ``used_memory`` before the first route was written.
    memory_base: int = 0

    def router_pid(self, i: int) -> int:
        popen = self.lf.router_procs[i].popen
        assert popen is not None
        return popen.pid

    def router_url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.lf.router_ports[i]}/mcp"

    def seconds(self, full: float) -> float:
        return max(1.0, full / 2) if self.quick else full


# --- routers ------------------------------------------------------------------------


def serving(port: int) -> int:
    """How many serving replicas the router on ``port`` sees (its ``/readyz``)."""
    resp = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2)
    return int(resp.json()["serving"])


def add_router(lf: LocalFleet, sees: int) -> None:
    """One more router of ``lf``'s fleet; returns once it sees ``sees`` serving replicas."""
    i, port = len(lf.router_procs), free_port()
    argv = ["router", "--port", str(port), "--redis", lf.redis_url, "--fleet", lf.fleet]
    proc = Proc(
        f"router-{i}", mcpfleet_argv(*argv, *lf.router_args), lf.workdir / f"router-{i}.log"
    )
    proc.start(lf.env())
    lf.router_procs.append(proc)
    lf.router_ports.append(port)
    wait_for(
        lambda: serving(port) >= sees,
        timeout=60,
        what=f"router-{i} to see {sees} serving replica(s)",
        retry_on=(OSError, ValueError, KeyError, httpx.HTTPError),
    )


def idle(
    run: Run, seconds: float, pids: dict[str, int]
) -> tuple[dict[str, float], dict[str, float]]:
    """Over an idle window: Redis commands per second by command, and CPU seconds per
    second of each process named in ``pids`` (every thread's, from ``/proc``)."""
    cpu_before = {n: cpu_ns(p) for n, p in pids.items()}
    before, started = command_calls(run.rclient), time.perf_counter()
    time.sleep(seconds)
    after, took = command_calls(run.rclient), time.perf_counter() - started
    cpu = {n: (cpu_ns(p) - cpu_before[n]) / 1e9 / took for n, p in pids.items()}
    rates = {k: (after.get(k, 0) - before.get(k, 0)) / took for k in after}
    return {k: v for k, v in rates.items() if v}, cpu


def routers_curve(run: Run) -> None:
    """Background commands/s per router as routers are added (the replicas' own first)."""
    window = PRUNE_CYCLE  # each replica prunes the registry once a window
    replicas_bg, _ = idle(run, window, {})
    run.rows.append(
        (
            "scale, Redis background of 3 replicas, no router",
            f"{sum(replicas_bg.values()):.1f} commands/s",
            "",
            f"{breakdown(replicas_bg)} per s; heartbeats every 1 s; idle {window:g} s",
        )
    )
    curve = Curve("routers", "Redis background commands/s per router", "commands/s")
    for n in ROUTER_STEPS:
        while len(run.lf.router_procs) < n:
            add_router(run.lf, 3)
        time.sleep(1.0)  # past the new router's start-up reads
        bg, _ = idle(run, window, {})
        mine = {k: (v - replicas_bg.get(k, 0.0)) / n for k, v in bg.items()}
        mine = {k: v for k, v in mine.items() if abs(v) >= 0.05}
        note = f"{sum(bg.values()):.1f}/s in all; per router {breakdown(mine)}; idle {window:g} s"
        curve.add(n, total(mine), note)
    run.curves.append(curve)
    for proc in run.lf.router_procs[2:]:  # two routers are enough for the rest
        proc.stop()
    del run.lf.router_procs[2:], run.lf.router_ports[2:]


# --- sessions -----------------------------------------------------------------------


def open_sessions(run: Run, http: httpx.Client, n: int) -> tuple[list[str], dict[str, float]]:
    """``n`` real handshake sessions opened through the first router; Redis commands per
    ``initialize`` (net of the background)."""
    before, started = command_calls(run.rclient), time.perf_counter()
    ids = []
    for _ in range(n):
        resp = http.post(
            run.router_url(0), content=initialize_body("bench-scale"), headers=HANDSHAKE_HEADERS
        )
        resp.raise_for_status()
        ids.append(resp.headers["mcp-session-id"])
    took = time.perf_counter() - started
    return ids, per_unit(before, command_calls(run.rclient), run.background, took, n)


def write_routes(run: Run, count: int) -> None:
    """``count`` routes to stand-in owners, written as a router writes a route."""
    px = int(SESSION_IDLE * 1000)
    for start in range(0, count, 5000):
        pipe = run.rclient.pipeline(transaction=False)
        for i in range(start, min(count, start + 5000)):
            pipe.set(run.keys.session(uuid.uuid4().hex), f"standin-owner-{i % 50}", px=px)
        pipe.execute()


def cold_pings(run: Run, http: httpx.Client, ids: list[str]) -> tuple[float, dict[str, float]]:
    """One ping per session through the second router (its first request for each):
    router CPU per request (us) and Redis commands per request."""
    pid = run.router_pid(1)
    cpu, before, started = cpu_ns(pid), command_calls(run.rclient), time.perf_counter()
    for session in ids:
        resp = http.post(
            run.router_url(1),
            content=PING,
            headers={**HANDSHAKE_HEADERS, "mcp-session-id": session},
        )
        if resp.status_code != 200:
            raise RuntimeError(f"ping of {session}: {resp.status_code} {resp.text[:200]}")
    took = time.perf_counter() - started
    used_us = (cpu_ns(pid) - cpu) / 1e3
    commands = per_unit(before, command_calls(run.rclient), run.background, took, len(ids))
    return used_us / len(ids), commands


def warm_pings(run: Run, ids: list[str]) -> tuple[float, dict[str, float], int]:
    """wrk pings on sessions the second router has cached: router CPU per request (us),
    Redis commands per request, and the requests made."""
    file = Path(tempfile.mkstemp(prefix="mcpfleet-scale-", suffix=".txt")[1])
    try:
        file.write_text("".join(f"{s}\n" for s in ids))
        pid = run.router_pid(1)
        cpu, before, started = cpu_ns(pid), command_calls(run.rclient), time.perf_counter()
        res = run_wrk(
            run.router_url(1),
            connections=4,
            seconds=run.seconds(2.0),
            mode="sticky",
            sessions_file=file,
        )
        took, used_us = time.perf_counter() - started, (cpu_ns(pid) - cpu) / 1e3
    finally:
        file.unlink(missing_ok=True)
    if res.bad or res.socket_errors:
        raise RuntimeError(f"sticky pings failed: bad={res.bad} socket errors={res.socket_errors}")
    commands = per_unit(before, command_calls(run.rclient), run.background, took, res.requests)
    return used_us / max(1, res.requests), commands, res.requests


def sessions_step(run: Run, http: httpx.Client, step: int, curves: dict[str, Curve]) -> None:
    """Routes up to ``step``, then each measure of the step (the paths' counts at the first)."""
    written = curves["memory"].steps[-1].units if curves["memory"].steps else 0
    write_routes(run, step - written)
    used = int(run.rclient.info("memory")["used_memory"])
    curves["memory"].add(
        step, (used - run.memory_base) / step, f"INFO used_memory delta / {step:,} routes written"
    )
    ids, per_init = open_sessions(run, http, COLD)
    us, commands = cold_pings(run, http, ids)
    curves["cold"].add(step, us, f"{COLD} fresh sessions, one ping each, sequential")
    curves["lookups"].add(step, total(commands), breakdown(commands, COLD))
    warm_us, warm_commands, n = warm_pings(run, ids[:WARM])
    note = f"wrk 4 connections on {WARM} sessions, n={n}; commands: {breakdown(warm_commands, n)}"
    curves["warm"].add(step, warm_us, note)
    if step == SESSION_STEPS[0]:
        run.paths += [
            PathCost("initialize (handshake session opened)", per_init, COLD, "through a router"),
            PathCost(
                "sticky request, owner looked up",
                commands,
                COLD,
                "a router's first request for the session",
            ),
            PathCost("sticky request, owner cached", warm_commands, n, "through a router"),
        ]


def held_sessions(run: Run, http: httpx.Client, n: int) -> None:
    """``n`` real handshake sessions opened and initialized through the first router and
    left idle: the replicas' and that router's memory per session (RSS deltas)."""
    replicas = replica_pids(run)
    before = (sum(map(rss_bytes, replicas)), rss_bytes(run.router_pid(0)))
    ids, _ = open_sessions(run, http, n)
    note = json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"})
    for session in ids:
        headers = {**HANDSHAKE_HEADERS, "mcp-session-id": session}
        resp = http.post(run.router_url(0), content=note, headers=headers)
        if resp.status_code != 202:
            raise RuntimeError(f"initialized of {session}: {resp.status_code}")
    time.sleep(1.0)  # a heartbeat: the attestations carry the new counts
    after = (sum(map(rss_bytes, replicas)), rss_bytes(run.router_pid(0)))
    each = before[0] / len(replicas) / 2**20
    for label, i, what in (
        ("the replicas", 0, f"RSS delta of the 3 replicas ({each:.0f} MiB each before)"),
        ("the router that opened them", 1, "RSS delta: its cached routes"),
    ):
        run.rows.append(
            (
                f"scale, memory per idle handshake session, {label}",
                f"{(after[i] - before[i]) / n / 1024:.1f} KiB",
                "",
                f"{what} / {n:,} real sessions, initialized, no call pending",
            )
        )


def sessions_curve(run: Run) -> None:
    dim = "sessions (routes in Redis)"
    curves = {
        "memory": Curve(dim, "Redis memory per route", "B", digits=0),
        "cold": Curve(dim, "router CPU per sticky request, owner looked up", "us"),
        "lookups": Curve(dim, "Redis commands per sticky request, owner looked up", "", digits=2),
        "warm": Curve(dim, "router CPU per sticky request, owner cached", "us"),
    }
    run.background, _ = idle(run, PRUNE_CYCLE, {})
    with httpx.Client(timeout=10) as http:
        held_sessions(run, http, 300 if run.quick else 1000)
        run.memory_base = int(run.rclient.info("memory")["used_memory"])
        for step in SESSION_STEPS:
            sessions_step(run, http, step, curves)
    run.curves += list(curves.values())


# --- replicas in the registry -------------------------------------------------------


def registry(run: Run) -> dict[str, bytes]:
    """Every record in the registry now, by replica name (as a router reads them)."""
    names = sorted(n.decode() for n in cast(set[bytes], run.rclient.smembers(run.keys.replicas)))
    raws = cast(list[bytes | None], run.rclient.mget([run.keys.replica(n) for n in names]))
    return {n: r for n, r in zip(names, raws, strict=True) if r is not None}


def write_standins(run: Run, count: int) -> None:
    """``count`` stand-in attestations, serving, each at a real replica's address."""
    real = [Attestation.from_json(raw) for n, raw in registry(run).items() if n in run.lf.members]
    now = time.time()
    pipe = run.rclient.pipeline(transaction=False)
    for i in range(count):
        like = real[i % len(real)]
        name = f"standin-{i:04d}"
        att = Attestation(name, like.address, "serving", like.kids, now, started=now)
        pipe.set(run.keys.replica(name), att.to_json(), px=600_000)
        pipe.sadd(run.keys.replicas, name)
    pipe.execute()


def drop_standins(run: Run) -> None:
    names = [n.decode() for n in cast(set[bytes], run.rclient.smembers(run.keys.replicas))]
    standins = [n for n in names if n not in run.lf.members]
    if standins:
        run.rclient.delete(*(run.keys.replica(n) for n in standins))
        run.rclient.srem(run.keys.replicas, *standins)


def pick_us(attestations: list[Attestation], n: int) -> tuple[float, float]:
    """Microseconds per stateless pick and per session placement over ``attestations``,
    as the router makes them (:meth:`ReplicaView.serving`, then the decision)."""
    view = ReplicaView(cast(Any, None), RedisKeys("scale"), Health())
    view.state = ViewState(replicas={a.name: a for a in attestations})
    rng = random.Random(1)
    started = time.perf_counter()
    for _ in range(n):
        pick_stateless(view.serving(), rng)
    stateless = (time.perf_counter() - started) / n * 1e6
    started = time.perf_counter()
    for _ in range(n):
        place_session(view.serving())
    return stateless, (time.perf_counter() - started) / n * 1e6


@dataclass(frozen=True)
class Rounds:
    """A wrk run of modern rounds through a router: CPU per round, Redis commands per round."""

    router_us: float
    replicas_us: float
    commands: dict[str, float]
    rounds: int
    note: str


def replica_pids(run: Run) -> list[int]:
    return [m.proc.popen.pid for m in run.lf.members.values() if m.proc.popen is not None]


def modern_rounds(run: Run, background: dict[str, float]) -> Rounds:
    """wrk modern rounds (8 connections) through the first router."""
    pid, replicas = run.router_pid(0), replica_pids(run)
    cpu, served = cpu_ns(pid), sum(map(cpu_ns, replicas))
    before, started = command_calls(run.rclient), time.perf_counter()
    res = run_wrk(run.router_url(0), connections=8, seconds=run.seconds(2.0))
    took, used_us = time.perf_counter() - started, (cpu_ns(pid) - cpu) / 1e3
    replicas_us = (sum(map(cpu_ns, replicas)) - served) / 1e3
    n = max(1, res.requests)
    commands = per_unit(before, command_calls(run.rclient), background, took, n)
    note = f"wrk 8 connections, n={res.requests}, bad={res.bad + res.socket_errors}"
    return Rounds(used_us / n, replicas_us / n, commands, n, note)


def replicas_step(run: Run, n: int, curves: dict[str, Curve]) -> None:
    """The registry at ``n`` replicas (3 real, the rest stand-ins), then each measure."""
    drop_standins(run)
    write_standins(run, n - len(run.lf.members))
    for port in run.lf.router_ports:

        def sees_all(p: int = port) -> bool:
            return serving(p) == n

        wait_for(
            sees_all,
            timeout=30,
            what=f"routers to see {n} replicas",
            retry_on=(OSError, httpx.HTTPError),
        )
    records = registry(run)
    window = PRUNE_CYCLE
    bg, cpu = idle(run, window, {"router": run.router_pid(0)})
    per_read = cpu["router"] * REFRESH * 1e6
    note = f"the router's idle CPU over {window:g} s / its reads (one per {REFRESH:g} s)"
    curves["read"].add(n, per_read, note)
    size = sum(map(len, records.values()))
    curves["bytes"].add(n, size / 1024, f"{len(records)} records in one MGET")
    curves["bg"].add(n, sum(bg.values()), f"{breakdown(bg)} per s; 2 routers, 3 replicas")
    parsed = [Attestation.from_json(r) for r in records.values()]
    stateless, place = pick_us(parsed, 2000 if run.quick else 20000)
    curves["pick"].add(n, stateless, f"a new session's placement: {place:.2f} us")
    rounds = modern_rounds(run, bg)
    curves["round"].add(n, rounds.router_us, rounds.note)
    curves["replica"].add(n, rounds.replicas_us, f"the 3 real replicas' CPU; {rounds.note}")
    if n == REPLICA_STEPS[0]:
        run.paths.append(
            PathCost("modern round (stateless)", rounds.commands, rounds.rounds, "through a router")
        )


def replicas_curve(run: Run) -> None:
    dim = "replicas in the registry"
    curves = {
        "read": Curve(dim, "router CPU per registry read", "us"),
        "bytes": Curve(dim, "registry bytes per read", "KiB"),
        "bg": Curve(dim, "Redis background commands/s", "commands/s"),
        "pick": Curve(dim, "the pick's cost per modern round (in process)", "us", digits=2),
        "round": Curve(dim, "router CPU per modern round", "us"),
        "replica": Curve(dim, "replica CPU per modern round", "us"),
    }
    try:
        for n in REPLICA_STEPS:
            replicas_step(run, n, curves)
    finally:
        drop_standins(run)
    run.curves += list(curves.values())


# --- the run ------------------------------------------------------------------------


def measure(quick: bool) -> list[Row]:
    work = Path(tempfile.mkdtemp(prefix="mcpfleet-bench-scale-"))
    lf = LocalFleet(work / "fleet", replicas=3, routers=0, fleet="scale", limits=False)
    run: Run | None = None
    try:
        lf.start()
        run = Run(lf, redis.Redis(host="127.0.0.1", port=lf.redis_port), RedisKeys(lf.fleet), quick)
        routers_curve(run)
        sessions_curve(run)
        replicas_curve(run)
        capacity = redis_capacity(lf.redis_port, 20_000 if quick else 100_000)
        run.paths += once_paths(work, 50 if quick else 200)
        run.paths += listen_paths(work, 10 if quick else 50, 5 if quick else 20)
        run.paths += limits_paths(work, 50 if quick else 200)
        run.paths += store_paths(work, 50 if quick else 200)
        rows = run.rows + [row for curve in run.curves for row in curve_rows(curve)]
        rows += path_rows(run.paths)
        if capacity is None:
            rows.append(
                (
                    "scale, one Redis master's commands/s on this machine",
                    "not measured",
                    "",
                    "redis-benchmark (Debian's redis-tools) not installed",
                )
            )
        else:
            rows.append(
                (
                    "scale, one Redis master's commands/s on this machine",
                    f"{capacity[0]:,.0f}/s",
                    "",
                    capacity[1],
                )
            )
            rows += first_limit(capacity[0], run.paths)
        return rows
    finally:
        if run is not None:
            run.rclient.close()
        lf.stop()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter windows (a smoke run)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    started = time.monotonic()
    rows = measure(args.quick)
    print(f"mcpfleet bench-scale, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M:%S')}")
    print(render(rows))
    took = time.monotonic() - started
    one, five, fifteen = os.getloadavg()
    print(f"\nbench-scale took {int(took // 60)} min {int(took % 60)} s;", end=" ")
    print(f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
