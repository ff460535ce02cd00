"""The targets' table: every set-up and every target of one ``make bench`` run, side by side.

``make bench`` prints it after its main table, from figures that run measured:

* plain FastMCP (the same two-round guard tool, JSON and SSE response modes),
  the replica, and the replica with ``once=True`` (:mod:`benchkit.roundcost`:
  one client, interleaved slices): CPU per asking and per answer round,
  latency p50/p99 of each, and rounds/s per core (one asking and one answer
  round per flow) with the ratio to plain FastMCP in the replica's mode;
* direct, the router and nginx (:mod:`benchkit.routercost`: wrk, modern
  asking rounds of the example app, alternating slices): p50/p99 at 1
  connection, CPU per round of the router and of nginx (8 connections), and
  rounds/s per router (or nginx) core with the ratio to plain FastMCP's;
* each target with the figure it is judged on and PASS / FAIL.

The two halves are different clients (one Python client vs wrk) on different
apps, so latencies compare within a half, never across. Nothing asserts.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from benchkit import roundcost, routercost
from benchkit.roundcost import (
    CPU_RATIO_TARGET,
    JSON_MODE,
    ONCE_CPU_TARGET_US,
    ONCE_P50_TARGET_MS,
    PLAIN_JSON,
    PLAIN_SSE,
    REPLICA,
    REPLICA_DEFAULTS,
    REPLICA_ONCE,
    SSE_MODE,
    Server,
)

Row = tuple[str, str, str, str, str]
HEAD: Row = (
    "set-up",
    "CPU per round, ask / answer",
    "p50 ask / answer",
    "p99",
    "rounds/s per core",
)
TARGET_HEAD: Row = ("target", "measured", "from", "verdict", "on")


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def _p(values: Sequence[float], q: float) -> float:
    return roundcost._p(list(values), q)


def replica_rows(servers: dict[str, Server]) -> tuple[list[Row], list[Row]]:
    """The set-up rows of the replica half, and its targets."""
    plain = {JSON_MODE: servers[PLAIN_JSON], SSE_MODE: servers[PLAIN_SSE]}
    rep, once = servers[REPLICA], servers[REPLICA_ONCE]
    base = plain.get(rep.mode, servers[PLAIN_SSE])
    out: list[Row] = []
    user = servers[REPLICA_DEFAULTS]
    for s in (servers[PLAIN_JSON], servers[PLAIN_SSE], rep, once, user):
        ratio = ""
        if s is not base:
            ratio = f" (x{s.rounds_per_core() / base.rounds_per_core():.2f} of plain {base.mode})"
        out.append(
            (
                f"{s.name} ({s.mode} mode)",
                f"{s.ask_us:.0f} / {s.answer_us:.0f} us",
                f"{statistics.median(s.ask_ms):.2f} / {statistics.median(s.answer_ms):.2f} ms",
                f"{_p(s.ask_ms, 0.99):.2f} / {_p(s.answer_ms, 0.99):.2f} ms",
                f"{s.rounds_per_core():.0f}{ratio}",
            )
        )
    targets: list[Row] = []
    for who, s in (("replica", rep), ("replica as a user gets it", user)):
        same = plain.get(s.mode, servers[PLAIN_SSE])
        for kind, ours, theirs in (
            ("asking", s.ask_us, same.ask_us),
            ("answer", s.answer_us, same.answer_us),
        ):
            times = ours / theirs
            targets.append(
                (
                    f"{who} CPU per {kind} round <= x{CPU_RATIO_TARGET:.2f} plain FastMCP",
                    f"x{times:.2f}",
                    f"{ours:.0f} vs {theirs:.0f} us",
                    _verdict(times <= CPU_RATIO_TARGET),
                    f"{s.asks} flows each, {s.mode} mode",
                )
            )
    added = once.answer_us - rep.answer_us
    targets.append(
        (
            f"once=True adds <= {ONCE_CPU_TARGET_US:.0f} us CPU to the answer round",
            f"{added:+.0f} us",
            f"{once.answer_us:.0f} vs {rep.answer_us:.0f} us",
            _verdict(added <= ONCE_CPU_TARGET_US),
            "same replica, same run",
        )
    )
    p50 = statistics.median(once.answer_ms) - statistics.median(rep.answer_ms)
    targets.append(
        (
            f"once=True adds <= {ONCE_P50_TARGET_MS} ms p50 to the answer round",
            f"{p50:+.2f} ms",
            f"{statistics.median(once.answer_ms):.2f} vs {statistics.median(rep.answer_ms):.2f} ms",
            _verdict(p50 <= ONCE_P50_TARGET_MS),
            "same replica, same run",
        )
    )
    return out, targets


def proxy_rows(
    fig: routercost.Figures, plain_per_core: float | None
) -> tuple[list[Row], list[Row]]:
    """The set-up rows of the proxy half (direct, router, nginx), and its targets."""
    out: list[Row] = []
    names = [n for n in (routercost.DIRECT, routercost.ROUTER, routercost.NGINX)]
    for name in names:
        one, eight = fig.modern.get((name, 1)), fig.modern.get((name, 8))
        if one is None or eight is None:
            continue
        cpu, per_core = "", ""
        seconds = eight.cpu.get(name)
        if seconds:
            cpu = f"{seconds / max(1, eight.requests) * 1e6:.0f} us (asking round, 8 conn)"
            rate = eight.requests / seconds
            ratio = f" (x{rate / plain_per_core:.2f} of plain FastMCP)" if plain_per_core else ""
            per_core = f"{rate:.0f}{ratio}"
        label = {
            routercost.DIRECT: "direct to the replicas (wrk)",
            routercost.ROUTER: "mcpfleet router (wrk)",
            routercost.NGINX: "nginx round robin (wrk)",
        }[name]
        out.append((label, cpu, f"{one.p(0.5):.2f} ms (1 conn)", f"{one.p(0.99):.2f} ms", per_core))
    targets: list[Row] = []
    router8 = fig.modern.get((routercost.ROUTER, 8))
    if router8 is not None and router8.cpu.get(routercost.ROUTER):
        cpu_us = router8.cpu[routercost.ROUTER] / max(1, router8.requests) * 1e6
        targets.append(
            (
                f"router CPU <= {routercost.CPU_TARGET_US:.0f} us per modern round",
                f"{cpu_us:.0f} us",
                f"{router8.requests} rounds",
                _verdict(cpu_us <= routercost.CPU_TARGET_US),
                "wrk, 8 connections",
            )
        )
    have_nginx = (routercost.NGINX, 1) in fig.modern
    for conns in routercost.CONNECTIONS:
        direct = fig.modern.get((routercost.DIRECT, conns))
        router = fig.modern.get((routercost.ROUTER, conns))
        nginx = fig.modern.get((routercost.NGINX, conns))
        if direct is None or router is None or nginx is None:
            continue
        over = router.p(0.5) - direct.p(0.5)
        bound = nginx.p(0.5) - direct.p(0.5) + routercost.NGINX_SLACK_MS
        targets.append(
            (
                f"router p50 overhead <= nginx's + {routercost.NGINX_SLACK_MS} ms, {conns} conn",
                f"{over:+.2f} ms",
                f"bound {bound:+.2f} ms",
                _verdict(over <= bound),
                f"direct p50 {direct.p(0.5):.2f} ms",
            )
        )
    direct_s, router_s = fig.sticky.get(routercost.DIRECT), fig.sticky.get(routercost.ROUTER)
    if direct_s is not None and router_s is not None and have_nginx:
        over = router_s.p(0.5) - direct_s.p(0.5)
        bound = routercost.STICKY_FACTOR * (
            fig.modern[(routercost.NGINX, 1)].p(0.5)
            - fig.modern[(routercost.DIRECT, 1)].p(0.5)
            + routercost.NGINX_SLACK_MS
        )
        targets.append(
            (
                f"sticky request overhead <= x{routercost.STICKY_FACTOR} that bound (1 conn)",
                f"{over:+.2f} ms",
                f"bound {bound:+.2f} ms",
                _verdict(over <= bound),
                "handshake-era ping, its owner vs the router",
            )
        )
    return out, targets


def summary_rows(
    servers: dict[str, Server] | None, fig: routercost.Figures | None
) -> tuple[list[Row], list[Row]]:
    """Both halves (what was measured of them): set-up rows, then target rows."""
    setups: list[Row] = []
    targets: list[Row] = []
    plain_per_core = None
    if servers:
        rows, tg = replica_rows(servers)
        setups += rows
        targets += tg
        plain_per_core = servers[PLAIN_JSON].rounds_per_core()
    if fig is not None:
        rows, tg = proxy_rows(fig, plain_per_core)
        setups += rows
        targets += tg
    return setups, targets


def render(rows: Sequence[Row], head: Row) -> str:
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    line = "+".join("-" * (w + 2) for w in widths)
    out = [" | ".join(c.ljust(w) for c, w in zip(head, widths, strict=True)), line]
    out += [" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(out)


def render_summary(servers: dict[str, Server] | None, fig: routercost.Figures | None) -> str:
    setups, targets = summary_rows(servers, fig)
    if not setups and not targets:
        return ""
    return render(setups, HEAD) + "\n\n" + render(targets, TARGET_HEAD)
