"""The hosted workflow (.github/workflows/ci.yaml) can pass, and says what it runs.

GitHub's runners are not this project's CI machine: nothing here can run the
workflow, so these checks read it and hold it honest. It runs the tiers an
Ubuntu runner can (lint, types, unit, packaging, fleet, faults), through the
project's own make targets and package list, and it says in its header that
`.ci/run` is the project's CI and which tiers it leaves to it; no job pulls a
kind node image from a registry (the e2e tier's node image is made here).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "ci.yaml"


@pytest.fixture(scope="module")
def workflow() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(WORKFLOW.read_text())
    return loaded


def _steps(workflow: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for job in workflow["jobs"].values() for s in job["steps"]]


def _runs(workflow: dict[str, Any]) -> str:
    return "\n".join(s.get("run", "") for s in _steps(workflow))


def test_every_action_is_pinned_by_a_full_commit(workflow: dict[str, Any]) -> None:
    uses = [s["uses"] for s in _steps(workflow) if "uses" in s]
    assert len(uses) >= 2
    for ref in uses:
        assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", ref), ref
    for line in WORKFLOW.read_text().splitlines():
        if "uses:" in line:
            assert re.search(r"@[0-9a-f]{40} # v\d", line), line


def test_one_run_per_ref(workflow: dict[str, Any]) -> None:
    assert workflow["concurrency"]["cancel-in-progress"] is True
    assert "github.ref" in workflow["concurrency"]["group"]


def test_every_make_target_it_runs_exists(workflow: dict[str, Any]) -> None:
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([\w-]+):", makefile, flags=re.M))
    used = [t for line in re.findall(r"make ([\w -]+)", _runs(workflow)) for t in line.split()]
    assert used, "the workflow runs no make target"
    assert not [t for t in used if t not in targets], used


def test_it_runs_the_tiers_a_runner_can_and_says_what_it_leaves_to_ci_run(
    workflow: dict[str, Any],
) -> None:
    runs = _runs(workflow)
    for target in ("make lint typecheck", "make test-unit", "make test-fleet", "make test-faults"):
        assert target in runs, target
    header = WORKFLOW.read_text().split("\nname:", 1)[0]
    assert "NOT the project's CI" in header and ".ci/run" in header
    for tier in ("conformance", "control-plane", "node", "e2e"):
        assert tier in header.split("It leaves to .ci/run:", 1)[1], tier


def test_no_job_pulls_a_kind_node_image_the_provider_makes_here(
    workflow: dict[str, Any],
) -> None:
    text = WORKFLOW.read_text()
    assert "kindest/node" not in text and "docker pull" not in text
    assert "--cluster-provider" not in _runs(workflow)


def test_the_packages_come_from_the_projects_own_list(workflow: dict[str, Any]) -> None:
    """redis-sentinel (the Sentinel tests) and wrk (the wrk script test), through
    hack/ensure-debs.sh, so the two never drift apart."""
    runs = _runs(workflow)
    assert "hack/ensure-debs.sh bench" in runs
    assert runs.index("hack/ensure-debs.sh") < runs.index("make test-fleet")
    script = (ROOT / "hack" / "ensure-debs.sh").read_text()
    for command in ("redis-server", "redis-sentinel", "promtool", "wrk", "nginx"):
        assert f"command -v {command} " in script, command


def test_every_run_step_is_valid_bash(workflow: dict[str, Any]) -> None:
    for step in _steps(workflow):
        if "run" in step:
            check = subprocess.run(
                ["bash", "-n"], input=step["run"], text=True, capture_output=True, check=False
            )
            assert check.returncode == 0, (step.get("name"), check.stderr)
