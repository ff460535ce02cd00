"""The local Prometheus's configuration, targets and graph link (pure functions)."""

from __future__ import annotations

import urllib.parse
from pathlib import Path

from mcpfleet.dev.localprom import (
    REPLICA_JOB,
    ROUNDS_GRAPH,
    ROUTER_JOB,
    RULES_FILE,
    Target,
    _unix,
    graph_url,
    render_config,
    render_targets,
)


def test_every_process_is_a_target_with_the_labels_a_service_monitor_would_give() -> None:
    targets = render_targets(
        [
            Target("127.0.0.1:8001", REPLICA_JOB, "replica-0"),
            Target("127.0.0.1:8000", ROUTER_JOB, "router-0"),
        ],
        "dev",
    )
    assert targets == [
        {
            "targets": ["127.0.0.1:8001"],
            "labels": {"job": "mcpfleet-server", "namespace": "dev", "pod": "replica-0"},
        },
        {
            "targets": ["127.0.0.1:8000"],
            "labels": {"job": "mcpfleet-router", "namespace": "dev", "pod": "router-0"},
        },
    ]


def test_config_scrapes_the_targets_file_at_the_interval_with_the_rules() -> None:
    config = render_config(Path("/w/targets.json"), interval=1.0, rules=[RULES_FILE])
    assert config["global"] == {"scrape_interval": "1s", "evaluation_interval": "1s"}
    assert config["rule_files"] == [str(RULES_FILE)]
    (job,) = config["scrape_configs"]
    assert job["file_sd_configs"][0]["files"] == ["/w/targets.json"]
    assert job["scrape_timeout"] == "1s"


def test_the_rules_file_is_found_in_a_source_checkout() -> None:
    assert RULES_FILE.is_file()


def test_graph_link_shows_asking_vs_final_rounds() -> None:
    url = graph_url("http://127.0.0.1:9090")
    assert url.startswith("http://127.0.0.1:9090/graph?")
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
    assert query["g0.expr"] == [ROUNDS_GRAPH]
    assert "mcpfleet_rounds_total" in ROUNDS_GRAPH and "kind" in ROUNDS_GRAPH


def test_prometheus_nanosecond_timestamps_parse() -> None:
    assert _unix("2026-11-30T07:56:08.123456789Z") == 1796025368.123456
    assert _unix("2026-11-30T07:56:08Z") == 1796025368.0
