"""The locks (hack/lock/*.txt) are the exact set pyproject.toml's ranges resolve to.

The image installs hack/lock/runtime.txt (the tasks image
hack/lock/runtime-tasks.txt), `make` and .ci/run install hack/lock/dev.txt
(.venv-tasks hack/lock/tasks.txt), all with ``--require-hashes``. These checks fail when
pyproject.toml's dependencies change without `make lock`, when a direct
dependency's pin leaves its range, or when a pin lacks a hash.
"""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
LOCKS = ROOT / "hack" / "lock"


def _digest() -> str:
    spec = importlib.util.spec_from_file_location("deps_digest", LOCKS / "deps_digest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    digest: str = module.deps_digest(ROOT / "pyproject.toml")
    return digest


def pins(lock: Path) -> dict[str, tuple[str, int]]:
    """{canonical name: (version, number of hashes)} of a hashed requirements file."""
    text = lock.read_text().replace("\\\n", " ")
    out = {}
    for line in text.splitlines():
        match = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s;]+)", line)
        if match:
            out[canonicalize_name(match[1])] = (match[2], line.count("--hash=sha256:"))
    return out


def direct(extra: str) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    names = [extra] if extra == "operator" else ["operator", extra]
    for name in names:
        reqs += [
            Requirement(r)
            for r in project["optional-dependencies"][name]
            if canonicalize_name(Requirement(r).name) != "mcpfleet"
        ]
    return reqs


@pytest.mark.parametrize("lock", ["runtime.txt", "dev.txt", "tasks.txt", "runtime-tasks.txt"])
def test_each_lock_was_made_from_pyprojects_dependencies_as_they_are(lock: str) -> None:
    first = (LOCKS / lock).read_text().splitlines()[0]
    assert first.startswith("# pyproject-deps-sha256: "), first
    assert first.split()[2] == _digest(), (
        f"hack/lock/{lock} is stale: pyproject.toml's dependencies changed; run `make lock`"
    )


@pytest.mark.parametrize(
    ("lock", "extra"),
    [
        ("runtime.txt", "operator"),
        ("dev.txt", "test"),
        ("tasks.txt", "tasks"),
        ("runtime-tasks.txt", "tasks"),
    ],
)
def test_every_direct_dependency_is_pinned_inside_its_range_with_hashes(
    lock: str, extra: str
) -> None:
    pinned = pins(LOCKS / lock)
    assert len(pinned) > 50
    for req in direct(extra):
        name = canonicalize_name(req.name)
        assert name in pinned, f"{req.name} is not in hack/lock/{lock}"
        version, hashes = pinned[name]
        assert req.specifier.contains(version, prereleases=True), (req, version)
        assert hashes >= 1, name
    assert all(h >= 1 for _, h in pinned.values())


def test_the_image_runs_what_the_tests_ran() -> None:
    runtime, dev = pins(LOCKS / "runtime.txt"), pins(LOCKS / "dev.txt")
    differ = {n: (v, dev.get(n, ("absent", 0))[0]) for n, (v, _) in runtime.items()}
    assert not {n: d for n, d in differ.items() if d[0] != d[1]}


def test_the_tasks_image_runs_what_the_tasks_tests_ran() -> None:
    """Every pin of the tasks image's set is the tasks venv's, and it carries the engine."""
    image, tests = pins(LOCKS / "runtime-tasks.txt"), pins(LOCKS / "tasks.txt")
    differ = {n: (v, tests.get(n, ("absent", 0))[0]) for n, (v, _) in image.items()}
    assert not {n: d for n, d in differ.items() if d[0] != d[1]}
    assert {"fastmcp-tasks", "pydocket", "kopf"} <= set(image)
    assert image["fastmcp"][0] == image["fastmcp-tasks"][0], "the engine's own FastMCP"
    assert not {"pytest", "mypy", "ruff"} & set(image), "no test tools in an image"
