"""``make node-load``'s command lines (the node itself is the e2e tier's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetkit.cluster import nodeload


def test_buildah_and_podman_export_a_docker_archive_that_keeps_the_name() -> None:
    archive = Path("/tmp/x/image.tar")
    for store in ("buildah", "podman"):
        assert nodeload.export_command(store, "localhost/myapp:1", archive) == [
            store,
            "push",
            "--quiet",
            "localhost/myapp:1",
            "docker-archive:/tmp/x/image.tar:localhost/myapp:1",
        ]
    assert nodeload.export_command("docker", "myapp:1", archive) == [
        "docker",
        "save",
        "--output",
        "/tmp/x/image.tar",
        "myapp:1",
    ]


def test_each_store_is_asked_for_the_image_in_its_own_words() -> None:
    assert nodeload.inspect_command("buildah", "localhost/a:1")[:4] == [
        "buildah",
        "inspect",
        "--type",
        "image",
    ]
    assert nodeload.inspect_command("podman", "localhost/a:1")[:3] == ["podman", "image", "inspect"]


def test_an_image_no_store_holds_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nodeload.shutil, "which", lambda _: None)
    with pytest.raises(nodeload.LoadError, match="no local image localhost/nope:1"):
        nodeload.find_store("localhost/nope:1")


def test_without_a_running_node_it_says_how_to_start_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(nodeload, "POINTER", tmp_path / "absent.json")
    with pytest.raises(nodeload.LoadError, match=r"make cluster-up NODE=1"):
        nodeload.running_node()
    assert nodeload.main(["localhost/x:1"]) == 1
