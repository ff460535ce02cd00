"""Fixtures of the node tier: a real kubelet, containerd, scheduler and kube-proxy.

Each module that needs a node starts its own (one at a time: the node owns a
bridge and a cgroup root of the machine) and stops it when its tests are done.
Where the machine cannot run a node (not root, containerd or the built tools
missing, no image archive), the tests skip and say why; with ``CI=true`` they
fail instead.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fleetkit.cluster.node import Node, require_node, running_node
from fleetkit.failure import explain_on_failure

#: Starting a node (control plane, containerd, image import, kubelet) on two busy
#: cores takes a minute or two; a module's first test pays for it.
NODE_START_TIMEOUT = 600


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    require_node()
    with running_node(tmp_path_factory.mktemp("node")) as started:
        yield started


@pytest.fixture(autouse=True)
def _node_logs_on_failure(request: pytest.FixtureRequest) -> Iterator[None]:
    """When a test that used the node fails, show the components' log tails."""
    yield
    started = getattr(request.node, "funcargs", {}).get("node")
    if isinstance(started, Node):
        explain_on_failure(request, lambda: "\n===== node logs =====\n" + started.log_tail(30))
