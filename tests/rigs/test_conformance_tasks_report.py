"""Judging the ``tasks-*`` conformance runs (direct against fleet), without Node or a fleet."""

from __future__ import annotations

import json

from fleetkit.conformance.tasks import (
    PINS,
    TasksReport,
    counts,
    differences,
    expected_from,
    expected_problems,
    load_expected,
    reasons_missing,
    scenario_result,
    suite_name,
    table,
    task_counts,
    tasks_scenarios,
)

OK, BAD = "SUCCESS", "FAILURE"


def _report(**runs: dict[tuple[str, str], str]) -> TasksReport:
    return TasksReport(suite="s@1", scenarios=["tasks-a", "tasks-b"], runs=dict(runs))


def test_only_the_tasks_scenarios_are_taken_in_the_suites_order() -> None:
    listed = ["server-initialize", "tasks-lifecycle", "caching", "tasks-mrtr-input"]
    assert tasks_scenarios(listed) == ["tasks-lifecycle", "tasks-mrtr-input"]


def test_a_scenarios_result_is_its_worst_check() -> None:
    run = {
        ("tasks-a", "x"): OK,
        ("tasks-a", "y"): "WARNING",
        ("tasks-b", "x"): OK,
        ("tasks-b", "y"): BAD,
        ("tasks-c", "x"): "SKIPPED",
    }
    assert [scenario_result(run, s) for s in ("tasks-a", "tasks-b", "tasks-c", "tasks-d")] == [
        "warn",
        "FAIL",
        "skipped",
        "-",
    ]
    assert counts(run, "tasks-b") == "1/2"


def test_a_check_or_scenario_that_ends_otherwise_through_the_fleet_is_a_difference() -> None:
    same = {("tasks-a", "x"): OK, ("tasks-b", "x"): BAD}
    assert differences(_report(direct=same, fleet=dict(same))) == []
    worse = {**same, ("tasks-a", "x"): BAD}
    assert differences(_report(direct=same, fleet=worse)) == [
        "tasks-a / x: SUCCESS directly, FAILURE through the fleet",
        "tasks-a: pass directly, FAIL through the fleet",
    ]
    # Better through the fleet is a difference too: the router must change nothing.
    assert differences(_report(direct=worse, fleet=same))
    # A check the fleet run never reported.
    assert differences(_report(direct=same, fleet={("tasks-a", "x"): OK}))


def test_the_expected_set_pins_both_columns_and_asks_a_reason_for_each_failure() -> None:
    run = {("tasks-a", "x"): OK, ("tasks-b", "y"): BAD}
    report = _report(direct=run, fleet=dict(run))
    expected = expected_from(report, {"tasks-b/y": "why"})
    assert expected_problems(report, expected) == []
    assert reasons_missing(expected) == []
    assert reasons_missing(expected_from(report, {})) == ["tasks-b/y"]
    fixed = _report(direct={**run, ("tasks-b", "y"): OK}, fleet=dict(run))
    assert expected_problems(fixed, expected) == ["tasks-b/y: SUCCESS via direct, expected FAILURE"]
    report.missing = {"tasks-b": ["fleet"]}
    assert "tasks-b: wrote no results via fleet" in expected_problems(report, expected)


def test_the_table_lists_each_scenario_and_check_both_ways() -> None:
    run = {("tasks-a", "x"): OK, ("tasks-b", "y"): BAD}
    report = _report(direct=run, fleet=dict(run))
    report.seconds = {"direct": 1.0, "fleet": 2.0}
    report.spread = {"replica-0": (3, 2), "replica-1": (1, 2)}
    text = table(report)
    assert "tasks-b   FAIL    FAIL   0/1 / 0/1" in text
    assert "tasks-b   y      FAIL    FAIL" in text
    assert "fleet: 1 of 2 checks pass (2.0 s)" in text
    assert "replica-0 3/2, replica-1 1/2" in text


def test_task_counts_sum_every_tool_and_status_of_a_replicas_scrape() -> None:
    scrape = "\n".join(
        [
            "# HELP mcpfleet_tasks_created_total Tasks created.",
            'mcpfleet_tasks_created_total{tool="slow_compute"} 5.0',
            'mcpfleet_tasks_created_total{tool="failing_job"} 2.0',
            'mcpfleet_tasks_created_created{tool="failing_job"} 1.7e9',
            'mcpfleet_tasks_finished_total{status="completed",tool="slow_compute"} 4.0',
            'mcpfleet_tasks_finished_total{status="cancelled",tool="slow_compute"} 1.0',
        ]
    )
    assert task_counts(scrape) == (7, 5)


def test_the_expected_set_kept_in_the_repo_is_for_the_pinned_pre_release_with_reasons() -> None:
    pinned = json.loads((PINS / "package.json").read_text())["dependencies"]
    assert suite_name() == f"@modelcontextprotocol/conformance@{pinned[next(iter(pinned))]}"
    expected = load_expected()
    assert expected["suite"] == suite_name()
    assert reasons_missing(expected) == []
