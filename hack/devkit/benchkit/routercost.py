"""The router's targets: CPU per modern round, and latency overhead beside nginx's.

One fleet, and in front of the same replicas: the router (and, with ``--ref``,
an earlier commit's router beside it), nginx round robin, and direct (one wrk
per replica, the connections split, as a client spreading its own load
would). wrk drives modern rounds at 1, 8 and 64 connections in alternating
slices whose order rotates, so drifting load from other processes hits every
path alike; sticky (handshake-era) pings go to sessions of one replica,
straight to it and through the router. Per path and connection count:

* p50 latency and its overhead over direct (router, nginx);
* router CPU per round, from ``/proc`` over its own slices, divided by the
  rounds wrk completed through it, and so rounds/s per router core.

The targets, PASS / FAIL from this run's figures only:

* router CPU <= 300 us per modern round (8 connections);
* router p50 overhead over direct <= nginx's overhead + 0.2 ms, at 1, 8 and 64
  connections;
* a sticky request's router overhead <= 1.2 x that bound (1 connection).

``make bench`` prints these rows; on its own, with an earlier router beside::

    PYTHONPATH=hack/devkit .venv/bin/python -m benchkit.routercost --ref <commit>
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from benchkit.loadgen import WrkResult, run_wrk
from mcpfleet.dev.fleet import LocalFleet

Row = tuple[str, str, str, str]
DIRECT, ROUTER, NGINX = "direct", "router", "nginx"
CONNECTIONS = (1, 8, 64)
#: The targets (docs/performance.md, "Reading the targets' table").
CPU_TARGET_US = 300.0
NGINX_SLACK_MS = 0.2
STICKY_FACTOR = 1.2
HANDSHAKE = "2025-11-25"


@dataclass
class Path_:
    """One way to the replicas: wrk's target(s), and the process whose CPU counts."""

    name: str
    modern: str | list[tuple[str, int]] | None  # None: split over the replicas
    pid: int | None = None
    sticky: str | None = None


@dataclass
class Figures:
    modern: dict[tuple[str, int], WrkResult] = field(default_factory=dict)
    sticky: dict[str, WrkResult] = field(default_factory=dict)


def _split(urls: Sequence[str], connections: int) -> list[tuple[str, int]]:
    n = len(urls)
    out = [(u, connections // n + (1 if i < connections % n else 0)) for i, u in enumerate(urls)]
    return [(u, c) for u, c in out if c > 0]


def open_sessions(router: str, owner: str, count: int, tries: int = 200) -> list[str]:
    """Handshake sessions opened through ``router`` until ``count`` belong to ``owner``."""

    async def run() -> list[str]:
        body = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": HANDSHAKE,
                "capabilities": {},
                "clientInfo": {"name": "mcpfleet-routercost", "version": "1"},
            },
        }
        headers = {
            "content-type": "application/json",
            "accept": "application/json, text/event-stream",
        }
        mine: list[str] = []
        async with httpx.AsyncClient(timeout=10) as http:
            for _ in range(tries):
                resp = await http.post(router, content=json.dumps(body), headers=headers)
                resp.raise_for_status()
                if resp.headers.get("x-mcpfleet-replica") == owner:
                    mine.append(resp.headers["mcp-session-id"])
                    if len(mine) >= count:
                        break
        return mine

    return asyncio.run(run())


def measure(
    paths: Sequence[Path_],
    replicas: Sequence[str],
    sessions: Path | None,
    *,
    slices: int,
    seconds: float,
) -> Figures:
    fig = Figures()
    watch = {p.name: [p.pid] for p in paths if p.pid}
    for p in paths:  # warm-up: connections, caches, the replicas' first seals
        run_wrk(p.modern or _split(replicas, 4), connections=4, seconds=1)
    for i in range(slices):
        order = list(paths[i % len(paths) :]) + list(paths[: i % len(paths)])
        for conns in CONNECTIONS:
            for p in order:
                target = p.modern if p.modern is not None else _split(replicas, conns)
                if conns == 1 and p.modern is None:
                    target = replicas[0]
                res = run_wrk(target, connections=conns, seconds=seconds, watch=watch)
                key = (p.name, conns)
                fig.modern[key] = fig.modern.get(key, WrkResult()) + res
        if sessions is not None:
            for p in order:
                if p.sticky is None:
                    continue
                res = run_wrk(
                    p.sticky,
                    connections=1,
                    seconds=seconds,
                    mode="sticky",
                    sessions_file=sessions,
                    watch=watch,
                )
                fig.sticky[p.name] = fig.sticky.get(p.name, WrkResult()) + res
    return fig


def _cpu_us(res: WrkResult, name: str) -> float:
    return res.cpu.get(name, 0.0) / max(1, res.requests) * 1e6


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def rows(fig: Figures, routers: Sequence[str]) -> list[Row]:
    out: list[Row] = []
    have_nginx = any(name == NGINX for name, _ in fig.modern)
    for conns in CONNECTIONS:
        direct = fig.modern[(DIRECT, conns)].p(0.5)
        nginx_over = fig.modern[(NGINX, conns)].p(0.5) - direct if have_nginx else None
        for name in (*routers, NGINX):
            res = fig.modern.get((name, conns))
            if res is None:
                continue
            over = res.p(0.5) - direct
            bad = res.bad + res.socket_errors
            note = f"direct p50 {direct:.2f} ms, {res.rps:.0f}/s" + (f", bad={bad}" if bad else "")
            if name in routers:
                note += f", CPU {_cpu_us(res, name):.0f} us/round"
            verdict = ""
            if name in routers and nginx_over is not None:
                ok = over <= nginx_over + NGINX_SLACK_MS
                verdict = f"{_verdict(ok)} (<= nginx {nginx_over:+.2f} + {NGINX_SLACK_MS} ms)"
            out.append(
                (
                    f"router cost: p50 overhead over direct, {conns} conn, {name}",
                    f"{over:+.2f} ms (p50 {res.p(0.5):.2f} ms)",
                    verdict,
                    note,
                )
            )
    for name in routers:
        res = fig.modern[(name, 8)]
        cpu = _cpu_us(res, name)
        per_core = res.requests / res.cpu[name] if res.cpu.get(name) else 0.0
        out.append(
            (
                f"router cost: CPU per modern round, {name}",
                f"{cpu:.0f} us",
                f"{_verdict(cpu <= CPU_TARGET_US)} (<= {CPU_TARGET_US:.0f} us)",
                f"wrk 8 connections, {res.requests} rounds; "
                f"{per_core:.0f} rounds/s per router core",
            )
        )
    if fig.sticky and DIRECT in fig.sticky:
        direct = fig.sticky[DIRECT].p(0.5)
        bound = None
        if have_nginx:
            bound = STICKY_FACTOR * (
                fig.modern[(NGINX, 1)].p(0.5) - fig.modern[(DIRECT, 1)].p(0.5) + NGINX_SLACK_MS
            )
        for name in routers:
            res = fig.sticky.get(name)
            if res is None:
                continue
            over = res.p(0.5) - direct
            modern_over = fig.modern[(name, 1)].p(0.5) - fig.modern[(DIRECT, 1)].p(0.5)
            verdict = "" if bound is None else f"{_verdict(over <= bound)} (<= {bound:+.2f} ms)"
            out.append(
                (
                    f"router cost: sticky ping p50 overhead over its owner, {name}",
                    f"{over:+.2f} ms (p50 {res.p(0.5):.2f} ms)",
                    verdict,
                    f"x{over / modern_over:.2f} of its modern overhead (1 conn); "
                    f"CPU {_cpu_us(res, name):.0f} us/request",
                )
            )
    return out


def router_cost_rows(
    lf: LocalFleet,
    nginx: str | None,
    quick: bool,
    extra: Sequence[tuple[str, str, int]] = (),
    slices: int | None = None,
    keep: list[Figures] | None = None,
    nginx_pid: int | None = None,
) -> list[Row]:
    """``make bench``'s hook: the rows above for ``lf``'s first router (and ``extra``
    routers as (name, url, pid)), beside ``nginx`` (a URL) if it runs (its CPU
    counted when ``nginx_pid`` is its worker's). The figures go into ``keep`` too
    (for :mod:`benchkit.summary`)."""
    replicas = [f"{m.url}/mcp" for m in lf.members.values()]
    owner = sorted(lf.members)[0]
    popen = lf.router_procs[0].popen
    paths = [Path_(DIRECT, None, sticky=f"{lf.members[owner].url}/mcp")]
    paths.append(Path_(ROUTER, lf.url, popen.pid if popen else None, sticky=lf.url))
    paths += [Path_(name, url, pid, sticky=url) for name, url, pid in extra]
    if nginx is not None:
        paths.append(Path_(NGINX, nginx, nginx_pid))
    ids = Path(tempfile.mkstemp(prefix="mcpfleet-routercost-", suffix=".txt")[1])
    try:
        ids.write_text("".join(f"{s}\n" for s in open_sessions(lf.url, owner, 8)))
        fig = measure(
            paths, [*replicas], ids, slices=slices or (2 if quick else 4), seconds=1 if quick else 2
        )
    finally:
        ids.unlink(missing_ok=True)
    if keep is not None:
        keep.append(fig)
    return rows(fig, [ROUTER, *(name for name, _, _ in extra)])


def main() -> None:
    from benchkit.nginx import start_nginx
    from benchkit.refbench import checkout, start_ref_router
    from benchkit.table import render

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ref", help="an earlier commit whose router runs beside this one")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--slices", type=int, help="alternating slices (default 4; 2 with --quick)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mcpfleet-routercost-"))
    lf = LocalFleet(work / "fleet", replicas=3, fleet="routercost", limits=False)
    lf.start()
    nginx = None
    ref = None
    try:
        nginx = start_nginx(work, [m.url for m in lf.members.values()])
        extra: list[tuple[str, str, int]] = []
        if args.ref:
            imports, cli = checkout(args.ref, work)
            ref, ref_url = start_ref_router(lf, imports, cli)
            assert ref.popen is not None
            extra.append((f"router@{args.ref}", ref_url, ref.popen.pid))
        nginx_url = f"http://127.0.0.1:{nginx[1]}/mcp" if nginx else None
        print(render(router_cost_rows(lf, nginx_url, args.quick, extra, args.slices)))
    finally:
        if ref is not None:
            ref.stop()
        if nginx is not None:
            nginx[0].terminate()
            nginx[0].wait(10)
        lf.stop()
        if args.ref:
            from benchkit.refbench import remove_checkout

            remove_checkout(work)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
