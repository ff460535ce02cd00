"""Your own app on the chart (the real helm): the replicas' image, app, config and
extra containers; image fields one by one; extraObjects; service accounts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetkit.cluster import chartkit
from fleetkit.cluster.helm import Helm

from .chartrender import SCENARIOS, _by, _container, _extra, _pod_specs, _render

pytestmark = pytest.mark.timeout(300)


def test_the_replicas_run_your_own_image_and_app_with_its_config(
    rendered: dict[tuple[str, bool], list[dict[str, Any]]],
) -> None:
    docs = rendered["own-app", False]
    values = yaml.safe_load(SCENARIOS["own-app"].read_text())
    own = values["server"]
    spec = _by(docs, "Deployment", "-server")["spec"]["template"]["spec"]
    server = _container(spec, "server")
    assert server["image"].startswith(own["image"]["repository"] + ":")
    assert f"--app={own['app']}" in server["args"]
    env = {e["name"] for e in server["env"]}
    assert {e["name"] for e in own["extraEnv"]} <= env and "POD_NAME" in env
    assert server["envFrom"] == own["envFrom"]
    for mount in own["extraVolumeMounts"]:
        assert mount in server["volumeMounts"]
    for volume in own["extraVolumes"]:
        assert volume in spec["volumes"]
    assert [c["name"] for c in spec["initContainers"]] == [c["name"] for c in own["initContainers"]]
    assert [c["name"] for c in spec["containers"]] == [
        "server",
        *(c["name"] for c in own["extraContainers"]),
    ]
    # The router, the operator and the helm test keep the mcpfleet image.
    mcpfleet = _container(_by(docs, "Deployment", "-router")["spec"]["template"]["spec"], "router")
    assert not mcpfleet["image"].startswith(own["image"]["repository"] + ":")
    account = _by(docs, "ServiceAccount", "-server")
    assert spec["serviceAccountName"] == account["metadata"]["name"]
    assert spec["automountServiceAccountToken"] is False
    assert account["automountServiceAccountToken"] is False
    extra = {(k, n) for k, n in _extra("own-app")}
    assert extra and extra <= {(d["kind"], d["metadata"]["name"]) for d in docs}


def test_server_image_fields_fall_back_to_image_one_by_one(helm: Helm, tmp_path: Path) -> None:
    def server(values: dict[str, Any]) -> dict[str, Any]:
        docs = chartkit.objects(_render(helm, values, tmp_path))
        spec = _by(docs, "Deployment", "-server")["spec"]["template"]["spec"]
        return _container(spec, "server")

    base = {"image": {"repository": "reg.example/mcpfleet", "tag": "9.9", "pullPolicy": "Always"}}
    assert server(base)["image"] == "reg.example/mcpfleet:9.9"
    mine = server({**base, "server": {"image": {"repository": "reg.example/myapp"}}})
    assert mine["image"] == "reg.example/myapp:9.9" and mine["imagePullPolicy"] == "Always"
    digest = "sha256:" + "b" * 64
    pinned = server(
        {
            **base,
            "server": {
                "image": {
                    "repository": "reg.example/myapp",
                    "tag": "1",
                    "digest": digest,
                    "pullPolicy": "Never",
                }
            },
        }
    )
    assert (
        pinned["image"] == f"reg.example/myapp:1@{digest}" and pinned["imagePullPolicy"] == "Never"
    )


def test_extra_objects_are_rendered_maps_as_is_strings_through_tpl(
    helm: Helm, tmp_path: Path
) -> None:
    values = {
        "extraObjects": [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "plain"},
                "data": {"a": "1"},
            },
            "apiVersion: v1\nkind: ConfigMap\n"
            "metadata:\n  name: '{{ .Release.Name }}-templated'\n"
            "data:\n  ns: '{{ .Release.Namespace }}'\n",
        ]
    }
    docs = chartkit.objects(_render(helm, values, tmp_path, release="shop", namespace="tools"))
    assert _by(docs, "ConfigMap", "plain")["data"] == {"a": "1"}
    assert _by(docs, "ConfigMap", "shop-templated")["data"] == {"ns": "tools"}


def test_component_service_accounts_are_made_only_when_asked(helm: Helm, tmp_path: Path) -> None:
    plain = chartkit.objects(chartkit.render(helm))
    assert {d["metadata"]["name"] for d in plain if d["kind"] == "ServiceAccount"} == {
        "mcpfleet-operator",
        "mcpfleet-uninstall",
    }
    for name, spec in _pod_specs(plain):
        if name.endswith(("-server", "-router")):
            assert spec["serviceAccountName"] == "default"
    values = {
        "server": {"serviceAccount": {"create": True, "annotations": {"iam.example/role": "app"}}},
        "router": {"serviceAccount": {"create": False, "name": "shared"}},
    }
    docs = chartkit.objects(_render(helm, values, tmp_path))
    account = _by(docs, "ServiceAccount", "-server")
    assert account["metadata"]["annotations"] == {"iam.example/role": "app"}
    server = _by(docs, "Deployment", "-server")["spec"]["template"]["spec"]
    router = _by(docs, "Deployment", "-router")["spec"]["template"]["spec"]
    assert server["serviceAccountName"] == "mcpfleet-server"
    assert router["serviceAccountName"] == "shared"
