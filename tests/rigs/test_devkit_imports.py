"""The developer kits import without circles: each module of ``benchkit`` and
``fleetkit`` can be read, and changed, knowing only the modules below it."""

from __future__ import annotations

from pathlib import Path

import grimp
import pytest

DEVKIT = Path(__file__).resolve().parents[2] / "hack" / "devkit"


def circles(package: str) -> list[tuple[str, str]]:
    """Pairs of the package's modules that import each other, directly or not."""
    graph = grimp.build_graph(package)
    modules = sorted(m for m in graph.modules if m.startswith(f"{package}."))
    return [
        (a, b)
        for i, a in enumerate(modules)
        for b in modules[i + 1 :]
        if graph.chain_exists(importer=a, imported=b) and graph.chain_exists(importer=b, imported=a)
    ]


@pytest.mark.parametrize("package", ["benchkit", "fleetkit"])
def test_a_devkit_package_has_no_import_circle(package: str) -> None:
    assert (DEVKIT / package / "__init__.py").is_file()
    assert circles(package) == []


def test_a_circle_is_seen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "circlekit"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f() -> None:\n    from circlekit import b\n")
    (pkg / "b.py").write_text("from circlekit import c\n")
    (pkg / "c.py").write_text("import circlekit.a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert circles("circlekit") == [
        ("circlekit.a", "circlekit.b"),
        ("circlekit.a", "circlekit.c"),
        ("circlekit.b", "circlekit.c"),
    ]
