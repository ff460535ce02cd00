"""``make node-load IMAGE=<name>``: a user's image into the running node's containerd.

The local node (``make cluster-up NODE=1``, or the node the e2e tier starts)
pulls nothing from a registry: its containerd holds only what was imported.
This exports ``IMAGE`` from the local image store that built it (buildah's
and podman's share one; else Docker's) as a docker-archive and imports it
into the node's containerd, in the CRI namespace the kubelet uses. The last
line printed is ``loaded: <name>``; a Pod then runs it with
``imagePullPolicy: Never`` (or ``IfNotPresent``).

Command lines are built by pure functions (unit-tested without a node).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from fleetkit.cluster.node import POINTER, Node

#: Image stores, in the order they are asked for the image.
STORES = ("buildah", "podman", "docker")


class LoadError(RuntimeError):
    """The image or the node is not there; the message says what to run."""


def inspect_command(store: str, image: str) -> list[str]:
    if store == "buildah":
        return ["buildah", "inspect", "--type", "image", "--format", "{{.FromImageID}}", image]
    return [store, "image", "inspect", "--format", "{{.Id}}", image]


def export_command(store: str, image: str, archive: Path) -> list[str]:
    """Write ``image`` to ``archive`` as a docker-archive that keeps its name."""
    if store == "docker":
        return ["docker", "save", "--output", str(archive), image]
    return [store, "push", "--quiet", image, f"docker-archive:{archive}:{image}"]


def find_store(image: str) -> str:
    """The first local store that holds ``image``."""
    for store in STORES:
        if shutil.which(store) is None:
            continue
        found = subprocess.run(
            inspect_command(store, image), capture_output=True, text=True, timeout=60, check=False
        )
        if found.returncode == 0:
            return store
    raise LoadError(
        f"no local image {image} in {', '.join(s for s in STORES if shutil.which(s))}"
        " (build it first, e.g. bash deploy/own-app/build.sh)"
    )


def running_node() -> Node:
    """The node this machine runs now (its state is in /run/mcpfleet-node.json)."""
    try:
        state = json.loads(POINTER.read_text())
    except (OSError, ValueError):
        raise LoadError("no node is running here: make cluster-up NODE=1") from None
    node = Node.adopt(state)
    if not node.alive() or not node.containerd_socket.exists():
        where = state.get("workdir")
        raise LoadError(f"the node in {where} is not running: make cluster-up NODE=1")
    return node


def load(image: str, node: Node | None = None) -> str:
    """Import ``image`` into the node's containerd; returns the line to print."""
    node = node or running_node()
    store = find_store(image)
    with tempfile.TemporaryDirectory(prefix="mcpfleet-node-load-") as tmp:
        archive = Path(tmp) / "image.tar"
        subprocess.run(export_command(store, image, archive), check=True, timeout=600)
        node.ctr("images", "import", str(archive), timeout=600)
    listed = node.ctr("images", "list", "--quiet")
    if not any(line.endswith(image) for line in listed.splitlines()):
        raise LoadError(f"containerd does not list {image} after the import:\n{listed}")
    return f"loaded: {image}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fleetkit.cluster.nodeload", description=__doc__
    )
    parser.add_argument("image", help="the image's name, e.g. localhost/myapp:1")
    args = parser.parse_args(argv)
    try:
        print(load(args.image))
    except (LoadError, subprocess.CalledProcessError) as exc:
        print(f"node-load: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
