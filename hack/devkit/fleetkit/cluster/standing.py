"""``make cluster-up`` / ``make cluster-down``: a control plane that outlives one command.

Starts the same :class:`fleetkit.cluster.controlplane.ControlPlane` the tests use, in the
background, with its state (pids, ports, kubeconfig) under ``.cache/cluster/``.

With ``--fleet N`` it also brings up what the operator tests run, for a person
to drive with kubectl: the chart's CRDs and operator RBAC, Redis, the
operator under its ServiceAccount, a KeyRing, N replicas whose key
directories are fed from the Secret the way the kubelet does it (their Pods
registered and labelled for the selector), and a router. Those live in a
background process (``_fleet``, it holds the volume syncers) that ``down``
stops first. ``up`` prints ``export KUBECONFIG=...``, ``namespace: ...``,
``keyring: ...`` and ``router: ...``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import yaml

from fleetkit.cluster.controlplane import (
    OPTIONAL_TOOLS,
    REQUIRED_TOOLS,
    ControlPlane,
    missing_tools,
    repo_root,
    tail,
)


def _cluster_dir() -> Path:
    return repo_root() / ".cache" / "cluster"


#: The namespace and KeyRing ``up --fleet`` creates.
FLEET_NAMESPACE = "mcpfleet"
FLEET_KEYRING = "keys"


def _fleet_file() -> Path:
    return _cluster_dir() / "fleet.json"


def _up(args: argparse.Namespace) -> int:
    if args.node and args.fleet:
        print(
            "--fleet runs the replicas as local processes; with --node, run them as pods "
            "(hack/devkit/fleetkit/cluster/nodefleet.py) instead: use one or the other",
            file=sys.stderr,
        )
        return 2
    if args.node:
        return _up_node()
    state_file = _cluster_dir() / "state.json"
    if state_file.exists():
        state = json.loads(state_file.read_text())
        if "node" in state:
            print("a cluster with a node is up: make cluster-down first", file=sys.stderr)
            return 1
        plane = ControlPlane.adopt(state)
        if all(c.alive() for c in plane._components):
            print(f"already up: {state['server']}\n  export KUBECONFIG={state['admin_kubeconfig']}")
            if args.fleet:
                if _fleet_alive():
                    _print_fleet(state, json.loads(_fleet_file().read_text()))
                    return 0
                return _start_fleet(args, state)
            return 0
        _stop_fleet()
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
    if args.fleet:
        return _start_fleet(args, plane.state())
    return 0


# --- the fleet: operator, KeyRing, replicas and router (``up --fleet N``) -----------


def _fleet_alive() -> bool:
    try:
        pid = int(json.loads(_fleet_file().read_text())["pid"])
    except (FileNotFoundError, KeyError, ValueError):
        return False
    return _pid_is_fleet(pid)


def _pid_is_fleet(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"fleetkit.cluster" in cmdline and b"_fleet" in cmdline


def _print_fleet(state: dict[str, object], fleet: dict[str, object]) -> None:
    print(f"export KUBECONFIG={state['admin_kubeconfig']}")
    print(f"namespace: {fleet['namespace']}")
    print(f"keyring: {fleet['keyring']}")
    print(f"router: {fleet['router']}", flush=True)


def _start_fleet(args: argparse.Namespace, state: dict[str, object]) -> int:
    """Run ``_fleet`` in the background; wait until it reports ready; print the lines."""
    if args.fleet < 1:
        print("--fleet needs at least 1 replica", file=sys.stderr)
        return 1
    if args.token_ttl <= 0:
        print("--token-ttl must be a positive number of seconds", file=sys.stderr)
        return 1
    _fleet_file().unlink(missing_ok=True)
    log = _cluster_dir() / "fleet.log"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with log.open("ab") as fh:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fleetkit.cluster",
                "_fleet",
                "--fleet",
                str(args.fleet),
                "--token-ttl",
                str(args.token_ttl),
            ],
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            print(f"the fleet did not start (exit {proc.returncode}); see {log}", file=sys.stderr)
            print(tail(log, 40), file=sys.stderr)
            return 1
        if _fleet_file().exists():
            fleet = json.loads(_fleet_file().read_text())
            if fleet.get("ready"):
                _print_fleet(state, fleet)
                return 0
        time.sleep(0.2)
    print(f"the fleet was not ready within 300s; see {log}", file=sys.stderr)
    return 1


def _run_fleet(args: argparse.Namespace) -> int:
    """The background holder of the fleet: until SIGTERM (``down``)."""
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    from fleetkit.cluster.operatorkit import operator_env, ring_body_for
    from mcpfleet_operator.api import KEYRINGS

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    state = json.loads((_cluster_dir() / "state.json").read_text())
    plane = ControlPlane.adopt(state)
    plane._owns_workdir = False  # stopping this handle must not remove the cluster's files
    plane._components.clear()  # nor stop the control plane: `down` does that
    admin = plane.api_client()
    try:
        k8s.CoreV1Api(admin).create_namespace(
            k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=FLEET_NAMESPACE))
        )
    except ApiException as exc:
        if exc.status != 409:
            raise
    ttl = int(args.token_ttl)
    workdir = _cluster_dir() / "fleet"
    shutil.rmtree(workdir, ignore_errors=True)
    with operator_env(
        plane,
        plane.helm(),
        admin,
        FLEET_NAMESPACE,
        workdir,
        replicas=args.fleet,
        state_ttl=ttl,
        stall_after=30.0,
        fleet="default",
    ) as env:
        env.resources.create(KEYRINGS, ring_body_for(env, FLEET_KEYRING, token_ttl=f"{ttl}s"))
        env.resources.wait_keyring(FLEET_KEYRING, "Ready", timeout=120)
        _fleet_file().write_text(
            json.dumps(
                {
                    "pid": os.getpid(),
                    "ready": True,
                    "namespace": FLEET_NAMESPACE,
                    "keyring": FLEET_KEYRING,
                    "router": env.fleet.url,
                    "redis": env.fleet.redis_url,
                    "operator_metrics": f"http://127.0.0.1:{env.operator.metrics_port}/metrics",
                    "workdir": str(workdir),
                },
                indent=2,
            )
        )
        print(f"fleet ready: router {env.fleet.url}", flush=True)
        while not stop.wait(1.0):
            if not env.operator.alive:
                print("the operator exited; restarting it", flush=True)
                env.start_operator()
    print("fleet stopped", flush=True)
    return 0


def _stop_fleet() -> None:
    try:
        pid = int(json.loads(_fleet_file().read_text())["pid"])
    except (FileNotFoundError, KeyError, ValueError):
        return
    if not _pid_is_fleet(pid):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while _pid_is_fleet(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _pid_is_fleet(pid):
        os.kill(pid, signal.SIGKILL)
    _fleet_file().unlink(missing_ok=True)
    print("fleet stopped")


def _up_node() -> int:
    """``up --node``: the control plane plus a real node (see :mod:`fleetkit.cluster.node`)."""
    from fleetkit.cluster.node import Node, node_missing

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
    values = _cluster_dir() / "helm-values.yaml"
    values.write_text(
        "# The chart on this machine's node: the images `make image` built and\n"
        "# `make cluster-up NODE=1` imported (never pulled).\n"
        + yaml.safe_dump(node.images.helm_values(), sort_keys=False)
    )
    print(
        f"node up: {node.plane.server}, node {NODE_NAME_HINT}, pods on a bridge\n"
        f"  export KUBECONFIG={node.plane.admin_kubeconfig}\n"
        f"  images: {node.images.app}, {node.images.redis} (imagePullPolicy: Never)\n"
        f"  install: .cache/bin/helm install mcpfleet charts/mcpfleet -f {values}\n"
        f"helm values: {values}\n"
        f"  logs: {node.plane._dir / 'logs'}\n"
        f"  stop: make cluster-down"
    )
    return 0


#: Printed by ``up --node`` (fleetkit.cluster.node.NODE_NAME, without importing it here).
NODE_NAME_HINT = "mcpfleet-node"


def _down(args: argparse.Namespace) -> int:
    state_file = _cluster_dir() / "state.json"
    if not state_file.exists():
        print("no control plane is up (no .cache/cluster/state.json)")
        return 0
    _stop_fleet()
    state = json.loads(state_file.read_text())
    if "node" in state:
        from fleetkit.cluster.node import Node

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
        "--fleet",
        type=int,
        default=0,
        metavar="N",
        help="also run the operator, a KeyRing, N replicas fed from its Secret, and a router",
    )
    up.add_argument(
        "--token-ttl",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="the KeyRing's tokenTTL and the replicas' --state-ttl (with --fleet)",
    )
    up.add_argument(
        "--node",
        action="store_true",
        help="also a real node: containerd, kubelet, kube-scheduler, kube-proxy (root)",
    )
    up.set_defaults(func=_up)
    fleet = sub.add_parser("_fleet", help=argparse.SUPPRESS)
    fleet.add_argument("--fleet", type=int, required=True)
    fleet.add_argument("--token-ttl", type=float, required=True)
    fleet.set_defaults(func=_run_fleet)
    sub.add_parser("down", help="stop what `up` started").set_defaults(func=_down)
    status = sub.add_parser("status", help="are the processes running?")
    status.add_argument("--logs", action="store_true", help="print the log tails")
    status.set_defaults(func=_status)
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
