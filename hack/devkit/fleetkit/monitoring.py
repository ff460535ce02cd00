"""The committed dashboards and alert rules, read as data, for the tests that check them.

The fleet test evaluates every query found here against a real Prometheus;
the unit tests check the files' shape. Grafana variables are substituted the
way Grafana would for one namespace and a short scrape interval.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]
DASHBOARDS_DIR = ROOT / "charts" / "mcpfleet" / "dashboards"
RULES_FILE = ROOT / "charts" / "mcpfleet" / "rules" / "mcpfleet.rules.yaml"
RULE_TESTS = ROOT / "deploy" / "monitoring" / "tests"
RUNBOOK = ROOT / "deploy" / "monitoring" / "RUNBOOK.md"
GENERATOR = ROOT / "deploy" / "monitoring" / "dashboards.py"

#: Metrics only the operator exports: they have data only where it runs (a cluster).
OPERATOR_PREFIX = "mcpfleet_operator_"
#: The scrape job of the operator's metrics Service (the chart's ServiceMonitor).
OPERATOR_JOB = "-operator-metrics"


#: Metrics only a replica whose app has MCP task tools exports (mcpfleet.tasks): the
#: tasks tests check them (.venv-tasks, make test-tasks), not the plain fleet's.
TASKS_PREFIX = "mcpfleet_tasks_"


def needs_tasks(expr: str) -> bool:
    """True for an expression over the task metrics (an app with task tools)."""
    return TASKS_PREFIX in expr


#: kube-state-metrics' series of the HorizontalPodAutoscalers (the Autoscaling row,
#: McpfleetAutoscalerAtMax): data only on a cluster that runs kube-state-metrics.
KSM_PREFIX = "kube_horizontalpodautoscaler_"


def needs_kube_state_metrics(expr: str) -> bool:
    """True for an expression over kube-state-metrics' HPA series (a cluster)."""
    return KSM_PREFIX in expr


_OPERATOR_UP = re.compile(r"\bup\{[^}]*" + re.escape(OPERATOR_JOB))


def needs_operator(expr: str) -> bool:
    """True for an expression with data only where the operator runs: over its metrics,
    or over its scrape target's ``up``."""
    return OPERATOR_PREFIX in expr or _OPERATOR_UP.search(expr) is not None


_SELECTOR = re.compile(r"\b(mcpfleet_[a-z0-9_]+)(\{[^}]*\})?")


def load_generator() -> ModuleType:
    """``deploy/monitoring/dashboards.py`` as a module (it is not part of the package)."""
    spec = importlib.util.spec_from_file_location("mcpfleet_dashboards", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class PanelQuery:
    dashboard: str
    panel: str
    expr: str

    @property
    def metrics(self) -> set[str]:
        return {m.group(1) for m in _SELECTOR.finditer(self.expr)}

    @property
    def needs_operator(self) -> bool:
        return any(m.startswith(OPERATOR_PREFIX) for m in self.metrics)

    @property
    def needs_tasks(self) -> bool:
        return any(m.startswith(TASKS_PREFIX) for m in self.metrics)

    @property
    def needs_kube_state_metrics(self) -> bool:
        return needs_kube_state_metrics(self.expr)


def dashboards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS_DIR.glob("*.json"))}


def panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in board["panels"] if p.get("type") != "row"]


def panel_queries() -> list[PanelQuery]:
    out = []
    for board in dashboards().values():
        for panel in panels(board):
            for target in panel["targets"]:
                out.append(PanelQuery(board["title"], panel["title"], target["expr"]))
    return out


def substitute(expr: str, namespace: str, rate_interval: str = "10s", rng: str = "5m") -> str:
    """What Grafana sends to Prometheus for one namespace."""
    return (
        expr.replace("$namespace", re.escape(namespace))
        .replace("$__rate_interval", rate_interval)
        .replace("$__range", rng)
        .replace("$__interval", "1s")
    )


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    labels: dict[str, str]
    annotations: dict[str, str]

    def selectors(self) -> list[str]:
        """Every vector selector in the expression (metric name with its matchers)."""
        return sorted({m.group(0) for m in _SELECTOR.finditer(self.expr)})


def alerts() -> list[Alert]:
    doc = yaml.safe_load(RULES_FILE.read_text())
    out = []
    for group in doc["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                out.append(
                    Alert(
                        rule["alert"],
                        rule["expr"],
                        dict(rule.get("labels", {})),
                        dict(rule.get("annotations", {})),
                    )
                )
    return out


def require_binary(name: str) -> str:
    """A Debian-packaged binary (prometheus, promtool); in CI a missing one fails the run."""
    import shutil

    import pytest

    found = shutil.which(name)
    if found:
        return found
    if os.environ.get("CI") == "true":
        pytest.fail(f"{name} is not installed (make deps installs the prometheus package)")
    pytest.skip(f"{name} is not installed: apt-get install prometheus (or make deps)")
