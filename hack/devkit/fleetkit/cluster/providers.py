"""Cluster providers of the end-to-end tier: where the chart is installed for real.

- :class:`LocalProvider` (``local``): this machine's node (:mod:`fleetkit.cluster.node`:
  containerd, kubelet, scheduler, kube-proxy, CoreDNS; root). The images are the
  archives ``make image`` wrote, imported into the node's containerd. The host
  reaches Services at their ClusterIPs (kube-proxy's rules) and pods at their IPs.
- the kind provider (``kind``): a kind cluster (``deploy/kind/cluster.yaml``:
  one control plane, two workers) on the node image made here
  (:mod:`fleetkit.cluster.kind`, ``make kind-up``), with a Docker engine where one
  answers, else podman; the same archives go in with ``kind load
  image-archive``, and the host reaches Services at their ClusterIPs too (a
  route to the Service range through the control-plane node). One cluster
  serves the whole session (:func:`kind_cluster`): making one costs minutes.

Both hand the tests a :class:`Cluster`: a kubeconfig, chart values that point
at the local images, :meth:`Cluster.reach` for a Service's address from this
machine, and :meth:`Cluster.router_values` (a release's router at a fixed
ClusterIP the tests name as its Host). Command lines are built by pure functions, unit-tested where
the provider cannot run.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from fleetkit.cluster.controlplane import repo_root

PROVIDERS = ("local", "kind")
KIND_CONFIG = repo_root() / "deploy" / "kind" / "cluster.yaml"
#: What the README tells a user to run to make and delete a kind cluster.
UP_SCRIPT = repo_root() / "deploy" / "kind" / "up.sh"
DOWN_SCRIPT = repo_root() / "deploy" / "kind" / "down.sh"
#: The node's Service range is 10.217.128.0/24; the first 16 addresses are the
#: API server's static band, never handed out dynamically: a fixed ClusterIP here
#: cannot collide with an allocated one.
LOCAL_ROUTER_IP = "10.217.128.12"
#: More of that band, one per further release installed beside the first.
LOCAL_ROUTER_IPS = (LOCAL_ROUTER_IP, "10.217.128.13", "10.217.128.14")
#: The same in kind's Service range (10.96.0.0/16: its static band is the first
#: 256 addresses; 10.96.0.1 is the API server's, 10.96.0.10 the DNS').
KIND_ROUTER_IPS = ("10.96.0.12", "10.96.0.13", "10.96.0.14")


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
    #: Fixed router ClusterIPs, one per release (the first is in ``values``).
    router_ips: tuple[str, ...] = LOCAL_ROUTER_IPS
    #: Takes a node away as a lost machine would (None: this provider cannot).
    stop_node: Callable[[str], None] | None = None
    #: Freezes a node (a hung machine) and thaws it again (None: this provider cannot).
    pause_node: Callable[[str], None] | None = None
    unpause_node: Callable[[str], None] | None = None
    #: The kind cluster's name (empty for other providers).
    kind_name: str = ""
    _closers: list[Callable[[], None]] = field(default_factory=list)

    def router_values(self, index: int) -> dict[str, Any]:
        """The router values of the ``index``-th release installed side by side."""
        return local_router_values(self.router_ips[index])


def unavailable(provider: str) -> str | None:
    """Why ``provider`` cannot run here (None: it can)."""
    if provider == "local":
        from fleetkit.cluster.node import node_missing

        reasons = node_missing()
        return "; ".join(reasons) if reasons else None
    if provider == "kind":
        from fleetkit.cluster.kind import missing

        reasons = missing()
        return "; ".join(reasons) if reasons else None
    return f"unknown provider {provider!r} (one of {', '.join(PROVIDERS)})"


# --------------------------------------------------------------------------- local


@contextlib.contextmanager
def local_cluster(workdir: Path) -> Iterator[Cluster]:
    """This machine's node; the router at a fixed ClusterIP the host reaches directly."""
    from fleetkit.cluster.node import running_node

    with running_node(workdir) as node:
        api = node.api_client()
        core = k8s.CoreV1Api(api)

        values = node.images.helm_values()
        values["router"] = local_router_values(LOCAL_ROUTER_IP)
        try:
            yield Cluster(
                provider="local",
                kubeconfig=node.admin_kubeconfig,
                api=api,
                values=values,
                reach=cluster_ip_reach(core),
                diagnostics=lambda: node.log_tail(20),
                router_ips=LOCAL_ROUTER_IPS,
            )
        finally:
            api.close()


def cluster_ip_reach(core: k8s.CoreV1Api) -> Callable[[str, str, int], tuple[str, int]]:
    """A Service's ClusterIP and port: the host routes to the Service range."""

    def reach(namespace: str, service: str, port: int) -> tuple[str, int]:
        svc = core.read_namespaced_service(service, namespace)
        assert svc.spec is not None, service
        return str(svc.spec.cluster_ip), port

    return reach


def local_router_values(ip: str) -> dict[str, Any]:
    """A release's router at the fixed ClusterIP ``ip``, answering it as a Host too
    (the tests are its clients); a second release beside the first takes another."""
    return {"service": {"clusterIP": ip}, "allowedHosts": [ip, f"{ip}:*"]}


# --------------------------------------------------------------------------- kind


def kind_values(tag: str) -> dict[str, Any]:
    """The images ``kind load`` put on the kind nodes (a local name is never pulled)."""
    from fleetkit.cluster.node import Images

    values = Images(tag).helm_values()
    values["router"] = local_router_values(KIND_ROUTER_IPS[0])
    return values


@contextlib.contextmanager
def kind_cluster(workdir: Path, name: str = "") -> Iterator[Cluster]:
    """A kind cluster with the images loaded; Services reached at their ClusterIPs.

    The cluster is ``$MCPFLEET_KIND_CLUSTER`` (default ``mcpfleet-e2e``): one
    ``make kind-up`` made (``mcpfleet``) is used as it is, and deleted after
    unless ``MCPFLEET_KIND_KEEP=1``.
    """
    from fleetkit.cluster import kind
    from fleetkit.cluster.node import Images

    name = name or os.environ.get("MCPFLEET_KIND_CLUSTER", "mcpfleet-e2e")
    images = Images()
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        setup = kind.up(name, [a for a in images.archives if "pause" not in a.name])
    except BaseException:
        kind.down(name)
        raise
    try:
        from kubernetes import config as k8s_config

        api = k8s_config.new_client_from_config(config_file=str(setup.kubeconfig))
        try:
            yield Cluster(
                provider="kind",
                kubeconfig=setup.kubeconfig,
                api=api,
                values=kind_values(images.tag),
                reach=cluster_ip_reach(k8s.CoreV1Api(api)),
                diagnostics=lambda: kind.diagnostics(name),
                router_ips=KIND_ROUTER_IPS,
                stop_node=lambda node: kind.stop_node(name, node),
                pause_node=lambda node: kind.pause_node(name, node),
                unpause_node=lambda node: kind.unpause_node(name, node),
                kind_name=name,
            )
        finally:
            api.close()
    finally:
        if os.environ.get("MCPFLEET_KIND_KEEP") != "1":
            # As a user deletes it (the README's command): deploy/kind/down.sh.
            done = subprocess.run(
                ["bash", str(DOWN_SCRIPT)],
                env={**os.environ, "KIND_CLUSTER": name},
                capture_output=True,
                text=True,
                timeout=900,
                check=False,
            )
            if done.returncode != 0:
                raise RuntimeError(
                    f"deploy/kind/down.sh (KIND_CLUSTER={name}) exited {done.returncode}; "
                    f"kind cluster {name} left behind:\n{done.stdout}{done.stderr}"
                )


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
