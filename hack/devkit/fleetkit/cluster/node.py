"""A real Kubernetes node on this machine: containerd, kubelet, kube-scheduler, kube-proxy.

:class:`Node` extends the control plane of :mod:`fleetkit.cluster.controlplane` (etcd,
kube-apiserver, kube-controller-manager) into a one-node cluster whose pods
really run: containerd (Debian's, as a plain process with its own config,
root, state and socket under the node's directory) runs them with runc, the
CNI ``bridge`` plugin puts them on a bridge (:data:`BRIDGE`, pods in
:data:`POD_CIDR`), kube-proxy (iptables mode) makes Services reachable and the
kubelet registers as :data:`NODE_NAME`, mounts Secret volumes, runs probes and
sends SIGTERM when a pod is deleted. The image is the project's own
(``make image``), imported into containerd from its archive.

The API server listens on the bridge's gateway address (:data:`GATEWAY`), so
pods reach it (the ``kubernetes`` Service has real endpoints) and so does this
process. Everything else binds loopback or the bridge: no port opens on
another interface. Traffic goes only to pods, Services and loopback.

The machine is shared: :meth:`Node.stop` leaves it as it was found (see
:mod:`fleetkit.cluster.node_host`), and the node refuses to start beside another one.
Facts about this kind of machine that shaped the configuration (each cost a
failed attempt): cgroups are a v1/v2 hybrid (``failCgroupV1: false``,
``cgroupDriver: cgroupfs``, runc rather than crun); there is no systemd; swap
checks must be off; containerd 1.6 needs ``restrict_oom_score_adj`` or every
sandbox dies with "can't get final child's PID from pipe: EOF"; the CRI
sandbox image is built locally (``make image`` makes ``mcpfleet-pause``).

Why this rig stays beside kind (the e2e tier's one provider, ``E2E_PROVIDER``
default ``kind``): it is the node tier's (tests/node), which checks what kind
hides inside its node containers: the image imported straight into a
containerd from its archive (``make node-load``, the path of a cluster without
a registry), the kubelet's Secret-volume refresh and SIGTERM as they happen on
this host, and the host left exactly as found (iptables, mounts, sysctls). And
it runs the chart without podman or a node image (``E2E_PROVIDER=local``), a
cluster in about a minute where kind takes several.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from fleetkit.cluster import node_host
from fleetkit.cluster.controlplane import (
    ControlPlane,
    _Component,
    _terminate,
    free_port,
    missing_tools,
    repo_root,
    tools_bin_dir,
    wait_for,
)
from fleetkit.cluster.pods import meta, name_of

NODE_NAME = "mcpfleet-node"
BRIDGE = "mcpfleet0"
#: Pod addresses: a private range unlikely to be used by anything else here.
POD_CIDR = "10.217.0.0/24"
GATEWAY = "10.217.0.1"
SERVICE_CIDR = "10.217.128.0/24"
#: The cgroup (in every hierarchy) under which the kubelet puts every pod.
CGROUP_ROOT = "mcpfleet-node"
CGROUP_FS = Path("/sys/fs/cgroup")
CNI_BIN = Path("/usr/lib/cni")
CNI_PLUGINS = ("bridge", "host-local", "loopback")
#: Built by hack/tools/build.sh.
NODE_TOOLS = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kubelet",
    "kube-scheduler",
    "kube-proxy",
    "coredns",
)
#: From Debian packages (hack/ensure-debs.sh node).
HOST_BINARIES = ("containerd", "containerd-shim-runc-v2", "ctr", "runc", "iptables", "ip")
#: A pointer to the running node's state: there is one node per machine (one
#: bridge, one cgroup root), and a node left by a killed run is found here.
POINTER = Path("/run/mcpfleet-node.json")
#: What the node's controller-manager runs besides the control plane's set.
NODE_CONTROLLERS = ("node-lifecycle-controller", "pod-garbage-collector-controller")


class NodeError(RuntimeError):
    """The node failed to start or to stop cleanly; the message says what and where."""


# --------------------------------------------------------------------------- requirements


def project_version() -> str:
    for line in (repo_root() / "pyproject.toml").read_text().splitlines():
        if line.startswith("version = "):
            return line.split('"')[1]
    raise LookupError("no version in pyproject.toml")


@dataclass(frozen=True)
class Images:
    """The image ``make image`` built, and the CRI sandbox image beside it."""

    tag: str = field(default_factory=project_version)

    @property
    def app(self) -> str:
        return f"localhost/mcpfleet:{self.tag}"

    @property
    def pause(self) -> str:
        return f"localhost/mcpfleet-pause:{self.tag}"

    @property
    def redis(self) -> str:
        """The chart's built-in Redis (Debian's redis-server on the same base)."""
        return f"localhost/mcpfleet-redis:{self.tag}"

    @property
    def tasks(self) -> str:
        """The image for apps with MCP tasks (``make image-tasks``): the [tasks] extra's set."""
        return f"localhost/mcpfleet:{self.tag}-tasks"

    @property
    def tasks_archive(self) -> Path:
        """``make image-tasks``'s archive: only the e2e tier's tasks case loads it."""
        return repo_root() / ".cache" / "image" / f"mcpfleet-{self.tag}-tasks.tar"

    @property
    def archives(self) -> tuple[Path, ...]:
        out = repo_root() / ".cache" / "image"
        return (
            out / f"mcpfleet-{self.tag}.tar",
            out / f"mcpfleet-pause-{self.tag}.tar",
            out / f"mcpfleet-redis-{self.tag}.tar",
        )

    def helm_values(self) -> dict[str, Any]:
        """Chart values that run the release on these local images (never pulled)."""
        return {
            "image": {"repository": "localhost/mcpfleet", "tag": self.tag, "pullPolicy": "Never"},
            "redis": {
                "image": {
                    "repository": "localhost/mcpfleet-redis",
                    "tag": self.tag,
                    "pullPolicy": "Never",
                }
            },
        }


def node_missing(bin_dir: Path | None = None, images: Images | None = None) -> list[str]:
    """Why this machine cannot run a node now (empty: it can)."""
    reasons = []
    if os.geteuid() != 0:
        reasons.append("not root (a kubelet and containerd need root)")
    host = [b for b in HOST_BINARIES if shutil.which(b) is None]
    if host:
        reasons.append(f"{', '.join(host)} not installed: bash hack/ensure-debs.sh node")
    cni = [p for p in CNI_PLUGINS if not (CNI_BIN / p).is_file()]
    if cni:
        reasons.append(
            f"CNI plugins {', '.join(cni)} missing in {CNI_BIN}: containernetworking-plugins"
        )
    tools = missing_tools(NODE_TOOLS, bin_dir)
    if tools:
        reasons.append(f"{', '.join(tools)} not built: make tools")
    missing_archives = [str(a) for a in (images or Images()).archives if not a.is_file()]
    if missing_archives:
        reasons.append(f"no image archive {', '.join(missing_archives)}: make image")
    running = _running_node_workdir()
    if running:
        reasons.append(f"another node is running here ({running}): make cluster-down")
    return reasons


def _running_node_workdir() -> str | None:
    """The workdir of a node whose processes still run on this machine, if any."""
    try:
        state = json.loads(POINTER.read_text())
    except (OSError, ValueError):
        return None
    plane = (state.get("plane") or {}).get("components", [])
    alive = [
        c for c in plane if _Component(c["name"], c["args"], Path(c["log"]), pid=c["pid"]).alive()
    ]
    return str(state.get("workdir")) if alive else None


def require_node(bin_dir: Path | None = None) -> None:
    """Skip the calling test when the machine cannot run a node; with CI=true, fail."""
    import pytest

    reasons = node_missing(bin_dir)
    if reasons:
        message = "cannot run a node here: " + "; ".join(reasons)
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and {message}", pytrace=False)
        pytest.skip(message)


# --------------------------------------------------------------------------- the node


@dataclass
class Node:
    """A one-node cluster; :meth:`start`, use :attr:`plane`, :meth:`stop`.

    :param workdir: every file of the node (control plane, containerd root and
        state, kubelet root, CNI state, logs). Removed by :meth:`stop`.
    """

    workdir: Path
    bin_dir: Path = field(default_factory=tools_bin_dir)
    images: Images = field(default_factory=Images)
    die_with_parent: bool = True
    start_timeout: float = 180.0
    plane: ControlPlane | None = field(default=None, init=False)
    before: node_host.HostState | None = field(default=None, init=False, repr=False)
    _own: list[_Component] = field(default_factory=list, init=False, repr=False)

    # ---- paths

    @property
    def containerd_dir(self) -> Path:
        return self.workdir / "containerd"

    @property
    def containerd_socket(self) -> Path:
        return self.containerd_dir / "containerd.sock"

    @property
    def kubelet_dir(self) -> Path:
        return self.workdir / "kubelet"

    @property
    def admin_kubeconfig(self) -> Path:
        assert self.plane is not None
        return self.plane.admin_kubeconfig

    def api_client(self) -> k8s.ApiClient:
        assert self.plane is not None, "start() the node first"
        return self.plane.api_client()

    # ---- life cycle

    def start(self) -> Node:
        """Start everything, in order, and wait until the node is Ready."""
        _clear_stale_node()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.before = node_host.snapshot()
        self._save()
        deadline = time.monotonic() + self.start_timeout
        try:
            self._make_bridge()
            self._make_cgroups()
            self.plane = ControlPlane(
                bin_dir=self.bin_dir,
                workdir=self.workdir / "plane",
                controller_manager=True,
                die_with_parent=self.die_with_parent,
                start_timeout=max(30.0, deadline - time.monotonic()),
                address=GATEWAY,
                service_cidr=SERVICE_CIDR,
                extra_controllers=NODE_CONTROLLERS,
                extra_apiserver_args=self._apiserver_args(),
            )
            self.plane.start()
            self._save()
            self._grant_node_rights()
            self._start_containerd(deadline)
            self._import_images()
            self._start_scheduler()
            # kube-proxy is healthy only once its Node exists: start it, then
            # the kubelet that registers the Node, then wait for both.
            proxy_healthy = self._start_proxy()
            self._start_dns(deadline)
            self._start_kubelet(deadline)
            self._wait(self._component("kube-proxy"), proxy_healthy, deadline)
            self._save()
        except BaseException:
            logs = self.log_tail()
            with contextlib.suppress(Exception):
                self.stop()
            raise NodeError(f"the node failed to start; logs:\n{logs}") from None
        return self

    def stop(self) -> node_host.RestoreReport:
        """Pods, processes, mounts, cgroups, iptables, bridge, sysctls: all back as found."""
        self._delete_all_pods()
        for component in reversed(self._own):
            if component.name != "containerd":
                _terminate(component, 15.0)
        self._kill_leftover_containers()
        self._remove_log_links()
        for component in self._own:
            if component.name == "containerd":
                _terminate(component, 15.0)
        self._proxy_cleanup()
        if self.plane is not None:
            self.plane._components = [c for c in self.plane._components if c not in self._own]
            self.plane.stop()
        self._own.clear()
        self._remove_cni_cache()
        report = node_host.RestoreReport()
        if self.before is not None:
            report = node_host.restore(
                self.before,
                roots=[str(self.workdir)],
                links=[BRIDGE],
                marks=[BRIDGE, POD_CIDR, SERVICE_CIDR],
            )
        self._remove_cgroups(report)
        shutil.rmtree(self.workdir, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            if json.loads(POINTER.read_text()).get("workdir") == str(self.workdir):
                POINTER.unlink()
        return report

    def __enter__(self) -> Node:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- state (cluster up / down, and a node left by a killed run)

    def state(self) -> dict[str, Any]:
        return {
            "workdir": str(self.workdir),
            "images_tag": self.images.tag,
            "before": self.before.to_json() if self.before else None,
            "plane": self.plane.state() if self.plane else None,
            "own": [c.name for c in self._own],
        }

    def _save(self) -> None:
        state = json.dumps(self.state(), indent=2)
        (self.workdir / "node.json").write_text(state)
        POINTER.write_text(state)

    @classmethod
    def adopt(cls, state: dict[str, Any]) -> Node:
        """A handle on a node another process started, so that :meth:`stop` ends it."""
        node = cls(workdir=Path(state["workdir"]), images=Images(state["images_tag"]))
        node.die_with_parent = False
        if state.get("before"):
            node.before = node_host.HostState.from_json(state["before"])
        if state.get("plane"):
            node.plane = ControlPlane.adopt(state["plane"])
            node._own = [c for c in node.plane._components if c.name in state.get("own", [])]
        return node

    def alive(self) -> bool:
        return self.plane is not None and all(c.alive() for c in self.plane._components)

    # ---- diagnostics

    def log_tail(self, lines: int = 30) -> str:
        return self.plane.log_tail(lines) if self.plane else "(no control plane)"

    def ctr(self, *args: str, timeout: float = 120.0) -> str:
        """``ctr`` against this node's containerd, in the CRI namespace."""
        result = subprocess.run(
            ["ctr", "--address", str(self.containerd_socket), "--namespace", "k8s.io", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if result.returncode != 0:
            raise NodeError(f"ctr {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout

    # ---- start-up steps

    def _spawn(self, name: str, args: list[str]) -> _Component:
        assert self.plane is not None
        component = self.plane._spawn(name, args)
        self._own.append(component)
        return component

    def _wait(self, component: _Component, ready: Any, deadline: float) -> None:
        assert self.plane is not None
        self.plane._wait(component, ready, deadline)

    def _apiserver_args(self) -> tuple[str, ...]:
        pki = self.workdir / "plane" / "pki"
        return (
            # kubectl logs/exec: the API server reaches the kubelet as admin, at
            # its InternalIP (the node has no resolvable host name).
            f"--kubelet-client-certificate={pki / 'admin.crt'}",
            f"--kubelet-client-key={pki / 'admin.key'}",
            "--kubelet-preferred-address-types=InternalIP",
        )

    def _make_bridge(self) -> None:
        """The pod bridge, with the gateway address the API server binds to."""
        if BRIDGE in node_host.link_names():
            raise NodeError(f"bridge {BRIDGE} exists: another node runs here (make cluster-down)")
        for args in (
            ["ip", "link", "add", "name", BRIDGE, "type", "bridge"],
            ["ip", "addr", "add", f"{GATEWAY}/{POD_CIDR.split('/')[1]}", "dev", BRIDGE],
            ["ip", "link", "set", BRIDGE, "up"],
        ):
            subprocess.run(args, check=True, capture_output=True, timeout=30)

    def _make_cgroups(self) -> None:
        """The kubelet's cgroup root in every hierarchy (it must exist before the kubelet)."""
        for hierarchy in _cgroup_hierarchies():
            path = hierarchy / CGROUP_ROOT
            path.mkdir(exist_ok=True)
            for name in ("cpuset.cpus", "cpuset.mems"):  # v1 cpuset: a child starts empty
                if (hierarchy / name).exists() and not (path / name).read_text().strip():
                    (path / name).write_text((hierarchy / name).read_text())

    def _remove_cgroups(self, report: node_host.RestoreReport) -> None:
        for hierarchy in _cgroup_hierarchies():
            root = hierarchy / CGROUP_ROOT
            if not root.is_dir():
                continue
            dirs = sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
            for path in [*dirs, root]:
                try:
                    wait_for(
                        functools.partial(_rmdir, path),
                        timeout=10,
                        interval=0.2,
                        what=f"rmdir {path}",
                    )
                except TimeoutError:
                    report.failed.append(f"cgroup {path} could not be removed")

    def _grant_node_rights(self) -> None:
        """Bind the nodes group to the bootstrap ``system:node`` role (RBAC, no Node authorizer)."""
        with k8s.ApiClient(self._admin_config()) as api:
            binding = k8s.V1ClusterRoleBinding(
                metadata=k8s.V1ObjectMeta(name="mcpfleet-node:system:node"),
                role_ref=k8s.V1RoleRef(
                    api_group="rbac.authorization.k8s.io", kind="ClusterRole", name="system:node"
                ),
                subjects=[
                    k8s.RbacV1Subject(
                        kind="Group", name="system:nodes", api_group="rbac.authorization.k8s.io"
                    )
                ],
            )
            k8s.RbacAuthorizationV1Api(api).create_cluster_role_binding(binding)

    def _admin_config(self) -> k8s.Configuration:
        assert self.plane is not None
        return self.plane._admin_configuration()

    def _start_containerd(self, deadline: float) -> None:
        d = self.containerd_dir
        for sub in ("root", "state", "opt"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        cni_conf = self.workdir / "cni" / "net.d"
        cni_conf.mkdir(parents=True, exist_ok=True)
        (cni_conf / "10-mcpfleet.conflist").write_text(json.dumps(self._cni_config(), indent=2))
        config = d / "config.toml"
        config.write_text(self._containerd_config())
        component = self._spawn("containerd", ["containerd", "--config", str(config)])

        def ready() -> bool:
            if not self.containerd_socket.exists():
                return False
            return (
                subprocess.run(
                    ["ctr", "--address", str(self.containerd_socket), "version"],
                    capture_output=True,
                    timeout=10,
                    check=False,
                ).returncode
                == 0
            )

        self._wait(component, ready, deadline)

    def _cni_config(self) -> dict[str, Any]:
        return {
            "cniVersion": "1.0.0",
            "name": "mcpfleet",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    # No masquerading: pods talk to each other, to Services and
                    # to this machine, never beyond it.
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_CIDR, "gateway": GATEWAY}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.workdir / "cni" / "ipam"),
                    },
                }
            ],
        }

    def _containerd_config(self) -> str:
        d = self.containerd_dir
        runc = shutil.which("runc") or "runc"
        return f"""\
version = 2
root = "{d / "root"}"
state = "{d / "state"}"
oom_score = 0
disabled_plugins = [
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = "{self.containerd_socket}"

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{d / "opt"}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{self.images.pause}"
  # Without it every sandbox dies: "can't get final child's PID from pipe: EOF".
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  disable_apparmor = true
  disable_hugetlb_controller = true
  tolerate_missing_hugetlb_controller = true

[plugins."io.containerd.grpc.v1.cri".containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  BinaryName = "{runc}"
  SystemdCgroup = false

[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "{CNI_BIN}"
  conf_dir = "{self.workdir / "cni" / "net.d"}"
  max_conf_num = 1
"""

    def _import_images(self) -> None:
        for archive in self.images.archives:
            self.ctr("images", "import", str(archive), timeout=300)

    def _start_scheduler(self) -> None:
        assert self.plane is not None
        kubeconfig = self.plane.kubeconfig_for_user("system:kube-scheduler")
        self._spawn(
            "kube-scheduler",
            [
                str(self.bin_dir / "kube-scheduler"),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
            ],
        )

    def _component(self, name: str) -> _Component:
        (component,) = [c for c in self._own if c.name == name]
        return component

    def _start_proxy(self) -> Callable[[], bool]:
        """Start kube-proxy; returns its health check."""
        assert self.plane is not None
        kubeconfig = self.plane.kubeconfig_for_user("system:kube-proxy")
        healthz = free_port()
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(kubeconfig)},
            "hostnameOverride": NODE_NAME,
            "bindAddress": GATEWAY,
            "healthzBindAddress": f"127.0.0.1:{healthz}",
            "metricsBindAddress": f"127.0.0.1:{free_port()}",
            "mode": "iptables",
            "clusterCIDR": POD_CIDR,
            # Service traffic between pods of one bridge needs its replies to
            # come back through the host (no br_netfilter here): masquerade it.
            "iptables": {"masqueradeAll": True, "syncPeriod": "30s", "minSyncPeriod": "0s"},
            # Leave the machine's conntrack sysctls alone.
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
            # NodePorts only on the bridge address, never on another interface.
            "nodePortAddresses": [f"{GATEWAY}/32"],
            "oomScoreAdj": 0,
        }
        path = self.workdir / "kube-proxy.yaml"
        path.write_text(yaml.safe_dump(config))
        self._spawn("kube-proxy", [str(self.bin_dir / "kube-proxy"), f"--config={path}"])

        def healthy() -> bool:
            import http.client

            conn = http.client.HTTPConnection("127.0.0.1", healthz, timeout=2)
            try:
                conn.request("GET", "/healthz")
                return conn.getresponse().status == 200
            finally:
                conn.close()

        return healthy

    def _start_dns(self, deadline: float) -> None:
        """CoreDNS on the gateway address: the pods' resolver (cluster names only).

        It answers for ``cluster.local`` from the API (Services, pods) and
        forwards nothing: no query leaves the machine.
        """
        assert self.plane is not None
        user = "mcpfleet:coredns"
        with k8s.ApiClient(self._admin_config()) as api:
            rbac = k8s.RbacAuthorizationV1Api(api)
            rbac.create_cluster_role(
                k8s.V1ClusterRole(
                    metadata=k8s.V1ObjectMeta(name=user),
                    rules=[
                        k8s.V1PolicyRule(
                            api_groups=[""],
                            resources=["services", "pods", "namespaces", "endpoints"],
                            verbs=["list", "watch"],
                        ),
                        k8s.V1PolicyRule(
                            api_groups=["discovery.k8s.io"],
                            resources=["endpointslices"],
                            verbs=["list", "watch"],
                        ),
                    ],
                )
            )
            rbac.create_cluster_role_binding(
                k8s.V1ClusterRoleBinding(
                    metadata=k8s.V1ObjectMeta(name=user),
                    role_ref=k8s.V1RoleRef(
                        api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=user
                    ),
                    subjects=[
                        k8s.RbacV1Subject(
                            kind="User", name=user, api_group="rbac.authorization.k8s.io"
                        )
                    ],
                )
            )
        kubeconfig = self.plane.kubeconfig_for_user(user)
        ready = free_port()
        corefile = self.workdir / "Corefile"
        corefile.write_text(
            f""".:53 {{
    bind {GATEWAY}
    errors
    ready 127.0.0.1:{ready}
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    cache 5
}}
"""
        )
        component = self._spawn("coredns", [str(self.bin_dir / "coredns"), "-conf", str(corefile)])

        def synced() -> bool:
            import http.client

            conn = http.client.HTTPConnection("127.0.0.1", ready, timeout=2)
            try:
                conn.request("GET", "/ready")
                return conn.getresponse().status == 200
            finally:
                conn.close()

        self._wait(component, synced, deadline)

    def _start_kubelet(self, deadline: float) -> None:
        assert self.plane is not None
        kubeconfig = self.plane.kubeconfig_for_user(f"system:node:{NODE_NAME}", ["system:nodes"])
        self.kubelet_dir.mkdir(parents=True, exist_ok=True)
        resolv = self.workdir / "resolv.conf"
        # Pods with dnsPolicy Default get this: no resolver beyond the machine.
        resolv.write_text("nameserver 127.0.0.1\noptions ndots:1\n")
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": GATEWAY,
            "port": free_port(),
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": free_port(),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(self.plane.ca_file)},
            },
            "authorization": {"mode": "Webhook"},
            # This machine: cgroup v1/v2 hybrid, no systemd, swap checks off.
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": f"/{CGROUP_ROOT}",
            "failCgroupV1": False,
            "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "clusterDomain": "cluster.local",
            "clusterDNS": [GATEWAY],
            "resolvConf": str(resolv),
            "podLogsDir": str(self.workdir / "pod-logs"),
            "volumePluginDir": str(self.workdir / "volume-plugins"),
            "oomScoreAdj": 0,
            "maxPods": 30,
            "serializeImagePulls": False,
            # Images come from archives, never from a registry: never collect them.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            # The disk is shared with other work: evict only when nearly full.
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "2%",
                "imagefs.available": "2%",
                "nodefs.inodesFree": "2%",
            },
            "protectKernelDefaults": False,
        }
        path = self.workdir / "kubelet.yaml"
        path.write_text(yaml.safe_dump(config))
        self._spawn(
            "kubelet",
            [
                str(self.bin_dir / "kubelet"),
                f"--config={path}",
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={self.kubelet_dir}",
                f"--hostname-override={NODE_NAME}",
                f"--node-ip={GATEWAY}",
                "--v=1",
            ],
        )
        wait_for(
            self._node_ready,
            timeout=max(1.0, deadline - time.monotonic()),
            interval=0.5,
            what=f"node {NODE_NAME} to be Ready",
        )

    def _node_ready(self) -> bool:
        for component in self._own:
            if not component.alive():
                raise NodeError(f"{component.name} exited during start-up")
        with k8s.ApiClient(self._admin_config()) as api:
            try:
                node = k8s.CoreV1Api(api).read_node(NODE_NAME)
            except ApiException as exc:
                if exc.status == 404:
                    return False
                raise
        assert node.status is not None and node.spec is not None, NODE_NAME
        conditions = {c.type: c.status for c in (node.status.conditions or [])}
        taints = [t.key for t in (node.spec.taints or [])]
        return conditions.get("Ready") == "True" and not taints

    # ---- stop steps

    def _delete_all_pods(self) -> None:
        """Delete every pod while the kubelet runs, so sandboxes and networks go properly."""
        if self.plane is None or not any(c.name == "kubelet" and c.alive() for c in self._own):
            return
        try:
            with k8s.ApiClient(self._admin_config()) as api:
                core = k8s.CoreV1Api(api)
                for pod in core.list_pod_for_all_namespaces().items:
                    namespace = meta(pod).namespace
                    assert namespace is not None, name_of(pod)
                    with contextlib.suppress(ApiException):
                        core.delete_namespaced_pod(name_of(pod), namespace, grace_period_seconds=0)
            wait_for(lambda: not self._running_tasks(), timeout=30, interval=0.5, what="no task")
        except Exception:  # teardown goes on: what is left is killed below
            pass

    def _running_tasks(self) -> list[str]:
        try:
            lines = self.ctr("tasks", "ls", timeout=10).splitlines()[1:]
        except (NodeError, subprocess.TimeoutExpired, FileNotFoundError):
            return []
        return [line for line in lines if "RUNNING" in line]

    def _kill_leftover_containers(self) -> None:
        """SIGKILL what runs in the node's cgroups, and its containerd's shims.

        Both are the node's own by construction: the pods' cgroups are under
        :data:`CGROUP_ROOT`, and a shim names its containerd's socket on its
        command line. Nothing else on the machine is touched.
        """
        socket = str(self.containerd_socket).encode()
        for _ in range(3):
            pids: set[int] = set()
            for hierarchy in _cgroup_hierarchies():
                root = hierarchy / CGROUP_ROOT
                if root.is_dir():
                    for procs in root.rglob("cgroup.procs"):
                        with contextlib.suppress(OSError, ValueError):
                            pids |= {int(p) for p in procs.read_text().split()}
            for proc in Path("/proc").iterdir():
                if proc.name.isdigit():
                    with contextlib.suppress(OSError):
                        cmdline = (proc / "cmdline").read_bytes().split(b"\0")
                        if b"containerd-shim" in cmdline[0] and socket in cmdline:
                            pids.add(int(proc.name))
            pids.discard(os.getpid())
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.5)  # the kernel reaps asynchronously; check again

    def _remove_log_links(self) -> None:
        """The kubelet's links in /var/log/containers to this node's logs (a stopped
        kubelet leaves those of containers it had no time to remove)."""
        links = Path("/var/log/containers")
        if not links.is_dir():
            return
        for link in links.iterdir():
            with contextlib.suppress(OSError):
                if link.is_symlink() and str(link.readlink()).startswith(f"{self.workdir}/"):
                    link.unlink()

    def _remove_cni_cache(self) -> None:
        """libcni's cached results for this node's pods (left when a sandbox was never
        torn down through CNI, e.g. after a killed run): the ``mcpfleet`` network's,
        and the loopback network's too when the cache did not exist before the node."""
        results = Path("/var/lib/cni/results")
        if not results.is_dir():
            return
        prefixes = ["mcpfleet-"]
        if self.before is not None and not self.before.dirs.get("/var/lib/cni", True):
            prefixes.append("cni-loopback-")
        for entry in results.iterdir():
            if entry.name.startswith(tuple(prefixes)) and entry.is_file():
                with contextlib.suppress(OSError):
                    entry.unlink()

    def _proxy_cleanup(self) -> None:
        """``kube-proxy --cleanup``: its own rules and chains, as upstream removes them."""
        binary = self.bin_dir / "kube-proxy"
        if binary.is_file():
            with contextlib.suppress(subprocess.TimeoutExpired):
                subprocess.run(
                    [str(binary), "--cleanup"], capture_output=True, timeout=60, check=False
                )


def _cgroup_hierarchies() -> list[Path]:
    """The mounted cgroup hierarchies (v1 controllers and the unified v2 one)."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        sep = fields.index("-")
        if fields[sep + 1] in ("cgroup", "cgroup2") and fields[4].startswith(str(CGROUP_FS)):
            out.append(Path(fields[4]))
    return out


def _rmdir(path: Path) -> bool:
    try:
        path.rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def _clear_stale_node() -> None:
    """Tear down a node whose processes are all gone (a killed run); refuse a live one."""
    try:
        state = json.loads(POINTER.read_text())
    except FileNotFoundError:
        return
    stale = Node.adopt(state)
    if stale.plane is not None and any(c.alive() for c in stale.plane._components):
        raise NodeError(
            f"a node is already running (workdir {state['workdir']}): stop it first"
            " (make cluster-down)"
        )
    stale.stop()


@contextlib.contextmanager
def running_node(workdir: Path, *, die_with_parent: bool = True) -> Iterator[Node]:
    node = Node(workdir=workdir, die_with_parent=die_with_parent)
    node.start()
    try:
        yield node
    finally:
        report = node.stop()
        if report.failed:
            print("node teardown left:\n  " + "\n  ".join(report.failed))
