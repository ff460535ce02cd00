"""The hot-path rows of ``make bench``: modern rounds driven by wrk, side by side.

Three ways to the same replicas, measured in one run in alternating slices
(the order rotates each slice), so drifting load from other processes on a
shared machine hits all three alike:

* direct: wrk straight to the replicas (latency: one replica; throughput: one
  wrk per replica, the connections split between them, as a client that
  spreads its own load would);
* the mcpfleet router in front of them;
* nginx, a plain round-robin proxy over them, as the baseline proxy.

Figures are wrk's (its latency histogram merged over the slices); the CPU
shares come from /proc over the same runs (see :mod:`benchkit.loadgen`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from benchkit.loadgen import WrkResult, run_wrk

Row = tuple[str, str, str, str]
DIRECT, ROUTER, NGINX = "direct", "mcpfleet router", "nginx (round robin)"


@dataclass
class HotPath:
    latency: dict[str, WrkResult]
    throughput: dict[str, WrkResult]
    connections: int

    def rows(self) -> list[Row]:
        rows: list[Row] = []
        base = self.latency[DIRECT]
        for name, res in self.latency.items():
            ratio = "" if name == DIRECT else f"p50 x{res.p(0.5) / base.p(0.5):.2f} of direct"
            rows.append(
                (
                    f"modern round latency, wrk 1 connection, {name}",
                    f"p50 {res.p(0.5):.2f} ms / p99 {res.p(0.99):.2f} ms",
                    ratio,
                    f"n={res.requests}, bad={res.bad + res.socket_errors}",
                )
            )
        base_rps = self.throughput[DIRECT].rps
        for name, res in self.throughput.items():
            target = "3 wrk, one per replica" if name == DIRECT else ""
            rows.append(
                (
                    f"modern rounds/s, wrk {self.connections} connections, {name}",
                    f"{res.rps:.0f}/s",
                    "" if name == DIRECT else f"x{res.rps / base_rps:.2f} of direct",
                    ", ".join(x for x in (target, f"p50 {res.p(0.5):.1f} ms", _bad(res)) if x),
                )
            )
        for name, res in self.throughput.items():
            shares = ", ".join(
                f"{who} {res.cpu_share(who) * 100:.0f}%" for who in sorted(res.cpu) if res.cpu[who]
            )
            rows.append(
                (
                    f"wrk CPU while measuring rounds/s, {name}",
                    f"{res.wrk_share * 100:.1f}% of one core",
                    f"machine busy {res.machine_busy / res.wall:.2f} cores",
                    shares,
                )
            )
        return rows


def _bad(res: WrkResult) -> str:
    bad = res.bad + res.socket_errors
    return f"{bad} bad answers" if bad else ""


def measure_hot_path(
    direct_one: str,
    direct_all: Sequence[str],
    router: str,
    nginx: str | None,
    watch: Mapping[str, Sequence[int]],
    *,
    slices: int,
    slice_seconds: float,
    connections: int = 16,
) -> HotPath:
    latency: dict[str, WrkResult] = {DIRECT: WrkResult(), ROUTER: WrkResult()}
    throughput: dict[str, WrkResult] = {DIRECT: WrkResult(), ROUTER: WrkResult()}
    single: dict[str, str] = {DIRECT: direct_one, ROUTER: router}
    if nginx is not None:
        latency[NGINX], throughput[NGINX], single[NGINX] = WrkResult(), WrkResult(), nginx
    split = [
        (url, connections // len(direct_all) + (1 if i < connections % len(direct_all) else 0))
        for i, url in enumerate(direct_all)
    ]
    names = list(single)
    # Warm-up: connections, caches, the replicas' first seals.
    for name in names:
        run_wrk(single[name], connections=4, seconds=1)
    for i in range(slices):
        order = names[i % len(names) :] + names[: i % len(names)]
        for name in order:
            latency[name] = latency[name] + run_wrk(
                single[name], connections=1, seconds=slice_seconds, watch=watch
            )
        for name in order:
            target = split if name == DIRECT else single[name]
            throughput[name] = throughput[name] + run_wrk(
                target, connections=connections, seconds=slice_seconds, watch=watch
            )
    return HotPath(latency, throughput, connections)
