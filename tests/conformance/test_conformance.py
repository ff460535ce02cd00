"""The official MCP conformance suite, through the fleet: the router changes no outcome.

One fleet of three replicas serving the conformance app; every server scenario
of the pinned suite (active and pending) runs against one replica, through the
router, and through the router while the key ring rotates (see
``fleetkit.conformance``). The suite is installed by ``make conformance`` /
``make test`` (``hack/conformance/install.sh``); without it these tests skip,
and with ``CI=true`` they fail.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetkit.conformance.modern import ASKING, ASKING_CALLS
from fleetkit.conformance.suite import (
    EXPECTED,
    TARGETS,
    Report,
    SuiteMissing,
    expected_problems,
    find_suite,
    fleet_regressions,
    load_expected,
    pinned,
    reasons_missing,
    run_all,
    table,
)
from fleetkit.fleet import require_redis

# Three suite runs of ~10 s each on an idle machine, plus the fleet's start.
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Report]:
    require_redis()
    try:
        suite = find_suite()
    except SuiteMissing as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(str(exc))
        pytest.skip(str(exc))
    result = run_all(suite, tmp_path_factory.mktemp("conformance"))
    print(table(result))
    yield result


def test_every_server_scenario_ran_through_every_target(report: Report) -> None:
    assert len(report.scenarios) >= 30, report.scenarios
    assert report.missing == {}
    for target in TARGETS:
        assert {s for s, _ in report.runs[target]} == set(report.scenarios), target


def test_nothing_that_passes_directly_fails_through_the_fleet_or_during_a_rotation(
    report: Report,
) -> None:
    assert fleet_regressions(report) == []


def test_the_rotation_ran_while_the_suite_did(report: Report) -> None:
    # Whole stage/promote/retire cycles, every step attested by every replica,
    # at least one of them while the suite was running.
    assert report.rotation_steps[:3] == ["stage", "promote", "retire"]
    assert report.steps_during_suite >= 1


def test_every_outcome_matches_the_expected_set_kept_in_the_repo(report: Report) -> None:
    problems = expected_problems(report, load_expected())
    assert problems == [], "\n".join(
        [*problems, f"(a deliberate change: update {EXPECTED.name} and its reasons)"]
    )


def test_the_expected_set_gives_a_reason_for_every_check_allowed_to_fail() -> None:
    assert reasons_missing(load_expected()) == []


def test_the_expected_set_is_for_the_pinned_suite() -> None:
    suite = json.loads(Path(EXPECTED).read_text())["suite"]
    version = pinned()["@modelcontextprotocol/conformance"]
    assert suite == f"@modelcontextprotocol/conformance@{version}"


def test_the_suites_calls_pass_on_the_modern_era_through_the_router(report: Report) -> None:
    failed = {m.name: m.detail for m in report.modern if not m.ok}
    assert failed == {}
    assert {m.name for m in report.modern} >= set(ASKING)


def test_modern_rounds_of_the_asking_tools_spread_across_replicas(report: Report) -> None:
    asking = [m for m in report.modern if m.name in ASKING]
    # Each call is two independent rounds: the question, then the answered call.
    assert all(m.tool_calls == 2 * ASKING_CALLS for m in asking), asking
    reached = {r for m in asking for r in m.replicas}
    assert len(reached) >= 2, f"{len(asking) * 2 * ASKING_CALLS} rounds all on {reached}"
