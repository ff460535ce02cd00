"""A node whose run was killed (every process SIGKILLed, a pod running) is still
cleaned up completely by the next one, from the state it left in ``/run``."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from kubernetes import client as k8s

from fleetkit.cluster import node_host
from fleetkit.cluster.controlplane import wait_for
from fleetkit.cluster.node import (
    BRIDGE,
    CGROUP_ROOT,
    POINTER,
    Node,
    _cgroup_hierarchies,
    require_node,
)

from .conftest import NODE_START_TIMEOUT

pytestmark = pytest.mark.timeout(NODE_START_TIMEOUT)


def test_a_killed_node_is_cleaned_up_from_its_pointer(tmp_path: Path) -> None:
    require_node()
    node = Node(workdir=tmp_path / "node")
    node.start()
    try:
        assert node.plane is not None and node.before is not None
        with node.api_client() as api:
            core = k8s.CoreV1Api(api)
            pod = {
                "metadata": {"name": "sleeper"},
                "spec": {
                    "containers": [
                        {
                            "name": "sleeper",
                            "image": node.images.app,
                            "imagePullPolicy": "Never",
                            "command": ["python3", "-c", "import time; time.sleep(600)"],
                        }
                    ]
                },
            }
            core.create_namespaced_pod("default", pod)
            wait_for(
                lambda: core.read_namespaced_pod("sleeper", "default").status.phase == "Running",
                timeout=120,
                interval=0.5,
                what="the pod to run",
            )
        # What a killed test run leaves: every process of the node gone at once,
        # the pod's container, its shim, mounts, cgroups, iptables and bridge not.
        for component in node.plane._components:
            assert component.process is not None
            os.kill(component.process.pid, signal.SIGKILL)
            component.process.wait(10)
        assert BRIDGE in node_host.link_names()
        state = json.loads(POINTER.read_text())
    except BaseException:
        node.stop()
        raise
    stale = Node.adopt(state)
    report = stale.stop()
    assert report.failed == []
    assert node_host.differences(node.before, [str(node.workdir)], [BRIDGE]) == []
    socket = str(node.containerd_socket).encode()
    for proc in os.listdir("/proc"):
        if proc.isdigit():
            try:
                with open(f"/proc/{proc}/cmdline", "rb") as f:
                    assert socket not in f.read(), f"pid {proc} uses the killed containerd"
            except OSError:
                pass
    for hierarchy in _cgroup_hierarchies():
        assert not (hierarchy / CGROUP_ROOT).exists(), hierarchy
    assert not POINTER.exists()
    assert not node.workdir.exists()
