"""The chart's values for the elastic fleet, rendered with the real helm.

The operator's deletion cost settings (``operator.deletionCost``) become flags
that ``mcpfleet operator`` itself parses into the policy it writes costs by.
The MCP signals (``server.autoscaling.mcp``) become a KEDA ScaledObject where
the cluster serves ``keda.sh/v1alpha1`` (``helm template --api-versions``),
checked against the CRD of the KEDA pinned in ``hack/tools/keda``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from fleetkit.cluster import chartkit
from fleetkit.cluster.chartfleet import merge
from fleetkit.cluster.controlplane import repo_root
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


# --------------------------------------------------------------------------- MCP signals (KEDA)

KEDA = ("--api-versions", "keda.sh/v1alpha1")
KEDA_MODULE = "github.com/kedacore/keda/v2"
MCP_ON = {"server": {"autoscaling": {"enabled": True, "mcp": {"enabled": True}}}}


def _render_with(
    helm: Helm, values: dict[str, Any], tmp_path: Path, *args: str
) -> list[dict[str, Any]]:
    path = tmp_path / f"values-{len(list(tmp_path.glob('values-*')))}.yaml"
    path.write_text(yaml.safe_dump(values))
    return chartkit.objects(chartkit.render(helm, "-f", str(path), *args))


def _kinds(docs: list[dict[str, Any]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for d in docs:
        if d["kind"] in ("HorizontalPodAutoscaler", "ScaledObject"):
            out.setdefault(d["kind"], []).append(d["metadata"]["name"])
    return out


def _server_replicas_set(docs: list[dict[str, Any]]) -> bool:
    (server,) = [
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-server")
    ]
    return "replicas" in server["spec"]


@pytest.mark.parametrize(
    ("values", "args", "expected", "replicas"),
    [
        # off: a replica count, nothing scales
        ({}, KEDA, {}, True),
        # CPU: the chart's HPA
        (
            {"server": {"autoscaling": {"enabled": True}}},
            KEDA,
            {"HorizontalPodAutoscaler": ["mcpfleet-server"]},
            False,
        ),
        # MCP signals on a cluster with KEDA: the ScaledObject instead of the HPA
        (MCP_ON, KEDA, {"ScaledObject": ["mcpfleet-server"]}, False),
        # MCP signals where KEDA's API is not served: the CPU HPA
        (MCP_ON, (), {"HorizontalPodAutoscaler": ["mcpfleet-server"]}, False),
        # MCP on, autoscaling off: nothing scales
        (
            {"server": {"autoscaling": {"mcp": {"enabled": True}}}},
            KEDA,
            {},
            True,
        ),
    ],
    ids=["off", "cpu", "mcp", "mcp-without-keda", "mcp-but-autoscaling-off"],
)
def test_each_combination_of_the_autoscaling_values_renders_one_scaler_at_most(
    helm: Helm,
    tmp_path: Path,
    values: dict[str, Any],
    args: tuple[str, ...],
    expected: dict[str, list[str]],
    replicas: bool,
) -> None:
    docs = _render_with(helm, values, tmp_path, *args)
    assert {k: v for k, v in _kinds(docs).items() if "router" not in str(v)} == expected
    assert _server_replicas_set(docs) is replicas


def _scaled_object(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == "ScaledObject"]
    return found


def test_the_issues_targets_are_exactly_the_scaledobjects_per_replica_targets(
    helm: Helm, tmp_path: Path
) -> None:
    """ "Keep each replica under 70% of its session cap and under 40 rounds in flight"."""
    values = {
        "router": {"sessionCap": 1000},
        "server": {
            "autoscaling": {
                "enabled": True,
                "minReplicas": 3,
                "maxReplicas": 12,
                "behavior": {"scaleDown": {"stabilizationWindowSeconds": 600}},
                "mcp": {
                    "enabled": True,
                    "sessionCapFraction": 0.7,
                    "roundsInFlight": 40,
                    "listenStreamsFraction": 0,
                    "tasksRunningFraction": 0,
                    "tasksQueuedPerReplica": 0,
                    "refusedInitializePerSecond": 0,
                    "cpu": False,
                },
            }
        },
    }
    so = _scaled_object(_render_with(helm, values, tmp_path, *KEDA))
    spec = so["spec"]
    assert spec["scaleTargetRef"]["name"] == "mcpfleet-server"
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (3, 12)
    hpa = spec["advanced"]["horizontalPodAutoscalerConfig"]
    assert hpa["behavior"] == {"scaleDown": {"stabilizationWindowSeconds": 600}}
    triggers = {t["name"]: t for t in spec["triggers"]}
    assert set(triggers) == {"sessions", "rounds-in-flight"}
    series = '{namespace="mcpfleet",job="mcpfleet-server"}'
    sessions, rounds = triggers["sessions"], triggers["rounds-in-flight"]
    for trigger in (sessions, rounds):
        assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    assert sessions["metadata"]["query"] == f"sum(mcpfleet_replica_sessions{series})"
    assert sessions["metadata"]["threshold"] == "700"
    assert rounds["metadata"]["query"] == f"sum(mcpfleet_replica_requests_in_flight{series})"
    assert rounds["metadata"]["threshold"] == "40"


def test_every_signal_by_default_and_cpu_too(helm: Helm, tmp_path: Path) -> None:
    so = _scaled_object(_render_with(helm, MCP_ON, tmp_path, *KEDA))
    triggers = {t["name"]: t for t in so["spec"]["triggers"]}
    thresholds = {n: t["metadata"].get("threshold") for n, t in triggers.items()}
    # router.sessionCap 1000, server.listenStreams 1024, server.tasks.concurrency 10.
    assert thresholds == {
        "sessions": "700",
        "rounds-in-flight": "40",
        "listen-streams": "716.8",
        "tasks-running": "7",
        "tasks-queued": "5",
        "initialize-refused": "0.1",
        "cpu": None,
    }
    assert triggers["cpu"]["metadata"] == {"value": "70"}
    # Fleet-wide: the queue's depth is the same on every replica (its max, per replica);
    # the routers' refusals grow the replicas in proportion (a Value target).
    queued, refused = triggers["tasks-queued"], triggers["initialize-refused"]
    assert queued["metricType"] == "AverageValue"
    assert queued["metadata"]["query"] == (
        'max(mcpfleet_tasks_queue_depth{namespace="mcpfleet",job="mcpfleet-server"})'
    )
    assert refused["metricType"] == "Value"
    assert refused["metadata"]["query"] == (
        'sum(rate(mcpfleet_router_requests_total{namespace="mcpfleet",job="mcpfleet-router",'
        'route="initialize",outcome="no_replica"}[1m]))'
    )


@pytest.mark.parametrize(
    ("drain", "period"),
    [({}, 60), ({"timeout": 120}, 143)],
    ids=["default-drain", "long-drain"],
)
def test_the_default_scale_down_removes_one_replica_per_drain(
    helm: Helm, tmp_path: Path, drain: dict[str, int], period: int
) -> None:
    """One replica at a time, each after the last one's grace period (preStop + drain
    timeout + linger + 5) and 15 s more, at least a minute; after 5 minutes below target."""
    values = merge(MCP_ON, {"server": {"drain": drain}})
    so = _scaled_object(_render_with(helm, values, tmp_path, *KEDA))
    behavior = so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior == {
        "scaleDown": {
            "stabilizationWindowSeconds": 300,
            "policies": [{"type": "Pods", "value": 1, "periodSeconds": period}],
        }
    }


ROUTER_MCP = {"router": {"autoscaling": {"enabled": True, "mcp": {"enabled": True}}}}


@pytest.mark.parametrize(
    ("values", "args", "expected"),
    [
        ({"router": {"autoscaling": {"enabled": True}}}, KEDA, {"HorizontalPodAutoscaler"}),
        (ROUTER_MCP, KEDA, {"ScaledObject"}),
        (ROUTER_MCP, (), {"HorizontalPodAutoscaler"}),
        (merge(ROUTER_MCP, {"router": {"enabled": False}}), KEDA, set()),
    ],
    ids=["cpu", "mcp", "mcp-without-keda", "no-router"],
)
def test_the_routers_scale_on_their_requests_in_flight_through_keda(
    helm: Helm, tmp_path: Path, values: dict[str, Any], args: tuple[str, ...], expected: set[str]
) -> None:
    docs = _render_with(helm, values, tmp_path, *args)
    kinds = {d["kind"] for d in docs if d["metadata"]["name"] == "mcpfleet-router"}
    assert kinds & {"HorizontalPodAutoscaler", "ScaledObject"} == expected
    if expected == {"ScaledObject"}:
        (so,) = [d for d in docs if d["kind"] == "ScaledObject"]
        triggers = {t["name"]: t for t in so["spec"]["triggers"]}
        assert set(triggers) == {"requests-in-flight", "cpu"}
        assert triggers["requests-in-flight"]["metadata"]["query"] == (
            'sum(mcpfleet_router_requests_in_flight{namespace="mcpfleet",job="mcpfleet-router"})'
        )
        assert triggers["requests-in-flight"]["metadata"]["threshold"] == "200"


def test_a_scaledobject_with_nothing_to_scale_on_is_refused(helm: Helm, tmp_path: Path) -> None:
    nothing = {"sessionCapFraction": 0, "roundsInFlight": 0, "listenStreamsFraction": 0}
    nothing |= {"tasksRunningFraction": 0, "tasksQueuedPerReplica": 0}
    nothing |= {"refusedInitializePerSecond": 0, "cpu": False, "enabled": True}
    values = {"server": {"autoscaling": {"enabled": True, "mcp": nothing}}}
    with pytest.raises(HelmError, match="nothing to scale on"):
        _render_with(helm, values, tmp_path, *KEDA)


def test_the_scaledobject_is_valid_against_kedas_own_crd(helm: Helm, tmp_path: Path) -> None:
    """Against the CRD of the KEDA pinned in hack/tools/keda (its openAPIV3Schema, closed)."""
    keda = chartkit.module_dir(KEDA_MODULE, repo_root() / "hack" / "tools" / "keda")
    crd = yaml.safe_load((keda / "config/crd/bases/keda.sh_scaledobjects.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    schema = chartkit._strict(version["schema"]["openAPIV3Schema"])
    docs = _render_with(helm, merge(MCP_ON, ROUTER_MCP), tmp_path, *KEDA)
    scaled = [d for d in docs if d["kind"] == "ScaledObject"]
    assert len(scaled) == 2
    for so in scaled:
        jsonschema.validate(so, schema)
    so["spec"]["triggers"][0]["metricTyp"] = "AverageValue"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(so, schema)
