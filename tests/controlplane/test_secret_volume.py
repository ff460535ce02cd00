"""The kubelet-style Secret volume: real watch, atomic ..data swap, sub-second updates."""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s

from fleetkit.cluster.controlplane import ControlPlane, wait_for
from fleetkit.cluster.kubelet_secret import DATA_DIR, SecretVolumeSyncer, read_snapshot
from fleetkit.cluster.rbac import service_account_with_rules

pytestmark = pytest.mark.controlplane

KEYS = ("key-0", "key-1", "key-2", "key-3")


def _generation(n: int) -> dict[str, str]:
    """Every key carries the same generation marker: a mix is detectable."""
    return {key: f"generation-{n}" for key in KEYS}


@pytest.fixture
def keys_secret(admin_api: k8s.ApiClient, namespace: str) -> str:
    k8s.CoreV1Api(admin_api).create_namespaced_secret(
        namespace,
        k8s.V1Secret(metadata=k8s.V1ObjectMeta(name="fleet-keys"), string_data=_generation(0)),
    )
    # Only get+watch on the one Secret, like a kubelet's view of its pod's volume.
    rule = k8s.V1PolicyRule(
        api_groups=[""],
        resources=["secrets"],
        resource_names=["fleet-keys"],
        verbs=["get", "watch"],
    )
    service_account_with_rules(admin_api, namespace, "kubelet", [rule])
    return "fleet-keys"


@pytest.fixture
def syncer(
    control_plane: ControlPlane, namespace: str, keys_secret: str, tmp_path: Path
) -> Iterator[SecretVolumeSyncer]:
    api = control_plane.api_client_for_service_account(namespace, "kubelet")
    s = SecretVolumeSyncer(api, namespace, keys_secret, tmp_path / "keys", default_mode=0o440)
    s.start()
    yield s
    s.stop()


def _update(admin_api: k8s.ApiClient, namespace: str, n: int) -> None:
    k8s.CoreV1Api(admin_api).patch_namespaced_secret(
        "fleet-keys",
        namespace,
        {"stringData": _generation(n)},
        _content_type="application/merge-patch+json",
    )


def test_volume_has_the_kubelet_layout(syncer: SecretVolumeSyncer) -> None:
    target = syncer.directory
    data_link = target / DATA_DIR
    assert data_link.is_symlink()
    timestamped = os.readlink(data_link)
    assert timestamped.startswith("..") and (target / timestamped).is_dir()
    entries = sorted(p.name for p in target.iterdir())
    assert entries == sorted([*KEYS, DATA_DIR, timestamped])
    for key in KEYS:
        assert os.readlink(target / key) == f"{DATA_DIR}/{key}"
        assert (target / key).read_text() == "generation-0"
        assert stat.S_IMODE((target / timestamped / key).stat().st_mode) == 0o440


def test_update_reaches_the_directory_within_a_second(
    syncer: SecretVolumeSyncer, admin_api: k8s.ApiClient, namespace: str
) -> None:
    before = os.readlink(syncer.directory / DATA_DIR)
    started = time.monotonic()
    _update(admin_api, namespace, 1)
    wait_for(
        lambda: (syncer.directory / "key-0").read_text() == "generation-1",
        timeout=1.0,
        interval=0.005,
        what="the Secret update to reach the volume",
    )
    elapsed = time.monotonic() - started
    assert elapsed < 1.0
    # A new timestamped directory; the old one goes right after the swap.
    after = os.readlink(syncer.directory / DATA_DIR)
    assert after != before
    wait_for(
        lambda: not (syncer.directory / before).exists(),
        timeout=1.0,
        interval=0.005,
        what="the old timestamped directory to be removed",
    )
    assert not (syncer.directory / "..data_tmp").exists()


def test_readers_never_see_a_mix_of_two_versions(
    syncer: SecretVolumeSyncer, admin_api: k8s.ApiClient, namespace: str
) -> None:
    updates = 30
    seen: set[str] = set()
    mixed: list[dict[str, bytes]] = []
    errors: list[BaseException] = []
    snapshots = 0
    done = threading.Event()

    def reader() -> None:
        nonlocal snapshots
        while not done.is_set():
            try:
                snapshot = read_snapshot(syncer.directory)
            except RuntimeError as exc:  # no stable read at all: a failure too
                errors.append(exc)
                return
            snapshots += 1
            values = set(snapshot.values())
            if set(snapshot) != set(KEYS) or len(values) != 1:
                mixed.append(snapshot)
            seen.update(v.decode() for v in values)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for n in range(1, updates + 1):
            _update(admin_api, namespace, n)
            # Let each generation land before the next, so the reader races
            # many distinct swaps rather than one coalesced write.
            marker = f"generation-{n}"
            wait_for(
                lambda: (syncer.directory / "key-0").read_text() == marker,  # noqa: B023
                timeout=1.0,
                interval=0.002,
                what=f"generation {n}",
            )
    finally:
        done.set()
        thread.join(10)

    assert not errors
    assert not mixed, f"{len(mixed)} of {snapshots} snapshots mixed versions: {mixed[:3]}"
    # The test can fail: the reader did overlap with many swaps.
    assert syncer.writes >= updates
    assert len(seen) > updates // 2, f"reader saw only {sorted(seen)}"
    assert read_snapshot(syncer.directory) == {k: f"generation-{updates}".encode() for k in KEYS}


def test_syncer_stops_promptly(
    control_plane: ControlPlane, namespace: str, keys_secret: str, tmp_path: Path
) -> None:
    api = control_plane.api_client_for_service_account(namespace, "kubelet")
    syncer = SecretVolumeSyncer(api, namespace, keys_secret, tmp_path / "v").start()
    started = time.monotonic()
    syncer.stop(timeout=2.0)
    assert time.monotonic() - started < 2.0


def test_an_expired_resource_version_makes_the_syncer_read_again(
    control_plane: ControlPlane,
    admin_api: k8s.ApiClient,
    namespace: str,
    keys_secret: str,
    tmp_path: Path,
) -> None:
    api = control_plane.api_client_for_service_account(namespace, "kubelet")
    syncer = SecretVolumeSyncer(api, namespace, keys_secret, tmp_path / "v")
    # As if this syncer had been disconnected for a long time: the history
    # after its resourceVersion is compacted away, so its watch gets 410 Gone.
    stale = k8s.CoreV1Api(admin_api).read_namespaced_secret(keys_secret, namespace)
    assert stale.metadata is not None
    syncer.resource_version = stale.metadata.resource_version
    _update(admin_api, namespace, 1)
    control_plane.compact_etcd()
    _update(admin_api, namespace, 2)
    syncer.start()
    try:
        assert syncer.relists == 1  # the 410 led to a GET, not to a dead syncer
        assert syncer.last_error is None
        assert read_snapshot(syncer.directory) == {k: b"generation-2" for k in KEYS}
        _update(admin_api, namespace, 7)
        wait_for(
            lambda: (syncer.directory / "key-0").read_text() == "generation-7",
            timeout=1.0,
            interval=0.005,
            what="an update after the re-read",
        )
    finally:
        syncer.stop()
