"""``make bench``'s rows for MCP tasks: a task's creation, its first
``tasks/get`` on another replica, and completed tasks/s per replica.

A fleet of three replicas of :mod:`fleetkit.apps.taskapp` (an app written for
FastMCP's tasks engine, unchanged) behind one router, on one Redis, without
auth. The engine needs the ``[tasks]`` extra, which lives in ``.venv-tasks``
(docs/tasks.md says why), so :func:`task_rows`, which ``make bench`` calls
from the main venv, runs this module there as a child process
(``.venv-tasks/bin/python -m benchkit.taskbench --json``): every process of
that fleet, and the clients, run on ``.venv-tasks``. Without it, or when the
run fails, the table gets one row saying why.

Three measures, one after the other, on one fleet:

* **Latency** (one client, sequential): a ``tools/call`` of the task tool
  ``double`` (``seconds=0``) through the router, timed until its
  ``CreateTaskResult`` (which the engine answers only once the task is
  durable), then at once a ``tasks/get`` of the new id sent straight to a
  replica other than the one that created it (round robin over the two
  others), timed until its answer. p50/p99 of each and of the pair (per
  sample); a ``tasks/get`` answered "not found" is counted (the fleet tier
  proves there are none).
* **Completed tasks/s, a burst**: a fixed count of short tasks created
  through the router by a few clients, each sending its share one creation
  after the other without waiting for any task; the run ends when the
  replicas' completion counters have gone up by the count. Per replica: each
  replica's worker's completions (its
  ``mcpfleet_tasks_finished_total{status="completed"}``, before and after)
  over the run's time. The creations' own rate is printed beside it: when
  the workers keep up, it is the bound.
* **Completed tasks/s, waiting clients**: a few clients, each creating a task
  through the router and polling ``tasks/get`` through the router the way
  FastMCP's own task client does (backoff from 20 ms, doubling, up to the
  task's ``pollIntervalMs``) until it is final, then creating the next. The
  poll cadence is part of what this measures: it is what such a client gets
  (create to seen final, p50/p99), not the workers' ceiling.

Every task's final status and result are checked (``wrong`` counts the
others).

Nothing here asserts: a benchmark reports, tests prove behaviour.

    PYTHONPATH=hack/devkit .venv/bin/python -m benchkit.taskbench [--quick]  # the rows alone
    PYTHONPATH=hack/devkit .venv-tasks/bin/python -m benchkit.taskbench --json  # the child
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from fleetkit.clients.taskwire import FINAL, NOT_FOUND, create, task
from fleetkit.fleet import FleetOptions, ProcessFleet
from mcpfleet.dev.wait import wait_for

Row = tuple[str, str, str, str]

#: The repository's root (this file is hack/devkit/benchkit/taskbench.py).
ROOT = Path(__file__).resolve().parents[3]
#: The tasks venv ``make venv-tasks`` makes.
TASKS_PYTHON = ROOT / ".venv-tasks" / "bin" / "python"
APP = "fleetkit.apps.taskapp:app"
TOOL = "double"
#: Seconds the whole child run may take before ``make bench`` gives up on it.
RUN_LIMIT = 240.0
#: Seconds one throughput client waits for its task to end.
TASK_LIMIT = 30.0
#: FastMCP's task client starts polling at this interval (seconds) and doubles it.
FIRST_POLL = 0.02


@dataclass
class Run:
    """One throughput run: ``tasks`` tasks by ``clients`` concurrent clients."""

    clients: int
    tasks: int
    #: Seconds from the first creation sent until every task was completed.
    seconds: float = 0.0
    #: Seconds the creations alone took (the burst: creations do not wait).
    create_seconds: float = 0.0
    #: Tasks each replica's worker completed in the run (its counter's increase).
    completed: dict[str, int] = field(default_factory=dict)
    #: Milliseconds from sending a creation to seeing its task final (waiting clients).
    end_to_end_ms: list[float] = field(default_factory=list)
    #: Tasks that did not end completed with their own result (2n).
    wrong: int = 0

    def per_replica(self) -> list[float]:
        """Each replica's completed tasks/s over the run, by replica name."""
        return [self.completed[name] / self.seconds for name in sorted(self.completed)]


@dataclass
class TaskFigures:
    """What one run measured, as the child hands it to ``make bench`` (JSON)."""

    #: Milliseconds from sending the task-creating ``tools/call`` to its answer.
    create_ms: list[float] = field(default_factory=list)
    #: Milliseconds of the ``tasks/get`` sent right after, to another replica.
    get_ms: list[float] = field(default_factory=list)
    #: Of those ``tasks/get``, how many answered "not found".
    not_found: int = 0
    replicas: int = 3
    #: Clients that wait for each task (create, poll until final, next).
    waiting: Run | None = None
    #: Clients that create their share without waiting, then the fleet drains it.
    burst: Run | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> TaskFigures:
        data = json.loads(text)
        for name in ("waiting", "burst"):
            if data.get(name) is not None:
                data[name] = Run(**data[name])
        return cls(**data)


def _p(values: list[float], q: float) -> float:
    """The ``q`` quantile (nearest rank) of ``values``."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _ms(values: list[float]) -> str:
    return f"p50 {statistics.median(values):.1f} / p99 {_p(values, 0.99):.1f} ms"


def _rate_row(label: str, run: Run, replicas: int, note: str) -> Row:
    per = run.per_replica()
    total = run.tasks / run.seconds
    spread = f"max/min x{max(per) / min(per):.2f}" if per and min(per) > 0 else "a replica ran none"
    return (
        label,
        " / ".join(f"{r:.0f}" for r in per) + " /s",
        f"total {total:.0f}/s, {total / replicas:.0f}/s per replica; {spread}",
        note,
    )


def rows_of(fig: TaskFigures) -> list[Row]:
    """The bench table's rows for one run's figures."""
    pairs = [c + g for c, g in zip(fig.create_ms, fig.get_ms, strict=True)]
    n = len(pairs)
    out: list[Row] = [
        (
            "task: tools/call -> CreateTaskResult (router)",
            _ms(fig.create_ms),
            "",
            f"{n} sequential, 1 client; answered once the task is durable",
        ),
        (
            "task: then tasks/get on another replica (direct)",
            _ms(fig.get_ms),
            f"x{statistics.median(fig.get_ms) / statistics.median(fig.create_ms):.2f} of create",
            f"not found: {fig.not_found} of {n}",
        ),
        (
            "task: create + tasks/get elsewhere, the pair",
            _ms(pairs),
            "",
            f"{fig.replicas} replicas, 1 router, 1 Redis, no auth",
        ),
    ]
    if fig.burst is not None:
        b = fig.burst
        out.append(
            _rate_row(
                "task: completed tasks/s per replica, burst",
                b,
                fig.replicas,
                f"{b.tasks} tasks of 0 s created by {b.clients} clients "
                f"({b.tasks / b.create_seconds:.0f}/s) at once; wrong: {b.wrong}",
            )
        )
    if fig.waiting is not None:
        w = fig.waiting
        out += [
            _rate_row(
                "task: completed tasks/s per replica, waiting clients",
                w,
                fig.replicas,
                f"{w.tasks} tasks of 0 s, {w.clients} clients each waiting on its task",
            ),
            (
                "task: create -> seen final, waiting clients",
                _ms(w.end_to_end_ms),
                "",
                f"tasks/get via router, 20 ms backoff; wrong: {w.wrong}",
            ),
        ]
    return out


def skipped(reason: str) -> list[Row]:
    return [("task rows (MCP tasks)", "skipped", "", reason)]


def task_rows(quick: bool, python: Path = TASKS_PYTHON) -> list[Row]:
    """``make bench``'s task rows: this module run in the tasks venv, or why not."""
    if not python.exists():
        return skipped(f"no {python}: make venv-tasks")
    probe = subprocess.run(
        [str(python), "-c", "import fastmcp_tasks"], capture_output=True, text=True, check=False
    )
    if probe.returncode != 0:
        return skipped(f"fastmcp_tasks does not import in {python}: make venv-tasks")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT / "hack" / "devkit"), env.get("PYTHONPATH")) if p
    )
    argv = [str(python), "-m", "benchkit.taskbench", "--json", *(["--quick"] if quick else [])]
    try:
        run = subprocess.run(
            argv, capture_output=True, text=True, env=env, timeout=RUN_LIMIT, check=False
        )
    except subprocess.TimeoutExpired:
        return skipped(f"the run took over {RUN_LIMIT:.0f} s")
    lines = run.stdout.strip().splitlines()
    if run.returncode != 0 or not lines:
        tail = (run.stderr.strip().splitlines() or ["no output"])[-1]
        return skipped(f"the run failed ({run.returncode}): {tail}")
    return rows_of(TaskFigures.from_json(lines[-1]))


# --- the measurement, in the tasks venv --------------------------------------------------


def measure(quick: bool) -> TaskFigures:
    if shutil.which("redis-server") is None:
        raise SystemExit("redis-server is not installed (make deps)")
    work = Path(tempfile.mkdtemp(prefix="mcpfleet-taskbench-"))
    lf = ProcessFleet(work, **FleetOptions(app=APP, fleet="taskbench").fleet_fields())
    fig = TaskFigures(replicas=lf.replicas)
    try:
        lf.start()
        with httpx.Client(timeout=10) as http:
            latency(http, lf, fig, 60 if quick else 200)
        fig.burst = burst(lf, Run(clients=4, tasks=150 if quick else 600))
        fig.waiting = waiting_clients(lf, Run(clients=4, tasks=100 if quick else 300))
    finally:
        lf.stop()
        shutil.rmtree(work, ignore_errors=True)
    return fig


def latency(http: httpx.Client, lf: ProcessFleet, fig: TaskFigures, n: int) -> None:
    """``n`` creations through the router, each followed by a ``tasks/get`` elsewhere."""
    urls = {name: f"{m.url}/mcp" for name, m in lf.members.items()}
    warm = 10
    for i in range(warm + n):
        started = time.perf_counter()
        made = create(http, lf.url, TOOL, {"n": i})
        created = time.perf_counter()
        if made.error is not None or "taskId" not in made.result:
            raise RuntimeError(f"creation failed: {made.body}")
        others = sorted(name for name in urls if name != made.replica)
        url = urls[others[i % len(others)]]
        got = task(http, url, "tasks/get", made.result["taskId"])
        done = time.perf_counter()
        if i < warm:
            continue
        fig.create_ms.append((created - started) * 1e3)
        fig.get_ms.append((done - created) * 1e3)
        if got.error is not None and got.error.get("code") == NOT_FOUND:
            fig.not_found += 1
        elif got.error is not None:
            raise RuntimeError(f"tasks/get failed: {got.body}")


def completions(lf: ProcessFleet) -> dict[str, int]:
    """Each replica's ``mcpfleet_tasks_finished_total{tool=TOOL,status="completed"}``."""
    out: dict[str, int] = {}
    for name, member in lf.members.items():
        text = httpx.get(f"{member.url}/metrics", timeout=5).text
        out[name] = sum(
            int(s.value)
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == "mcpfleet_tasks_finished_total"
            and s.labels.get("tool") == TOOL
            and s.labels.get("status") == "completed"
        )
    return out


def _create(http: httpx.Client, lf: ProcessFleet, n: int) -> dict[str, Any]:
    made = create(http, lf.url, TOOL, {"n": n})
    if made.error is not None or "taskId" not in made.result:
        raise RuntimeError(f"creation failed: {made.body}")
    return made.result


def _is_right(result: dict[str, Any], n: int) -> bool:
    """Whether a final ``tasks/get`` result is ``completed`` with ``double``'s answer."""
    inner = result.get("result")
    structured = inner.get("structuredContent") if isinstance(inner, dict) else None
    return result.get("status") == "completed" and structured == {"result": 2 * n}


def _in_parallel(clients: int, work: Callable[[int], None]) -> None:
    """``work(i)`` for each of ``clients`` clients at once; the first error is raised."""
    with ThreadPoolExecutor(clients) as pool:
        for future in [pool.submit(work, i) for i in range(clients)]:
            future.result()


def burst(lf: ProcessFleet, run: Run) -> Run:
    """``run.tasks`` tasks created at once by ``run.clients`` clients; the fleet drains them.

    Each client sends its share of creations through the router one after the
    other, without waiting for any task; the run ends when the replicas'
    completion counters, read every 50 ms, have gone up by ``run.tasks``.
    Then every task is read back (untimed, by the same clients) for its
    status and result.
    """
    ids: dict[str, int] = {}
    lock = threading.Lock()
    before = completions(lf)

    def creator(i: int) -> None:
        with httpx.Client(timeout=10) as http:
            for n in range(i, run.tasks, run.clients):
                made = _create(http, lf, n)
                with lock:
                    ids[str(made["taskId"])] = n

    started = time.perf_counter()
    _in_parallel(run.clients, creator)
    run.create_seconds = time.perf_counter() - started

    def drained() -> bool:
        return sum(completions(lf).values()) - sum(before.values()) >= run.tasks

    wait_for(drained, timeout=TASK_LIMIT, what=f"{run.tasks} tasks to complete", interval=0.05)
    run.seconds = time.perf_counter() - started
    after = completions(lf)
    run.completed = {name: after[name] - before.get(name, 0) for name in after}
    everyone = sorted(ids.items())

    def checker(i: int) -> None:
        with httpx.Client(timeout=10) as http:
            for task_id, n in everyone[i :: run.clients]:
                got = task(http, lf.url, "tasks/get", task_id)
                if got.error is not None or not _is_right(got.result, n):
                    with lock:
                        run.wrong += 1

    _in_parallel(run.clients, checker)
    return run


def waiting_clients(lf: ProcessFleet, run: Run) -> Run:
    """``run.tasks`` tasks by ``run.clients`` clients, each creating and polling until final."""
    lock = threading.Lock()
    left = iter(range(run.tasks))

    def client(_: int) -> None:
        with httpx.Client(timeout=10) as http:
            while True:
                with lock:
                    n = next(left, None)
                if n is None:
                    return
                started = time.perf_counter()
                made = _create(http, lf, n)
                ceiling = max(FIRST_POLL, float(made.get("pollIntervalMs", 1000)) / 1000)
                delay, deadline = FIRST_POLL, started + TASK_LIMIT
                while True:
                    # The client's poll cadence (FastMCP's task client: backoff
                    # from 20 ms, doubling, capped at pollIntervalMs) is part of
                    # what a client of the fleet waits: it is measured, not a wait.
                    time.sleep(delay)
                    delay = min(delay * 2, ceiling)
                    got = task(http, lf.url, "tasks/get", str(made["taskId"]))
                    if got.error is not None:
                        raise RuntimeError(f"tasks/get failed: {got.body}")
                    if got.result["status"] in FINAL:
                        break
                    if time.perf_counter() > deadline:
                        raise RuntimeError(f"a task not final within {TASK_LIMIT} s")
                seen = time.perf_counter()
                with lock:
                    run.end_to_end_ms.append((seen - started) * 1e3)
                    run.wrong += not _is_right(got.result, n)

    before = completions(lf)
    started = time.perf_counter()
    _in_parallel(run.clients, client)
    run.seconds = time.perf_counter() - started
    after = completions(lf)
    run.completed = {name: after[name] - before.get(name, 0) for name in after}
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer samples (a smoke run)")
    parser.add_argument(
        "--json", action="store_true", help="print the figures as JSON (what make bench reads)"
    )
    args = parser.parse_args()
    if not args.json:
        # Run from the main venv: measure in the tasks venv, print the rows.
        from benchkit.table import render

        started = time.monotonic()
        print(render(task_rows(args.quick)))
        one, five, fifteen = os.getloadavg()
        print(f"took {time.monotonic() - started:.0f} s; load {one:.2f} {five:.2f} {fifteen:.2f}")
        return
    fig = measure(args.quick)
    sys.stdout.write(fig.to_json() + "\n")


if __name__ == "__main__":
    main()
