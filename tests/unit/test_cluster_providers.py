"""The e2e tier's cluster providers: the kind provider's command lines, and why one cannot run."""

from __future__ import annotations

from pathlib import Path

import yaml

from fleetkit.kind import kind_binary
from fleetkit.providers import KIND_CONFIG, KindCommands, kind_values, unavailable


def test_kind_commands_create_load_and_delete_one_named_cluster(tmp_path: Path) -> None:
    cmds = KindCommands(name="e2e", kubeconfig=tmp_path / "kubeconfig")
    assert cmds.create() == [
        "kind", "create", "cluster", "--name", "e2e", "--config", str(KIND_CONFIG),
        "--kubeconfig", str(tmp_path / "kubeconfig"), "--wait", "120s",
    ]  # fmt: skip
    archive = tmp_path / "mcpfleet-0.1.0.tar"
    assert cmds.load(archive) == ["kind", "load", "image-archive", str(archive), "--name", "e2e"]
    assert cmds.delete()[:5] == ["kind", "delete", "cluster", "--name", "e2e"]
    assert "--kubeconfig" in cmds.delete(), "never the user's default kubeconfig"


def test_kind_port_forward_binds_loopback_to_the_service(tmp_path: Path) -> None:
    cmds = KindCommands(name="e2e", kubeconfig=tmp_path / "k", kubectl="/bin/kubectl")
    line = cmds.port_forward("ns", "mcpfleet-router", 80, 41234)
    assert line[0] == "/bin/kubectl"
    assert line[line.index("--kubeconfig") + 1] == str(tmp_path / "k")
    assert line[line.index("--namespace") + 1] == "ns"
    assert line[-3:] == ["127.0.0.1", "service/mcpfleet-router", "41234:80"]


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


def test_a_provider_that_cannot_run_says_why() -> None:
    reason = unavailable("kind")
    if kind_binary() is None:
        assert reason is not None and "kind is not built" in reason
    assert "unknown provider" in str(unavailable("minikube"))
