"""With kube-controller-manager, Deployments make Pods; make_pod_ready plays the kubelet."""

from __future__ import annotations

import pytest
from kubernetes import client as k8s

from fleetkit.cluster.controlplane import OPTIONAL_TOOLS, ControlPlane, require_tools, wait_for
from fleetkit.cluster.pods import make_pod_ready

pytestmark = pytest.mark.controlplane


def _deployment(name: str, replicas: int) -> k8s.V1Deployment:
    labels = {"app": name}
    return k8s.V1Deployment(
        metadata=k8s.V1ObjectMeta(name=name),
        spec=k8s.V1DeploymentSpec(
            replicas=replicas,
            selector=k8s.V1LabelSelector(match_labels=labels),
            template=k8s.V1PodTemplateSpec(
                metadata=k8s.V1ObjectMeta(labels=labels),
                spec=k8s.V1PodSpec(
                    containers=[k8s.V1Container(name=name, image="example.invalid/web:1")]
                ),
            ),
        ),
    )


def test_deployment_becomes_available_when_its_pods_are_made_ready(
    control_plane: ControlPlane, admin_api: k8s.ApiClient, namespace: str
) -> None:
    require_tools(OPTIONAL_TOOLS, control_plane.bin_dir)
    assert control_plane.controller_manager
    core = k8s.CoreV1Api(admin_api)
    apps = k8s.AppsV1Api(admin_api)
    apps.create_namespaced_deployment(namespace, _deployment("web", 2))

    def two_pods() -> list[k8s.V1Pod] | None:
        pods = core.list_namespaced_pod(namespace, label_selector="app=web").items
        return pods if len(pods) == 2 else None

    # The ServiceAccount admission plugin is on: the ReplicaSet controller's
    # Pods are admitted once the controller-manager made the "default" account.
    pods = wait_for(two_pods, timeout=20, what="the ReplicaSet to create 2 Pods")
    assert all(p.status and p.status.phase == "Pending" for p in pods)  # no kubelet runs them

    for i, pod in enumerate(pods):
        assert pod.metadata and pod.metadata.name
        ip = f"127.0.0.{10 + i}"
        patched = make_pod_ready(admin_api, namespace, pod.metadata.name, ip)
        assert patched["status"]["podIP"] == ip

    def available() -> k8s.V1DeploymentStatus | None:
        status = apps.read_namespaced_deployment("web", namespace).status
        return status if status and status.available_replicas == 2 else None

    status = wait_for(available, timeout=20, what="the Deployment to report 2 available Pods")
    assert status.ready_replicas == 2
