"""Dashboards as code: the committed JSON is the generator's output, and every panel is usable."""

from __future__ import annotations

import re
from typing import Any

import pytest

from fleetkit import monitoring


def test_generator_reproduces_the_committed_dashboards_byte_for_byte() -> None:
    gen = monitoring.load_generator()
    committed = {p.name for p in monitoring.DASHBOARDS_DIR.glob("*.json")}
    assert committed == set(gen.DASHBOARDS), "one committed file per generated dashboard"
    for name, build in gen.DASHBOARDS.items():
        text = (monitoring.DASHBOARDS_DIR / name).read_text()
        assert text == gen.render(build), f"{name} is stale: run make dashboards"


def test_the_three_dashboards_have_stable_uids_and_titles() -> None:
    boards = {b["uid"]: b["title"] for b in monitoring.dashboards().values()}
    assert boards == {
        "mcpfleet-rounds": "mcpfleet / Rounds",
        "mcpfleet-keyring": "mcpfleet / Key ring",
        "mcpfleet-routing": "mcpfleet / Routing",
    }


@pytest.mark.parametrize("name", sorted(monitoring.dashboards()))
def test_every_panel_has_a_unit_a_description_and_uses_the_variables(name: str) -> None:
    board = monitoring.dashboards()[name]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["namespace"]["type"] == "query"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    for panel in monitoring.panels(board):
        title = panel["title"]
        assert panel["description"].strip(), title
        assert panel["fieldConfig"]["defaults"].get("unit"), title
        assert panel["datasource"]["uid"] == "${datasource}", title
        assert panel["targets"], title
        for target in panel["targets"]:
            expr = target["expr"]
            assert 'namespace=~"$namespace"' in expr, (title, expr)
            if "rate(" in expr:
                assert "[$__rate_interval]" in expr, (title, expr)
            assert target["datasource"]["uid"] == "${datasource}"


def test_dashboard_queries_only_name_mcpfleet_metrics_with_one_prefix() -> None:
    for q in monitoring.panel_queries():
        assert q.metrics, q
        for metric in q.metrics:
            word = metric.split("_")[1]
            assert word in {
                "rounds",
                "round",
                "elicitation",
                "requeststate",
                "keyring",
                "replica",
                "router",
                "operator",
                "tasks",
                "limited",
                "limit",
                "listen",
                "events",
            }, metric


def test_a_latency_panel_links_its_exemplars_to_traces_through_a_tracing_variable() -> None:
    boards = monitoring.dashboards()
    linked = {}
    for name, board in boards.items():
        variables = {v["name"]: v for v in board["templating"]["list"]}
        for panel in monitoring.panels(board):
            if not any(t.get("exemplar") for t in panel["targets"]):
                continue
            assert all(t.get("exemplar") for t in panel["targets"]), panel["title"]
            assert variables["tracing"]["type"] == "datasource", name
            (link,) = panel["fieldConfig"]["defaults"]["links"]
            assert '"datasource":"${tracing}"' in link["url"], link
            assert "${__data.fields.trace_id}" in link["url"], link
            linked[name] = panel["title"]
    assert linked == {
        "mcpfleet-rounds.json": "Round latency p99 per component",
        "mcpfleet-routing.json": "Proxy latency by route",
    }


#: kube-state-metrics' HorizontalPodAutoscaler series the Autoscaling row reads (its docs:
#: docs/metrics/workload/horizontalpodautoscaler-metrics.md); a misspelt name is no data.
KSM_HPA_METRICS = {
    "kube_horizontalpodautoscaler_status_desired_replicas",
    "kube_horizontalpodautoscaler_status_current_replicas",
    "kube_horizontalpodautoscaler_spec_max_replicas",
    "kube_horizontalpodautoscaler_spec_target_metric",
    "kube_horizontalpodautoscaler_status_target_metric",
}
SERVER_SCALEDOBJECT = monitoring.ROOT / "charts/mcpfleet/templates/server/scaledobject.yaml"


def _row(board: dict[str, Any], title: str) -> list[dict[str, Any]]:
    """The panels under the row ``title`` (the panels are listed after their row)."""
    out: list[dict[str, Any]] = []
    inside = False
    for panel in board["panels"]:
        if panel.get("type") == "row":
            inside = panel["title"] == title
        elif inside:
            out.append(panel)
    return out


def test_the_routing_dashboard_has_an_autoscaling_row_of_the_hpas_replicas_and_targets() -> None:
    panels = _row(monitoring.dashboards()["mcpfleet-routing.json"], "Autoscaling")
    exprs = {p["title"]: [t["expr"] for t in p["targets"]] for p in panels}
    everything = " ".join(e for es in exprs.values() for e in es)
    used = set(re.findall(r"\bkube_[a-z_]+", everything))
    assert used == KSM_HPA_METRICS, used
    for component, jobs in (
        ("Server", "mcpfleet_replica_build_info"),
        ("Router", "mcpfleet_router_replicas"),
    ):
        replicas = exprs[f"{component} replicas: desired, current and max (HPA)"]
        assert [re.findall(r"kube_\w+", e)[0] for e in replicas] == [
            "kube_horizontalpodautoscaler_status_desired_replicas",
            "kube_horizontalpodautoscaler_status_current_replicas",
            "kube_horizontalpodautoscaler_spec_max_replicas",
        ]
        # Only the fleet's HPA: the one named like the job of its metrics.
        for e in replicas:
            join = "and on (namespace, horizontalpodautoscaler) label_replace("
            assert f"{join}max by (namespace, job) ({jobs}" in e, e
    (ratio,) = exprs["Triggers against their targets (HPA)"]
    assert re.search(
        r"kube_horizontalpodautoscaler_status_target_metric\{[^}]*\} / on \(namespace, "
        r"horizontalpodautoscaler, metric_name, metric_target_type\) "
        r"kube_horizontalpodautoscaler_spec_target_metric",
        ratio,
    ), ratio


def test_the_autoscaling_row_shows_every_signal_of_the_servers_scaledobject_per_replica() -> None:
    """Each trigger query of the chart's ScaledObject is on the row, divided by the replicas."""
    template = SERVER_SCALEDOBJECT.read_text()
    signals = re.findall(r'printf "(sum|max)\((mcpfleet_\w+)\{%s\}\)"', template)
    assert len(signals) == 5, signals
    panels = _row(monitoring.dashboards()["mcpfleet-routing.json"], "Autoscaling")
    exprs = [t["expr"] for p in panels for t in p["targets"]]
    replicas = 'count by (namespace, job) (mcpfleet_replica_build_info{namespace=~"$namespace"})'
    for agg, metric in signals:
        wanted = f'{agg} by (namespace, job) ({metric}{{namespace=~"$namespace"}}) / {replicas}'
        assert wanted in exprs, (metric, exprs)
    # The fleet-wide refusals of initialize for capacity (a Value trigger): their rate.
    assert 'route=\\"initialize\\",outcome=\\"no_replica\\"' in template
    assert any(
        'mcpfleet_router_requests_total{namespace=~"$namespace",route="initialize",outcome="no_replica"}'
        in e
        for e in exprs
    ), exprs
