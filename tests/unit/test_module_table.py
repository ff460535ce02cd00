"""The module table of docs/architecture.md ("## Modules") names every module, and only
modules that exist; its drawing of the layers is the import contract's."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
SECTION = "\n## Modules\n"


def table_modules(doc: str) -> list[str]:
    """The backticked names in the module column of the section's table."""
    section = doc.split(SECTION, 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
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


def table_name(path: Path) -> str | None:
    """The name ``path`` has in the table (None for a package root's ``__init__``)."""
    _root, package, *rest = path.relative_to(ROOT).with_suffix("").parts
    if rest[-1] == "__init__":
        rest = rest[:-1]
    if not rest:
        return None
    return ".".join(["operator", *rest] if package == "mcpfleet_operator" else rest)


def test_every_module_the_table_names_exists() -> None:
    names = table_modules(DOC.read_text())
    assert len(names) >= 30, f"the table was not found or lost its rows: {names}"
    missing = [n for n in names if module_file(n) is None]
    assert not missing, (
        f"docs/architecture.md's module table names modules that do not exist: {missing}"
    )


def modules_not_in_table(doc: str) -> list[str]:
    names = set(table_modules(doc))
    modules = [
        name
        for root in ("server/mcpfleet", "operator/mcpfleet_operator")
        for path in sorted((ROOT / root).rglob("*.py"))
        if (name := table_name(path)) is not None
    ]
    assert "router.decisions" in modules and "operator.stepping" in modules
    # A package is in the table when its modules are.
    return [m for m in modules if m not in names and not any(n.startswith(m + ".") for n in names)]


def test_every_module_is_in_the_table() -> None:
    absent = modules_not_in_table(DOC.read_text())
    assert not absent, f"modules missing from docs/architecture.md's module table: {absent}"


def test_a_module_left_out_of_the_table_is_seen() -> None:
    doc = DOC.read_text()
    row = next(line for line in doc.splitlines() if line.startswith("| plumbing |"))
    assert "answers" in modules_not_in_table(doc.replace(row + "\n", ""))


@pytest.mark.parametrize("stale", ["keyring", "keydir", "routetable", "devfleet", "routing"])
def test_a_name_from_before_the_packages_fails_the_check(stale: str) -> None:
    assert module_file(stale) is None


# ------------------------------------------------- the drawing of the layers, against the contract

DIAGRAM_WIDTH = 64  # the mcpfleet column of the drawing; the operator's starts here


def drawn_layers(doc: str) -> list[set[str]]:
    """The names in each box row of the mcpfleet column of the drawing, top down: one
    set per layer (a layer's boxes open on one line, ``┌``, and close on one, ``└``)."""
    block = doc.split("\n## Layered layout\n", 1)[1].split("```", 2)[1]
    layers: list[set[str]] = []
    inside = False
    for line in block.splitlines():
        left = line[13:DIAGRAM_WIDTH]
        left = left[: max(left.rfind(c) for c in "│┤┐┘") + 1]  # the boxes, not the arrows
        if "┌" in left and not inside:
            layers.append(set())
            inside = True
        elif "└" in left:
            inside = False
        elif inside:
            # A box's own name: the first word in each cell; "(serve router ...)" annotates.
            text = re.sub(r"\([^)]*\)", " ", left)
            layers[-1] |= {cell.split()[0] for cell in re.split(r"[│├┤─]+", text) if cell.split()}
    return layers


def contract_layers() -> list[set[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["id"] == "server-layers"]
    return [set(re.split(r"\s*[|:]\s*", layer)) for layer in contract["layers"]]


def test_the_drawing_shows_the_layers_of_the_contract_in_its_order() -> None:
    drawn = drawn_layers(DOC.read_text())
    expected = contract_layers()
    # The drawing boxes cli and commands in one frame: one layer each in the contract.
    merged = [expected[0] | expected[1], *expected[2:]]
    assert drawn == merged


PACKAGES = sorted(p.parent.name for p in (ROOT / "server" / "mcpfleet").glob("*/__init__.py"))


@pytest.mark.parametrize("package", PACKAGES)
def test_the_package_docstring_names_each_of_its_modules(package: str) -> None:
    init = ROOT / "server" / "mcpfleet" / package / "__init__.py"
    text = init.read_text()
    named = set(re.findall(r"``(\w+)``", text))
    named |= set(re.findall(rf":mod:`~?mcpfleet\.{package}\.(\w+)`", text))
    modules = {p.stem for p in init.parent.glob("*.py") if p.stem != "__init__"}
    assert modules - named == set(), f"mcpfleet.{package}'s docstring leaves out modules"
