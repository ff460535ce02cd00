"""``make bench``'s rows for exactly-once final rounds: what ``once=True`` costs.

One replica of ``fleetkit.apps.onceapp`` with its Redis; the same one-question flow
with ``once`` (``charge``) and without (``charge_plain``), final rounds timed
alternately (which goes first alternates too) so both see the same machine
load. Each timed final round is a fresh flow's (its first round is untimed),
so every ``once`` sample pays the claim; a Redis ``PING`` from this process is
timed alongside, for the round trip the claim costs.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import redis

from fleetkit.apps.onceapp import EFFECTS_ENV
from fleetkit.clients.wire import accept, modern_call
from fleetkit.fleet import DEVKIT_DIR
from mcpfleet.dev.fleet import LocalFleet

Row = tuple[str, str, str, str]


def _final_round(http: httpx.Client, url: str, tool: str, n: int) -> float:
    """Seconds one final round took (its flow's first round is not timed)."""
    args = {"order": f"b{n}"}
    first = modern_call(url, tool, args, client=http)
    state = first.result["requestState"]
    started = time.perf_counter()
    answer = modern_call(
        url, tool, args, request_state=state, input_responses={"ok": accept(True)}, client=http
    )
    took = time.perf_counter() - started
    assert str(answer.result["content"][0]["text"]).endswith("charged"), answer.body
    return took


def once_rows(quick: bool) -> list[Row]:
    n = 100 if quick else 400
    work = Path(tempfile.mkdtemp(prefix="mcpfleet-bench-once-"))
    lf = LocalFleet(
        work,
        replicas=1,
        fleet="once",
        app="fleetkit.apps.onceapp:app",
        extra_env={"PYTHONPATH": str(DEVKIT_DIR), EFFECTS_ENV: str(work / "effects.log")},
        limits=False,
    )
    lf.start()
    try:
        url = f"{lf.members['replica-0'].url}/mcp"
        ping = redis.Redis(host="127.0.0.1", port=lf.redis_port)
        samples: dict[str, list[float]] = {"charge": [], "charge_plain": [], "ping": []}
        with httpx.Client(timeout=10) as http:
            for tool in ("charge", "charge_plain"):  # warm both paths
                _final_round(http, url, tool, -1)
            for i in range(n):
                order = ("charge", "charge_plain") if i % 2 == 0 else ("charge_plain", "charge")
                for tool in order:
                    samples[tool].append(_final_round(http, url, tool, i))
                started = time.perf_counter()
                ping.ping()
                samples["ping"].append(time.perf_counter() - started)
        ping.close()
    finally:
        lf.stop()
        shutil.rmtree(work, ignore_errors=True)
    once, plain, rtt = (
        statistics.median(samples[k]) * 1e3 for k in ("charge", "charge_plain", "ping")
    )
    return [
        (
            "final round p50, once=True / without (1 replica, direct)",
            f"{once:.2f} / {plain:.2f} ms",
            f"+{once - plain:.2f} ms (x{once / plain:.2f})",
            f"{n} alternating pairs; target <= +0.5 ms, one Redis round trip",
        ),
        (
            "Redis round trip (PING) from the bench, same run",
            f"p50 {rtt:.2f} ms",
            "",
            "the claim is one SET NX GET PX",
        ),
    ]


if __name__ == "__main__":
    for row in once_rows(quick=True):
        print(" | ".join(row))
