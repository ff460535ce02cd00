"""The chart's values and docs/flags.md agree with the flags' tables (config.SETTINGS).

The table is the one source: a flag that names the chart value it is passed
from (``chart``) must

- have that value in values.yaml, with the flag's default as its default,
  unless the table says why the chart's differs (``chart_differs``: then it
  must really differ, or the reason is stale);
- have a property in values.schema.json that accepts the flag's default and
  refuses what the flag refuses (a value the chart takes must not stop the
  replica or the router at start);
- be what the chart's Deployment passes to that flag: every ``--flag={{ .Values.X }}``
  of the server's and the router's Deployments is a flag of that process whose
  table names ``X``.

docs/flags.md's tables are made from the same tables (``make flags-docs``):
the committed page is what they make.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from mcpfleet.config import REPLICA_FLAGS, SETTINGS, Flags, ReplicaConfig, Setting

pytestmark = pytest.mark.unit

CHART = Path(__file__).resolve().parents[2] / "charts" / "mcpfleet"
#: The Deployment of each process, and the template variables it names values by.
TEMPLATES = {
    "serve": (CHART / "templates" / "server" / "deployment.yaml", {"$drain": "server.drain"}),
    "router": (CHART / "templates" / "router" / "deployment.yaml", {}),
}
PASSED = re.compile(r"^\s*- (--[a-z][a-z0-9-]*)=\{\{ *([.$][\w.]+) *\}\}\s*$", re.M)
#: For each flag type, values it refuses: the schema must refuse them too.
REFUSED = {
    "positive": [0, -1],
    "non_negative": [-1],
    "positive_int": [0],
    "non_negative_int": [-1],
    "share": [-0.1, 1.5],
    "port": [-1, 65536],
}


def _values() -> dict[str, Any]:
    return yaml.safe_load((CHART / "values.yaml").read_text())  # type: ignore[no-any-return]


def _schema() -> dict[str, Any]:
    return json.loads((CHART / "values.schema.json").read_text())  # type: ignore[no-any-return]


def _at(tree: dict[str, Any], path: str, children: str) -> Any:
    node: Any = tree
    for key in path.split("."):
        node = node[children][key] if children else node[key]
    return node


def _json(value: Any) -> Any:
    return list(value) if isinstance(value, tuple | list) else value


def charted() -> list[tuple[str, Setting, Flags]]:
    return [
        (command, setting, flags)
        for command, flags in SETTINGS.items()
        for setting in flags.settings()
        if setting.chart
    ]


def default_differences(values: dict[str, Any]) -> list[str]:
    """Each charted flag whose default and chart value's default disagree, unless said why."""
    out = []
    for command, setting, flags in charted():
        assert setting.chart is not None
        ours = _json(setting.default_in(flags.config))
        try:
            chart = _at(values, setting.chart, "")
        except KeyError:
            out.append(f"{command} {setting.flag}: no {setting.chart} in values.yaml")
            continue
        same = chart == ours
        if not setting.chart_differs and not same:
            out.append(f"{command} {setting.flag}: default {ours!r}, {setting.chart}: {chart!r}")
        elif setting.chart_differs and same:
            out.append(f"{command} {setting.flag}: said to differ from {setting.chart}, but equal")
    return out


def schema_differences(schema: dict[str, Any]) -> list[str]:
    out = []
    for command, setting, flags in charted():
        assert setting.chart is not None
        prop = _at(schema, setting.chart, "properties")
        checker = jsonschema.Draft7Validator(prop)
        default = _json(setting.default_in(flags.config))
        if not setting.chart_differs and not checker.is_valid(default):
            out.append(f"{command} {setting.flag}: the schema refuses its default {default!r}")
        kind = getattr(setting.type, "__name__", "")
        for bad in REFUSED.get(kind, []):
            if checker.is_valid(bad):
                out.append(f"{command} {setting.flag} refuses {bad}; {setting.chart} takes it")
    return out


def template_differences(texts: dict[str, str] | None = None) -> list[str]:
    """Each flag a Deployment passes a value other than the one the table names."""
    out = []
    for command, (template, names) in TEMPLATES.items():
        by_flag = {s.flag: s for s in SETTINGS[command].settings()}
        text = texts[command] if texts else template.read_text()
        passed = PASSED.findall(text)
        assert len(passed) > 8, f"{template.name}: the flags it passes were not read"
        for flag, value in passed:
            if value.startswith("$"):
                var, _, rest = value.partition(".")
                if var not in names:
                    continue
                path = f"{names[var]}.{rest}"
            else:
                path = value.removeprefix(".Values.")
            setting = by_flag.get(flag)
            if setting is None:
                out.append(f"{template.name}: {flag} is no flag of mcpfleet {command}")
            elif setting.chart != path:
                out.append(
                    f"{command} {flag}: the chart passes {path}, the table says {setting.chart}"
                )
    return out


def test_every_charted_flag_has_its_default_in_values_yaml() -> None:
    assert len(charted()) > 30, "the table's chart values were not read"
    assert not default_differences(_values())


def test_every_charted_flag_has_a_schema_property_that_takes_what_the_flag_takes() -> None:
    assert not schema_differences(_schema())


def test_the_deployments_pass_each_flag_the_value_the_table_names() -> None:
    assert not template_differences()


def test_a_default_that_differs_from_the_charts_is_reported() -> None:
    values = _values()
    values["server"]["stateTTL"] = 300
    values["router"]["unknownSessionTTL"] = 5
    values["router"]["sessionCap"] = None  # said to differ, yet now equal
    assert [d.split(":")[0] for d in default_differences(values)] == [
        "serve --state-ttl",
        "router --session-cap",
        "router --unknown-session-ttl",
    ]


def test_a_schema_that_takes_what_the_flag_refuses_is_reported() -> None:
    schema = _schema()
    schema["properties"]["server"]["properties"]["stateTTL"] = {"type": "integer"}
    schema["properties"]["router"]["properties"]["redisPoolWait"] = {"type": "string"}
    assert schema_differences(schema) == [
        "serve --state-ttl refuses 0; server.stateTTL takes it",
        "serve --state-ttl refuses -1; server.stateTTL takes it",
        "router --redis-pool-wait: the schema refuses its default 0.5",
    ]


def test_a_deployment_passing_another_value_or_an_unknown_flag_is_reported() -> None:
    texts = {command: template.read_text() for command, (template, _) in TEMPLATES.items()}
    texts["serve"] = texts["serve"].replace(".Values.server.stateTTL", ".Values.server.sseTtl")
    texts["router"] = texts["router"].replace("--redis-pool-size=", "--redis-pool-max=")
    assert template_differences(texts) == [
        "serve --state-ttl: the chart passes server.sseTtl, the table says server.stateTTL",
        "deployment.yaml: --redis-pool-max is no flag of mcpfleet router",
    ]


# --------------------------------------------------------------------------- docs/flags.md


def _flags_table() -> Any:
    path = CHART.parents[1] / "docs" / "flags-table.py"
    spec = importlib.util.spec_from_file_location("flags_table", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_flags_md_is_what_the_tables_make() -> None:
    """``make flags-docs`` was run after the last change to a flag's declaration."""
    made = _flags_table()
    page = made.PAGE.read_text()
    assert made.render(page) == page, "docs/flags.md is stale: run make flags-docs"


def test_docs_flags_md_has_a_row_for_every_flag_of_both_processes() -> None:
    page = _flags_table().PAGE.read_text()
    for command, flags in SETTINGS.items():
        section = page.split(f"<!-- flags:{command}:begin -->")[1].split("<!-- flags:")[0]
        rows = re.findall(r"^\| `(--[a-z-]+)", section, re.M)
        assert [r for r in rows if r != "--redis"] == [s.flag for s in flags.settings()], command


def test_a_changed_default_makes_docs_flags_md_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    made = _flags_table()
    page = made.PAGE.read_text()
    rows = list(REPLICA_FLAGS.rows)
    i, ttl = next((n, r) for n, r in enumerate(rows) if getattr(r, "flag", "") == "--state-ttl")
    assert isinstance(ttl, Setting)
    rows[i] = dataclasses.replace(ttl, default=300.0)
    monkeypatch.setitem(made.SETTINGS, "serve", Flags(ReplicaConfig, tuple(rows)))
    changed = made.render(page)
    assert changed != page and "| `--state-ttl` | 300 |" in changed
