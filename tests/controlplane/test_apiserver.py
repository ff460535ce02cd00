"""The API server itself: it starts from scratch, answers, and serves custom resources."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from fleetkit.cluster.controlplane import ControlPlane, pinned_version, wait_for

pytestmark = pytest.mark.controlplane


def test_api_server_answers_readyz_and_version(control_plane: ControlPlane) -> None:
    status, body = control_plane.get("/readyz")
    assert (status, body) == (200, b"ok")

    status, body = control_plane.get("/version")
    assert status == 200
    version = json.loads(body)
    # The binary was stamped with its real version, which helm's kubeVersion
    # checks and the operator's capability checks depend on.
    assert version["gitVersion"] == pinned_version("k8s.io/kubernetes")


def test_control_plane_listens_on_loopback_only(control_plane: ControlPlane) -> None:
    assert control_plane.server.startswith("https://127.0.0.1:")
    kubeconfig = Path(control_plane.admin_kubeconfig).read_text()
    assert f"server: {control_plane.server}" in kubeconfig


def test_admin_creates_crd_and_custom_object(admin_api: k8s.ApiClient, namespace: str) -> None:
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.fleetkit.test"},
        "spec": {
            "group": "fleetkit.test",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "required": ["size"],
                                    "properties": {"size": {"type": "integer", "minimum": 1}},
                                }
                            },
                        }
                    },
                }
            ],
        },
    }
    extensions = k8s.ApiextensionsV1Api(admin_api)
    model = k8s.V1CustomResourceDefinition.from_dict(crd)
    assert model is not None
    extensions.create_custom_resource_definition(model)

    def established() -> bool:
        got = extensions.read_custom_resource_definition("widgets.fleetkit.test")
        conditions = (got.status.conditions if got.status else None) or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    wait_for(established, timeout=15, what="the Widget CRD to be Established")

    custom = k8s.CustomObjectsApi(admin_api)
    widget = {
        "apiVersion": "fleetkit.test/v1",
        "kind": "Widget",
        "metadata": {"name": "w1"},
        "spec": {"size": 3},
    }
    custom.create_namespaced_custom_object("fleetkit.test", "v1", namespace, "widgets", widget)
    got: Any = custom.get_namespaced_custom_object(
        "fleetkit.test", "v1", namespace, "widgets", "w1"
    )
    assert got["spec"] == {"size": 3}

    # The schema is enforced by the server: the CRD is real, not a stub.
    invalid = {**widget, "metadata": {"name": "w2"}, "spec": {"size": 0}}
    with pytest.raises(k8s.ApiException) as refused:
        custom.create_namespaced_custom_object("fleetkit.test", "v1", namespace, "widgets", invalid)
    assert refused.value.status == 422


def test_a_second_control_plane_starts_and_stops_without_leftovers(
    control_plane: ControlPlane,
) -> None:
    # Its own ports, PKI and temp dir: independent of the session's plane.
    other = ControlPlane(bin_dir=control_plane.bin_dir).start()
    try:
        assert other.port != control_plane.port
        assert other.get("/readyz")[0] == 200
        assert "kube-apiserver (running)" in other.log_tail()
        processes = list(other.processes.values())
        assert len(processes) == 2  # etcd, kube-apiserver
        workdir = other.workdir
    finally:
        other.stop()
    assert workdir is not None and not workdir.exists()
    assert all(p is not None and p.poll() is not None for p in processes)
    # The session's plane is untouched.
    assert control_plane.get("/readyz")[0] == 200
