"""``make cluster-up`` / ``make cluster-down``: a control plane that outlives one command.

Starts the same :class:`fleetkit.controlplane.ControlPlane` the tests use, in the
background, with its state (pids, ports, kubeconfig) under ``.cache/cluster/``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from fleetkit.controlplane import (
    OPTIONAL_TOOLS,
    REQUIRED_TOOLS,
    ControlPlane,
    missing_tools,
    repo_root,
)


def _cluster_dir() -> Path:
    return repo_root() / ".cache" / "cluster"


def _up(args: argparse.Namespace) -> int:
    if args.node:
        return _up_node()
    state_file = _cluster_dir() / "state.json"
    if state_file.exists():
        state = json.loads(state_file.read_text())
        plane = ControlPlane.adopt(state)
        if all(c.alive() for c in plane._components):
            print(f"already up: {state['server']}\n  export KUBECONFIG={state['admin_kubeconfig']}")
            return 0
        plane.stop()  # a stale or half-dead cluster: clear it and start over
    missing = missing_tools(REQUIRED_TOOLS)
    if missing:
        print(f"missing {', '.join(missing)}: run `make tools`", file=sys.stderr)
        return 1
    with_manager = not args.no_controller_manager and not missing_tools(OPTIONAL_TOOLS)
    shutil.rmtree(_cluster_dir(), ignore_errors=True)
    plane = ControlPlane(
        workdir=_cluster_dir(), controller_manager=with_manager, die_with_parent=False
    )
    plane.start()
    state_file.write_text(json.dumps(plane.state(), indent=2))
    print(
        f"control plane up: {plane.server}"
        f" ({', '.join(c.name for c in plane._components)})\n"
        f"  export KUBECONFIG={plane.admin_kubeconfig}\n"
        f"  logs: {plane._dir / 'logs'}\n"
        f"  stop: make cluster-down"
    )
    return 0


def _up_node() -> int:
    """``up --node``: the control plane plus a real node (see :mod:`fleetkit.node`)."""
    from fleetkit.node import Node, node_missing

    state_file = _cluster_dir() / "state.json"
    if state_file.exists():
        print("a cluster is up already (.cache/cluster/state.json): make cluster-down first")
        return 1
    reasons = node_missing()
    if reasons:
        print("cannot run a node here: " + "; ".join(reasons), file=sys.stderr)
        return 1
    shutil.rmtree(_cluster_dir(), ignore_errors=True)
    node = Node(workdir=_cluster_dir() / "node", die_with_parent=False)
    node.start()
    _cluster_dir().mkdir(parents=True, exist_ok=True)
    state_file.write_text(json.dumps({"node": node.state()}, indent=2))
    assert node.plane is not None
    print(
        f"node up: {node.plane.server}, node {NODE_NAME_HINT}, pods on a bridge\n"
        f"  export KUBECONFIG={node.plane.admin_kubeconfig}\n"
        f"  image: {node.images.app} (imagePullPolicy: Never)\n"
        f"  logs: {node.plane._dir / 'logs'}\n"
        f"  stop: make cluster-down"
    )
    return 0


#: Printed by ``up --node`` (fleetkit.node.NODE_NAME, without importing it here).
NODE_NAME_HINT = "mcpfleet-node"


def _down(args: argparse.Namespace) -> int:
    state_file = _cluster_dir() / "state.json"
    if not state_file.exists():
        print("no control plane is up (no .cache/cluster/state.json)")
        return 0
    state = json.loads(state_file.read_text())
    if "node" in state:
        from fleetkit.node import Node

        report = Node.adopt(state["node"]).stop()
        state_file.unlink(missing_ok=True)
        for failure in report.failed:
            print(f"  left behind: {failure}", file=sys.stderr)
        print(
            "node and control plane stopped; the machine is as it was"
            if not report.failed
            else "node stopped, with leftovers (above)"
        )
        return 1 if report.failed else 0
    plane = ControlPlane.adopt(json.loads(state_file.read_text()))
    plane.stop()
    print("control plane stopped")
    return 0


def _status(args: argparse.Namespace) -> int:
    state_file = _cluster_dir() / "state.json"
    if not state_file.exists():
        print("down")
        return 1
    state = json.loads(state_file.read_text())
    if "node" in state:  # up --node: the plane's state is inside the node's
        state = state["node"]["plane"]
    plane = ControlPlane.adopt(state)
    for c in plane._components:
        print(f"{c.name}: {'running' if c.alive() else 'EXITED'} (pid {c.pid})")
    if args.logs:
        plane.print_logs()
    return 0 if all(c.alive() for c in plane._components) else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fleetkit.cluster", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start in the background; state in .cache/cluster/")
    up.add_argument("--no-controller-manager", action="store_true")
    up.add_argument(
        "--node",
        action="store_true",
        help="also a real node: containerd, kubelet, kube-scheduler, kube-proxy (root)",
    )
    up.set_defaults(func=_up)
    sub.add_parser("down", help="stop what `up` started").set_defaults(func=_down)
    status = sub.add_parser("status", help="are the processes running?")
    status.add_argument("--logs", action="store_true", help="print the log tails")
    status.set_defaults(func=_status)
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
