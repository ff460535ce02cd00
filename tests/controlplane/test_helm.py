"""The built helm: it runs, renders a chart, and installs it into the real API server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from kubernetes import client as k8s

from fleetkit.cluster.controlplane import pinned_version
from fleetkit.cluster.helm import Helm, HelmError

pytestmark = pytest.mark.controlplane

CHART = Path(__file__).parent / "fixtures" / "tinychart"


def test_helm_version_reports_the_pinned_release(helm: Helm) -> None:
    out = helm.run("version", "--template", "{{ .Version }}").stdout
    # build.sh stamps the module version; an unstamped build says "v3.22".
    assert out == pinned_version("helm.sh/helm/v3")


def test_helm_template_renders_the_fixture_chart(helm: Helm) -> None:
    out = helm.run("template", "demo", str(CHART), "--set", "greeting=bonjour").stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    assert len(docs) == 1
    (configmap,) = docs
    assert configmap["kind"] == "ConfigMap"
    assert configmap["metadata"]["name"] == "demo-tiny"
    assert configmap["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    assert configmap["data"]["greeting"] == "bonjour"
    # Offline, helm's default capabilities come from the pinned client-go.
    assert configmap["data"]["kubeVersion"].startswith("v1.")


def test_helm_refuses_a_chart_whose_kube_version_does_not_match(helm: Helm, tmp_path: Path) -> None:
    chart = tmp_path / "tinychart"
    chart.mkdir()
    for path in CHART.rglob("*"):
        target = chart / path.relative_to(CHART)
        if path.is_dir():
            target.mkdir()
        else:
            target.write_bytes(path.read_bytes())
    meta = chart / "Chart.yaml"
    meta.write_text(meta.read_text().replace('">=1.30.0-0"', '"<1.0.0"'))
    with pytest.raises(HelmError, match="kubeVersion"):
        helm.run("template", "demo", str(chart))


def test_helm_installs_the_chart_into_the_api_server(
    cluster_helm: Helm, admin_api: k8s.ApiClient, namespace: str
) -> None:
    cluster_helm.run(
        "install", "demo", str(CHART), "--namespace", namespace, "--set", "greeting=hi", "--wait"
    )
    configmap = k8s.CoreV1Api(admin_api).read_namespaced_config_map("demo-tiny", namespace)
    assert configmap.data is not None
    assert configmap.data["greeting"] == "hi"
    # Installed against the real server, Capabilities are the server's version.
    server_version = k8s.VersionApi(admin_api).get_code().git_version
    assert configmap.data["kubeVersion"] == server_version

    releases = json.loads(cluster_helm.run("list", "-n", namespace, "-o", "json").stdout)
    assert [(r["name"], r["status"]) for r in releases] == [("demo", "deployed")]
