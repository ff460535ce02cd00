"""The developer kits import without circles: each module of ``benchkit``,
``codekit`` and ``fleetkit`` can be read, and changed, knowing only the
modules below it; and fleetkit's sub-packages are layers: conformance and the
cluster rigs over the ``Fleet`` interface and its local backends, over the
clients and the apps."""

from __future__ import annotations

from pathlib import Path

import grimp
import pytest

DEVKIT = Path(__file__).resolve().parents[2] / "hack" / "devkit"

#: fleetkit's layers, highest first; the parts of one layer import none of each
#: other. ``.`` stands for the modules directly in ``fleetkit/``.
FLEETKIT_LAYERS: list[set[str]] = [
    {"conformance", "cluster"},
    {"."},
    {"clients", "apps"},
]


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


def subpackages(package: str, graph: grimp.ImportGraph) -> set[str]:
    return {m for m in graph.find_children(package) if graph.find_children(m)}


def layer_breaches(package: str, layers: list[set[str]]) -> list[tuple[str, str]]:
    """Direct imports from a part of ``package`` to a part of its own layer or a higher one."""
    graph = grimp.build_graph(package)
    subs = {m.split(".")[1] for m in subpackages(package, graph)}
    rank = {part: i for i, layer in enumerate(layers) for part in layer}

    def part(module: str) -> str:
        name = module.split(".")[1]
        return name if name in subs else "."

    out = []
    for importer in sorted(m for m in graph.modules if m.startswith(f"{package}.")):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            if not imported.startswith(f"{package}."):
                continue
            a, b = part(importer), part(imported)
            if a != b and rank[b] <= rank[a]:
                out.append((importer, imported))
    return out


@pytest.mark.parametrize("package", ["benchkit", "codekit", "fleetkit"])
def test_a_devkit_package_has_no_import_circle(package: str) -> None:
    assert (DEVKIT / package / "__init__.py").is_file()
    assert circles(package) == []


def test_every_fleetkit_subpackage_has_a_layer() -> None:
    graph = grimp.build_graph("fleetkit")
    subs = {m.split(".")[1] for m in subpackages("fleetkit", graph)}
    placed = set().union(*FLEETKIT_LAYERS) - {"."}
    assert subs == placed


def test_fleetkit_imports_only_downward_between_its_layers() -> None:
    assert layer_breaches("fleetkit", FLEETKIT_LAYERS) == []


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


def test_an_import_up_or_across_a_layer_is_seen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pkg = tmp_path / "layerkit"
    for sub in ("top", "low", "side"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "mid.py").write_text("from layerkit.low import x\n")
    (pkg / "top" / "t.py").write_text("from layerkit import mid\n")
    (pkg / "low" / "x.py").write_text("from layerkit.top import t\nfrom layerkit.side import y\n")
    (pkg / "side" / "y.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert layer_breaches("layerkit", [{"top"}, {"."}, {"low", "side"}]) == [
        ("layerkit.low.x", "layerkit.side.y"),
        ("layerkit.low.x", "layerkit.top.t"),
    ]
