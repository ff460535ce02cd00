"""The hosted CI workflow (.github/workflows/ci.yaml) can pass, and runs what it pins.

GitHub's runners are not this machine: these checks read the workflow and
hold it to what the tiers need (the packages the fleet tier starts, the
tools the e2e tier builds) and to supply-chain hygiene (actions and the kind
node image pinned, one run per ref, kind's logs kept when a run fails).
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


def _steps(workflow: dict[str, Any], job: str) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = workflow["jobs"][job]["steps"]
    return steps


def test_every_action_is_pinned_by_a_full_commit(workflow: dict[str, Any]) -> None:
    uses = [s["uses"] for job in workflow["jobs"] for s in _steps(workflow, job) if "uses" in s]
    assert len(uses) >= 6
    for ref in uses:
        assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", ref), ref
    # The tag each commit was, for a reader.
    for line in WORKFLOW.read_text().splitlines():
        if "uses:" in line:
            assert re.search(r"@[0-9a-f]{40} # v\d", line), line


def test_one_run_per_ref_and_the_kind_node_image_pinned(workflow: dict[str, Any]) -> None:
    assert workflow["concurrency"]["cancel-in-progress"] is True
    assert "github.ref" in workflow["concurrency"]["group"]
    image = workflow["env"]["KIND_NODE_IMAGE"]
    assert re.fullmatch(r"kindest/node:v[\d.]+@sha256:[0-9a-f]{64}", image), image
    kind = next(s for s in _steps(workflow, "e2e-kind") if "kind-action" in s.get("uses", ""))
    assert kind["with"]["version"] == "${{ env.KIND_VERSION }}"
    assert re.fullmatch(r"v\d+\.\d+\.\d+", workflow["env"]["KIND_VERSION"])


def test_the_fleet_job_installs_what_the_fleet_tier_starts(workflow: dict[str, Any]) -> None:
    """redis-sentinel (the Sentinel tests) and wrk (the wrk script test), through the
    project's own package list, so the two never drift apart."""
    runs = " ".join(s.get("run", "") for s in _steps(workflow, "lint-unit-fleet"))
    assert "hack/ensure-debs.sh bench" in runs
    fleet = runs.index("make test-fleet")
    assert runs.index("hack/ensure-debs.sh") < fleet
    # What ensure-debs.sh installs with "bench" on a machine that has none of it.
    script = (ROOT / "hack" / "ensure-debs.sh").read_text()
    for command in ("redis-server", "redis-sentinel", "promtool", "wrk", "nginx"):
        assert f"command -v {command} " in script, command


def test_kind_logs_are_exported_and_kept_when_the_e2e_job_fails(
    workflow: dict[str, Any],
) -> None:
    steps = _steps(workflow, "e2e-kind")
    export = [s for s in steps if "kind export logs" in s.get("run", "")]
    upload = [s for s in steps if "upload-artifact" in s.get("uses", "")]
    assert export and upload
    assert export[0]["if"] == "failure()" and upload[0]["if"] == "failure()"
    assert steps.index(export[0]) < steps.index(upload[0])
    assert upload[0]["with"]["path"] in export[0]["run"]


def test_the_kind_log_step_is_valid_bash(workflow: dict[str, Any]) -> None:
    for step in _steps(workflow, "e2e-kind"):
        if "run" in step:
            check = subprocess.run(
                ["bash", "-n"], input=step["run"], text=True, capture_output=True, check=False
            )
            assert check.returncode == 0, (step.get("name"), check.stderr)
