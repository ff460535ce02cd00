"""Helpers of the chart-render tests (``test_chart_render_*.py``): the scenarios, reading
rendered objects, rendering with values."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from fleetkit.cluster import chartkit
from fleetkit.cluster.helm import Helm

SCENARIOS = {p.name.removesuffix("-values.yaml"): p for p in chartkit.CI_VALUES}
SCENARIOS |= {"example-" + p.stem.removeprefix("values-"): p for p in chartkit.EXAMPLE_VALUES}
if chartkit.OWN_APP_VALUES.exists():
    SCENARIOS["own-app"] = chartkit.OWN_APP_VALUES


def _extra(scenario: str) -> set[tuple[str, str]]:
    """(kind, name) of the scenario's extraObjects: the user's objects, not the chart's."""
    values = yaml.safe_load(SCENARIOS[scenario].read_text()) or {}
    out = set()
    for obj in values.get("extraObjects", []):
        if isinstance(obj, str):  # a template: its kind and (literal) name by their lines
            kind = re.search(r"^kind: *(\S+)", obj, re.M)
            name = re.search(r"^  name: *(\S+)", obj, re.M)
            assert kind and name, obj
            out.add((kind.group(1), name.group(1)))
        else:
            out.add((obj["kind"], obj["metadata"]["name"]))
    return out


def _containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def _pod_specs(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for doc in docs:
        if doc["kind"] == "Deployment":
            yield doc["metadata"]["name"], doc["spec"]["template"]["spec"]
        elif doc["kind"] == "Pod":
            yield doc["metadata"]["name"], doc["spec"]


def _by(docs: list[dict[str, Any]], kind: str, suffix: str = "") -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(suffix)]
    return found


def _render(helm: Helm, values: dict[str, Any], tmp_path: Path, *args: str, **kw: Any) -> str:
    path = tmp_path / f"values-{len(list(tmp_path.glob('values-*')))}.yaml"
    path.write_text(yaml.safe_dump(values))
    return chartkit.render(helm, "-f", str(path), *args, **kw)


def _container(spec: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in _containers(spec) if c["name"] == name]
    return found
