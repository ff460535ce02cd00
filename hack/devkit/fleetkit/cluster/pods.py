"""Pods on a control plane without a kubelet: the status a kubelet would write."""

from __future__ import annotations

import datetime
from typing import Any, Protocol

from kubernetes import client as k8s

from fleetkit.cluster.controlplane import LOOPBACK


class _Object(Protocol):
    """An object the API server returns (a Pod, a Node, a Secret, ...)."""

    metadata: k8s.V1ObjectMeta | None


def meta(obj: _Object) -> k8s.V1ObjectMeta:
    """``obj.metadata``: the client types it optional; the API server always sends it."""
    assert obj.metadata is not None, obj
    return obj.metadata


def name_of(obj: _Object) -> str:
    """``obj.metadata.name``, which every object the API server returns has."""
    name = meta(obj).name
    assert name is not None, obj
    return name


def make_pod_ready(
    api: k8s.ApiClient, namespace: str, name: str, ip: str = LOOPBACK
) -> dict[str, Any]:
    """Write the status a kubelet would report for a started, ready Pod.

    There is no kubelet (and no scheduler) in this control plane, so Pods stay
    Pending. Patching ``status`` to Running with every container ready and an
    IP lets the ReplicaSet and Deployment controllers count the Pod as
    available and the EndpointSlice controller publish it, which is all the
    operator and the router observe. The Pod's processes, if any, are run by
    the test itself (e.g. a replica on ``ip``).
    """
    core = k8s.CoreV1Api(api)
    pod = core.read_namespaced_pod(name, namespace)
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    containers = pod.spec.containers if pod.spec else []
    condition_types = ("PodScheduled", "Initialized", "ContainersReady", "Ready")
    body = {
        "status": {
            "phase": "Running",
            "hostIP": LOOPBACK,
            "hostIPs": [{"ip": LOOPBACK}],
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "startTime": now,
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": now} for t in condition_types
            ],
            "containerStatuses": [
                {
                    "name": c.name,
                    "image": c.image,
                    "imageID": "",
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": now}},
                }
                for c in containers
            ],
        }
    }
    response = core.patch_namespaced_pod_status(
        name, namespace, body, _content_type="application/strategic-merge-patch+json"
    )
    result: dict[str, Any] = api.sanitize_for_serialization(response)
    return result
