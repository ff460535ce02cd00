"""The e2e tier's cluster providers: the kind provider's command lines, and why one cannot run."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
import yaml

from fleetkit.cluster.kind import KindSetup, kind_binary, route_commands, service_subnet
from fleetkit.cluster.providers import (
    KIND_CONFIG,
    KIND_ROUTER_IPS,
    LOCAL_ROUTER_IPS,
    Cluster,
    kind_values,
    unavailable,
)


def test_the_host_routes_the_kind_service_range_through_the_control_plane() -> None:
    subnet = service_subnet(KIND_CONFIG)
    assert subnet == "10.96.0.0/16"
    add, delete = route_commands(subnet, "10.89.0.2")
    assert add == ["ip", "route", "replace", "10.96.0.0/16", "via", "10.89.0.2"]
    assert delete == ["ip", "route", "del", "10.96.0.0/16", "via", "10.89.0.2"]
    # The fixed router addresses are in that range, in its static band.
    network = ipaddress.ip_network(subnet)
    assert all(ipaddress.ip_address(ip) in network for ip in KIND_ROUTER_IPS)
    assert all(int(ipaddress.ip_address(ip)) - int(network[0]) < 256 for ip in KIND_ROUTER_IPS)


def test_a_config_without_a_service_range_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "cluster.yaml"
    bad.write_text("kind: Cluster\napiVersion: kind.x-k8s.io/v1alpha4\n")
    with pytest.raises(RuntimeError, match=r"networking\.serviceSubnet"):
        service_subnet(bad)


def test_kind_load_and_the_node_address_go_through_the_engine(tmp_path: Path) -> None:
    setup = KindSetup(name="e2e", engine="podman", image="i", kubeconfig=tmp_path / "k")
    archive = tmp_path / "image.tar"
    assert setup.save_image("localhost/ownapp:1", archive) == [
        "podman", "save", "--format", "docker-archive", "-o", str(archive), "localhost/ownapp:1",
    ]  # fmt: skip
    docker = KindSetup(name="e2e", engine="docker", image="i", kubeconfig=tmp_path / "k")
    assert docker.save_image("x:1", archive) == ["docker", "save", "-o", str(archive), "x:1"]
    assert setup.node_ip(setup.control_plane())[0] == "podman"
    assert setup.node_ip(setup.control_plane())[-1] == "e2e-control-plane"
    assert setup.stop_node("e2e-worker") == ["podman", "stop", "e2e-worker"]


def test_kind_config_is_a_kind_cluster_with_workers() -> None:
    config = yaml.safe_load(KIND_CONFIG.read_text())
    assert config["kind"] == "Cluster"
    assert config["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    roles = [n["role"] for n in config["nodes"]]
    assert roles.count("control-plane") == 1 and roles.count("worker") >= 2


def test_kind_values_point_the_chart_at_the_loaded_images() -> None:
    values = kind_values("9.9.9")
    assert values["image"] == {
        "repository": "localhost/mcpfleet",
        "tag": "9.9.9",
        "pullPolicy": "Never",
    }
    assert values["redis"]["image"]["repository"] == "localhost/mcpfleet-redis"
    assert values["router"]["service"] == {"clusterIP": KIND_ROUTER_IPS[0]}
    assert KIND_ROUTER_IPS[0] in values["router"]["allowedHosts"]


def test_each_release_side_by_side_gets_its_own_router_address() -> None:
    local = Cluster("local", Path("k"), None, {}, lambda n, s, p: ("", 0))  # type: ignore[arg-type]
    kind = Cluster(
        "kind",
        Path("k"),
        None,
        {},
        lambda n, s, p: ("", 0),
        router_ips=KIND_ROUTER_IPS,  # type: ignore[arg-type]
    )
    assert local.router_values(1)["service"]["clusterIP"] == LOCAL_ROUTER_IPS[1]
    assert kind.router_values(1)["service"]["clusterIP"] == KIND_ROUTER_IPS[1]


def test_a_provider_that_cannot_run_says_why() -> None:
    reason = unavailable("kind")
    if kind_binary() is None:
        assert reason is not None and "kind is not built" in reason
    assert "unknown provider" in str(unavailable("minikube"))
