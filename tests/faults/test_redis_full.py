"""Redis filled near its maxmemory: once-flows refused, everything else keeps working.

A real Redis under a small ``maxmemory`` (``noeviction``, Redis's default),
filled by another tenant to ~90% of it: past ``--once-memory-limit`` (80%)
every replica refuses **new** once-flows with the retryable "ledger is full"
error (``finish`` never runs), while the memory the fleet needs to live is
still there: new sessions open through the router (their routes are written),
plain tools answer, heartbeats go on (every replica stays in the registry
past its heartbeat TTL). Once the memory is freed, the same final round sent
again completes and ``finish`` runs once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from fleetkit.fleet import FleetOptions, local_fleet
from fleetkit.onceapp import EFFECTS_ENV
from fleetkit.wire import Answer, initialize_body
from mcpfleet.contract import HEARTBEAT_TTL, SESSION_HEADER, RedisKeys
from mcpfleet.dev.fleet import LocalFleet
from mcpfleet.dev.wait import wait_for
from mcpfleet.registry import read_replicas_sync

from .conftest import FaultTable
from .oncewire import ask, charged, count, final

FILLER = "tenant:filler:"
CHUNK = 64 * 1024


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[LocalFleet, Path]]:
    effects = tmp_path / "effects.log"
    options = FleetOptions(
        app="fleetkit.onceapp:app", replicas=2, fleet="fullredis", env={EFFECTS_ENV: str(effects)}
    )
    with local_fleet(tmp_path / "fleet", options) as lf:
        yield lf, effects


def share(client: redis.Redis) -> float:
    info = client.info("memory")
    return int(info["used_memory"]) / int(info["maxmemory"])


def memory_ratio(url: str) -> float:
    """``mcpfleet_redis_memory_ratio`` as the replica at ``url`` exports it."""
    for line in httpx.get(f"{url}/metrics", timeout=5).text.splitlines():
        if line.startswith("mcpfleet_redis_memory_ratio"):
            return float(line.split()[-1])
    return 0.0


def full(answer: Answer) -> bool:
    err = answer.error or {}
    return (err.get("data") or {}).get("reason") == "full"


@pytest.mark.timeout(120)
def test_a_redis_near_its_maxmemory_refuses_new_once_flows_and_keeps_the_fleet(
    fleet: tuple[LocalFleet, Path], fault_table: FaultTable, watch_fleet: list[LocalFleet]
) -> None:
    lf, effects = fleet
    watch_fleet.append(lf)
    replica = f"{lf.members['replica-0'].url}/mcp"
    client = redis.Redis(host="127.0.0.1", port=lf.redis_port, socket_timeout=2)
    keys = RedisKeys(lf.fleet)
    row = fault_table.row("Redis at ~90% of maxmemory (once limit 80%)")
    try:
        used = int(client.info("memory")["used_memory"])
        client.config_set("maxmemory", used + 8 * 1024 * 1024)
        n = 0
        while share(client) < 0.9:
            client.set(f"{FILLER}{n}", b"x" * CHUNK)
            n += 1
        filled = share(client)
        # Each replica reads Redis's memory once a second, off the request path.
        started = time.monotonic()
        for member in lf.members.values():
            wait_for(
                lambda m=member: memory_ratio(m.url) >= 0.8,
                timeout=10,
                what=f"{member.name} to see Redis {filled:.0%} full",
            )
        seen = time.monotonic() - started
        state = ask(replica, "full-1")  # the asking round keeps nothing in Redis
        for member in lf.members.values():
            sent = time.monotonic()
            answer = final(f"{member.url}/mcp", "full-1", state)
            row.answered(sent)
            row.attempts += 1
            assert full(answer), answer.body
            assert (answer.error or {}).get("data", {}).get("retryable") is True, answer.body
        assert count(effects, "full-1") == 0, "finish ran while the ledger was full"

        # The fleet lives: a new session through the router, a plain tool, heartbeats.
        with httpx.Client(timeout=10) as http:
            resp = http.post(
                lf.router_url(0),
                content=initialize_body("full"),
                headers={
                    "content-type": "application/json",
                    "accept": "application/json, text/event-stream",
                },
            )
            assert resp.status_code == 200, resp.text
            session = resp.headers[SESSION_HEADER]
        assert client.get(keys.session(session)) is not None, "the new session's route"
        plain_state = ask(replica, "plain-1", "charge_plain")
        plain = final(replica, "plain-1", plain_state, "charge_plain")
        assert plain.status == 200 and not plain.error, plain.body
        time.sleep(HEARTBEAT_TTL + 1)
        assert set(read_replicas_sync(client, keys)) == {"replica-0", "replica-1"}
        assert share(client) < 1.0

        # Freed: the same round sent again completes, once.
        for k in client.scan_iter(match=f"{FILLER}*", count=1000):
            client.delete(k)
        after: list[Answer] = []

        def completes() -> bool:
            sent = time.monotonic()
            after.append(final(replica, "full-1", state))
            row.answered(sent)
            row.attempts += 1
            return charged(after[-1], "full-1")

        freed = time.monotonic()
        wait_for(completes, timeout=10, interval=0.3, what="once-flows to be accepted again")
        back = time.monotonic() - freed
        runs = count(effects, "full-1")
        row.double_runs = max(0, runs - 1)
        row.lost = 0 if runs == 1 else 1
        row.notes = (
            f"filled to {filled:.0%}; every replica saw it within {seen:.2f}s; "
            f"accepted again {back:.2f}s after freeing"
        )
        print(f"redis full: {row.notes}")
        assert runs == 1
    finally:
        client.config_set("maxmemory", 0)
        client.close()
