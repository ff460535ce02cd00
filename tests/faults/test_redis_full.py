"""Once-results filling Redis toward its maxmemory: once-flows refused, the fleet keeps working.

A real Redis under a small ``maxmemory`` (``noeviction``, Redis's default, as
the chart sets it). Once-flows whose results are 60 KiB each fill it: past
``--once-memory-limit`` (80%) every replica refuses **new** once-flows with the
retryable "ledger is full" error (``finish`` never runs), while the memory
the fleet needs to live is still there: new sessions open through the router
(their routes are written; the handshake event store writes nothing past the
limit either, its events go out without ids), plain tools answer, heartbeats go on (every
replica stays in the registry past its heartbeat TTL). Once the memory is
there again (here: ``maxmemory`` raised, as an operator would; in time, the
results expire), the same final round sent again completes and ``finish``
runs once.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from fleetkit.apps.onceapp import EFFECTS_ENV
from fleetkit.clients.rawsession import metric_sum
from fleetkit.clients.wire import Answer, initialize_body
from fleetkit.faulttable import FaultTable
from fleetkit.fleet import FleetOptions, ProcessFleet, local_fleet
from mcpfleet.contract import HEARTBEAT_TTL, SESSION_HEADER, RedisKeys
from mcpfleet.dev.fleet import LocalFleet
from mcpfleet.dev.wait import wait_for
from mcpfleet.registry import read_replicas_sync

from .oncewire import ask, count, final

RECEIPT = 60 * 1024
EVENTS_DROPPED = "mcpfleet_events_dropped_total"
HEADROOM = 4 * 1024 * 1024


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[ProcessFleet, Path]]:
    effects = tmp_path / "effects.log"
    options = FleetOptions(
        app="fleetkit.apps.onceapp:app",
        replicas=2,
        fleet="fullredis",
        env={EFFECTS_ENV: str(effects)},
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


def charged(answer: Answer, order: str) -> bool:
    content = answer.result.get("content") or [{}]
    return answer.status == 200 and str(content[0].get("text", "")).startswith(f"{order}: charged")


@pytest.mark.timeout(180)
def test_once_results_filling_redis_refuse_new_once_flows_and_keep_the_fleet(
    fleet: tuple[ProcessFleet, Path], fault_table: FaultTable, watch_fleet: list[LocalFleet]
) -> None:
    lf, effects = fleet
    watch_fleet.append(lf)
    urls = [f"{m.url}/mcp" for m in lf.members.values()]
    client = redis.Redis(host="127.0.0.1", port=lf.redis_port, socket_timeout=2)
    keys = RedisKeys(lf.fleet)
    row = fault_table.row("once-results filling Redis (maxmemory, once limit 80%)")

    def once_flow(url: str, order: str) -> Answer:
        state = ask(url, order, "charge_receipt", size=RECEIPT)
        sent = time.monotonic()
        answer = final(url, order, state, "charge_receipt", size=RECEIPT)
        row.answered(sent)
        row.attempts += 1
        return answer

    try:
        client.config_set("maxmemory", int(client.info("memory")["used_memory"]) + HEADROOM)
        # Fill with once-results until a replica refuses (its watcher reads Redis each second).
        stored = 0
        while True:
            order = f"fill-{stored}"
            answer = once_flow(urls[stored % len(urls)], order)
            if full(answer):
                break
            assert charged(answer, order), answer.body
            stored += 1
            assert stored < 400, f"no refusal with Redis {share(client):.0%} full"
        filled = share(client)
        refused_order = order
        assert count(effects, refused_order) == 0, "finish ran while the ledger was full"
        assert (answer.error or {}).get("data", {}).get("retryable") is True, answer.body
        # Past the first refusal Redis's share can fall back under the limit by a client
        # buffer or two (Redis trims idle clients' query buffers: ~1% of this maxmemory
        # each): another tenant's data keeps it clearly over, for every replica to read.
        other = 0
        while share(client) < 0.85:
            client.set(f"other-tenant:{other}", b"x" * RECEIPT)
            other += 1
            assert other < 50, f"Redis {share(client):.0%} full"

        # Every replica refuses once it has read the memory, not only the one that did.
        for member in lf.members.values():
            wait_for(
                lambda m=member: memory_ratio(m.url) >= 0.8,  # type: ignore[misc]
                timeout=10,
                what=f"{member.name} to see Redis {filled:.0%} full",
            )
        refusals = [once_flow(url, f"refused-{i}") for i, url in enumerate(urls)]
        assert all(full(a) for a in refusals), [a.body for a in refusals]
        assert all(count(effects, f"refused-{i}") == 0 for i in range(len(urls)))

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
        # Past the limit the event store writes nothing either: the answer's events carry
        # no resumable id, each counted, and the memory left is the routes' and heartbeats'.
        assert not re.search(r"^id: *[0-9a-f]{32}/", resp.text, re.MULTILINE), resp.text
        owner = lf.members[resp.headers["x-mcpfleet-replica"]]
        assert metric_sum(httpx.get(f"{owner.url}/metrics").text, EVENTS_DROPPED, reason="store")
        plain_state = ask(urls[0], "plain-1", "charge_plain")
        plain = final(urls[0], "plain-1", plain_state, "charge_plain")
        assert plain.status == 200 and not plain.error, plain.body
        time.sleep(HEARTBEAT_TTL + 1)
        assert set(read_replicas_sync(client, keys)) == set(lf.members)
        assert share(client) < 1.0

        # Room again: the refused round sent again completes, once.
        client.config_set("maxmemory", int(client.info("memory")["used_memory"]) + 8 * HEADROOM)
        freed = time.monotonic()
        again = ask(urls[0], refused_order, "charge_receipt", size=RECEIPT)

        def completes() -> bool:
            return charged(
                final(urls[0], refused_order, again, "charge_receipt", size=RECEIPT),
                refused_order,
            )

        wait_for(completes, timeout=10, interval=0.3, what="once-flows to be accepted again")
        back = time.monotonic() - freed
        runs = count(effects, refused_order)
        row.double_runs = max(0, runs - 1)
        row.lost = 0 if runs == 1 else 1
        row.notes = (
            f"{stored} results of 60 KiB stored, refused at {filled:.0%}; "
            f"accepted again {back:.2f}s after maxmemory was raised"
        )
        print(f"once-results filling Redis: {row.notes}")
        assert runs == 1
    finally:
        client.config_set("maxmemory", 0)
        client.close()
