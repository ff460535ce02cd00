"""Cluster providers of the end-to-end tier: where the chart is installed for real.

- :class:`LocalProvider` (``local``): this machine's node (:mod:`fleetkit.node`:
  containerd, kubelet, scheduler, kube-proxy, CoreDNS; root). The images are the
  archives ``make image`` wrote, imported into the node's containerd. The host
  reaches Services at their ClusterIPs (kube-proxy's rules) and pods at their IPs.
- the kind provider (``kind``): a kind cluster (``deploy/kind/cluster.yaml``:
  one control plane, two workers) on the node image made here
  (:mod:`fleetkit.kind`, ``make kind-up``), with a Docker engine where one
  answers, else podman; the same archives go in with ``kind load
  image-archive``, and the host reaches Services through ``kubectl port-forward``.

Both hand the tests a :class:`Cluster`: a kubeconfig, chart values that point
at the local images, and :meth:`Cluster.reach` for a Service's address from
this machine. Command lines are built by pure functions, unit-tested where
the provider cannot run.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from fleetkit.controlplane import free_port, repo_root, tools_bin_dir, wait_for

PROVIDERS = ("local", "kind")
KIND_CONFIG = repo_root() / "deploy" / "kind" / "cluster.yaml"
#: The node's Service range is 10.217.128.0/24; the first 16 addresses are the
#: API server's static band, never handed out dynamically: a fixed ClusterIP here
#: cannot collide with an allocated one.
LOCAL_ROUTER_IP = "10.217.128.12"
#: More of that band, one per further release installed beside the first.
LOCAL_ROUTER_IPS = (LOCAL_ROUTER_IP, "10.217.128.13", "10.217.128.14")


@dataclass
class Cluster:
    """A running cluster the chart can be installed into."""

    provider: str
    kubeconfig: Path
    api: k8s.ApiClient
    #: Chart values for this cluster (the local images; how the host reaches the router).
    values: dict[str, Any]
    reach: Callable[[str, str, int], tuple[str, int]]
    #: Called to explain a failure (node logs).
    diagnostics: Callable[[], str] = lambda: ""
    _closers: list[Callable[[], None]] = field(default_factory=list)


def unavailable(provider: str) -> str | None:
    """Why ``provider`` cannot run here (None: it can)."""
    if provider == "local":
        from fleetkit.node import node_missing

        reasons = node_missing()
        return "; ".join(reasons) if reasons else None
    if provider == "kind":
        from fleetkit.kind import missing

        reasons = missing()
        return "; ".join(reasons) if reasons else None
    return f"unknown provider {provider!r} (one of {', '.join(PROVIDERS)})"


# --------------------------------------------------------------------------- local


@contextlib.contextmanager
def local_cluster(workdir: Path) -> Iterator[Cluster]:
    """This machine's node; the router at a fixed ClusterIP the host reaches directly."""
    from fleetkit.node import running_node

    with running_node(workdir) as node:
        api = node.api_client()
        core = k8s.CoreV1Api(api)

        def reach(namespace: str, service: str, port: int) -> tuple[str, int]:
            svc = core.read_namespaced_service(service, namespace)
            return str(svc.spec.cluster_ip), port

        values = node.images.helm_values()
        values["router"] = local_router_values(LOCAL_ROUTER_IP)
        try:
            yield Cluster(
                provider="local",
                kubeconfig=node.admin_kubeconfig,
                api=api,
                values=values,
                reach=reach,
                diagnostics=lambda: node.log_tail(20),
            )
        finally:
            api.close()


def local_router_values(ip: str) -> dict[str, Any]:
    """A release's router at the fixed ClusterIP ``ip``, answering it as a Host too
    (the tests are its clients); a second release beside the first takes another."""
    return {"service": {"clusterIP": ip}, "allowedHosts": [ip, f"{ip}:*"]}


# --------------------------------------------------------------------------- kind


@dataclass(frozen=True)
class KindCommands:
    """The command lines of the kind provider (pure: unit-tested without Docker)."""

    name: str
    kubeconfig: Path
    config: Path = KIND_CONFIG
    kind: str = "kind"
    kubectl: str = "kubectl"

    def create(self) -> list[str]:
        return [
            self.kind,
            "create",
            "cluster",
            "--name",
            self.name,
            "--config",
            str(self.config),
            "--kubeconfig",
            str(self.kubeconfig),
            "--wait",
            "120s",
        ]

    def load(self, archive: Path) -> list[str]:
        return [self.kind, "load", "image-archive", str(archive), "--name", self.name]

    def delete(self) -> list[str]:
        return [
            self.kind,
            "delete",
            "cluster",
            "--name",
            self.name,
            "--kubeconfig",
            str(self.kubeconfig),
        ]

    def port_forward(self, namespace: str, service: str, port: int, local: int) -> list[str]:
        return [
            self.kubectl,
            "--kubeconfig",
            str(self.kubeconfig),
            "--namespace",
            namespace,
            "port-forward",
            "--address",
            "127.0.0.1",
            f"service/{service}",
            f"{local}:{port}",
        ]


def kind_values(tag: str) -> dict[str, Any]:
    """The images ``kind load`` put on the kind node (a local name is never pulled)."""
    from fleetkit.node import Images

    return Images(tag).helm_values()


@contextlib.contextmanager
def kind_cluster(workdir: Path, name: str = "") -> Iterator[Cluster]:
    """A kind cluster with the images loaded; Services reached through port-forwards.

    The cluster is ``$MCPFLEET_KIND_CLUSTER`` (default ``mcpfleet-e2e``): one
    ``make kind-up`` made (``mcpfleet``) is used as it is, and deleted after
    unless ``MCPFLEET_KIND_KEEP=1``.
    """
    from fleetkit import kind
    from fleetkit.node import Images

    name = name or os.environ.get("MCPFLEET_KIND_CLUSTER", "mcpfleet-e2e")

    images = Images()
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        setup = kind.up(name, [a for a in images.archives if "pause" not in a.name])
    except BaseException:
        kind.down(name)
        raise
    kubectl = tools_bin_dir() / "kubectl"
    cmds = KindCommands(
        name=name,
        kubeconfig=setup.kubeconfig,
        kubectl=str(kubectl) if kubectl.exists() else "kubectl",
    )
    forwards: list[subprocess.Popen[bytes]] = []
    try:
        from kubernetes import config as k8s_config

        api = k8s_config.new_client_from_config(config_file=str(cmds.kubeconfig))
        known: dict[tuple[str, str, int], tuple[int, subprocess.Popen[bytes]]] = {}

        def reach(namespace: str, service: str, port: int) -> tuple[str, int]:
            key = (namespace, service, port)
            # A port-forward follows one pod: when that pod is gone (a reinstall,
            # a rescheduled replica) kubectl exits, and a new one is started.
            if key in known and known[key][1].poll() is not None:
                del known[key]
            if key not in known:
                local = free_port()
                proc = subprocess.Popen(
                    cmds.port_forward(namespace, service, port, local),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                forwards.append(proc)
                wait_for(lambda: _connects(local), timeout=60, what=f"port-forward to {service}")
                known[key] = (local, proc)
            return "127.0.0.1", known[key][0]

        yield Cluster(
            provider="kind",
            kubeconfig=cmds.kubeconfig,
            api=api,
            values=kind_values(images.tag),
            reach=reach,
            diagnostics=lambda: kind.diagnostics(name),
        )
        api.close()
    finally:
        for proc in forwards:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        if os.environ.get("MCPFLEET_KIND_KEEP") != "1":
            left = kind.down(name)
            if left:
                raise RuntimeError(f"kind cluster {name} left behind: {left}")


def _connects(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def cluster(provider: str, workdir: Path) -> Iterator[Cluster]:
    if provider == "local":
        with local_cluster(workdir) as c:
            yield c
    elif provider == "kind":
        with kind_cluster(workdir) as c:
            yield c
    else:
        raise ValueError(f"unknown provider {provider!r}")
