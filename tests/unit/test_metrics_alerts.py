"""The alert rules follow the conventions: names, severities, annotations, runbooks, tests."""

from __future__ import annotations

import re

import yaml

from fleetkit import monitoring

EXPECTED = {
    "McpfleetRequestStateRejectionsHigh",
    "McpfleetKeyRingMismatch",
    "McpfleetKeyRingReloadFailing",
    "McpfleetKeyRotationStuck",
    "McpfleetKeyRotationFailed",
    "McpfleetNoServingReplica",
    "McpfleetRouterDegraded",
    "McpfleetOwnerGoneSpike",
    "McpfleetElicitationDeclineShareHigh",
    "McpfleetOperatorDown",
    "McpfleetKeyTooOld",
    "McpfleetRouterErrorRatioHigh",
    "McpfleetSessionCapReached",
    "McpfleetRedisMemoryNearMax",
    # MCP tasks: a growing queue, tasks failing.
    "McpfleetTaskQueueGrowing",
    "McpfleetTasksFailing",
    # Limits per principal: refusals that do not stop.
    "McpfleetLimitingSustained",
    # The operator's tasks wait: a rotation that retired its old key under live tasks.
    "McpfleetKeyRotationAbandonedTasks",
    # Notifications: events dropped before reaching listen streams.
    "McpfleetEventsDropped",
    # Autoscaling: the servers' HPA at maxReplicas with a trigger over its target.
    "McpfleetAutoscalerAtMax",
}


def test_every_expected_alert_exists_once() -> None:
    names = [a.name for a in monitoring.alerts()]
    assert sorted(names) == sorted(EXPECTED)


def test_alerts_are_camel_case_with_severity_summary_description_and_runbook() -> None:
    runbook = monitoring.RUNBOOK.read_text()
    sections = {m.group(1) for m in re.finditer(r"^## (\w+)$", runbook, re.M)}
    for alert in monitoring.alerts():
        assert re.fullmatch(r"Mcpfleet(?:[A-Z][a-z]+)+", alert.name), alert.name
        assert alert.labels["severity"] in {"critical", "warning", "info"}, alert.name
        summary = alert.annotations["summary"]
        assert "{{" not in summary and summary.endswith("."), alert.name
        assert "{{ $labels.namespace }}" in alert.annotations["description"], alert.name
        url = alert.annotations["runbook_url"]
        assert url.endswith("RUNBOOK.md#" + alert.name.lower()), alert.name
        assert alert.name in sections, f"RUNBOOK.md has no section for {alert.name}"
        section = runbook.split(f"## {alert.name}\n", 1)[1].split("\n## ", 1)[0]
        for part in ("**Meaning.**", "**Confirm.**", "**Act.**"):
            assert part in section, (alert.name, part)


def test_every_alert_has_a_firing_and_a_quiet_promtool_case() -> None:
    cases: dict[str, list[bool]] = {}
    for path in monitoring.RULE_TESTS.glob("*.test.yaml"):
        doc = yaml.safe_load(path.read_text())
        for group in doc["tests"]:
            for case in group.get("alert_rule_test", []):
                cases.setdefault(case["alertname"], []).append(bool(case["exp_alerts"]))
    for name in EXPECTED:
        assert True in cases.get(name, []), f"{name}: no firing case"
        assert False in cases.get(name, []), f"{name}: no quiet case"
