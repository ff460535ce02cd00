"""The conformance suite's ``tasks-*`` scenarios: through the fleet as against one replica.

The pre-release of the suite that has them (pinned in ``hack/conformance/tasks/``,
installed by ``make conformance-tasks-suite``, a prerequisite of ``make test``
and ``make test-tasks``) runs every ``tasks-*`` server scenario against one
replica alone and through the router of three replicas sharing one queue (see
``fleetkit.conformance.tasks``), both serving ``fleetkit.apps.taskconfapp`` on
FastMCP's tasks engine. Runs with the tasks tests (marker ``tasks``, in
``.venv-tasks``); without the suite it skips, and with ``CI=true`` it fails.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from fleetkit.conformance.suite import SuiteMissing
from fleetkit.conformance.tasks import (
    EXPECTED,
    TARGETS,
    TasksReport,
    differences,
    expected_problems,
    find_tasks_suite,
    load_expected,
    reasons_missing,
    run_both,
    scenario_result,
    suite_name,
    table,
)
from fleetkit.fleet import require_redis

pytest.importorskip("fastmcp_tasks", reason="the [tasks] extra: make venv-tasks, make test-tasks")

# Two fleet starts and 2 x 10 suite processes (a Node start each, the scenarios'
# own waits: tasks of 1-2 s, polls every 200 ms).
pytestmark = [pytest.mark.tasks, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TasksReport]:
    require_redis()
    try:
        suite = find_tasks_suite()
    except SuiteMissing as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(str(exc))
        pytest.skip(str(exc))
    result = run_both(suite, tmp_path_factory.mktemp("tasksconf"))
    print("\n" + table(result))
    yield result


def test_every_tasks_scenario_of_the_pinned_suite_ran_both_ways(report: TasksReport) -> None:
    assert report.suite == suite_name()
    assert len(report.scenarios) >= 10, report.scenarios
    assert all(s.startswith("tasks-") for s in report.scenarios)
    assert report.missing == {}
    for target in TARGETS:
        assert {s for s, _ in report.runs[target]} == set(report.scenarios), target


def test_each_scenario_and_check_ends_the_same_through_the_fleet_as_directly(
    report: TasksReport,
) -> None:
    assert differences(report) == []
    assert [scenario_result(report.runs["fleet"], s) for s in report.scenarios] == [
        scenario_result(report.runs["direct"], s) for s in report.scenarios
    ]


def test_the_fleet_run_created_and_ran_its_tasks_on_more_than_one_replica(
    report: TasksReport,
) -> None:
    # Otherwise "the same through the fleet" would only say the router reached one replica.
    created = {name for name, (made, _) in report.spread.items() if made}
    finished = {name for name, (_, ended) in report.spread.items() if ended}
    assert len(report.spread) == 3, report.spread
    assert len(created) >= 2 and len(finished) >= 2, report.spread


def test_every_outcome_matches_the_expected_set_kept_in_the_repo(report: TasksReport) -> None:
    problems = expected_problems(report, load_expected())
    assert problems == [], "\n".join(
        [*problems, f"(a deliberate change: update {EXPECTED.name} and its reasons)"]
    )


def test_the_expected_set_gives_a_reason_for_every_check_allowed_not_to_pass() -> None:
    assert reasons_missing(load_expected()) == []


def test_the_expected_set_is_for_the_pinned_pre_release() -> None:
    assert load_expected()["suite"] == suite_name()
