"""The folders server/ and operator/ import as mcpfleet.server and mcpfleet.operator.

Proven for a built wheel and for the editable install, with the repository root
as the working directory (where a package called ``operator`` would shadow the
standard library).
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = (
    "import operator, json, mcpfleet.server, mcpfleet.operator, mcpfleet.server.cli;"
    "assert operator.itemgetter(1)([0, 7]) == 7, 'stdlib operator shadowed';"
    "print(mcpfleet.server.__file__);"
    "print(list(mcpfleet.operator.__path__)[0])"
)


def _run(argv: list[str], env: dict[str, str] | None = None) -> str:
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONSAFEPATH", "PYTHONPATH")}
    env.update(extra)
    return env


def test_editable_install_imports_from_the_folders() -> None:
    out = _run([sys.executable, "-c", PROBE], env=_env()).split()
    assert out[0] == str(ROOT / "server" / "__init__.py")
    assert out[1] == str(ROOT / "operator")


@pytest.mark.timeout(300)
def test_built_wheel_maps_the_folders_under_mcpfleet(tmp_path: Path) -> None:
    _run([sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path / "dist"), str(ROOT)])
    (wheel,) = (tmp_path / "dist").glob("mcpfleet-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "mcpfleet/server/__init__.py" in names
    assert "mcpfleet/server/example/app.py" in names
    assert "mcpfleet/operator/rotation.py" in names
    assert not any(n.startswith(("operator/", "server/", "tests/")) for n in names)
    assert "operator/__init__.py" not in names and "mcpfleet/__init__.py" not in names

    target = tmp_path / "site"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(target),
            str(wheel),
        ],
        env=_env(PYTHONSAFEPATH="1"),
    )
    out = _run([sys.executable, "-c", PROBE], env=_env(PYTHONPATH=str(target))).split()
    assert out[0] == str(target / "mcpfleet" / "server" / "__init__.py")
    assert out[1] == str(target / "mcpfleet" / "operator")
