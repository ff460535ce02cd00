"""The source roots server/ and operator/ hold the packages mcpfleet and mcpfleet_operator.

The mcpfleet wheel holds those two and nothing else; the example apps beside
them (server/mcpfleet_examples/) are the wheel of server/pyproject.toml.

A file's path under its root is its import name, in a built wheel and in the
editable install, and nothing at the repository root shadows the standard
library: the plain interpreter, started in the root (where ``-c`` and ``-m``
put the working directory on sys.path), still imports the standard library's
``operator``.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
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
    """`make venv` installs mcpfleet and, beside it, mcpfleet-examples, both editable."""
    probe = PROBE + ";import mcpfleet_examples; print(mcpfleet_examples.__file__)"
    out = _run([sys.executable, "-c", probe], env=_env()).split()
    assert out[0] == str(ROOT / "server" / "mcpfleet" / "__init__.py")
    assert out[1] == str(ROOT / "operator" / "mcpfleet_operator" / "__init__.py")
    assert out[2] == str(ROOT / "server" / "mcpfleet_examples" / "__init__.py")


#: The product's packages, each under its source root: all the mcpfleet wheel holds.
PRODUCT = {"mcpfleet": "server", "mcpfleet_operator": "operator"}
#: The example apps beside the product: the mcpfleet-examples distribution.
EXAMPLES = "mcpfleet_examples"


def _build(source: Path, outdir: Path, name: str) -> set[str]:
    """Build the wheel of the project in ``source``; the names the wheel holds."""
    _run([sys.executable, "-m", "build", "--wheel", "--outdir", str(outdir), str(source)])
    (wheel,) = outdir.glob(f"{name}-*.whl")
    return set(zipfile.ZipFile(wheel).namelist())


#: What a build leaves in the tree: setuptools packs whatever is in build/lib, so
#: a stale file there (a module since moved) would reach the wheel.
LEFTOVERS = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")


def _checkout(into: Path) -> Path:
    """The files the build reads, as a fresh clone has them (no build/ left over)."""
    into.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, into / name)
    for root in ("server", "operator"):
        shutil.copytree(ROOT / root, into / root, ignore=LEFTOVERS)
    return into


def _sources(package: str, root: str) -> set[str]:
    """The .py files of ``package`` as a wheel names them (the path under its root)."""
    base = ROOT / root
    return {str(p.relative_to(base)) for p in (base / package).rglob("*.py")}


@pytest.mark.timeout(300)
def test_the_wheel_holds_the_product_and_every_folder_of_it_as_a_package(tmp_path: Path) -> None:
    """A new sub-folder is packaged without a hand-kept list, and nothing else is."""
    names = _build(_checkout(tmp_path / "src"), tmp_path / "dist", "mcpfleet")
    tops = {n.split("/", 1)[0] for n in names}
    version = importlib.metadata.version("mcpfleet")
    assert {t for t in tops if t.endswith(".dist-info")} == {f"mcpfleet-{version}.dist-info"}
    assert {t for t in tops if not t.endswith(".dist-info")} == set(PRODUCT), (
        f"the wheel holds more than the product: {sorted(tops)}"
    )
    for package, root in PRODUCT.items():
        missing = _sources(package, root) - names
        assert not missing, f"{package}: not in the wheel: {sorted(missing)}"
    modules = {n for n in names if n.endswith(".py")}
    assert modules == set().union(*(_sources(p, r) for p, r in PRODUCT.items()))
    # The example apps left the package (0.1.0 had them as mcpfleet.example).
    assert not any(n.startswith(("mcpfleet/example/", f"{EXAMPLES}/")) for n in names)
    assert "mcpfleet/py.typed" in names and "mcpfleet_operator/py.typed" in names
    assert not any(n.startswith(("operator/", "server/", "tests/", "fleetkit/")) for n in names)

    target = tmp_path / "site"
    _install(target, *(tmp_path / "dist").glob("*.whl"))
    out = _run([sys.executable, "-c", PROBE], env=_env(PYTHONPATH=str(target))).split()
    assert out[0] == str(target / "mcpfleet" / "__init__.py")
    assert out[1] == str(target / "mcpfleet_operator" / "__init__.py")


def _install(target: Path, *wheels: Path) -> None:
    _run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target)]
        + [str(w) for w in wheels],
        env=_env(),
    )


#: In a process where only the installed wheels are on the path (not this tree's
#: editable install): the default app, and 0.1.0's name of it, load from mcpfleet_examples.
LOADS = (
    "import sys, logging, mcpfleet, mcpfleet_examples.app as new\n"
    "assert new.__file__.startswith(sys.path[0]), new.__file__\n"
    "assert mcpfleet.__file__.startswith(sys.path[0]), mcpfleet.__file__\n"
    "from mcpfleet.config import DEFAULT_APP\n"
    "from mcpfleet.replica.appload import load_app\n"
    "logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format='%(message)s')\n"
    "assert load_app(DEFAULT_APP) is new.app\n"
    "assert load_app('mcpfleet.example.app:app') is new.app\n"
    "print('loaded', DEFAULT_APP)\n"
)


@pytest.mark.timeout(300)
def test_the_examples_are_a_wheel_of_their_own_beside_the_product(tmp_path: Path) -> None:
    """server/pyproject.toml builds mcpfleet-examples from the folder mcpfleet is in too."""
    checkout = _checkout(tmp_path / "src")
    names = _build(checkout / "server", tmp_path / "dist", "mcpfleet_examples")
    modules = {n for n in names if not n.startswith("mcpfleet_examples-")}
    assert modules == _sources(EXAMPLES, "server"), sorted(names)
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    requires = [
        line.split(":", 1)[1].strip()
        for line in zipfile.ZipFile(wheel).read(meta).decode().splitlines()
        if line.startswith("Requires-Dist:")
    ]
    version = importlib.metadata.version("mcpfleet")
    assert f"mcpfleet=={version}" in requires, requires

    _build(checkout, tmp_path / "dist", "mcpfleet")
    target = tmp_path / "site"
    _install(target, *(tmp_path / "dist").glob("*.whl"))
    env = _env(PYTHONPATH=str(target), PYTHONNOUSERSITE="1")
    out = _run([sys.executable, "-S", "-c", _with_site(target) + LOADS], env=env)
    assert "module mcpfleet.example.app moved to mcpfleet_examples.app" in out, out
    assert out.strip().endswith("loaded mcpfleet_examples.app:app"), out


def _with_site(target: Path) -> str:
    """Without ``site`` (-S), so this tree's editable finders are not installed: the
    target first, then the venv's other packages (FastMCP and the rest) by path only."""
    paths = [str(target), *(p for p in sys.path if p.endswith("site-packages"))]
    return f"import sys; sys.path[:0] = {paths!r}\n"


def test_the_old_import_path_warns_and_gives_the_same_modules() -> None:
    probe = (
        "import warnings; warnings.simplefilter('error');\n"
        "import mcpfleet.guard, mcpfleet_examples.app\n"
        "try:\n"
        "    import mcpfleet.server\n"
        "except DeprecationWarning as e:\n"
        "    print('warned:', e)\n"
        "warnings.simplefilter('ignore')\n"
        "import mcpfleet.server.guard as old, mcpfleet.server.example.app as old_app\n"
        "from mcpfleet.server import ask_then\n"
        "assert old is mcpfleet.guard and old_app is mcpfleet_examples.app\n"
        "assert ask_then is mcpfleet.guard.ask_then\n"
        "print('same')\n"
    )
    out = _run([sys.executable, "-c", probe], env=_env())
    assert "warned: the import path mcpfleet.server is deprecated" in out
    assert "removed in mcpfleet 0.2.0" in out
    assert out.strip().endswith("same")
