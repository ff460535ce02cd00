"""Drift caught before users meet it: the newest dependencies the bounds allow are tested.

``make test-latest`` makes ``.venv-latest`` without the lock (pip ``--upgrade``,
eager) and runs ``LATEST_TIERS`` there; ``make test`` runs it on the unit and
packaging tiers, and ``.github/workflows/latest.yaml`` runs the fleet tier on
it daily. These checks read the Makefile and the workflow (nothing here can run
GitHub's scheduler) and hold them to that.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
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


def test_the_latest_venv_runs_on_the_newest_python_here_and_is_made_again_when_it_moves() -> None:
    assert re.search(
        r"^LATEST_PYTHON \?= \$\(shell bash hack/newest-python.sh \$\(PYTHON\)\)$",
        MAKEFILE,
        flags=re.M,
    )
    recipe = _recipe("venv-latest")
    # LATEST_PYTHON read once (hack/newest-python.sh runs each time it is read).
    assert recipe.count("$(LATEST_PYTHON)") == 1 and 'python="$(LATEST_PYTHON)"' in recipe
    assert 'bash hack/venv.sh "$$python" $(LATEST_VENV)' in recipe
    # A venv of another Python is removed first, not reused.
    assert "rm -rf $(LATEST_VENV)" in recipe


def test_the_scheduled_workflow_runs_the_oldest_and_the_newest_pythons() -> None:
    workflow: dict[str, Any] = yaml.safe_load(WORKFLOW.read_text())
    (job,) = workflow["jobs"].values()
    pythons = job["strategy"]["matrix"]["python"]
    assert pythons[0] == "3.11" and len(pythons) >= 2
    assert sorted(pythons, key=lambda v: tuple(map(int, v.split(".")))) == pythons
    runs = "\n".join(s.get("run", "") for s in job["steps"])
    assert "LATEST_PYTHON=python${{ matrix.python }}" in runs
    # As root, as .ci/run runs: the fleet tier's Quickstart-as-a-user test needs it.
    assert re.search(r'^sudo env "PATH=\$PATH" CI=true make test-latest ', runs, flags=re.M), runs
    (setup,) = [s for s in job["steps"] if "setup-python" in s.get("uses", "")]
    assert setup["with"]["python-version"] == "${{ matrix.python }}"


def _bin(tmp: Path, tools: dict[str, str]) -> Path:
    """A directory of ``name -> script`` executables, beside the tools the script needs."""
    bindir = tmp / "bin"
    bindir.mkdir()
    for tool in ("bash", "seq", "ls", "grep", "sort"):
        found = shutil.which(tool)
        assert found, tool
        (bindir / tool).symlink_to(found)
    for name, body in tools.items():
        (bindir / name).write_text(body)
        (bindir / name).chmod(0o755)
    return bindir


def test_newest_python_takes_the_newest_that_runs_else_the_fallback(tmp_path: Path) -> None:
    script = str(ROOT / "hack" / "newest-python.sh")
    here = f'#!/bin/sh\nexec {sys.executable} "$@"\n'  # this CPython (3.11 or later)
    shim = "#!/bin/sh\necho 'pyenv: python3.20: command not found' >&2\nexit 127\n"
    bindir = _bin(tmp_path, {"python3.20": shim, "python3.19": here, "python3.12": here})
    env = {"PATH": str(bindir)}
    out = subprocess.run(["bash", script, "fallback-python"], env=env, capture_output=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.decode().strip() == str(bindir / "python3.19")
    # Nothing that runs: the fallback.
    (bindir / "python3.19").unlink()
    (bindir / "python3.12").unlink()
    out = subprocess.run(["bash", script, "fallback-python"], env=env, capture_output=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.decode().strip() == "fallback-python"
