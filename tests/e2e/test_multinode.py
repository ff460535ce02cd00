"""What only several nodes show: the chart's topology spread and PodDisruptionBudget at work.

These need a cluster with two schedulable workers: ``--cluster-provider kind``
(``deploy/kind/cluster.yaml``: one control plane, two workers, on the node
image made here). On a one-node provider they skip with the reason. One release
per module, the tests in order: install (spread over both workers), then a
drain of the worker that holds most replicas, through the Eviction API as
``kubectl drain`` does it, which the PDB (maxUnavailable 1) must pace.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from fleetkit.chartfleet import ChartFleet, ready
from fleetkit.controlplane import wait_for
from fleetkit.providers import Cluster

pytestmark = pytest.mark.timeout(1200)

NAMESPACE = "mcpfleet-multinode"
CONTROL_PLANE_LABEL = "node-role.kubernetes.io/control-plane"


def workers(cluster: Cluster) -> list[str]:
    nodes = k8s.CoreV1Api(cluster.api).list_node().items
    return sorted(
        n.metadata.name
        for n in nodes
        if CONTROL_PLANE_LABEL not in (n.metadata.labels or {}) and not n.spec.unschedulable
    )


@pytest.fixture(scope="module")
def release(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ChartFleet]:
    provider = request.config.getoption("--cluster-provider")
    if provider != "kind":
        # Decided before any cluster starts: the local provider is one node.
        pytest.skip(f"cluster provider {provider} is one node; these need --cluster-provider kind")
    e2e_cluster: Cluster = request.getfixturevalue("e2e_cluster")
    found = workers(e2e_cluster)
    if len(found) < 2:
        pytest.skip(
            f"cluster provider {e2e_cluster.provider} has {len(found)} schedulable worker(s); "
            "the multi-node scenarios need 2 (--cluster-provider kind)"
        )
    fleet = ChartFleet(e2e_cluster, NAMESPACE, tmp_path_factory.mktemp("multinode"))
    yield fleet
    with contextlib.suppress(Exception):
        fleet.uninstall()


@pytest.fixture(autouse=True)
def _diagnostics_on_failure(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    report = getattr(request.node, "rep_call", None)
    fleet = request.node.funcargs.get("release")
    if report is not None and report.failed and isinstance(fleet, ChartFleet):
        print(fleet.diagnostics())
        print(fleet.cluster.diagnostics())


def placement(fleet: ChartFleet) -> Counter[str]:
    return Counter(p.spec.node_name for p in fleet.pods("server") if ready(p))


def test_install_spreads_the_replicas_over_both_workers(release: ChartFleet) -> None:
    release.install()
    release.wait_serving(3)
    on = placement(release)
    assert sum(on.values()) == 3
    assert set(on) == set(workers(release.cluster)), (
        f"topology spread (maxSkew 1 over kubernetes.io/hostname) left a worker empty: {dict(on)}"
    )
    assert max(on.values()) - min(on.values()) <= 1


def _evict(fleet: ChartFleet, name: str) -> int:
    """POST an Eviction for the pod: 201 accepted, 429 refused by the PDB."""
    body = k8s.V1Eviction(metadata=k8s.V1ObjectMeta(name=name, namespace=fleet.namespace))
    try:
        fleet.core.create_namespaced_pod_eviction(name, fleet.namespace, body)
    except ApiException as exc:
        return int(exc.status)
    return 201


def test_a_node_drain_is_paced_by_the_pdb_and_the_replicas_move(release: ChartFleet) -> None:
    node = placement(release).most_common(1)[0][0]
    others = [w for w in workers(release.cluster) if w != node]
    on_node = [p.metadata.name for p in release.pods("server") if p.spec.node_name == node]
    assert len(on_node) == 2, f"expected two replicas on {node} (3 over 2 workers): {on_node}"
    release.core.patch_node(node, {"spec": {"unschedulable": True}})
    try:
        first, second = on_node
        assert _evict(release, first) == 201
        # maxUnavailable 1: while the first one's replacement is not Ready, the
        # second eviction is refused (HTTP 429), as kubectl drain would see it.
        assert _evict(release, second) == 429
        wait_for(
            lambda: _evict(release, second) == 201,
            timeout=300,
            interval=2,
            what=f"the PDB to allow evicting {second} once a replacement is Ready",
        )
        release.wait_serving(3)

        def moved() -> Counter[str] | None:
            on = placement(release)
            names = {p.metadata.name for p in release.pods("server")}
            gone = not names & set(on_node)
            return on if gone and sum(on.values()) == 3 and node not in on else None

        on = wait_for(moved, timeout=300, interval=1, what=f"3 Ready replicas off {node}")
        assert set(on) <= set(others)
    finally:
        release.core.patch_node(node, {"spec": {"unschedulable": False}})
