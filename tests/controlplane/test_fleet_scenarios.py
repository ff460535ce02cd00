"""The fleet scenarios on the control-plane backend: the key ring in a real Secret.

The very scenarios the fleet tier runs on local processes (``fleetkit.scenarios``)
run here on :class:`~fleetkit.cluster.cpfleet.ControlPlaneFleet`: each replica reads its
own kubelet-style volume of the Secret, and the rotation is done by updating the
Secret through the API. One fleet serves the module (starting replicas is what
costs on two cores); its request-state tokens live ``STATE_TTL`` seconds so the
rotation's TTL wait is short, which the other scenarios do not notice.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from fleetkit import scenarios
from fleetkit.cluster.controlplane import LOOPBACK, ControlPlane, temporary_namespace, wait_for
from fleetkit.cluster.cpfleet import (
    KEYS_MODE,
    SERVER_COMPONENT,
    ControlPlaneFleet,
    control_plane_fleet,
    cp_diagnostics,
)
from fleetkit.cluster.kubelet_secret import DATA_DIR
from fleetkit.failure import explain_on_failure
from fleetkit.fleet import FleetOptions
from mcpfleet.contract import COMPONENT_LABEL, KEYRING_FILE, KEYRING_LABEL
from mcpfleet.keys.files import read_ring

pytestmark = pytest.mark.controlplane

STATE_TTL = 4.0


@pytest.fixture(scope="module")
def cp_fleet(
    control_plane: ControlPlane,
    admin_api: k8s.ApiClient,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ControlPlaneFleet]:
    """Three replicas and a router, the key ring in a Secret of a namespace of their own."""
    with (
        temporary_namespace(admin_api, "fleet-scenarios") as namespace,
        control_plane_fleet(
            control_plane,
            namespace,
            tmp_path_factory.mktemp("cpfleet"),
            FleetOptions(replica_args=("--state-ttl", str(int(STATE_TTL)))),
        ) as cf,
    ):
        yield cf


@pytest.fixture(autouse=True)
def _fleet_diagnostics_on_failure(request: pytest.FixtureRequest) -> Iterator[None]:
    """Log tails, Redis, the Secret, Pods and volumes when a test here fails.

    The control plane's own log tails are printed by the tier's conftest.
    """
    yield
    cf = request.node.funcargs.get("cp_fleet")
    if isinstance(cf, ControlPlaneFleet):
        explain_on_failure(request, lambda: cp_diagnostics(cf, plane_logs=False))


# --- the scenarios, as on every backend ------------------------------------------------


async def test_modern_booking_rounds_land_on_several_replicas(cp_fleet: ControlPlaneFleet) -> None:
    await scenarios.modern_rounds_spread(cp_fleet)


async def test_handshake_session_stays_on_the_replica_that_owns_it(
    cp_fleet: ControlPlaneFleet,
) -> None:
    await scenarios.handshake_session_sticks(cp_fleet)


async def test_twenty_concurrent_handshake_sessions_all_succeed(
    cp_fleet: ControlPlaneFleet,
) -> None:
    await scenarios.concurrent_handshake_sessions(cp_fleet, 20)


async def test_rotation_through_the_secret_fails_no_round(cp_fleet: ControlPlaneFleet) -> None:
    before = cp_fleet.keyring_secret()
    await scenarios.rotation_under_load(cp_fleet, state_ttl=STATE_TTL)
    # Three updates of the one Secret, each read back by every replica's own volume.
    after = cp_fleet.keyring_secret()
    assert after.metadata.uid == before.metadata.uid
    assert after.metadata.resource_version != before.metadata.resource_version
    ring = cp_fleet.ring_of(after)
    assert ring.phase == "stable"
    for name in cp_fleet.replica_names():
        assert read_ring(cp_fleet.replica_keys_dir(name)).kids == ring.kids


# --- what this backend adds: Pods, volumes, the Secret's concurrency and RBAC -----------


def test_replicas_have_ready_pods_that_match_their_attestations(
    cp_fleet: ControlPlaneFleet,
) -> None:
    pods = {p.metadata.name: p for p in cp_fleet.pods()}
    assert (
        sorted(pods) == sorted(cp_fleet.replica_names()) == ["replica-0", "replica-1", "replica-2"]
    )
    attestations = cp_fleet.attestations()
    for name, pod in pods.items():
        labels = pod.metadata.labels
        assert labels[COMPONENT_LABEL] == SERVER_COMPONENT
        assert labels[KEYRING_LABEL] == cp_fleet.secret_name
        ready = {c.type: c.status for c in pod.status.conditions}
        assert pod.status.phase == "Running" and ready["Ready"] == "True", pod.status
        assert pod.status.pod_ip == LOOPBACK
        # The Pod mounts the Secret the replica's volume is synced from.
        (volume,) = pod.spec.volumes
        assert volume.secret.secret_name == cp_fleet.secret_name
        assert volume.secret.default_mode == KEYS_MODE
        # What the operator will do: match a Pod to the replica attesting under its name.
        address = urllib.parse.urlsplit(attestations[name].address)
        assert address.hostname == pod.status.pod_ip
        assert attestations[name].kids == cp_fleet.ring().kids


def test_each_replica_volume_follows_secret_updates(cp_fleet: ControlPlaneFleet) -> None:
    cf = cp_fleet
    names = cf.replica_names()
    dirs = {name: cf.replica_keys_dir(name) for name in names}
    assert len(set(dirs.values())) == len(names), "each replica reads a volume of its own"
    read = cf.keyring_secret()
    original = cf.ring_of(read)
    assert original.phase == "stable"
    for directory in dirs.values():
        assert (directory / DATA_DIR).is_symlink()
        assert read_ring(directory).kids == original.kids

    staged = cf.rotate_step("stage")
    # Optimistic concurrency: a write based on what was read before the stage is refused.
    with pytest.raises(ApiException) as refused:
        cf.replace_ring(read, original.stage())
    assert refused.value.status == 409
    assert cf.ring().kids == staged.kids

    # Only the Secret changed; every replica's volume got the update and its ring loaded.
    cf.wait_attested(staged.kids, timeout=15)
    for name, directory in dirs.items():
        assert read_ring(directory).kids == staged.kids, name
        assert cf.attestations()[name].kids == staged.kids

    aborted = cf.rotate_step("abort")
    assert aborted.kids == original.kids
    cf.wait_attested(original.kids, timeout=15)


def test_the_volumes_and_the_rotation_have_only_the_rights_they_need(
    cp_fleet: ControlPlaneFleet, control_plane: ControlPlane
) -> None:
    cf = cp_fleet
    ns, secret = cf.namespace, cf.secret_name
    volume = k8s.CoreV1Api(control_plane.api_client_for_service_account(ns, cf.volume_account))
    rotator = k8s.CoreV1Api(control_plane.api_client_for_service_account(ns, cf.rotator_account))
    read = volume.read_namespaced_secret(secret, ns)
    assert KEYRING_FILE in read.data
    refused = {
        "volume updates the secret": lambda: volume.replace_namespaced_secret(secret, ns, read),
        "volume lists secrets": lambda: volume.list_namespaced_secret(ns),
        "rotator lists secrets": lambda: rotator.list_namespaced_secret(ns),
        "rotator deletes the secret": lambda: rotator.delete_namespaced_secret(secret, ns),
        "rotator reads pods": lambda: rotator.list_namespaced_pod(ns),
    }
    statuses = {}
    for what, call in refused.items():
        with pytest.raises(ApiException) as excinfo:
            call()
        statuses[what] = excinfo.value.status
    assert set(statuses.values()) == {403}, statuses


def test_added_replicas_get_pods_and_lose_them_when_killed_or_drained(
    cp_fleet: ControlPlaneFleet,
) -> None:
    """Last in the module: it leaves the fleet with its three original replicas."""
    cf = cp_fleet
    for name in ("replica-3", "replica-4"):
        cf.add_replica(name, wait=False)
    for name in ("replica-3", "replica-4"):
        cf.wait_replica(name)
    pods = {p.metadata.name: p for p in cf.pods()}
    for name in ("replica-3", "replica-4"):
        ready = {c.type: c.status for c in pods[name].status.conditions}
        assert ready["Ready"] == "True"
        assert name in cf.volumes
    core = k8s.CoreV1Api(cf.admin)

    def pod_gone(name: str) -> bool:
        try:
            core.read_namespaced_pod(name, cf.namespace)
        except ApiException as exc:
            return exc.status == 404
        return False

    cf.kill("replica-3")
    assert pod_gone("replica-3")
    assert "replica-3" not in cf.volumes

    cf.drain("replica-4")
    assert pod_gone("replica-4"), "draining starts with the Pod's deletion"
    # The volume goes once the replica has drained and exited.
    wait_for(
        lambda: "replica-4" not in cf.volumes,
        timeout=30,
        what="replica-4 to drain and its volume to stop",
    )
    assert not cf.members["replica-4"].proc.alive
    assert sorted(p.metadata.name for p in cf.pods()) == ["replica-0", "replica-1", "replica-2"]
