"""fleetkit.cluster.kind without a cluster: command lines, engine environment, the config."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from fleetkit.cluster.controlplane import repo_root
from fleetkit.cluster.kind import (
    CONFIG,
    NETWORK,
    KindSetup,
    containers_conf,
    image_from_output,
)

pytestmark = pytest.mark.rigs


def test_create_names_the_node_image_the_config_and_a_private_kubeconfig(tmp_path: Path) -> None:
    setup = KindSetup(name="e2e", engine="podman", image="localhost/n:1", kubeconfig=tmp_path / "k")
    line = setup.create()
    assert line[:5] == ["kind", "create", "cluster", "--name", "e2e"]
    assert line[line.index("--image") + 1] == "localhost/n:1"
    assert line[line.index("--config") + 1] == str(CONFIG)
    assert line[line.index("--kubeconfig") + 1] == str(tmp_path / "k")
    assert "--kubeconfig" in setup.delete(), "never the user's default kubeconfig"
    assert setup.load(tmp_path / "a.tar") == [
        "kind", "load", "image-archive", str(tmp_path / "a.tar"), "--name", "e2e",
    ]  # fmt: skip
    assert setup.load(tmp_path / "a.tar", ["e2e-worker", "e2e-worker2"])[-2:] == [
        "--nodes", "e2e-worker,e2e-worker2",
    ]  # fmt: skip


def test_a_node_is_stopped_or_frozen_and_thawed_by_its_engine(tmp_path: Path) -> None:
    setup = KindSetup(name="e2e", engine="podman", image="i", kubeconfig=tmp_path / "k")
    assert setup.stop_node("e2e-worker") == ["podman", "stop", "e2e-worker"]
    assert setup.pause_node("e2e-worker") == ["podman", "pause", "e2e-worker"]
    assert setup.unpause_node("e2e-worker") == ["podman", "unpause", "e2e-worker"]
    docker = KindSetup(name="e2e", engine="docker", image="i", kubeconfig=tmp_path / "k")
    assert docker.pause_node("n")[0] == "docker"


def test_the_engine_env_picks_the_provider_and_our_own_network(tmp_path: Path) -> None:
    conf = tmp_path / "containers.conf"
    env = KindSetup("c", "podman", "i", tmp_path / "k", containers_conf=conf).env()
    assert env["KIND_EXPERIMENTAL_PROVIDER"] == "podman"
    assert env["KIND_EXPERIMENTAL_PODMAN_NETWORK"] == NETWORK != "kind"
    assert env["CONTAINERS_CONF"] == str(conf)
    assert "CONTAINERS_CONF" not in KindSetup("c", "docker", "i", tmp_path / "k").env()


def test_containers_conf_asks_only_for_what_the_host_allows() -> None:
    text = containers_conf(20000, 96365)
    assert 'default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]' in text
    assert 'runtime = "runc"' in text, "crun refuses the cgroup v1/v2 hybrid"
    assert "nproc=100:100" in containers_conf(20000, 100)


def test_the_image_name_is_the_last_kind_node_image_line() -> None:
    out = "kind-image: up to date\nkind node image: localhost/mcpfleet-kind-node:v1.37.2-abc\n"
    assert image_from_output(out) == "localhost/mcpfleet-kind-node:v1.37.2-abc"
    with pytest.raises(RuntimeError, match="kind node image"):
        image_from_output("something else\n")


def _pin(module: str, directory: Path) -> str:
    return subprocess.run(
        ["go", "list", "-m", "-f", "{{.Version}}", module],
        cwd=directory,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()


def test_cluster_yaml_has_three_nodes_and_points_kubeadm_at_the_pinned_images() -> None:
    config = yaml.safe_load(CONFIG.read_text())
    roles = [n["role"] for n in config["nodes"]]
    assert roles == ["control-plane", "worker", "worker"]
    patches = [yaml.safe_load(p) for p in config["kubeadmConfigPatches"]]
    by_kind = {p["kind"]: p for p in patches}
    cluster = by_kind["ClusterConfiguration"]
    assert cluster["imageRepository"] == "localhost/mcpfleet-kind"
    tools = repo_root() / "hack" / "tools"
    if not tools.joinpath("go.mod").exists():
        pytest.skip("hack/tools is not in this tree")
    try:
        etcd = _pin("go.etcd.io/etcd/server/v3", tools)
        coredns = _pin("github.com/coredns/coredns", tools / "coredns")
    except (FileNotFoundError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"go cannot read the pins here: {exc}")
    assert cluster["etcd"]["local"]["imageTag"] == etcd
    assert cluster["dns"]["imageTag"] == coredns
    assert by_kind["KubeletConfiguration"]["failCgroupV1"] is False
    assert by_kind["KubeletConfiguration"]["oomScoreAdj"] == 0


def test_the_node_image_cni_manifest_has_a_placeholder_the_build_fills() -> None:
    manifest = repo_root() / "hack" / "kind" / "node" / "kind" / "manifests" / "default-cni.yaml"
    docs = list(yaml.safe_load_all(manifest.read_text()))
    daemonset = next(d for d in docs if d["kind"] == "DaemonSet")
    images = {c["image"] for c in daemonset["spec"]["template"]["spec"]["containers"]}
    assert images == {"@KUBE_ROUTER_IMAGE@"}
    assert re.search(r"@KUBE_ROUTER_IMAGE@", (repo_root() / "hack/kind/node-image.sh").read_text())
