"""``make bench``'s rows for a Redis Cluster beside one Redis: the once and sticky paths.

Two fleets side by side, each of two replicas of ``fleetkit.apps.onceapp`` and
two routers, every component under its own ACL user: one on a redis-server
(``redis://``), one on a Redis Cluster of 3 masters and 3 replicas
(``redis+cluster://``, :mod:`fleetkit.clusterrig`). Timed alternately (which
set-up goes first alternates too), so both see the same machine load:

* a once-flow's final round through router 0 (the claim, its confirmation and
  the stored result: three commands on the flow's slot);
* ``initialize`` through router 0 (the route written: one ``SET``);
* the new session's first request through router 1, which never saw it (one
  ``MGET``: the lookup no cache answers).

The ratio is cluster over standalone: what the cluster client (slot map,
per-node pools, redirections) costs the paths Redis is on.
"""

from __future__ import annotations

import contextlib
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx

from fleetkit.apps.onceapp import EFFECTS_ENV
from fleetkit.clients.wire import accept, initialize_body, modern_call
from fleetkit.clusterrig import cluster_fleet, redis_cluster
from fleetkit.fleet import FleetOptions
from fleetkit.redisrig import RedisFleet, RedisServer, redis_fleet
from mcpfleet.contract import SESSION_HEADER

Row = tuple[str, str, str, str]
HEADERS = {
    "content-type": "application/json",
    "accept": "application/json, text/event-stream",
    "mcp-protocol-version": "2025-11-25",
}
PING = '{"jsonrpc":"2.0","id":2,"method":"ping"}'
KINDS = ("once", "initialize", "cold")


def _options(work: Path, fleet: str) -> FleetOptions:
    return FleetOptions(
        fleet=fleet,
        replicas=2,
        routers=2,
        app="fleetkit.apps.onceapp:app",
        env={EFFECTS_ENV: str(work / f"{fleet}-effects.log")},
    )


@contextlib.contextmanager
def _fleets(work: Path) -> Iterator[dict[str, RedisFleet]]:
    server = RedisServer(work / "standalone").start()
    try:
        plain = redis_fleet(
            work / "plain",
            [server],
            f"redis://127.0.0.1:{server.port}/0",
            server.admin,
            _options(work, "plain"),
        )
        with (
            plain,
            redis_cluster(work / "cluster") as rig,
            cluster_fleet(work / "tagged", _options(work, "tagged"), rig) as tagged,
        ):
            yield {"standalone": plain, "cluster": tagged}
    finally:
        server.stop()


def _timed(step: Callable[[], object]) -> float:
    started = time.perf_counter()
    step()
    return time.perf_counter() - started


def _sample(http: httpx.Client, lf: RedisFleet, n: int) -> dict[str, float]:
    """One sample of each path on ``lf``'s fleet."""
    url, other = lf.router_url(0), lf.router_url(1)
    args = {"order": f"b{n}"}
    state = modern_call(url, "charge", args, client=http).result["requestState"]

    def once() -> None:
        answer = modern_call(
            url,
            "charge",
            args,
            request_state=state,
            input_responses={"ok": accept(True)},
            client=http,
        )
        assert str(answer.result["content"][0]["text"]).endswith("charged"), answer.body

    took = {"once": _timed(once)}
    opened: list[str] = []

    def initialize() -> None:
        resp = http.post(url, content=initialize_body("bench"), headers=HEADERS)
        assert resp.status_code == 200, resp.text
        opened.append(resp.headers[SESSION_HEADER])

    took["initialize"] = _timed(initialize)

    def cold() -> None:
        resp = http.post(other, content=PING, headers={**HEADERS, SESSION_HEADER: opened[0]})
        assert resp.status_code == 200, resp.text

    took["cold"] = _timed(cold)
    http.delete(url, headers={**HEADERS, SESSION_HEADER: opened[0]})
    return took


def cluster_rows(quick: bool) -> list[Row]:
    n = 60 if quick else 300
    work = Path(tempfile.mkdtemp(prefix="mcpfleet-bench-cluster-"))
    samples: dict[tuple[str, str], list[float]] = {
        (setup, kind): [] for setup in ("standalone", "cluster") for kind in KINDS
    }
    try:
        with _fleets(work) as fleets, httpx.Client(timeout=10) as http:
            for lf in fleets.values():  # warm every path
                _sample(http, lf, -1)
            for i in range(n):
                order = list(fleets.items()) if i % 2 == 0 else list(fleets.items())[::-1]
                for setup, lf in order:
                    for kind, took in _sample(http, lf, i).items():
                        samples[setup, kind].append(took)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return rows_of(samples, n)


def rows_of(samples: dict[tuple[str, str], list[float]], n: int) -> list[Row]:
    """The rows: each path's p50 on the cluster and on one Redis, and their ratio (pure)."""
    p50 = {key: statistics.median(values) * 1e3 for key, values in samples.items()}
    names = {
        "once": "once final round p50 (router, claim + confirm + result)",
        "initialize": "initialize p50 (router writes the route)",
        "cold": "first request via the other router p50 (route lookup)",
    }
    return [
        (
            f"{names[kind]}, Redis Cluster / one Redis",
            f"{p50['cluster', kind]:.2f} / {p50['standalone', kind]:.2f} ms",
            f"x{p50['cluster', kind] / p50['standalone', kind]:.2f}",
            f"{n} alternating pairs; 3 masters + 3 replicas vs one redis-server, ACL users",
        )
        for kind in KINDS
    ]


if __name__ == "__main__":
    import sys

    for row in cluster_rows(quick="--quick" in sys.argv[1:]):
        print(" | ".join(row))
