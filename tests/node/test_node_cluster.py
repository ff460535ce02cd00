"""The node itself: pods of the real image run, resolve names, reach the API; teardown is clean.

One node serves the module; the last test stops it and checks that the
machine is as it was before the node started (processes, mounts, cgroups,
iptables chains, the bridge, sysctls).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest
from kubernetes import client as k8s

from fleetkit.cluster import node_host
from fleetkit.cluster.controlplane import temporary_namespace, wait_for
from fleetkit.cluster.node import (
    BRIDGE,
    CGROUP_ROOT,
    NODE_NAME,
    SERVICE_CIDR,
    Node,
    _cgroup_hierarchies,
)

from .conftest import NODE_START_TIMEOUT

pytestmark = pytest.mark.timeout(NODE_START_TIMEOUT)


@pytest.fixture(scope="module")
def api(node: Node) -> k8s.ApiClient:
    return node.api_client()


@pytest.fixture
def namespace(api: k8s.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    with temporary_namespace(api, request.node.name.removeprefix("test_")[:30]) as name:
        yield name


def run_to_completion(
    api: k8s.ApiClient, node: Node, namespace: str, script: str, **spec: object
) -> str:
    """Run ``python3 -c SCRIPT`` in a pod of the image; its log once it Succeeded."""
    core = k8s.CoreV1Api(api)
    body = {
        "metadata": {"name": "probe"},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "probe",
                    "image": node.images.app,
                    "imagePullPolicy": "Never",
                    "command": ["python3", "-c", script],
                }
            ],
            **spec,
        },
    }
    core.create_namespaced_pod(namespace, body)

    def finished() -> str | None:
        phase = core.read_namespaced_pod("probe", namespace).status.phase
        return phase if phase in ("Succeeded", "Failed") else None

    phase = wait_for(finished, timeout=120, interval=0.5, what="the probe pod to finish")
    # Read through the API server, which asks the kubelet: `kubectl logs`.
    log: str = core.read_namespaced_pod_log("probe", namespace)
    assert phase == "Succeeded", log
    return log


def test_the_node_registers_ready_with_its_bridge_address(api: k8s.ApiClient) -> None:
    node = k8s.CoreV1Api(api).read_node(NODE_NAME)
    conditions = {c.type: c.status for c in node.status.conditions}
    assert conditions["Ready"] == "True"
    addresses = {a.type: a.address for a in node.status.addresses}
    assert addresses["InternalIP"] == "10.217.0.1"
    assert not node.spec.taints


def test_a_pod_of_the_image_runs_as_the_non_root_uid_of_the_dockerfile(
    api: k8s.ApiClient, node: Node, namespace: str
) -> None:
    log = run_to_completion(
        api,
        node,
        namespace,
        "import os, mcpfleet; print(os.getuid(), mcpfleet.__name__)",
    )
    # The Dockerfile's USER 10001:10001, with no securityContext in the pod.
    # (containerd's CRI applies the image's UID but not its GID: pods that need
    # the group set runAsGroup, as the fleet's Deployment does.)
    assert log.strip() == "10001 mcpfleet"


def test_a_pod_resolves_the_api_service_and_calls_it_with_its_service_account_token(
    api: k8s.ApiClient, node: Node, namespace: str
) -> None:
    script = """
import json, socket, ssl, urllib.request
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
ip = socket.gethostbyname("kubernetes.default.svc.cluster.local")
ctx = ssl.create_default_context(cafile=f"{sa}/ca.crt")
review = json.dumps({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
req = urllib.request.Request(
    "https://kubernetes.default.svc/apis/authentication.k8s.io/v1/selfsubjectreviews",
    data=review.encode(), method="POST",
    headers={"Authorization": "Bearer " + open(f"{sa}/token").read(),
             "Content-Type": "application/json"})
user = json.load(urllib.request.urlopen(req, context=ctx, timeout=10))["status"]["userInfo"]
print(json.dumps({"ip": ip, "user": user["username"]}))
"""
    out = json.loads(run_to_completion(api, node, namespace, script).strip().splitlines()[-1])
    # The `kubernetes` Service: the first address of the range, through kube-proxy
    # to the API server on the bridge; the name through CoreDNS.
    assert out["ip"] == SERVICE_CIDR.replace("0/24", "1")
    assert out["user"] == f"system:serviceaccount:{namespace}:default"


def test_stopping_the_node_leaves_the_machine_as_it_found_it(node: Node) -> None:
    """Last in the module: it stops the module's node."""
    assert node.before is not None and node.plane is not None
    pids = [c.process.pid for c in node.plane._components if c.process is not None]
    assert len(pids) >= 8, "etcd, apiserver, manager, containerd, scheduler, proxy, dns, kubelet"
    socket = str(node.containerd_socket)
    roots = [str(node.workdir)]
    report = node.stop()
    assert report.failed == []
    assert node_host.differences(node.before, roots, [BRIDGE]) == []
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}"), f"pid {pid} still runs"
    for proc in os.listdir("/proc"):
        if proc.isdigit():
            try:
                with open(f"/proc/{proc}/cmdline", "rb") as f:
                    assert socket.encode() not in f.read(), f"pid {proc} uses the node's containerd"
            except OSError:
                pass
    for hierarchy in _cgroup_hierarchies():
        assert not (hierarchy / CGROUP_ROOT).exists(), hierarchy
    assert BRIDGE not in node_host.link_names()
    assert not node.workdir.exists()
