"""The task queue's Redis master SIGKILLed through Sentinel while tasks are created and run.

The rig is :func:`fleetkit.failover.sentinel_fleet` (a master, its replica, three
sentinels; down-after 1 s) with two replicas of ``fleetkit.apps.taskapp`` and a
router, every component under its own ACL user, the queue reached through
``redis+sentinel://``. Tasks are created through the router without pause;
the master is SIGKILLed; creation goes on until the new master has answered
as many again. Every task answered with a ``CreateTaskResult`` must then
resolve and complete: a creation waits, through Sentinel, until a replica
of the master acknowledged it (``WAIT``), so the failover cannot take an
answered task with it. A creation cut off by the failover is answered with
the deadline's error (its outcome unknown) and is not counted as answered.
Delivery is at least once: a task whose completion the old master took with
it runs again (counted, not failed).
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleetkit.clients.taskwire import FINAL, create, task
from fleetkit.failover import FLEET, sentinel_fleet
from fleetkit.faulttable import FaultTable
from fleetkit.fleet import FleetOptions
from mcpfleet.dev.wait import wait_for

pytest.importorskip("fastmcp_tasks", reason="the [tasks] extra: make venv-tasks, make test-tasks")

pytestmark = [pytest.mark.faults, pytest.mark.tasks]

#: Tasks answered before the kill, and again by the new master after it.
BATCH = 20
EFFECTS_ENV = "MCPFLEET_TEST_EFFECTS"


def _unreplicated(http: httpx.Client, urls: list[str]) -> float:
    total = 0.0
    for url in urls:
        for family in text_string_to_metric_families(http.get(f"{url}/metrics").text):
            total += sum(
                s.value for s in family.samples if s.name == "mcpfleet_tasks_unreplicated_total"
            )
    return total


@pytest.mark.timeout(240)
def test_a_master_killed_while_tasks_are_created_and_run_loses_no_answered_task(
    tmp_path: Path, fault_table: FaultTable
) -> None:
    row = fault_table.row("task queue's Redis master SIGKILL (Sentinel), tasks created and run")
    log = tmp_path / "effects"
    options = FleetOptions(
        fleet=FLEET,
        replicas=2,
        routers=1,
        app="fleetkit.apps.taskapp:app",
        env={EFFECTS_ENV: str(log)},
        replica_args=("--tasks-redelivery", "3"),
    )
    with sentinel_fleet(tmp_path, options=options) as setup, httpx.Client(timeout=30) as http:
        lf = setup.fleet
        replica_urls = [m.url for m in lf.members.values()]
        answered: dict[str, str] = {}  # tag -> task id
        unknown: list[str] = []
        slowest = 0.0
        tags = (f"f{i}" for i in itertools.count())

        def make() -> None:
            nonlocal slowest
            tag = next(tags)
            start = time.monotonic()
            try:
                made = create(http, lf.url, "effect", {"tag": tag, "seconds": 0.5})
            except httpx.HTTPError as exc:
                unknown.append(f"{tag}: {type(exc).__name__}")
                return
            slowest = max(slowest, time.monotonic() - start)
            if made.status == 200 and made.error is None and "taskId" in made.result:
                answered[tag] = made.result["taskId"]
            else:
                unknown.append(f"{tag}: {made.status} {made.error or made.body}")

        while len(answered) < BATCH:
            make()
        assert not unknown, unknown
        assert _unreplicated(http, replica_urls) == 0, "the replica acknowledged every creation"
        killed = time.monotonic()
        setup.master.kill()
        limit = killed + 60
        while len(answered) < 2 * BATCH:
            assert time.monotonic() < limit, f"the new master answered no creation: {unknown}"
            make()
        promoted = time.monotonic() - killed
        assert setup.current_master() is setup.replica

        final: dict[str, str] = {}
        missing: Counter[str] = Counter()

        def all_ended() -> bool:
            for tag, task_id in answered.items():
                if tag in final:
                    continue
                got = task(http, lf.url, "tasks/get", task_id)
                if got.error is not None:
                    missing[tag] += 1
                    continue
                if got.result["status"] in FINAL:
                    final[tag] = got.result["status"]
            return len(final) == len(answered)

        try:
            wait_for(all_ended, timeout=60, what="every answered task to end", interval=0.3)
        except Exception:
            lost = sorted(set(answered) - set(final))
            pytest.fail(f"answered tasks that did not end: {lost}; not found counts {missing}")
        ran = Counter(
            line.split()[1] for line in log.read_text().splitlines() if line.startswith("done ")
        )
        unreplicated = _unreplicated(http, replica_urls)

    row.attempts = len(answered)
    row.lost = sum(1 for tag in answered if final.get(tag) != "completed")
    row.double_runs = sum(1 for tag in answered if ran[tag] > 1)
    row.worst_seconds = slowest
    row.notes = (
        f"{len(unknown)} creation(s) cut off by the failover (outcome unknown, not answered); "
        f"new master answering {promoted:.1f} s after the kill; {row.double_runs} task(s) "
        f"ran again (at least once); {unreplicated:.0f} answered with the new master alone"
    )
    print(f"\n{row.notes}")
    assert all(status == "completed" for status in final.values()), final
    assert all(ran[tag] >= 1 for tag in answered), "every answered task's effect ran"
