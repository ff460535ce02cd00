"""The chart as tests see it: render it with the real helm, validate it with kubeconform.

kubeconform needs JSON schemas and there is no network here, so
:func:`kubeconform_schemas` makes them from sources pinned in ``hack/tools``:

- the Kubernetes OpenAPI v2 document (``api/openapi-spec/swagger.json`` of the
  ``k8s.io/kubernetes`` module the control-plane binaries are built from): one
  file per kind, each carrying the definitions it reaches;
- the CRD YAML of the prometheus-operator module (ServiceMonitor,
  PrometheusRule, ...) pinned in ``hack/tools/prometheus-operator``, and the
  chart's own CRDs.

Every object schema that lists its properties is made strict
(``additionalProperties: false``, unless the API says unknown fields are
kept), as kubeconform's ``-strict`` schemas are: a misspelt field fails.
Files are laid out for the ``-schema-location`` template
:data:`SCHEMA_TEMPLATE` and cached by the hash of their sources.
"""

from __future__ import annotations

import copy
import hashlib
import json
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from fleetkit.cluster.controlplane import Helm, repo_root, tools_bin_dir

CHART = repo_root() / "charts" / "mcpfleet"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
#: Worked examples of values files (not packaged; the render tests cover them).
EXAMPLE_VALUES = sorted((CHART / "examples").glob("values-*.yaml"))
#: The values that run the example own app (deploy/own-app/), as its README shows.
OWN_APP_VALUES = repo_root() / "deploy" / "own-app" / "values.yaml"
#: kubeconform's -schema-location, relative to the schema directory.
SCHEMA_TEMPLATE = "{{ .Group }}/{{ .ResourceAPIVersion }}/{{ .ResourceKind }}.json"
PROMETHEUS_OPERATOR = "github.com/prometheus-operator/prometheus-operator"
#: The API group versions a cluster with the Prometheus Operator serves.
MONITORING_API = "monitoring.coreos.com/v1"


def render(helm: Helm, *args: str, release: str = "mcpfleet", namespace: str = "mcpfleet") -> str:
    """``helm template`` of the chart; ``args`` are extra helm arguments (-f, --set, ...)."""
    return helm.run("template", release, str(CHART), "--namespace", namespace, *args).stdout


def objects(manifest: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(manifest) if d]


# --------------------------------------------------------------------------- sources


def module_dir(module: str, workdir: Path) -> Path:
    """The module's directory in the Go module cache, downloaded (and hash-checked) if needed."""
    out = subprocess.run(
        ["go", "mod", "download", "-json", module],
        cwd=workdir,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
        env=_go_env(),
    ).stdout
    return Path(json.loads(out)["Dir"])


def _go_env() -> dict[str, str]:
    import os

    return {**os.environ, "GOFLAGS": "-mod=readonly"}


def schema_sources() -> tuple[Path, list[Path]]:
    """The OpenAPI document and the CRD files the schemas are made from."""
    tools = repo_root() / "hack" / "tools"
    swagger = module_dir("k8s.io/kubernetes", tools) / "api" / "openapi-spec" / "swagger.json"
    po = module_dir(PROMETHEUS_OPERATOR, tools / "prometheus-operator")
    crds = sorted((po / "example" / "prometheus-operator-crd").glob("*.yaml"))
    crds += sorted((CHART / "crds").glob("*.yaml"))
    return swagger, crds


# --------------------------------------------------------------------------- schemas


def _strict(node: Any) -> Any:
    """Close every object schema that lists its properties; int-or-string as either."""
    if isinstance(node, list):
        return [_strict(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strict(v) for k, v in node.items()}
    if out.get("format") == "int-or-string" or out.get("x-kubernetes-int-or-string"):
        for key in ("type", "format"):
            out.pop(key, None)
        out["oneOf"] = [{"type": "string"}, {"type": "integer"}]
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def _v3_to_v2(node: Any) -> Any:
    """OpenAPI v3 wraps a lone $ref in allOf (to add a default); JSON Schema takes it bare."""
    if isinstance(node, list):
        return [_v3_to_v2(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _v3_to_v2(v) for k, v in node.items() if k != "default"}
    if (
        list(out.get("allOf", [None]))
        and len(out.get("allOf", [])) == 1
        and "$ref" in out["allOf"][0]
    ):
        out.update(out.pop("allOf")[0])
    return out


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            yield ref.removeprefix("#/definitions/")
        for value in node.values():
            yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


def _reachable(definitions: dict[str, Any], root: str) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    todo = [root]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen[name] = definitions[name]
        todo.extend(_refs(definitions[name]))
    return seen


def _write(out: Path, group: str, version: str, kind: str, schema: dict[str, Any]) -> None:
    path = out / (group or "v1") / version / f"{kind.lower()}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(schema))


class _CrdLoader(yaml.SafeLoader):
    """PyYAML reads a bare ``=`` (an enum value in the CRDs) as YAML 1.1's value tag."""


def _construct_value(loader: _CrdLoader, node: yaml.ScalarNode) -> Any:
    return loader.construct_scalar(node)


_CrdLoader.add_constructor("tag:yaml.org,2002:value", _construct_value)


def make_schemas(swagger: Path, crds: Sequence[Path], out: Path) -> None:
    """Write kubeconform schemas for every kind of ``swagger`` and every CRD version."""
    raw = json.loads(swagger.read_text())["definitions"]
    # The OpenAPI v2 document leaves out the CRD API itself; its v3 document has it.
    v3 = swagger.parent / "v3" / "apis__apiextensions.k8s.io__v1_openapi.json"
    text = v3.read_text().replace("#/components/schemas/", "#/definitions/")
    for name, definition in json.loads(text)["components"]["schemas"].items():
        raw.setdefault(name, _v3_to_v2(definition))
    definitions = {k: _strict(v) for k, v in raw.items()}
    for name, definition in definitions.items():
        for gvk in definition.get("x-kubernetes-group-version-kind", []):
            schema = {
                "$ref": f"#/definitions/{name}",
                "definitions": copy.deepcopy(_reachable(definitions, name)),
            }
            _write(out, gvk["group"], gvk["version"], gvk["kind"], schema)
    for path in crds:
        for crd in yaml.load_all(path.read_text(), Loader=_CrdLoader):
            if not crd or crd.get("kind") != "CustomResourceDefinition":
                continue
            spec = crd["spec"]
            for version in spec["versions"]:
                schema = _strict(version["schema"]["openAPIV3Schema"])
                props = schema.setdefault("properties", {})
                props.setdefault("apiVersion", {"type": "string"})
                props.setdefault("kind", {"type": "string"})
                props["metadata"] = {"type": "object"}
                _write(out, spec["group"], version["name"], spec["names"]["kind"], schema)


def kubeconform_schemas() -> Path:
    """The schema directory for the pinned sources (made once, under ``.cache``)."""
    swagger, crds = schema_sources()
    digest = hashlib.sha256()
    for path in [swagger, *crds, Path(__file__)]:
        digest.update(path.read_bytes())
    out = repo_root() / ".cache" / "kubeconform-schemas" / digest.hexdigest()[:16]
    if not (out / ".complete").exists():
        tmp = out.with_suffix(".tmp")
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
        make_schemas(swagger, crds, tmp)
        (tmp / ".complete").write_text("")
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    return out


def kubeconform(manifest: str, schemas: Path, bin_dir: Path | None = None) -> list[str]:
    """Validate a rendered manifest; returns kubeconform's complaints (empty: all valid)."""
    binary = (bin_dir or tools_bin_dir()) / "kubeconform"
    result = subprocess.run(
        [
            str(binary),
            "-strict",
            "-summary",
            "-output",
            "json",
            "-schema-location",
            f"{schemas}/{SCHEMA_TEMPLATE}",
            "-",
        ],
        input=manifest,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    report = json.loads(result.stdout or "{}")
    problems = [
        f"{r['kind']} {r['name']}: {r['status']}: {r.get('msg', '')}"
        for r in report.get("resources", [])
        if r.get("status") != "statusValid"
    ]
    if result.returncode != 0 and not problems:
        problems.append(f"kubeconform exited {result.returncode}: {result.stderr.strip()}")
    summary = report.get("summary", {})
    if not summary.get("valid"):
        problems.append(f"kubeconform validated nothing: {summary}")
    return problems


def value_paths(values: dict[str, Any], prefix: str = "") -> list[str]:
    """Every leaf of a values tree (a map with content is a branch; lists are leaves)."""
    paths = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            paths += value_paths(value, path + ".")
        else:
            paths.append(path)
    return paths
