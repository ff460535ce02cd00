"""The example apps' distribution (server/pyproject.toml) keeps step with mcpfleet's.

Two pyproject files, one version: mcpfleet-examples has mcpfleet's version and
needs exactly that mcpfleet, and the mcpfleet wheel's package list leaves the
examples out (tests/packaging/test_install.py builds both wheels).
"""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = tomllib.loads((ROOT / "pyproject.toml").read_text())
EXAMPLES = tomllib.loads((ROOT / "server" / "pyproject.toml").read_text())


def _included(config: dict[str, Any], name: str) -> bool:
    patterns: list[str] = config["tool"]["setuptools"]["packages"]["find"]["include"]
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def test_the_examples_have_mcpfleets_version_and_need_exactly_that_mcpfleet() -> None:
    version = PRODUCT["project"]["version"]
    assert EXAMPLES["project"]["name"] == "mcpfleet-examples"
    assert EXAMPLES["project"]["version"] == version
    assert EXAMPLES["project"]["dependencies"] == [f"mcpfleet=={version}"]
    assert EXAMPLES["project"]["optional-dependencies"]["tasks"] == [f"mcpfleet[tasks]=={version}"]


def test_each_pyproject_packages_its_own_packages_only() -> None:
    for name in ("mcpfleet", "mcpfleet.router", "mcpfleet_operator", "mcpfleet_operator.api"):
        assert _included(PRODUCT, name) and not _included(EXAMPLES, name), name
    for name in ("mcpfleet_examples", "mcpfleet_examples.app"):
        assert _included(EXAMPLES, name) and not _included(PRODUCT, name), name
