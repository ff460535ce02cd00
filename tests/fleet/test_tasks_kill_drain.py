"""MCP tasks whose worker goes away: a replica SIGKILLed, or drained, while it runs them.

Each scenario has a fleet of ``fleetkit.apps.taskapp`` of its own; the app writes
each task's start and end to an effects file, so a task that ran twice or never is
counted. Runs where the [tasks] extra is installed (``make test-tasks``).
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from fleetkit.clients.taskwire import create
from fleetkit.fleet import FleetOptions, local_fleet
from mcpfleet.dev.wait import wait_for

from .conftest import watched
from .taskfleet import APP, REDELIVERY, _starts, _victim, effects, wait_final

pytest.importorskip("fastmcp_tasks", reason="the [tasks] extra: make venv-tasks, make test-tasks")

pytestmark = [pytest.mark.fleet, pytest.mark.tasks]


#: Replicas SIGKILLed in a row while their workers run tasks (the issue's figure).
KILLS = 10


@pytest.mark.timeout(360)
def test_a_replica_killed_mid_task_leaves_no_task_working(
    tmp_path: Path, request: pytest.FixtureRequest, http: httpx.Client
) -> None:
    """Tasks whose worker is SIGKILLed run again on another worker within the bound.

    Delivery is at least once: a killed task's side effect may have started
    twice (docs/tasks.md); each one completes exactly once.
    """
    log = tmp_path / "effects"
    options = FleetOptions(
        app=APP,
        env={"MCPFLEET_TEST_EFFECTS": str(log)},
        replica_args=("--tasks-redelivery", str(REDELIVERY)),
    )
    rounds, per_round, seconds = KILLS, 6, 2.0
    with local_fleet(tmp_path, options) as lf, watched(request, lf):
        killed_tasks = 0
        counter = itertools.count()
        for _ in range(rounds):
            tags = {f"t{next(counter)}" for _ in range(per_round)}
            ids = {}
            for tag in sorted(tags):
                made = create(http, lf.url, "effect", {"tag": tag, "seconds": seconds})
                assert made.error is None, made.body
                ids[tag] = made.result["taskId"]

            def running(tags: set[str] = tags) -> dict[str, str]:
                found = {}
                for line in effects(log):
                    kind, tag, pid = line.split()
                    if kind == "start" and tag in tags:
                        found[tag] = pid.removeprefix("pid=")
                return found if len(found) == len(tags) else {}

            pids = wait_for(running, timeout=30, what="every task to start")
            by_pid = Counter(pids.values())
            victim_pid, victim_load = by_pid.most_common(1)[0]
            victim = next(
                n
                for n, r in lf.members.items()
                if r.proc.popen is not None and str(r.proc.popen.pid) == victim_pid
            )
            killed_at = time.monotonic()
            lf.kill(victim)
            killed_tasks += victim_load
            survivor = next(r for r in lf.members.values() if r.proc.alive)
            bound = REDELIVERY + seconds + 15
            final = wait_final(http, f"{survivor.url}/mcp", list(ids.values()), None, bound)
            took = time.monotonic() - killed_at
            statuses = Counter(r["status"] for r in final.values())
            print(
                f"\nkilled {victim} running {victim_load} of {per_round} tasks; all ended "
                f"{took:.1f} s after the kill: {dict(statuses)}"
            )
            assert statuses == {"completed": per_round}, final
            lf.add_replica(f"replica-new-{next(counter)}")
        lines = effects(log)
        starts = Counter(ln.split()[1] for ln in lines if ln.startswith("start"))
        dones = Counter(ln.split()[1] for ln in lines if ln.startswith("done"))
        total = rounds * per_round
        print(
            f"{rounds} kills, {total} tasks, {killed_tasks} on a killed worker: "
            f"side effects started {sum(starts.values())}, done {sum(dones.values())}, "
            f"started twice {sum(1 for c in starts.values() if c > 1)}"
        )
        assert set(dones) == set(starts) and len(dones) == total
        assert all(c == 1 for c in dones.values()), dones
        assert sum(starts.values()) == total + killed_tasks


@pytest.mark.timeout(240)
def test_a_draining_replica_takes_no_new_task_and_finishes_or_hands_back_what_it_runs(
    tmp_path: Path, request: pytest.FixtureRequest, http: httpx.Client
) -> None:
    """A real SIGTERM while tasks run, twice.

    Tasks shorter than the drain: the replica finishes them (each started once),
    takes none of those created while it drains, and exits 0. Tasks longer than
    the drain: at its deadline it hands them back, and another worker completes
    them well before the redelivery timeout would have. None lost, none left
    ``working``, each effect finished once.
    """
    log = tmp_path / "effects"
    drain, redelivery = 4.0, 20.0
    options = FleetOptions(
        app=APP,
        env={"MCPFLEET_TEST_EFFECTS": str(log)},
        replica_args=(
            "--drain-timeout",
            str(drain),
            "--tasks-redelivery",
            str(redelivery),
            "--tasks-concurrency",
            "4",
        ),
    )

    def run(tags: list[str], seconds: float) -> dict[str, str]:
        ids = {}
        for tag in tags:
            made = create(http, lf.url, "effect", {"tag": tag, "seconds": seconds})
            assert made.error is None, made.body
            ids[tag] = made.result["taskId"]
        return ids

    with local_fleet(tmp_path, options) as lf, watched(request, lf):
        # Shorter than the drain: finished by the draining replica itself.
        first = run([f"a{i}" for i in range(6)], 1.5)
        pids = wait_for(
            lambda: (p := _starts(log, set(first))) and len(p) == len(first) and p,
            timeout=30,
            what="every task to start",
        )
        victim, victim_pid, load = _victim(lf, pids)
        proc = lf.members[victim].proc
        lf.drain(victim)
        wait_for(
            lambda: "takes no new task" in proc.tail(200), timeout=10, what="the worker to stop"
        )
        later = run([f"n{i}" for i in range(6)], 0.2)
        survivor = next(r for n, r in lf.members.items() if n != victim and r.proc.alive)
        ids = {**first, **later}
        final = wait_final(http, f"{survivor.url}/mcp", list(ids.values()), None, 30)
        assert {r["status"] for r in final.values()} == {"completed"}, final
        assert proc.wait(drain + 10) == 0, "the drained replica exits by itself"
        starts = _starts(log, set(ids))
        assert all(len(p) == 1 for p in starts.values()), starts
        assert not [t for t in later if starts[t] == [victim_pid]], "no new task on it"
        print(f"\ndrained {victim} running {load} task(s): finished them, took none of 6 new")
        lf.add_replica("replica-after-drain")

        # Longer than the drain: handed back at its deadline.
        long = 8.0
        second = run([f"b{i}" for i in range(6)], long)
        pids = wait_for(
            lambda: (p := _starts(log, set(second))) and len(p) == len(second) and p,
            timeout=30,
            what="every task to start",
        )
        victim, victim_pid, load = _victim(lf, pids)
        proc = lf.members[victim].proc
        termed = time.monotonic()
        lf.drain(victim)
        survivor = next(r for n, r in lf.members.items() if n != victim and r.proc.alive)
        final = wait_final(http, f"{survivor.url}/mcp", list(second.values()), None, 60)
        took = time.monotonic() - termed
        assert {r["status"] for r in final.values()} == {"completed"}, final
        assert proc.wait(10) == 0
        assert "handed back" in proc.tail(200)
        lines = effects(log)
        starts = _starts(log, set(second))
        dones = Counter(ln.split()[1] for ln in lines if ln.startswith("done b"))
        handed = [t for t, p in starts.items() if p[0] == victim_pid]
        print(
            f"drained {victim} running {load} task(s) of {long:.0f} s with a {drain:.0f} s "
            f"drain: {len(handed)} handed back, all completed {took:.1f} s after SIGTERM"
        )
        assert len(handed) == load
        assert all(len(starts[t]) == 2 and starts[t][1] != victim_pid for t in handed), starts
        assert dones == Counter(dict.fromkeys(second, 1)), dones
        # Released at once, not left for the redelivery timeout to lapse.
        assert took < drain + 0.75 * redelivery + long, took
