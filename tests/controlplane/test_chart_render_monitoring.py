"""The chart's monitoring objects (the real helm): ServiceMonitors and the
PrometheusRule only where their API exists, with their knobs; the dashboards'
ConfigMaps; the key-age alert, unit-tested by promtool.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetkit.cluster import chartkit
from fleetkit.cluster.helm import Helm

from .chartrender import _by, _render

pytestmark = pytest.mark.timeout(300)


def test_monitoring_objects_only_where_the_api_exists(
    rendered: dict[tuple[str, bool], list[dict[str, Any]]],
) -> None:
    plain = {d["kind"] for d in rendered["default", False]}
    assert not plain & {"ServiceMonitor", "PrometheusRule"}
    docs = rendered["default", True]
    monitors = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ServiceMonitor"}
    assert {n.rsplit("-", 1)[1] for n in monitors} == {"server", "router", "operator"}
    for name, monitor in monitors.items():
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint.get("honorLabels", False) == name.endswith("-operator")
    rule = _by(docs, "PrometheusRule")
    source = yaml.safe_load((chartkit.CHART / "rules" / "mcpfleet.rules.yaml").read_text())
    assert rule["spec"]["groups"] == source["groups"]


def test_dashboards_are_configmaps_with_a_configurable_sidecar_label(helm: Helm) -> None:
    sources = sorted((chartkit.CHART / "dashboards").glob("*.json"))
    docs = chartkit.objects(chartkit.render(helm))
    maps = _dashboard_maps(docs)
    assert len(maps) == len(sources)
    assert all(m["metadata"]["labels"]["grafana_dashboard"] == "1" for m in maps)
    assert sorted(k for m in maps for k in m["data"]) == [p.name for p in sources]
    docs = chartkit.objects(
        chartkit.render(
            helm, "--set", "monitoring.dashboards.label=dash,monitoring.dashboards.labelValue=yes"
        )
    )
    maps = _dashboard_maps(docs)
    assert all(m["metadata"]["labels"]["dash"] == "yes" for m in maps)
    off = chartkit.objects(chartkit.render(helm, "--set", "monitoring.dashboards.enabled=false"))
    assert _dashboard_maps(off) == []


def _dashboard_maps(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ConfigMaps of a render but the replicas' limits file."""
    return [
        d
        for d in docs
        if d["kind"] == "ConfigMap" and not d["metadata"]["name"].endswith("-limits")
    ]


def test_service_monitor_knobs_and_the_runbook_base(helm: Helm, tmp_path: Path) -> None:
    relabel = [{"sourceLabels": ["__name__"], "regex": "python_gc_.*", "action": "drop"}]
    values = {
        "monitoring": {
            "serviceMonitor": {
                "scrapeTimeout": "7s",
                "relabelings": [{"targetLabel": "team", "replacement": "mcp"}],
                "metricRelabelings": relabel,
                "labels": {"release": "kps"},
            },
            "prometheusRule": {"runbookBaseURL": "https://runbooks.example/mcpfleet.md"},
        }
    }
    docs = chartkit.objects(
        _render(helm, values, tmp_path, "--api-versions", chartkit.MONITORING_API)
    )
    monitors = [d for d in docs if d["kind"] == "ServiceMonitor"]
    assert len(monitors) == 3
    for monitor in monitors:
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["scrapeTimeout"] == "7s"
        assert endpoint["relabelings"] == [{"targetLabel": "team", "replacement": "mcp"}]
        assert endpoint["metricRelabelings"] == relabel
        assert monitor["metadata"]["labels"]["release"] == "kps"
    rules = [r for g in _by(docs, "PrometheusRule")["spec"]["groups"] for r in g["rules"]]
    assert rules and all(
        r["annotations"]["runbook_url"]
        == "https://runbooks.example/mcpfleet.md#" + r["alert"].lower()
        for r in rules
    )
    default = chartkit.objects(chartkit.render(helm, "--api-versions", chartkit.MONITORING_API))
    url = _by(default, "PrometheusRule")["spec"]["groups"][0]["rules"][0]["annotations"]
    assert re.match(
        r"https://github\.com/mcpfleet/mcpfleet/blob/v\d+\.\d+\.\d+/", url["runbook_url"]
    )
    chart = yaml.safe_load((chartkit.CHART / "Chart.yaml").read_text())
    assert f"/blob/v{chart['version']}/" in url["runbook_url"], "the tag of this chart's version"


def test_the_releases_key_is_too_old_at_one_and_a_half_rotation_periods(
    helm: Helm, tmp_path: Path
) -> None:
    """The rendered rule, unit-tested by promtool: at rotateEvery 720h the release's key
    fires past 1080h; another KeyRing's key of the same age stays quiet (90 days)."""
    import shutil

    values = {"keyRing": {"rotateEvery": "720h"}}
    docs = chartkit.objects(
        _render(helm, values, tmp_path, "--api-versions", chartkit.MONITORING_API, namespace="shop")
    )
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": _by(docs, "PrometheusRule")["spec"]["groups"]}))
    age = 1080 * 3600 - 600
    series = "mcpfleet_operator_key_age_seconds"
    runbook = "https://github.com/mcpfleet/mcpfleet/blob/v0.1.0/deploy/monitoring/RUNBOOK.md"
    (tmp_path / "test.yaml").write_text(
        f"""
rule_files: [rules.yaml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: '{series}{{namespace="shop",keyring="mcpfleet-keys"}}'
        values: '{age}+60x60'
      - series: '{series}{{namespace="shop",keyring="other"}}'
        values: '{age}+60x60'
    alert_rule_test:
      - eval_time: 5m
        alertname: McpfleetKeyTooOld
        exp_alerts: []
      - eval_time: 50m
        alertname: McpfleetKeyTooOld
        exp_alerts:
          - exp_labels: {{severity: warning, namespace: shop, keyring: mcpfleet-keys}}
            exp_annotations:
              summary: "A key ring's sealing key is older than its rotation schedule allows."
              description: >-
                The sealing key of key ring mcpfleet-keys in namespace shop is
                45d 0h 40m 0s old: scheduled rotations are not completing.
              runbook_url: "{runbook}#mcpfleetkeytooold"
"""
    )
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed: bash hack/ensure-debs.sh")
    out = subprocess.run(
        [promtool, "test", "rules", "test.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
