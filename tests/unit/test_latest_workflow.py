"""Drift caught before users meet it: the newest dependencies the bounds allow are tested.

``make test-latest`` makes ``.venv-latest`` without the lock (pip ``--upgrade``,
eager) and runs ``LATEST_TIERS`` there; ``make test`` runs it on the unit and
packaging tiers, and ``.github/workflows/latest.yaml`` runs the fleet tier on
it daily. These checks read the Makefile and the workflow (nothing here can run
GitHub's scheduler) and hold them to that.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
MAKEFILE = (ROOT / "Makefile").read_text()
WORKFLOW = ROOT / ".github" / "workflows" / "latest.yaml"


def _recipe(target: str) -> str:
    match = re.search(rf"^{re.escape(target)}:[^\n]*\n((?:\t[^\n]*\n)+)", MAKEFILE, flags=re.M)
    assert match, f"no rule for {target}"
    return match.group(1)


def test_the_latest_venv_resolves_the_bounds_again_without_the_lock() -> None:
    recipe = _recipe("venv-latest")
    install = [line for line in recipe.splitlines() if "pip install" in line and "-e" in line]
    assert install, recipe
    (line,) = install
    assert "--upgrade" in line and "--upgrade-strategy eager" in line
    assert "--require-hashes" not in recipe and "hack/lock" not in recipe
    # No stamp file: each run resolves today's newest versions again.
    assert "touch" not in recipe


def test_make_test_runs_the_cheap_tiers_on_the_newest_dependencies() -> None:
    (line,) = [x for x in MAKEFILE.splitlines() if x.startswith("test:")]
    assert " test-latest " in line
    assert re.search(r"^LATEST_TIERS \?= unit or packaging$", MAKEFILE, flags=re.M)
    assert '-m "$(LATEST_TIERS)"' in _recipe("test-latest")


def test_the_scheduled_workflow_runs_the_fleet_tier_on_the_newest_dependencies() -> None:
    workflow: dict[str, Any] = yaml.safe_load(WORKFLOW.read_text())
    # PyYAML reads the key `on` as True.
    triggers = workflow.get("on", workflow.get(True))
    assert triggers["schedule"] and "workflow_dispatch" in triggers
    steps = [s for job in workflow["jobs"].values() for s in job["steps"]]
    runs = "\n".join(s.get("run", "") for s in steps)
    assert re.search(r'make test-latest LATEST_TIERS="[^"]*\bfleet\b', runs), runs
    for ref in [s["uses"] for s in steps if "uses" in s]:
        assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", ref), ref
