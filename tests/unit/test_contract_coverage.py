"""Every module of mcpfleet is placed by every contract that lists modules.

import-linter's layer contracts are exhaustive (a module missing from them fails
``lint-imports``); its forbidden contracts are deny-lists, which a new module
slips past unnoticed. Here each deny-list of mcpfleet's modules is checked
against every top-level module: a module is either forbidden or named below as
allowed, so a new one fails this test until it is placed on purpose.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "server" / "mcpfleet"

#: For each deny-list contract, the top-level modules of mcpfleet its sources may import.
ALLOWED = {
    # The operator shares the contract, the key ring, the registry and Redis with the
    # replicas; of the commands, only the Redis flags (an exception named in the contract).
    "operator-meets-server": {"contract", "keys", "registry", "redisconn"},
    # The example apps (mcpfleet_examples, beside mcpfleet) are written as an author
    # writes one: `from mcpfleet import ...`, no internal module.
    "apps-use-public-api": set(),
}


def top_level_modules(package: Path = PACKAGE) -> set[str]:
    """The modules and packages directly under ``package`` (not ``__init__``)."""
    names = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
    names |= {p.parent.name for p in package.glob("*/__init__.py")}
    return names


def contracts() -> dict[str, dict[str, Any]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return {contract["id"]: contract for contract in config["contracts"]}


def misplaced(
    contract: dict[str, Any], allowed: set[str], modules: set[str]
) -> dict[str, list[str]]:
    """Modules neither forbidden nor allowed, and modules both (or that do not exist)."""
    forbidden = {
        m.removeprefix("mcpfleet.")
        for m in contract["forbidden_modules"]
        if m.startswith("mcpfleet.")
    }
    return {
        "unplaced": sorted(modules - forbidden - allowed),
        "both": sorted(forbidden & allowed),
        "unknown": sorted((forbidden | allowed) - modules),
    }


@pytest.mark.parametrize("contract_id", sorted(ALLOWED))
def test_a_deny_list_contract_places_every_module(contract_id: str) -> None:
    contract = contracts()[contract_id]
    assert contract["type"] == "forbidden"
    found = misplaced(contract, ALLOWED[contract_id], top_level_modules())
    assert found == {"unplaced": [], "both": [], "unknown": []}, (
        f"{contract_id}: forbid each unplaced module in pyproject.toml, or allow it here"
    )


def test_every_forbidden_contract_of_mcpfleet_modules_is_checked_here() -> None:
    lists_modules = {
        cid
        for cid, c in contracts().items()
        if c["type"] == "forbidden"
        and any(m.startswith("mcpfleet.") for m in c["forbidden_modules"])
    }
    assert lists_modules == set(ALLOWED)


def test_a_new_module_is_seen(tmp_path: Path) -> None:
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "old.py").write_text("")
    (tmp_path / "new.py").write_text("")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    modules = top_level_modules(tmp_path)
    assert modules == {"old", "new", "pkg"}
    contract = {"forbidden_modules": ["mcpfleet.pkg", "kopf"]}
    assert misplaced(contract, {"old"}, modules) == {"unplaced": ["new"], "both": [], "unknown": []}
    assert misplaced(contract, {"pkg", "gone"}, modules)["both"] == ["pkg"]
    assert misplaced(contract, {"pkg", "gone"}, modules)["unknown"] == ["gone"]
