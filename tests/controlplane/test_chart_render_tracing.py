"""Traces as the chart renders them (the real helm): the OpenTelemetry environment of
the routers and the replicas, the identity setting, the OTLP port in the
NetworkPolicies.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleetkit.cluster import chartkit
from fleetkit.cluster.helm import Helm, HelmError

from .chartrender import _by, _render

pytestmark = pytest.mark.timeout(300)


def _otel_env(docs: list[dict[str, Any]], component: str) -> dict[str, str]:
    deployment = _by(docs, "Deployment", f"-{component}")
    (container,) = [
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == component
    ]
    return {
        e["name"]: e.get("value", "")
        for e in container.get("env", [])
        if "OTEL" in e["name"] or e["name"] == "MCPFLEET_TRACES_IDENTITY"
    }


def test_tracing_values_set_the_opentelemetry_environment_of_routers_and_replicas(
    helm: Helm,
) -> None:
    off = chartkit.objects(chartkit.render(helm))
    assert _otel_env(off, "server") == {} and _otel_env(off, "router") == {}
    on = chartkit.objects(
        chartkit.render(
            helm,
            "--set",
            "tracing.otlpEndpoint=http://collector:4318",
            "--set-json",
            "tracing.sampleRatio=0.01",
            "--set",
            "tracing.resourceAttributes.deployment\\.environment=prod",
        )
    )
    for component, service in (("server", "mcpfleet-replica"), ("router", "mcpfleet-router")):
        env = _otel_env(on, component)
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://collector:4318"
        assert env["OTEL_TRACES_SAMPLER"] == "parentbased_traceidratio"
        assert env["OTEL_TRACES_SAMPLER_ARG"] == "0.01"
        assert env["OTEL_SERVICE_NAME"] == service
        attrs = dict(a.split("=", 1) for a in env["OTEL_RESOURCE_ATTRIBUTES"].split(","))
        assert attrs["service.instance.id"] == "$(OTEL_POD_NAME)"
        assert attrs["deployment.environment"] == "prod"
        assert env["MCPFLEET_TRACES_IDENTITY"] == "keep"


def test_tracing_identity_digest_reaches_routers_and_replicas_and_nothing_else_is_taken(
    helm: Helm,
) -> None:
    endpoint = "tracing.otlpEndpoint=http://collector:4318"
    on = chartkit.objects(
        chartkit.render(helm, "--set", endpoint, "--set", "tracing.identity=digest")
    )
    for component in ("server", "router"):
        assert _otel_env(on, component)["MCPFLEET_TRACES_IDENTITY"] == "digest"
    with pytest.raises(HelmError, match="identity"):
        chartkit.render(helm, "--set", endpoint, "--set", "tracing.identity=hash")


@pytest.mark.parametrize(
    ("endpoint", "port"),
    [("http://collector.obs:4318", 4318), ("https://otlp.example.com", 443), ("http://otel", 80)],
)
def test_with_tracing_on_the_network_policies_open_the_otlp_endpoints_port(
    helm: Helm, schemas: Path, tmp_path: Path, endpoint: str, port: int
) -> None:
    values: dict[str, Any] = {
        "networkPolicy": {"enabled": True},
        "tracing": {"otlpEndpoint": endpoint},
    }

    def tracing_rules(manifest: str, suffix: str) -> list[dict[str, Any]]:
        egress = _by(chartkit.objects(manifest), "NetworkPolicy", suffix)["spec"]["egress"]
        return [r for r in egress if r.get("ports") == [{"protocol": "TCP", "port": port}]]

    manifest = _render(helm, values, tmp_path)
    assert chartkit.kubeconform(manifest, schemas) == []
    for suffix in ("-server", "-router"):
        assert [r.get("to") for r in tracing_rules(manifest, suffix)] == [None]
    assert tracing_rules(manifest, "-operator") == []
    peer = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "obs"}}}
    scoped = _render(
        helm, {**values, "networkPolicy": {"enabled": True, "tracingTo": [peer]}}, tmp_path
    )
    for suffix in ("-server", "-router"):
        (rule,) = tracing_rules(scoped, suffix)
        assert rule["to"] == [peer]
    off = _render(helm, {"networkPolicy": {"enabled": True}}, tmp_path)
    assert tracing_rules(off, "-server") == []
