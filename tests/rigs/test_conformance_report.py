"""Reading the conformance suite's results and comparing runs, without Node or a fleet."""

from __future__ import annotations

import json
from pathlib import Path

from fleetkit.conformance.modern import ModernResult, modern_table, suite_answer
from fleetkit.conformance.suite import (
    EXPECTED,
    Report,
    expected_from,
    expected_problems,
    fleet_regressions,
    fold_checks,
    load_expected,
    parse_scenario_list,
    read_results,
    reasons_missing,
    table,
)

LIST_OUTPUT = """Server scenarios (test against a server):
  - server-initialize [2025-06-18,2025-11-25]
  - json-schema-2020-12 [2025-11-25]
  - dns-rebinding-protection [2025-11-25]
"""


def _report(**runs: dict[tuple[str, str], str]) -> Report:
    return Report(suite="s@1", scenarios=["a", "b"], runs=dict(runs))


def test_scenario_list_is_read_from_the_cli_listing() -> None:
    assert parse_scenario_list(LIST_OUTPUT) == [
        "server-initialize",
        "json-schema-2020-12",
        "dns-rebinding-protection",
    ]


def test_trace_events_are_dropped_and_a_repeated_check_keeps_its_worst_status() -> None:
    checks = [
        {"id": "outgoing-request", "status": "INFO"},
        {"id": "incoming-sse-event", "status": "FAILURE"},
        {"id": "x", "status": "SUCCESS"},
        {"id": "x", "status": "WARNING"},
        {"id": "x", "status": "SUCCESS"},
        {"id": "resume", "status": "INFO"},
    ]
    assert fold_checks("sc", checks) == {("sc", "x"): "WARNING", ("sc", "resume"): "INFO"}


def test_results_are_read_per_scenario_from_the_suite_output_folders(tmp_path: Path) -> None:
    for name, checks in (
        ("server-tools-list-2026-11-30T08-36-26-873Z", [{"id": "tools-list", "status": "SUCCESS"}]),
        ("server-ping-2026-11-30T08-36-26-775Z", [{"id": "ping", "status": "FAILURE"}]),
        ("not-a-result", [{"id": "nope", "status": "SUCCESS"}]),
    ):
        (tmp_path / name).mkdir()
        (tmp_path / name / "checks.json").write_text(json.dumps(checks))
    outcomes, seen = read_results(tmp_path)
    assert outcomes == {("tools-list", "tools-list"): "SUCCESS", ("ping", "ping"): "FAILURE"}
    assert seen == {"tools-list", "ping"}


def test_a_check_passing_directly_but_not_through_the_fleet_is_a_regression() -> None:
    ok = {("a", "1"): "SUCCESS", ("a", "2"): "FAILURE"}
    assert fleet_regressions(_report(direct=ok, fleet=ok, rotation=ok)) == []
    worse = {("a", "1"): "WARNING", ("a", "2"): "FAILURE"}
    assert fleet_regressions(_report(direct=ok, fleet=ok, rotation=worse)) == [
        "a / 1: SUCCESS directly, WARNING via rotation"
    ]
    # Better through the fleet (the router's DNS-rebinding check) is no regression.
    better = {("a", "1"): "SUCCESS", ("a", "2"): "SUCCESS"}
    assert fleet_regressions(_report(direct=ok, fleet=better, rotation=better)) == []
    missing = {("a", "2"): "FAILURE"}
    assert fleet_regressions(_report(direct=ok, fleet=missing, rotation=ok)) == [
        "a / 1: SUCCESS directly, None via fleet"
    ]


def test_any_change_against_the_expected_set_is_reported_in_either_direction() -> None:
    expected = {
        "checks": {
            "a/1": {"direct": "SUCCESS", "fleet": "SUCCESS"},
            "a/2": {"direct": "FAILURE", "fleet": "SUCCESS", "reason": "why"},
            "b/3": {"direct": "SUCCESS", "fleet": "SUCCESS"},
        }
    }
    same_direct = {("a", "1"): "SUCCESS", ("a", "2"): "FAILURE", ("b", "3"): "SUCCESS"}
    same_fleet = {("a", "1"): "SUCCESS", ("a", "2"): "SUCCESS", ("b", "3"): "SUCCESS"}
    ok = _report(direct=same_direct, fleet=same_fleet, rotation=same_fleet)
    assert expected_problems(ok, expected) == []

    fixed = {**same_direct, ("a", "2"): "SUCCESS"}
    broke = {**same_fleet, ("b", "3"): "FAILURE"}
    new = {**same_fleet, ("b", "4"): "SUCCESS"}
    problems = expected_problems(_report(direct=fixed, fleet=broke, rotation=new), expected)
    assert problems == [
        "a/2: SUCCESS via direct, expected FAILURE",
        "b/3: FAILURE via fleet, expected SUCCESS",
        "b/4: new check, not in expected.json",
    ]
    gone = {k: v for k, v in same_direct.items() if k != ("b", "3")}
    report = _report(direct=gone, fleet=gone, rotation=gone)
    assert "b/3: expected but not reported by the suite" in expected_problems(report, expected)


def test_a_scenario_that_wrote_no_results_is_a_problem() -> None:
    report = _report(direct={}, fleet={}, rotation={})
    report.missing = {"ping": ["fleet"]}
    assert expected_problems(report, {"checks": {}}) == ["ping: wrote no results via fleet"]


def test_a_check_allowed_to_fail_needs_a_reason() -> None:
    expected = {
        "checks": {
            "a/1": {"direct": "SUCCESS", "fleet": "SUCCESS"},
            "a/2": {"direct": "FAILURE", "fleet": "FAILURE", "reason": " "},
            "a/3": {"direct": "WARNING", "fleet": "WARNING", "reason": "no event store"},
        }
    }
    assert reasons_missing(expected) == ["a/2"]


def test_the_repos_expected_set_gives_every_allowed_failure_a_reason() -> None:
    expected = load_expected(EXPECTED)
    assert reasons_missing(expected) == []
    assert len(expected["checks"]) >= 40  # type: ignore[arg-type]


def test_recording_a_run_keeps_reasons_only_where_something_does_not_pass() -> None:
    run = {("a", "1"): "SUCCESS", ("a", "2"): "FAILURE"}
    report = _report(direct=run, fleet=run, rotation=run)
    recorded = expected_from(report, {"a/1": "stale", "a/2": "because"})
    assert recorded == {
        "suite": "s@1",
        "checks": {
            "a/1": {"direct": "SUCCESS", "fleet": "SUCCESS"},
            "a/2": {"direct": "FAILURE", "fleet": "FAILURE", "reason": "because"},
        },
    }


def test_the_table_has_one_row_per_check_and_a_column_per_target() -> None:
    direct = {("a", "1"): "SUCCESS", ("b", "2"): "FAILURE"}
    fleet = {("a", "1"): "SUCCESS", ("b", "2"): "SUCCESS"}
    report = _report(direct=direct, fleet=fleet, rotation=fleet)
    report.rotation_steps = ["stage", "promote", "retire"]
    report.steps_during_suite = 3
    lines = table(report).splitlines()
    assert lines[0].split() == ["scenario", "check", "direct", "fleet", "fleet-during-rotation"]
    assert lines[2].split() == ["a", "1", "pass", "pass", "pass"]
    assert lines[3].split() == ["b", "2", "FAIL", "pass", "pass"]
    assert lines[4].startswith("direct: 1 of 2 checks pass")
    assert lines[-1].endswith("3 rotation steps attested during the rotation run")


def test_modern_probes_answer_each_question_as_the_suites_client_does() -> None:
    assert suite_answer("Who?", {"properties": {"username": {}, "email": {}}}) == {
        "username": "testuser",
        "email": "test@example.com",
    }
    assert suite_answer("Profile", {"properties": {"name": {}, "age": {}}})["age"] == 25


def test_the_modern_table_shows_each_call_its_result_and_the_replicas_reached() -> None:
    text = modern_table(
        [
            ModernResult("tools-call-elicitation", True, 9, 8, ["replica-0", "replica-2"]),
            ModernResult("tools-call-image", False, 2, 1, ["replica-1"], "content types []"),
        ]
    )
    lines = text.splitlines()
    assert lines[2].split() == ["tools-call-elicitation", "pass", "9", "replica-0,", "replica-2"]
    assert lines[3].split()[:3] == ["tools-call-image", "FAIL", "content"]
