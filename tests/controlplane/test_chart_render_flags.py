"""The values that become the replicas' and the router's flags, probes and shutdown
(the real helm): the drain and its grace period, session rehoming, the task and SSE
settings with the replicas' own defaults, the router's allowed hosts, its shutdown
and its HPA.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetkit.cluster import chartkit
from fleetkit.cluster.helm import Helm, HelmError

from .chartrender import _by, _container, _render

pytestmark = pytest.mark.timeout(300)


def test_the_grace_period_covers_the_prestop_pause_and_the_drain_deadline(helm: Helm) -> None:
    docs = chartkit.objects(
        chartkit.render(
            helm,
            "--set",
            "server.drain.timeout=45,server.drain.linger=3,server.drain.preStopSeconds=2",
        )
    )
    spec = _by(docs, "Deployment", "-server")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert "--drain-timeout=45" in container["args"] and "--drain-linger=3" in container["args"]
    assert container["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "2"]
    assert spec["terminationGracePeriodSeconds"] == 2 + 45 + 3 + 5
    env = {
        e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        for e in container["env"]
    }
    assert env["POD_NAME"] == "metadata.name" and env["POD_IP"] == "status.podIP"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"


@pytest.mark.parametrize(
    ("values", "router_flag", "server_flag"),
    [
        ((), False, None),
        (("--set", "router.rehomeSessions=true"), True, "--drain-handover"),
        (
            ("--set", "router.rehomeSessions=true,server.sessionRehome=false"),
            True,
            "--no-session-rehome",
        ),
    ],
    ids=["default-off", "on", "on-app-opted-out"],
)
def test_session_rehoming_is_off_by_default_and_its_values_set_both_components_flags(
    helm: Helm, values: tuple[str, ...], router_flag: bool, server_flag: str | None
) -> None:
    docs = chartkit.objects(chartkit.render(helm, *values))
    router = _by(docs, "Deployment", "-router")["spec"]["template"]["spec"]["containers"][0]
    server = _by(docs, "Deployment", "-server")["spec"]["template"]["spec"]["containers"][0]
    assert ("--rehome-sessions" in router["args"]) is router_flag
    flags = {"--drain-handover", "--no-session-rehome"} & set(server["args"])
    assert flags == ({server_flag} if server_flag else set())


def test_the_task_values_reach_the_replicas_flags_with_the_replicas_own_defaults(
    helm: Helm,
) -> None:
    from mcpfleet.config import ReplicaConfig

    def flags(*args: str) -> dict[str, float]:
        docs = chartkit.objects(chartkit.render(helm, *args))
        (container,) = _by(docs, "Deployment", "-server")["spec"]["template"]["spec"]["containers"]
        tasks = [a for a in container["args"] if a.startswith("--tasks-")]
        pairs = (a.split("=", 1) for a in tasks if "=" in a)
        return {k: float(v) for k, v in pairs} | {a: 1.0 for a in tasks if "=" not in a}

    defaults = ReplicaConfig(keys_dir=Path("."))
    assert flags() == {
        "--tasks-redelivery": defaults.tasks_redelivery,
        "--tasks-concurrency": defaults.tasks_concurrency,
        "--tasks-deadline": defaults.tasks_deadline,
    }
    assert defaults.tasks_encrypt is False
    tuned = (
        "server.tasks.redelivery=12,server.tasks.concurrency=4,server.tasks.deadline=3,"
        "server.tasks.encrypt=true"
    )
    assert flags("--set", tuned) == {
        "--tasks-redelivery": 12,
        "--tasks-concurrency": 4,
        "--tasks-deadline": 3,
        "--tasks-encrypt": 1,
    }


def test_the_sse_values_reach_the_replicas_flags_with_the_replicas_own_defaults(
    helm: Helm,
) -> None:
    from mcpfleet.config import ReplicaConfig

    def flags(*args: str) -> dict[str, float]:
        docs = chartkit.objects(chartkit.render(helm, *args))
        (container,) = _by(docs, "Deployment", "-server")["spec"]["template"]["spec"]["containers"]
        pairs = (a.split("=", 1) for a in container["args"] if a.startswith("--sse-"))
        return {k: float(v) for k, v in pairs}

    defaults = ReplicaConfig(keys_dir=Path("."))
    assert flags() == {"--sse-events": defaults.sse_events, "--sse-ttl": defaults.sse_ttl}
    assert flags("--set", "server.sseEvents=0,server.sseTtl=30") == {
        "--sse-events": 0,
        "--sse-ttl": 30,
    }
    with pytest.raises(HelmError, match="sseEvents"):
        chartkit.render(helm, "--set", "server.sseEvents=-1")


def test_the_router_answers_only_its_own_service_names(helm: Helm) -> None:
    docs = chartkit.objects(chartkit.render(helm, release="shop", namespace="tools"))
    args = _by(docs, "Deployment", "-router")["spec"]["template"]["spec"]["containers"][0]["args"]
    hosts = {a.split("=", 1)[1] for a in args if a.startswith("--allowed-host=")}
    assert {"shop-mcpfleet-router", "shop-mcpfleet-router.tools.svc:*"} <= hosts
    assert "shop-mcpfleet-router.tools.svc.cluster.local" in hosts
    assert not any(h in ("*", "") for h in hosts)


def test_the_router_shuts_down_like_a_replica_drains(helm: Helm, tmp_path: Path) -> None:
    from mcpfleet.cli import build_parser

    values = {
        "router": {
            "preStopSeconds": 4,
            "drainLinger": 3,
            "gracefulTimeout": 25,
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0},
            },
            "readinessProbe": {"periodSeconds": 3, "failureThreshold": 2},
            "livenessProbe": {"periodSeconds": 7, "timeoutSeconds": 2, "failureThreshold": 4},
            "podLabels": {"team": "mcp"},
            "priorityClassName": "fleet-critical",
        }
    }
    docs = chartkit.objects(_render(helm, values, tmp_path))
    router = _by(docs, "Deployment", "-router")
    spec = router["spec"]["template"]["spec"]
    container = _container(spec, "router")
    assert container["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "4"]
    assert spec["terminationGracePeriodSeconds"] == 4 + 3 + 25 + 5
    assert spec["priorityClassName"] == "fleet-critical"
    assert router["spec"]["strategy"] == values["router"]["strategy"]
    assert router["spec"]["template"]["metadata"]["labels"]["team"] == "mcp"
    ready, live = container["readinessProbe"], container["livenessProbe"]
    assert (ready["periodSeconds"], ready["failureThreshold"]) == (3, 2)
    assert (live["periodSeconds"], live["timeoutSeconds"], live["failureThreshold"]) == (7, 2, 4)
    # The rendered arguments are ones `mcpfleet router` takes, with the timeout.
    args = build_parser().parse_args(container["args"])
    assert args.graceful_timeout == 25 and args.drain_linger == 3
    default = _by(chartkit.objects(chartkit.render(helm)), "Deployment", "-router")
    default_spec = default["spec"]["template"]["spec"]
    assert default_spec["terminationGracePeriodSeconds"] == 2 + 2 + 10 + 5
    default_args = _container(default_spec, "router")["args"]
    assert "--graceful-timeout=10" in default_args and "--drain-linger=2" in default_args


def test_the_routers_scale_with_an_hpa_and_then_have_no_replica_count(
    helm: Helm, tmp_path: Path
) -> None:
    values = {"router": {"autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 5}}}
    docs = chartkit.objects(_render(helm, values, tmp_path))
    router = _by(docs, "Deployment", "-router")
    assert "replicas" not in router["spec"]
    hpa = _by(docs, "HorizontalPodAutoscaler", "-router")
    assert hpa["spec"]["scaleTargetRef"]["name"] == router["metadata"]["name"]
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 5)
    assert "replicas" in _by(docs, "Deployment", "-server")["spec"]
    with pytest.raises(HelmError) as refused:
        chartkit.render(
            helm,
            "--set",
            "router.autoscaling.enabled=true,router.autoscaling.minReplicas=12",
        )
    assert "router.autoscaling.minReplicas must not exceed" in str(refused.value)
