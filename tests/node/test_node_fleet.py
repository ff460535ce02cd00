"""The fleet scenarios on real pods: a Deployment of the real image on a real kubelet.

The very scenarios the fleet and control-plane tiers run (``fleetkit.scenarios``)
run here on :class:`~fleetkit.cluster.nodefleet.NodeFleet`, plus what only a node can
show: the kubelet's SIGTERM draining a pod that owns sessions, a killed
container, and the key ring reaching every replica through the Secret volume
after a rotation step (the pods nudged by annotation, as the operator does).
"""

from __future__ import annotations

import asyncio
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from fleetkit import scenarios
from fleetkit.cluster.controlplane import temporary_namespace, wait_for
from fleetkit.cluster.node import Node
from fleetkit.cluster.nodefleet import (
    GRACE_SECONDS,
    KEYS_MODE,
    KEYS_MOUNT,
    NodeFleet,
    node_diagnostics,
    node_fleet,
)
from fleetkit.failure import explain_on_failure
from mcpfleet.contract import KEYRING_NUDGE_ANNOTATION
from mcpfleet.fleetclient import Trace, connect, default_answer

from .conftest import NODE_START_TIMEOUT

pytestmark = pytest.mark.timeout(NODE_START_TIMEOUT)

STATE_TTL = 4.0
LIST = b'{"jsonrpc":"2.0","id":9,"method":"tools/list"}'
HEADERS = {
    "content-type": "application/json",
    "accept": "application/json, text/event-stream",
    "mcp-protocol-version": "2025-11-25",
}


@pytest.fixture(scope="module")
def nf(node: Node, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeFleet]:
    """Three replica pods and a router, the key ring in a Secret of their namespace."""
    with (
        temporary_namespace(node.api_client(), "node-fleet") as namespace,
        node_fleet(
            node,
            namespace,
            tmp_path_factory.mktemp("nodefleet"),
            replica_args=("--state-ttl", str(int(STATE_TTL))),
        ) as fleet,
    ):
        yield fleet


@pytest.fixture(autouse=True)
def _fleet_diagnostics_on_failure(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    fleet = request.node.funcargs.get("nf")
    if isinstance(fleet, NodeFleet):
        explain_on_failure(request, lambda: node_diagnostics(fleet))


# --- the scenarios, as on every backend ------------------------------------------------


async def test_modern_booking_rounds_land_on_several_replica_pods(nf: NodeFleet) -> None:
    await scenarios.modern_rounds_spread(nf)


async def test_handshake_session_stays_on_the_pod_that_owns_it(nf: NodeFleet) -> None:
    await scenarios.handshake_session_sticks(nf)


async def test_twenty_concurrent_handshake_sessions_all_succeed(nf: NodeFleet) -> None:
    await scenarios.concurrent_handshake_sessions(nf, 20)


async def test_rotation_through_the_secret_volume_fails_no_round(nf: NodeFleet) -> None:
    before = nf.keyring_secret()
    await scenarios.rotation_under_load(nf, state_ttl=STATE_TTL)
    after = nf.keyring_secret()
    assert after.metadata.uid == before.metadata.uid
    ring = nf.ring()
    assert ring.phase == "stable"
    # Every pod was nudged with the generation of the Secret it must load.
    for pod in nf.pods():
        assert pod.metadata.annotations[KEYRING_NUDGE_ANNOTATION] == after.metadata.resource_version


# --- what real pods add ----------------------------------------------------------------------


def test_replica_pods_are_ready_non_root_and_mount_the_secret_without_subpath(
    nf: NodeFleet,
) -> None:
    pods = {p.metadata.name: p for p in nf.pods()}
    assert sorted(pods) == nf.replica_names() and len(pods) == 3
    attestations = nf.attestations()
    for name, pod in pods.items():
        (container,) = pod.spec.containers
        assert pod.spec.security_context.run_as_user == 10001
        assert container.security_context.read_only_root_filesystem is True
        assert container.readiness_probe.http_get.path == "/readyz"
        assert container.liveness_probe.http_get.path == "/healthz"
        (mount,) = [m for m in container.volume_mounts if m.mount_path == KEYS_MOUNT]
        assert mount.sub_path is None, "a subPath volume never sees Secret updates"
        (keys,) = [v for v in pod.spec.volumes if v.secret is not None]
        assert keys.secret.default_mode == KEYS_MODE
        # The replica attests under its pod name, at its pod IP, the Secret's ring.
        address = urllib.parse.urlsplit(attestations[name].address)
        assert address.hostname == pod.status.pod_ip
        assert attestations[name].kids == nf.ring().kids
        status = httpx.get(f"http://{pod.status.pod_ip}:8001/readyz", timeout=5)
        assert status.status_code == 200 and status.headers["x-mcpfleet-replica"] == name


async def test_killed_owner_gives_404_then_a_new_session_completes(nf: NodeFleet) -> None:
    release = asyncio.Event()
    asked = asyncio.Event()

    async def slow_person(message: str, schema: dict[str, Any]) -> Any:
        if "How many minutes" in message:
            asked.set()
            await release.wait()
        return default_answer(message, schema)

    trace = Trace()
    failed: BaseException | None = None
    async with connect(nf.url, "handshake", trace, answer=slow_person, timeout=10) as client:
        call = asyncio.create_task(client.call_tool("plan_meeting", {"topic": "Doomed"}))
        await asyncio.wait_for(asked.wait(), 60)
        (owner,) = trace.replicas()
        (session,) = {r.session for r in trace.rounds if r.session}
        restarts = nf.restarts(owner)
        await asyncio.to_thread(nf.kill, owner)
        async with httpx.AsyncClient(timeout=10) as raw:
            resp = await raw.post(
                nf.url, content=LIST, headers={**HEADERS, "mcp-session-id": session}
            )
        assert resp.status_code == 404, resp.text
        release.set()
        try:
            await asyncio.wait_for(call, 30)
        except Exception as exc:  # the paused tool died with its container
            failed = exc
    assert failed is not None, "the call cannot complete: its container was killed"
    retry = Trace()
    async with connect(nf.url, "handshake", retry) as again:
        result = await again.call_tool("plan_meeting", {"topic": "Doomed"})
    assert str(result.data).startswith("Planned 'Doomed'")
    # The kubelet restarts the killed container in the same pod.
    await asyncio.to_thread(
        wait_for,
        lambda: nf.restarts(owner) > restarts and owner in nf.replica_names(),
        timeout=120,
        what=f"{owner} to be restarted by the kubelet and ready again",
    )
    await asyncio.to_thread(nf.wait_serving, 3, 120)


@pytest.mark.timeout(NODE_START_TIMEOUT)
async def test_deleting_a_pod_drains_it_under_load_and_nothing_fails(nf: NodeFleet) -> None:
    """The kubelet's SIGTERM: sessions on the pod finish there, new work goes elsewhere
    (the shared drain scenario); the pod is gone within its grace period and the
    Deployment brings the fleet back to three."""
    victim = nf.replica_names()[1]
    deleted = time.monotonic()
    await scenarios.drain_under_load(
        nf, victim, gone=lambda n: not nf.pod_exists(n), timeout=GRACE_SECONDS + 200
    )
    assert time.monotonic() - deleted < GRACE_SECONDS + 200
    serving = await asyncio.to_thread(nf.wait_serving, 3, 180)
    assert victim not in serving


async def test_a_rolling_update_under_load_fails_no_round_and_no_session(nf: NodeFleet) -> None:
    """A changed pod template rolls out (one new pod up, one old pod deleted, three
    times): every old pod is drained by the kubelet's SIGTERM while modern rounds
    and handshake sessions keep flowing, and none fails (the shared scenario)."""
    patch = {
        "spec": {
            "template": {"metadata": {"annotations": {"mcpfleet.dev/rolled-at": str(time.time())}}}
        }
    }

    def roll() -> None:
        nf.apps.patch_namespaced_deployment(nf.deployment, nf.namespace, patch)

    new = await scenarios.rolling_update_under_load(nf, roll)
    assert len(new) == 3
