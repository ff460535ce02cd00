"""Limits checked while Redis is stalled (SIGSTOP) or refusing: every answer within the deadline.

One replica with limits on (``--redis-deadline 1``) behind a router, clients sending
modern rounds and opening handshake sessions straight at the replica (the router's own
Redis behaviour is docs/faults.md's). While Redis is stopped the checks fail open: a
round waits at most one deadline (then Redis is left alone for a second: the next rounds
pay nothing), the failures are counted, and the rate still holds per replica.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import httpx
import pytest

from fleetkit.clients.wire import initialize_body, modern_call
from fleetkit.fleet import FleetOptions, ProcessFleet, local_fleet

pytestmark = pytest.mark.faults

DEADLINE = 1.0
ARGS = {"item": "tea", "amount_eur": 1}
JSON_SSE = {"content-type": "application/json", "accept": "application/json, text/event-stream"}


@pytest.fixture
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessFleet]:
    options = FleetOptions(
        replicas=1,
        replica_args=(
            *("--redis-deadline", str(DEADLINE), "--limit-sessions", "50"),
            *("--limit-rounds", "20", "--limit-burst", "20"),
        ),
    )
    with local_fleet(tmp_path_factory.mktemp("limits-stall"), options) as lf:
        yield lf


def failed_checks(replica_url: str) -> float:
    text = httpx.get(replica_url.removesuffix("/mcp") + "/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("mcpfleet_limit_checks_failed_total{")
    )


def test_rounds_and_initializes_are_answered_within_the_deadline_while_redis_is_stopped(
    fleet: ProcessFleet,
) -> None:
    member = next(iter(fleet.members.values()))
    replica = f"http://127.0.0.1:{member.port}/mcp"
    assert fleet.redis is not None and fleet.redis.popen is not None
    pid = fleet.redis.popen.pid
    timings: list[tuple[str, int, float]] = []
    with httpx.Client(timeout=10) as http:
        assert modern_call(replica, "confirm_purchase", ARGS, client=http).status in (200,)
        os.kill(pid, signal.SIGSTOP)
        try:
            for i in range(30):
                started = time.monotonic()
                if i % 3 == 0:
                    resp = http.post(replica, content=initialize_body("stall"), headers=JSON_SSE)
                    status = resp.status_code
                    kind = "initialize"
                else:
                    status = modern_call(replica, "confirm_purchase", ARGS, client=http).status
                    kind = "round"
                timings.append((kind, status, time.monotonic() - started))
        finally:
            os.kill(pid, signal.SIGCONT)
    worst = max(t for _, _, t in timings)
    slow = sum(1 for _, _, t in timings if t > 0.5)
    print(f"\nRedis stopped: {len(timings)} answers, the slowest {worst:.2f} s, {slow} over 0.5 s")
    assert {s for _, s, _ in timings} <= {200, 429}, timings
    assert worst <= DEADLINE + 1.0, timings
    # One deadline paid, then Redis is left alone a second at a time: few slow answers.
    assert slow <= 1 + int(sum(t for _, _, t in timings)), timings
    assert failed_checks(replica) >= 1
    # A burst of 20 at 20/s held in the replica's memory: some of 20 rounds in about a
    # second were refused with the 429, none hung.
    assert sum(1 for k, s, _ in timings if k == "round" and s == 200) >= 1
