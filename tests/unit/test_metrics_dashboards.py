"""Dashboards as code: the committed JSON is the generator's output, and every panel is usable."""

from __future__ import annotations

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
