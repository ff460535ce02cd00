"""The source roots server/ and operator/ hold the packages mcpfleet and mcpfleet_operator.

A file's path under its root is its import name, in a built wheel and in the
editable install, and nothing at the repository root shadows the standard
library: the plain interpreter, started in the root (where ``-c`` and ``-m``
put the working directory on sys.path), still imports the standard library's
``operator``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.packaging

ROOT = Path(__file__).resolve().parents[2]
PROBE = (
    "import operator, collections, json, mcpfleet, mcpfleet_operator, mcpfleet.cli;"
    "assert operator.itemgetter(1)([0, 7]) == 7, 'stdlib operator shadowed';"
    "assert collections.OrderedDict is not None;"
    "print(mcpfleet.__file__);"
    "print(mcpfleet_operator.__file__)"
)


def _run(argv: list[str], env: dict[str, str] | None = None) -> str:
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONSAFEPATH", "PYTHONPATH")}
    env.update(extra)
    return env


def test_the_repository_root_shadows_no_standard_library_module() -> None:
    """``python -c`` and ``python -m`` put the working directory first on sys.path."""
    out = _run(
        [sys.executable, "-c", "import operator, collections; print(operator.__file__)"],
        env=_env(),
    )
    assert Path(out.strip()).parent != ROOT / "operator"
    assert not (ROOT / "operator" / "__init__.py").exists()
    assert not (ROOT / "server" / "__init__.py").exists()


def test_editable_install_imports_from_the_source_roots() -> None:
    out = _run([sys.executable, "-c", PROBE], env=_env()).split()
    assert out[0] == str(ROOT / "server" / "mcpfleet" / "__init__.py")
    assert out[1] == str(ROOT / "operator" / "mcpfleet_operator" / "__init__.py")


@pytest.mark.timeout(300)
def test_every_folder_of_the_source_roots_is_a_package_in_the_wheel(tmp_path: Path) -> None:
    """A new sub-folder is packaged without a hand-kept list."""
    _run([sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path / "dist"), str(ROOT)])
    (wheel,) = (tmp_path / "dist").glob("mcpfleet-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for root in ("server", "operator"):
        for source in (ROOT / root).rglob("*.py"):
            assert str(source.relative_to(ROOT / root)) in names, source
    assert "mcpfleet/py.typed" in names and "mcpfleet_operator/py.typed" in names
    assert not any(n.startswith(("operator/", "server/", "tests/", "fleetkit/")) for n in names)

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
        env=_env(),
    )
    out = _run([sys.executable, "-c", PROBE], env=_env(PYTHONPATH=str(target))).split()
    assert out[0] == str(target / "mcpfleet" / "__init__.py")
    assert out[1] == str(target / "mcpfleet_operator" / "__init__.py")


def test_the_old_import_path_warns_and_gives_the_same_modules() -> None:
    probe = (
        "import warnings; warnings.simplefilter('error');\n"
        "import mcpfleet.guard, mcpfleet.example.app\n"
        "try:\n"
        "    import mcpfleet.server\n"
        "except DeprecationWarning as e:\n"
        "    print('warned:', e)\n"
        "warnings.simplefilter('ignore')\n"
        "import mcpfleet.server.guard as old, mcpfleet.server.example.app as old_app\n"
        "from mcpfleet.server import ask_then\n"
        "assert old is mcpfleet.guard and old_app is mcpfleet.example.app\n"
        "assert ask_then is mcpfleet.guard.ask_then\n"
        "print('same')\n"
    )
    out = _run([sys.executable, "-c", probe], env=_env())
    assert "warned: the import path mcpfleet.server is deprecated" in out
    assert "removed in mcpfleet 0.2.0" in out
    assert out.strip().endswith("same")
