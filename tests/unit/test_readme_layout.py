"""The README's module table ("How the fleet fits together") names modules that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECTION = "## How the fleet fits together"


def table_modules(readme: str) -> list[str]:
    """The backticked names in the module column of the section's table."""
    section = readme.split(SECTION, 1)[1]
    rows = [line for line in section.split("\n\n**", 1)[0].splitlines() if line.startswith("|")]
    names = []
    for row in rows[2:]:  # past the header and its rule
        module_cell = row.split("|")[2]
        names += re.findall(r"`([^`]+)`", module_cell)
    return names


def module_file(name: str) -> Path | None:
    """Where module ``name`` lives: ``operator.x`` is ``mcpfleet_operator.x``, anything else
    ``mcpfleet.<name>``; each under its source root, where the path is the import name."""
    first, *rest = name.split(".")
    parts = ["mcpfleet_operator", *rest] if first == "operator" else ["mcpfleet", first, *rest]
    base = ROOT / ("operator" if first == "operator" else "server")
    for candidate in (
        base.joinpath(*parts).with_suffix(".py"),
        base.joinpath(*parts, "__init__.py"),
    ):
        if candidate.is_file():
            return candidate
    return None


def test_every_module_the_readme_table_names_exists() -> None:
    names = table_modules((ROOT / "README.md").read_text())
    assert len(names) >= 20, f"the table was not found or lost its rows: {names}"
    missing = [n for n in names if module_file(n) is None]
    assert not missing, f"README's module table names modules that do not exist: {missing}"


@pytest.mark.parametrize("stale", ["keyring", "keydir", "routetable", "devfleet", "routing"])
def test_a_name_from_before_the_packages_fails_the_check(stale: str) -> None:
    assert module_file(stale) is None
