"""The chart, rendered by the real helm: lint, kubeconform, and the values it refuses.

Every ``charts/mcpfleet/ci/*-values.yaml`` scenario (and the examples, and your own
app's values) is linted, and rendered twice (with and without the Prometheus
Operator's API) and validated by kubeconform against strict schemas made from the
pinned Kubernetes OpenAPI document and the pinned prometheus-operator CRDs. Bad values
are refused by the chart's schema with a clear message; the README lists every value.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fleetkit.cluster import chartkit
from fleetkit.cluster.helm import Helm, HelmError

from .chartrender import SCENARIOS

pytestmark = pytest.mark.timeout(300)


def test_there_are_ci_scenarios() -> None:
    assert {"default", "autoscaling", "external-redis", "redis-auth", "hardened"} <= set(SCENARIOS)
    assert {"example-production", "example-external-sentinel", "own-app"} <= set(SCENARIOS)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_helm_lint_passes(helm: Helm, scenario: str) -> None:
    out = helm.run("lint", str(chartkit.CHART), "--strict", "-f", str(SCENARIOS[scenario])).stdout
    assert "0 chart(s) failed" in out


@pytest.mark.parametrize("monitoring", [False, True], ids=["plain", "prometheus-operator"])
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_scenario_is_valid_against_the_kubernetes_and_crd_schemas(
    helm: Helm, schemas: Path, scenario: str, monitoring: bool
) -> None:
    extra = ["--api-versions", chartkit.MONITORING_API] if monitoring else []
    # The chart's own CRDs are checked by the API server (the control-plane tier
    # applies them); here, every templated object.
    manifest = chartkit.render(helm, "-f", str(SCENARIOS[scenario]), *extra)
    assert chartkit.kubeconform(manifest, schemas) == []


def test_kubeconform_refuses_a_misspelt_field(helm: Helm, schemas: Path) -> None:
    """The schemas are strict: the validation above can fail."""
    manifest = chartkit.render(helm).replace("readOnlyRootFilesystem", "readOnlyRootFilesytem", 1)
    problems = chartkit.kubeconform(manifest, schemas)
    assert len(problems) == 1 and "readOnlyRootFilesytem" in problems[0]


def test_kubeconform_refuses_a_bad_service_monitor(helm: Helm, schemas: Path) -> None:
    manifest = chartkit.render(helm, "--api-versions", chartkit.MONITORING_API)
    manifest = manifest.replace("honorLabels: true", "honorLabels: maybe")
    assert any("ServiceMonitor" in p for p in chartkit.kubeconform(manifest, schemas))


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("operator.replicas=3", "/operator/replicas': value must be one of 1, 2"),
        ("redis.enabled=false", "/redis/external/url': minLength"),
        (
            "redis.enabled=false,redis.external.url=redis://u:secret@h:6379/0",
            "/redis/external/url': 'redis://u:secret@h:6379/0' does not match",
        ),
        ("fleet=Not_A_Label", "/fleet'"),
        ("server.replicas=0", "/server/replicas': minimum"),
        ("server.tasks.concurrency=0", "/server/tasks/concurrency': minimum"),
        ("image.pullPolicy=Sometimes", "/image/pullPolicy': value must be one of"),
        ("serverr.replicas=2", "additional properties 'serverr' not allowed"),
        ("image.digest=latest", "/image/digest'"),
        ("keyRing.rotateEvery=monthly", "/keyRing/rotateEvery'"),
        (
            "server.autoscaling.enabled=true,server.autoscaling.minReplicas=5,"
            "server.autoscaling.maxReplicas=3",
            "minReplicas must not exceed server.autoscaling.maxReplicas",
        ),
    ],
)
def test_bad_values_are_refused_with_a_clear_message(
    helm: Helm, setting: str, message: str
) -> None:
    with pytest.raises(HelmError) as refused:
        chartkit.render(helm, "--set", setting)
    assert message in str(refused.value)


def test_numbers_and_booleans_given_with_set_render_as_strings_in_labels_and_annotations(
    helm: Helm, schemas: Path
) -> None:
    """``--set server.podAnnotations.revision=2`` gives helm the number 2, which the API
    refuses in an annotation or a label: the chart renders every such value as a string."""
    settings = [
        "server.podAnnotations.revision=2",
        "server.podLabels.tier=1",
        "router.podAnnotations.ratio=0.5",
        "router.podLabels.canary=true",
        "router.service.annotations.weight=10",
        "operator.podAnnotations.generation=7",
        "redis.podAnnotations.backup=false",
        "server.serviceAccount.create=true",
        "server.serviceAccount.annotations.id=12345",
        "commonLabels.cost=42",
    ]
    manifest = chartkit.render(
        helm,
        *(a for s in settings for a in ("--set", s)),
        "--api-versions",
        chartkit.MONITORING_API,
    )
    assert chartkit.kubeconform(manifest, schemas) == []
    seen = set()
    for doc in chartkit.objects(manifest):
        metas = [doc.get("metadata", {})]
        template = doc.get("spec", {}).get("template", {})
        if isinstance(template, dict) and "metadata" in template:
            metas.append(template["metadata"])
        for meta in metas:
            for field in ("labels", "annotations"):
                for key, value in (meta.get(field) or {}).items():
                    assert isinstance(value, str), f"{doc['kind']} {field} {key}: {value!r}"
                    seen.add((key, value))
    for pair in [("revision", "2"), ("tier", "1"), ("ratio", "0.5"), ("canary", "true"),
                 ("weight", "10"), ("generation", "7"), ("backup", "false"), ("id", "12345"),
                 ("cost", "42")]:  # fmt: skip
        assert pair in seen, pair
    # A map where a value belongs is refused by the schema, naming the field.
    with pytest.raises(HelmError, match="podAnnotations"):
        chartkit.render(helm, "--set", "server.podAnnotations.team.name=x")


def test_the_chart_readme_lists_every_value() -> None:
    values = yaml.safe_load((chartkit.CHART / "values.yaml").read_text())
    readme = (chartkit.CHART / "README.md").read_text()
    listed = set(re.findall(r"^\| `([^`]+)` \|", readme, flags=re.M))
    assert listed == set(chartkit.value_paths(values))


def test_the_chart_readme_values_table_is_what_values_yaml_makes() -> None:
    """Regenerated and compared (``values-table.py --check``), as the dashboards are."""
    script = chartkit.CHART / "values-table.py"
    done = subprocess.run(
        [sys.executable, str(script), "--check"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
