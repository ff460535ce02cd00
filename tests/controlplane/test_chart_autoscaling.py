"""The chart's values for the elastic fleet, rendered with the real helm.

The operator's deletion cost settings (``operator.deletionCost``) become flags
that ``mcpfleet operator`` itself parses into the policy it writes costs by.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetkit.cluster import chartkit
from fleetkit.cluster.helm import Helm, HelmError
from mcpfleet_operator.cli import cost_policy
from mcpfleet_operator.deletioncost import PatchPolicy


def _render(helm: Helm, values: dict[str, Any], tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / f"values-{len(list(tmp_path.glob('values-*')))}.yaml"
    path.write_text(yaml.safe_dump(values))
    return chartkit.objects(chartkit.render(helm, "-f", str(path)))


def _operator_args(docs: list[dict[str, Any]]) -> list[str]:
    (deployment,) = [
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-operator")
    ]
    args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


def test_the_operator_keeps_deletion_costs_by_default_with_the_documented_policy(
    helm: Helm, tmp_path: Path
) -> None:
    from mcpfleet.cli import build_parser

    args = build_parser().parse_args(_operator_args(_render(helm, {}, tmp_path)))
    assert args.deletion_cost is True
    assert cost_policy(args) == PatchPolicy()


def test_the_deletion_cost_values_reach_the_operators_policy(helm: Helm, tmp_path: Path) -> None:
    from mcpfleet.cli import build_parser

    values = {
        "operator": {"deletionCost": {"minStep": 50, "maxInterval": 120, "patchesPerSecond": 0.5}}
    }
    args = build_parser().parse_args(_operator_args(_render(helm, values, tmp_path)))
    assert cost_policy(args) == PatchPolicy(min_step=50, max_interval=120.0, per_second=0.5)


def test_the_deletion_cost_can_be_turned_off(helm: Helm, tmp_path: Path) -> None:
    from mcpfleet.cli import build_parser

    values = {"operator": {"deletionCost": {"enabled": False}}}
    args = build_parser().parse_args(_operator_args(_render(helm, values, tmp_path)))
    assert args.deletion_cost is False


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("operator.deletionCost.minStep=0", "/operator/deletionCost/minStep': minimum"),
        ("operator.deletionCost.patchesPerSecond=0", "/operator/deletionCost/patchesPerSecond'"),
        ("operator.deletionCost.maxInterval=-1", "/operator/deletionCost/maxInterval'"),
        ("operator.deletionCost.often=true", "additional properties 'often' not allowed"),
    ],
)
def test_deletion_cost_values_out_of_range_are_refused(
    helm: Helm, setting: str, message: str
) -> None:
    with pytest.raises(HelmError) as refused:
        chartkit.render(helm, "--set", setting)
    assert message in str(refused.value)
