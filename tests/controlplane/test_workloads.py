"""With kube-controller-manager, Deployments make Pods; make_pod_ready plays the kubelet."""

from __future__ import annotations

import pytest
from fleetkit.controlplane import (
    OPTIONAL_TOOLS,
    ControlPlane,
    make_pod_ready,
    require_tools,
    wait_for,
)
from kubernetes import client as k8s

pytestmark = pytest.mark.controlplane


def test_deployment_becomes_available_when_its_pods_are_made_ready(
    control_plane: ControlPlane, admin_api: k8s.ApiClient, namespace: str
) -> None:
    require_tools(OPTIONAL_TOOLS, control_plane.bin_dir)
    assert control_plane.controller_manager
    core = k8s.CoreV1Api(admin_api)
    apps = k8s.AppsV1Api(admin_api)
    # The ServiceAccount admission plugin is on: Pods need the namespace's
    # "default" ServiceAccount, which the controller-manager creates.
    wait_for(
        lambda: core.list_namespaced_service_account(namespace).items,
        timeout=10,
        what="the default ServiceAccount",
    )
    labels = {"app": "web"}
    apps.create_namespaced_deployment(
        namespace,
        k8s.V1Deployment(
            metadata=k8s.V1ObjectMeta(name="web"),
            spec=k8s.V1DeploymentSpec(
                replicas=2,
                selector=k8s.V1LabelSelector(match_labels=labels),
                template=k8s.V1PodTemplateSpec(
                    metadata=k8s.V1ObjectMeta(labels=labels),
                    spec=k8s.V1PodSpec(
                        containers=[k8s.V1Container(name="web", image="example.invalid/web:1")]
                    ),
                ),
            ),
        ),
    )
    pods = wait_for(
        lambda: (
            (p := core.list_namespaced_pod(namespace, label_selector="app=web").items)
            and len(p) == 2
            and p
        ),
        timeout=20,
        what="the ReplicaSet to create 2 Pods",
    )
    assert all(p.status.phase == "Pending" for p in pods)  # no kubelet runs them

    for i, pod in enumerate(pods):
        status = make_pod_ready(admin_api, namespace, pod.metadata.name, f"127.0.0.{10 + i}")
        assert status["status"]["podIP"] == f"127.0.0.{10 + i}"

    deployment = wait_for(
        lambda: (
            (d := apps.read_namespaced_deployment("web", namespace)).status.available_replicas == 2
            and d
        ),
        timeout=20,
        what="the Deployment to report 2 available replicas",
    )
    assert deployment.status.ready_replicas == 2
