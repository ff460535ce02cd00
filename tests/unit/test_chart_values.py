"""values.yaml is the one source of the chart's values: the schema and the README agree with it.

- Every value with a comment of its own in values.yaml has a property in
  values.schema.json whose description is that comment (joined into one line, as
  the README's values table shows it).
- Every value of values.yaml has a property in the schema, or sits inside an
  object the schema takes as Kubernetes gives it (a security context,
  resources, a probe, a strategy: no properties listed, any key accepted).
- Every property of the schema is a value of values.yaml (except ``global``,
  which Helm itself passes to every chart).
- The README's values table is what ``values-table.py`` makes of values.yaml.

A description that differs is reported with both texts; the fix is to copy the
comment into the schema (values.yaml is the source).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[2] / "charts" / "mcpfleet"
#: Helm passes ``global`` to every chart; it is never in values.yaml.
HELM_OWN = {"global"}


def _values_table() -> Any:
    spec = importlib.util.spec_from_file_location("values_table", CHART / "values-table.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: The comment of each value, exactly as the README's values table reads it.
comments: Any = _values_table().comments


def value_paths(values: dict[str, Any], prefix: str = "") -> list[str]:
    """Every key of values.yaml, by dotted path (maps and leaves)."""
    out = []
    for key, value in values.items():
        out.append(prefix + key)
        if isinstance(value, dict):
            out += value_paths(value, f"{prefix}{key}.")
    return out


def schema_properties(node: dict[str, Any], prefix: str = "") -> dict[str, dict[str, Any]]:
    """Every property the schema declares, by dotted path."""
    out = {}
    for key, sub in node.get("properties", {}).items():
        out[prefix + key] = sub
        out.update(schema_properties(sub, f"{prefix}{key}."))
    return out


def description_differences(values_text: str, schema: dict[str, Any]) -> list[str]:
    props = schema_properties(schema)
    out = []
    for path, comment in comments(values_text).items():
        if path not in props:
            out.append(f"{path}: no schema property (values.yaml: {comment!r})")
        elif props[path].get("description") != comment:
            out.append(
                f"{path}:\n  values.yaml: {comment!r}\n"
                f"  schema:      {props[path].get('description')!r}"
            )
    return out


def unschemed_values(values: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    props = schema_properties(schema)

    def open_object(path: str) -> bool:
        """Whether an ancestor of ``path`` is an object whose keys the schema leaves open."""
        parts = path.split(".")
        for i in range(len(parts) - 1, 0, -1):
            node = props.get(".".join(parts[:i]))
            if node is not None:
                return "properties" not in node and node.get("additionalProperties") is not False
        return False

    return [p for p in value_paths(values) if p not in props and not open_object(p)]


def schema_only(values: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    known = set(value_paths(values))
    return sorted(p for p in schema_properties(schema) if p not in known and p not in HELM_OWN)


def load() -> tuple[str, dict[str, Any], dict[str, Any]]:
    text = (CHART / "values.yaml").read_text()
    return text, yaml.safe_load(text), json.loads((CHART / "values.schema.json").read_text())


def test_every_commented_value_has_its_comment_as_the_schema_description() -> None:
    text, _, schema = load()
    assert len(comments(text)) > 150, "the comments of values.yaml were not read"
    differences = description_differences(text, schema)
    assert not differences, "values.schema.json differs from values.yaml:\n" + "\n".join(
        differences
    )


def test_every_value_has_a_schema_property() -> None:
    _, values, schema = load()
    assert not unschemed_values(values, schema)


def test_every_schema_property_is_a_value() -> None:
    _, values, schema = load()
    assert not schema_only(values, schema)


def test_a_changed_comment_a_missing_property_and_a_stray_one_are_reported() -> None:
    text, values, schema = load()
    changed = text.replace("# The image repository.\n", "# Where the image is.\n", 1)
    assert [d.split(":")[0] for d in description_differences(changed, schema)] == [
        "image.repository"
    ]

    del schema["properties"]["image"]["properties"]["tag"]
    schema["properties"]["image"]["properties"]["colour"] = {"type": "string"}
    assert unschemed_values(values, schema) == ["image.tag"]
    assert schema_only(values, schema) == ["image.colour"]


def test_a_value_inside_a_kubernetes_object_needs_no_property_of_its_own() -> None:
    _, values, schema = load()
    assert "podSecurityContext.runAsUser" in value_paths(values)
    assert "podSecurityContext.runAsUser" not in unschemed_values(values, schema)
    schema["properties"]["podSecurityContext"]["additionalProperties"] = False
    assert "podSecurityContext.runAsUser" in unschemed_values(values, schema)


def test_the_chart_readme_values_table_is_what_values_yaml_makes() -> None:
    """``values-table.py --check``: the committed table is regenerated and compared."""
    done = subprocess.run(
        [sys.executable, str(CHART / "values-table.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
