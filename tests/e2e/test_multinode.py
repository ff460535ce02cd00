"""What only several nodes show: topology spread, PodDisruptionBudget, a node lost.

These need a cluster with two schedulable workers: ``--cluster-provider kind``
(``deploy/kind/cluster.yaml``: one control plane, two workers, on the node
image made here). On a one-node provider they skip with the reason. One release
per module, the tests in order: install (spread over both workers); a drain
of the worker that holds most replicas, through the Eviction API as ``kubectl
drain`` does it, which the PDB (maxUnavailable 1) must pace; then a worker
lost under load (its container stopped, as a machine shut down): modern
rounds carry on, the sessions it owned answer 404 and start again, its
replicas come back on the other worker and attest, and a rotation completes.

The replicas are what runs on the workers: the routers, Redis and the operator
are pinned to the control-plane node (values below), as a platform team keeps
its ingress and state apart from the app's nodes, so losing a worker loses
replicas, not the way in. The replicas tolerate an unreachable node for 10 s
(``server.tolerations``; the default is 300 s), so the test does not wait five
minutes for the eviction.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from fleetkit.clients.traffic import traffic
from fleetkit.cluster.chartfleet import ChartFleet, ready
from fleetkit.cluster.controlplane import wait_for
from fleetkit.cluster.providers import Cluster
from mcpfleet.fleetclient import Trace, connect

pytestmark = pytest.mark.timeout(1200)

NAMESPACE = "mcpfleet-multinode"
CONTROL_PLANE_LABEL = "node-role.kubernetes.io/control-plane"
#: This module stops a worker: the tier runs it last (tests/e2e/conftest.py).
TAKES_A_NODE_AWAY = True

_ON_THE_CONTROL_PLANE: dict[str, Any] = {
    "nodeSelector": {CONTROL_PLANE_LABEL: ""},
    "tolerations": [{"key": CONTROL_PLANE_LABEL, "operator": "Exists", "effect": "NoSchedule"}],
}
VALUES: dict[str, Any] = {
    "router": _ON_THE_CONTROL_PLANE,
    "redis": _ON_THE_CONTROL_PLANE,
    "operator": _ON_THE_CONTROL_PLANE,
    "server": {
        # Seconds a sealed request state lives, so a rotation's last phase (the old
        # key retired once no token sealed with it can still be valid) comes soon.
        "stateTTL": 5,
        "tolerations": [
            {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 10}
            for key in ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")
        ],
    },
}


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
    fleet = ChartFleet(e2e_cluster, NAMESPACE, tmp_path_factory.mktemp("multinode"), values=VALUES)
    yield fleet
    with contextlib.suppress(Exception):
        fleet.uninstall()


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


@contextlib.asynccontextmanager
async def _ended_quietly(
    client: contextlib.AbstractAsyncContextManager[Any], n: int, gone: set[int]
) -> AsyncIterator[Any]:
    """``client``, whose exit errors are ignored once ``n`` is in ``gone`` (a session
    its replica took away cannot be ended: that is not what is tested)."""
    entered = await client.__aenter__()
    try:
        yield entered
    finally:
        try:
            await client.__aexit__(None, None, None)
        except Exception:
            if n not in gone:
                raise


def _node_ready(fleet: ChartFleet, node: str) -> bool:
    conditions = fleet.core.read_node(node).status.conditions or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


async def test_a_lost_worker_loses_no_modern_round_and_its_replicas_come_back(
    release: ChartFleet,
) -> None:
    """A worker's container stopped under modern and handshake traffic: zero failed
    modern rounds; the sessions its replicas owned answer 404 and a new session
    completes; the replicas are rescheduled on the other worker and attest; a
    rotation started once the worker is gone completes."""
    stop_node = release.cluster.stop_node
    assert stop_node is not None, "the kind provider can stop a node"
    # The drain left every replica on one worker: a rollout spreads them again.
    await asyncio.to_thread(
        release.upgrade, "--set-string", "server.podAnnotations.mcpfleet\\.dev/spread=1"
    )

    def spread() -> Counter[str] | None:
        on = placement(release)
        names = release.replica_names()
        rolled = all(
            (p.metadata.annotations or {}).get("mcpfleet.dev/spread") == "1"
            for p in release.pods("server")
        )
        return on if rolled and len(names) == 3 and len(on) == 2 else None

    on = await asyncio.to_thread(
        wait_for, spread, timeout=300, interval=1, what="3 replicas over both workers again"
    )
    await asyncio.to_thread(release.wait_serving, 3)
    lost = on.most_common(1)[0][0]
    node_of = {p.metadata.name: p.spec.node_name for p in release.pods("server") if ready(p)}
    async with contextlib.AsyncExitStack() as stack:
        # Held handshake sessions, spread over the replicas (fewest sessions first).
        traces = [Trace() for _ in range(6)]
        gone: set[int] = set()  # sessions whose end (DELETE) cannot succeed
        held = [
            await stack.enter_async_context(
                _ended_quietly(connect(release.url, "handshake", t), n, gone)
            )
            for n, t in enumerate(traces)
        ]
        for n, client in enumerate(held):
            result = await client.call_tool("plan_meeting", {"topic": f"before {n}"})
            assert str(result.data).startswith(f"Planned 'before {n}'")
        owners = [next(iter(t.replicas())) for t in traces]
        doomed = [n for n, owner in enumerate(owners) if node_of[owner] == lost]
        assert doomed, f"no session is owned on {lost}: {owners} ({node_of})"
        gone.update(doomed)
        async with traffic() as load:
            for n in range(2):
                load.modern(release.url, "book_flight", {"destination": f"L{n}"}, "Booked")
            await load.progress(5, what="modern rounds before the worker is lost")
            await asyncio.to_thread(stop_node, lost)
            await asyncio.to_thread(
                wait_for,
                lambda: not _node_ready(release, lost),
                timeout=120,
                interval=1,
                what=f"{lost} NotReady",
            )

            def back() -> list[str] | None:
                on = placement(release)
                return release.replica_names() if lost not in on and sum(on.values()) == 3 else None

            names = await asyncio.to_thread(
                wait_for, back, timeout=300, interval=1, what=f"3 Ready replicas off {lost}"
            )
            await asyncio.to_thread(release.wait_serving, 3, 120)
            assert set(names) <= set(release.attestations())
            await load.progress(5, what="modern rounds once the replicas are back")
            kids = await asyncio.to_thread(release.rotate)
            await load.progress(5, what="modern rounds after the rotation")
        assert load.failures == [], load.failures[:5]
        await asyncio.to_thread(release.wait_attested, kids)
        # Sessions owned on the survivors answer on the same session; the lost
        # ones are 404 (the spec's session not found), and a new one completes.
        for n, (client, trace) in enumerate(zip(held, traces, strict=True)):
            if n in doomed:
                with pytest.raises(Exception) as refused:
                    await client.call_tool("plan_meeting", {"topic": f"after {n}"})
                assert "404" in str(refused.value) or "not found" in str(refused.value).lower(), (
                    refused.value
                )
                again = Trace()
                async with connect(release.url, "handshake", again) as fresh:
                    result = await fresh.call_tool("plan_meeting", {"topic": f"again {n}"})
                assert str(result.data).startswith(f"Planned 'again {n}'")
                assert node_of.get(next(iter(again.replicas())), "") != lost
            else:
                result = await client.call_tool("plan_meeting", {"topic": f"after {n}"})
                assert str(result.data).startswith(f"Planned 'after {n}'"), result.data
                assert trace.replicas() == {owners[n]}, "the same replica answered"
