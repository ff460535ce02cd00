"""``make bench``'s MCP tasks rows: judged from given figures, and what the table says when
the tasks venv is missing or its run fails (no fleet, no timing)."""

from __future__ import annotations

import stat
from pathlib import Path

from benchkit.taskbench import Run, TaskFigures, rows_of, task_rows


def figures() -> TaskFigures:
    # 100 creations of 1..100 ms, each followed by a tasks/get of 2 ms (one not found).
    return TaskFigures(
        create_ms=[float(i) for i in range(1, 101)],
        get_ms=[2.0] * 100,
        not_found=1,
        burst=Run(
            clients=4,
            tasks=600,
            seconds=4.0,
            create_seconds=3.0,
            completed={"replica-0": 200, "replica-1": 240, "replica-2": 160},
        ),
        waiting=Run(
            clients=4,
            tasks=300,
            seconds=10.0,
            completed={"replica-0": 100, "replica-1": 100, "replica-2": 100},
            end_to_end_ms=[50.0] * 99 + [400.0],
            wrong=2,
        ),
    )


def by_measure(rows: list[tuple[str, str, str, str]]) -> dict[str, tuple[str, str, str]]:
    return {r[0]: r[1:] for r in rows}


def test_the_rows_give_p50_p99_of_the_creation_the_get_elsewhere_and_the_pair() -> None:
    rows = by_measure(rows_of(figures()))
    assert rows["task: tools/call -> CreateTaskResult (router)"][0] == "p50 50.5 / p99 99.0 ms"
    get = rows["task: then tasks/get on another replica (direct)"]
    assert get[0] == "p50 2.0 / p99 2.0 ms"
    assert get[1] == "x0.04 of create"
    assert get[2] == "not found: 1 of 100"
    # The pair is per sample (create + its own get), not the sum of two percentiles.
    assert rows["task: create + tasks/get elsewhere, the pair"][0] == "p50 52.5 / p99 101.0 ms"


def test_tasks_per_replica_come_from_each_workers_completions_over_the_runs_time() -> None:
    rows = by_measure(rows_of(figures()))
    value, ratio, note = rows["task: completed tasks/s per replica, burst"]
    assert value == "50 / 60 / 40 /s"
    assert ratio == "total 150/s, 50/s per replica; max/min x1.50"
    assert note == "600 tasks of 0 s created by 4 clients (200/s) at once; wrong: 0"
    value, ratio, _ = rows["task: completed tasks/s per replica, waiting clients"]
    assert (value, ratio) == ("10 / 10 / 10 /s", "total 30/s, 10/s per replica; max/min x1.00")
    end_to_end = rows["task: create -> seen final, waiting clients"]
    assert end_to_end[0] == "p50 50.0 / p99 50.0 ms"
    assert end_to_end[2].endswith("wrong: 2")


def test_a_replica_that_completed_nothing_is_named_not_divided_by() -> None:
    fig = figures()
    assert fig.burst is not None
    fig.burst.completed["replica-2"] = 0
    value, ratio, _ = by_measure(rows_of(fig))["task: completed tasks/s per replica, burst"]
    assert value == "50 / 60 / 0 /s"
    assert ratio.endswith("a replica ran none")


def test_the_figures_cross_the_childs_json_unchanged() -> None:
    fig = figures()
    assert TaskFigures.from_json(fig.to_json()) == fig
    assert TaskFigures.from_json(TaskFigures(create_ms=[1.0], get_ms=[1.0]).to_json()).burst is None


def fake_python(tmp_path: Path, script: str) -> Path:
    """An executable that stands in for the tasks venv's python."""
    path = tmp_path / "python"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_without_the_tasks_venv_the_table_says_skipped_and_how_to_make_it(tmp_path: Path) -> None:
    ((_, value, _, why),) = task_rows(True, tmp_path / "no-venv" / "python")
    assert value == "skipped"
    assert "make venv-tasks" in why


def test_a_venv_without_the_engine_is_skipped_with_the_reason(tmp_path: Path) -> None:
    python = fake_python(tmp_path, "exit 1\n")
    ((_, value, _, why),) = task_rows(True, python)
    assert value == "skipped"
    assert why.startswith("fastmcp_tasks does not import")


def test_a_failed_run_is_skipped_with_its_last_error_line(tmp_path: Path) -> None:
    python = fake_python(
        tmp_path,
        'case "$1" in -c) exit 0;; esac\necho "starting" >&2\necho "redis refused" >&2\nexit 3\n',
    )
    ((_, value, _, why),) = task_rows(True, python)
    assert value == "skipped"
    assert why == "the run failed (3): redis refused"


def test_the_childs_last_stdout_line_becomes_the_rows(tmp_path: Path) -> None:
    data = tmp_path / "figures.json"
    data.write_text(figures().to_json())
    python = fake_python(
        tmp_path,
        f'case "$1" in -c) exit 0;; esac\necho "a log line"\ncat {data}\necho\n',
    )
    assert task_rows(False, python) == rows_of(figures())
