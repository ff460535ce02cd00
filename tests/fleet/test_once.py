"""Exactly-once final rounds across a 3-replica fleet with a real Redis.

The test app (``fleetkit.apps.onceapp``) appends a line to a file per run of
``finish``: every assertion counts side effects, never answers.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleetkit.apps.onceapp import EFFECTS_ENV
from fleetkit.clients.wire import Answer, accept, modern_call
from fleetkit.fleet import FleetOptions, ProcessFleet, local_fleet
from mcpfleet.dev.wait import wait_for
from mcpfleet.once import ONCE_META_KEY, RETRY_CODE

from .conftest import shared

pytestmark = pytest.mark.fleet


@pytest.fixture(scope="module")
def effects(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("effects") / "effects.log"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, effects: Path) -> Iterator[ProcessFleet]:
    workdir = tmp_path_factory.mktemp("once")
    env = {EFFECTS_ENV: str(effects)}
    with (
        local_fleet(workdir, FleetOptions(app="fleetkit.apps.onceapp:app", env=env)) as lf,
        shared(lf),
    ):
        yield lf


def count(effects: Path, order: str) -> int:
    if not effects.exists():
        return 0
    return sum(1 for ln in effects.read_text().splitlines() if ln.startswith(f"{order} "))


def ask(url: str, tool: str, order: str) -> str:
    """The flow's first round: the question, and the sealed state to answer it with."""
    first = modern_call(url, tool, {"order": order})
    assert first.result.get("resultType") == "input_required", first.body
    return str(first.result["requestState"])


def final(url: str, tool: str, order: str, state: str, **kw: Any) -> Answer:
    return modern_call(
        url, tool, {"order": order}, request_state=state, input_responses={"ok": accept(True)}, **kw
    )


def text(answer: Answer) -> str:
    content = answer.result.get("content") or [{}]
    return str(content[0].get("text"))


def retryable(answer: Answer) -> bool:
    err = answer.error
    return bool(err and err["code"] == RETRY_CODE and (err.get("data") or {}).get("retryable"))


def once_total(lf: ProcessFleet, outcome: str) -> float:
    total = 0.0
    for replica in lf.members.values():
        body = httpx.get(f"{replica.url}/metrics", timeout=5).text
        for line in body.splitlines():
            if line.startswith(f'mcpfleet_once_total{{outcome="{outcome}"}}'):
                total += float(line.rsplit(" ", 1)[1])
    return total


def test_a_final_round_replayed_on_every_replica_runs_finish_once(
    fleet: ProcessFleet, effects: Path
) -> None:
    claimed_before = once_total(fleet, "claimed")
    state = ask(fleet.url, "charge", "order-1")
    original = final(fleet.url, "charge", "order-1", state)
    assert text(original) == "order-1: charged", original.body
    assert ONCE_META_KEY not in (original.result.get("_meta") or {})
    served = set()
    for replica in fleet.members.values():
        for _ in range(2):
            replay = final(f"{replica.url}/mcp", "charge", "order-1", state)
            assert replay.status == 200, replay.body
            assert text(replay) == "order-1: charged"
            assert replay.result.get("structuredContent") == original.result.get(
                "structuredContent"
            )
            assert replay.result["_meta"][ONCE_META_KEY] == {"replayed": True}
            served.add(replay.replica)
    assert served == set(fleet.members), "every replica answered a replay"
    assert count(effects, "order-1") == 1
    assert once_total(fleet, "claimed") - claimed_before == 1


def test_twenty_concurrent_replays_of_one_final_round_charge_once(
    fleet: ProcessFleet, effects: Path
) -> None:
    state = ask(fleet.url, "charge", "order-race")
    answers: list[Answer] = []
    start = threading.Barrier(20)

    def replay() -> None:
        start.wait(timeout=30)
        answers.append(final(fleet.url, "charge", "order-race", state))

    threads = [threading.Thread(target=replay) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(answers) == 20
    assert count(effects, "order-race") == 1
    for answer in answers:
        assert text(answer) == "order-race: charged" or retryable(answer), answer.body
    assert sum(1 for a in answers if text(a) == "order-race: charged") >= 1


def test_redis_down_before_the_final_round_fails_closed_then_completes_once(
    fleet: ProcessFleet, effects: Path
) -> None:
    state = ask(fleet.url, "charge", "order-outage")
    fleet.stop_redis()
    try:
        for replica in fleet.members.values():
            answer = final(f"{replica.url}/mcp", "charge", "order-outage", state)
            assert retryable(answer), answer.body
            assert answer.error is not None and answer.error["data"]["reason"] == "unavailable"
        assert count(effects, "order-outage") == 0
    finally:
        fleet.start_redis()
    done = wait_for(
        lambda: (a := final(fleet.url, "charge", "order-outage", state)) and not retryable(a) and a,
        timeout=30,
        what="the final round to complete after Redis came back",
        interval=0.5,
    )
    assert text(done) == "order-outage: charged"
    for replica in fleet.members.values():
        again = final(f"{replica.url}/mcp", "charge", "order-outage", state)
        assert again.result["_meta"][ONCE_META_KEY] == {"replayed": True}
    assert count(effects, "order-outage") == 1


def test_a_flow_without_once_runs_finish_on_every_replay_as_before(
    fleet: ProcessFleet, effects: Path
) -> None:
    state = ask(fleet.url, "charge_plain", "order-plain")
    for _ in range(3):
        answer = final(fleet.url, "charge_plain", "order-plain", state)
        assert text(answer) == "order-plain: charged"
        assert ONCE_META_KEY not in (answer.result.get("_meta") or {})
    assert count(effects, "order-plain") == 3
