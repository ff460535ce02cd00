"""The scale targets, each printed with the figure measured in this run.

Nothing asserts: ``make bench`` reports met / not met, and says on which
figures (side-by-side ratios from one run on a shared machine).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from benchkit.hotpath import DIRECT, NGINX, ROUTER, HotPath

if TYPE_CHECKING:
    from benchkit import routercost
    from benchkit.roundcost import Server

Row = tuple[str, str, str, str]
KIB = 1024


@dataclass
class Figures:
    hot: HotPath | None = None
    #: Bytes per live handshake session (RSS / INFO memory deltas over the sessions).
    router_bytes_per_session: float | None = None
    redis_bytes_per_session: float | None = None
    #: The targets' table's figures (:mod:`benchkit.summary`): the round-cost servers, by name,
    #: and the router-cost run's figures.
    rounds: dict[str, Server] = field(default_factory=dict)
    router: routercost.Figures | None = None


def _verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def target_rows(fig: Figures) -> list[Row]:
    rows: list[Row] = []
    if fig.hot is not None:
        lat = fig.hot.latency
        direct, router = lat[DIRECT].p(0.5), lat[ROUTER].p(0.5)
        added = router / direct - 1
        rows.append(
            (
                "target: router adds <= 25% to a modern round's p50",
                f"{added * 100:+.0f}% ({direct:.2f} -> {router:.2f} ms)",
                _verdict(added <= 0.25),
                "wrk, 1 connection, vs direct",
            )
        )
        if NGINX in lat:
            nginx_added = lat[NGINX].p(0.5) - direct
            rows.append(
                (
                    "target: router adds no more than nginx adds (p50)",
                    f"router {router - direct:+.2f} ms, nginx {nginx_added:+.2f} ms",
                    _verdict(router - direct <= nginx_added),
                    "",
                )
            )
        thr = fig.hot.throughput
        share = thr[ROUTER].rps / thr[DIRECT].rps
        rows.append(
            (
                "target: router >= 75% of direct throughput",
                f"{share * 100:.0f}% ({thr[ROUTER].rps:.0f} of {thr[DIRECT].rps:.0f}/s)",
                _verdict(share >= 0.75),
                f"wrk, {fig.hot.connections} connections",
            )
        )
    if fig.router_bytes_per_session is not None:
        kib = fig.router_bytes_per_session / KIB
        rows.append(
            (
                "target: router memory per handshake session < 50 KiB",
                f"{kib:.1f} KiB",
                _verdict(kib < 50),
                "RSS delta / sessions, streams held open",
            )
        )
    if fig.redis_bytes_per_session is not None:
        kib = fig.redis_bytes_per_session / KIB
        rows.append(
            (
                "target: Redis memory per handshake session < 1 KiB",
                f"{fig.redis_bytes_per_session:.0f} B",
                _verdict(kib < 1),
                "INFO memory used_memory delta / sessions",
            )
        )
    return rows
