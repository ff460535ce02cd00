"""A real Kubernetes control plane on 127.0.0.1 for tests: etcd + kube-apiserver.

The binaries are built from the pinned Go module in ``hack/tools`` (``make tools``)
into ``.cache/bin``. :class:`ControlPlane` starts them on free loopback ports with
a throwaway PKI, RBAC enforced, and ServiceAccount tokens signed by a key of its
own, so a component under test can run with exactly the rights its RBAC grants
(:meth:`ControlPlane.kubeconfig_for_service_account`). kube-controller-manager is
optional: with it, Deployments create ReplicaSets and Pods. There is no kubelet
and no scheduler: :func:`fleetkit.cluster.pods.make_pod_ready` writes the status a kubelet would.

Everything a test needs is a plain class or function here, so any ``conftest.py``
can build its fixtures from them (see :func:`session_control_plane`). Beside
it: :mod:`fleetkit.cluster.helm` (the built helm), :mod:`fleetkit.cluster.rbac` (ServiceAccounts
and their Roles) and :mod:`fleetkit.cluster.pods` (a kubelet's Pod status).

Run by hand::

    make cluster-up      # python -m fleetkit.cluster up
    export KUBECONFIG=.cache/cluster/admin.kubeconfig
    make cluster-down    # python -m fleetkit.cluster down
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

import yaml
from kubernetes import client as k8s

from fleetkit.certs import CertificateAuthority, key_pem, new_signing_key, public_key_pem

# Re-exported: rigs written before helm had a module of its own import it here.
from fleetkit.cluster.helm import Helm as Helm
from fleetkit.cluster.helm import HelmError as HelmError

# The one wait helper, re-exported for the rigs that import it from here.
from mcpfleet.dev.ports import free_port as fleet_free_port
from mcpfleet.dev.wait import WaitTimeout as WaitTimeout
from mcpfleet.dev.wait import wait_for as wait_for

T = TypeVar("T")

#: Tools a :class:`ControlPlane` cannot run without.
REQUIRED_TOOLS = ("etcd", "kube-apiserver")
#: Tools that add something when present (Deployments that create Pods).
OPTIONAL_TOOLS = ("kube-controller-manager",)

LOOPBACK = "127.0.0.1"
# Service ClusterIPs are only numbers in etcd here (there is no kube-proxy), but
# an address that nothing can route to beyond this machine is the safe choice.
SERVICE_CIDR = "127.0.100.0/24"


class ControlPlaneError(RuntimeError):
    """The control plane failed to start or to answer; the message has the log tails."""


class _PortTaken(ControlPlaneError):
    """A component lost the race for a port chosen by :func:`free_port`: pick again."""


# --------------------------------------------------------------------------- tools


def repo_root() -> Path:
    """The checkout this file belongs to (hack/devkit/fleetkit/cluster/ is four levels down)."""
    return Path(__file__).resolve().parents[4]


def tools_bin_dir() -> Path:
    """Where ``hack/tools/build.sh`` put the binaries (``$FLEETKIT_TOOLS_BIN`` overrides)."""
    override = os.environ.get("FLEETKIT_TOOLS_BIN")
    return Path(override) if override else repo_root() / ".cache" / "bin"


def pinned_version(module: str) -> str:
    """The version ``hack/tools/go.mod`` pins for ``module`` (e.g. ``k8s.io/kubernetes``)."""
    go_mod = (repo_root() / "hack" / "tools" / "go.mod").read_text()
    match = re.search(rf"^\s+{re.escape(module)} (v\S+)", go_mod, re.MULTILINE)
    if match is None:
        raise LookupError(f"{module} is not pinned in hack/tools/go.mod")
    return match.group(1)


def find_tool(name: str, bin_dir: Path | None = None) -> Path | None:
    """The path of an executable built tool, or None."""
    path = (bin_dir or tools_bin_dir()) / name
    return path if path.is_file() and os.access(path, os.X_OK) else None


def missing_tools(names: Sequence[str] = REQUIRED_TOOLS, bin_dir: Path | None = None) -> list[str]:
    return [n for n in names if find_tool(n, bin_dir) is None]


def require_tools(names: Sequence[str] = REQUIRED_TOOLS, bin_dir: Path | None = None) -> Path:
    """Skip the calling test when tools are missing, but FAIL in CI.

    CI (``CI=true``) builds the tools first, so a missing binary there is a
    broken build, not a reason to silently run nothing.
    """
    import pytest

    missing = missing_tools(names, bin_dir)
    if missing:
        where = bin_dir or tools_bin_dir()
        reason = f"{', '.join(missing)} not built in {where}: run `make tools`"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and {reason}", pytrace=False)
        pytest.skip(reason)
    return bin_dir or tools_bin_dir()


# --------------------------------------------------------------------------- helpers


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (and not handed out lately)."""
    return fleet_free_port(LOOPBACK)


def tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log file ('' when it does not exist)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 256 * lines))
            data = f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    """preexec_fn: have the kernel SIGTERM the child when the test process dies.

    Without it, a test run killed by a timeout leaves etcd and kube-apiserver
    running and holding ports and CPU for the next run.
    """
    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(pr_set_pdeathsig, signal.SIGTERM)


def write_kubeconfig(
    path: Path,
    *,
    server: str,
    ca_pem: bytes,
    user: dict[str, str],
    name: str = "fleetkit",
    namespace: str | None = None,
) -> Path:
    """A kubeconfig that kubectl, helm and clients read; the CA beside it in a file.

    Files, not inline data: the kubernetes Python client copies inline data into a
    temporary file it removes at exit, which a process the tests SIGKILL never
    reaches, so each such process left one in the system's temporary directory.
    """
    ca_file = path.with_name(path.name + ".ca.crt")
    path.parent.mkdir(parents=True, exist_ok=True)
    ca_file.write_bytes(ca_pem)
    context: dict[str, str] = {"cluster": name, "user": name}
    if namespace:
        context["namespace"] = namespace
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": name,
                "cluster": {
                    "server": server,
                    "certificate-authority": str(ca_file),
                },
            }
        ],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": name, "context": context}],
        "current-context": name,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


# --------------------------------------------------------------------------- processes


@dataclass
class _Component:
    name: str
    args: list[str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    pid: int | None = None  # set when adopted from a state file (``down``)

    def alive(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        return self.pid is not None and _pid_runs(self.pid, self.args[0])


def _pid_runs(pid: int, binary: str) -> bool:
    """Whether ``pid`` is still the process we started (not a recycled pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    return cmdline == binary


@dataclass
class ControlPlane:
    """etcd + kube-apiserver (+ optionally kube-controller-manager) on 127.0.0.1.

    :param bin_dir: where the built tools are (default :func:`tools_bin_dir`).
    :param workdir: certificates, kubeconfigs, etcd data and logs. A fresh temp
        dir (removed by :meth:`stop`) when not given.
    :param controller_manager: also run kube-controller-manager, so Deployments
        create ReplicaSets and Pods and namespaces get their ``default``
        ServiceAccount. Without it the ServiceAccount admission plugin is off
        (it would reject every Pod whose ServiceAccount nobody created).
    :param die_with_parent: the processes get SIGTERM when this process dies.
    :param uncached: resources whose watches the API server serves straight
        from etcd instead of its watch cache. For these, :meth:`compact_etcd`
        really expires history (a watch from before it gets 410 Gone), which
        is how tests make a watcher go through its re-list path. Secrets by
        default: the key ring's Secret is the one whose watchers must recover.
    :param extra_apiserver_args: appended to kube-apiserver's command line.
    :param address: where kube-apiserver listens and what it advertises as the
        ``kubernetes`` Service's endpoint. Loopback by default; the node tier
        (:mod:`fleetkit.cluster.node`) passes the gateway address of its pod bridge so
        that pods reach the API, and the Service's endpoints are then kept by
        the lease reconciler instead of being left empty.
    :param service_cidr: the Service ClusterIP range.
    :param extra_controllers: run by kube-controller-manager besides :data:`CONTROLLERS`.
    """

    bin_dir: Path = field(default_factory=tools_bin_dir)
    workdir: Path | None = None
    controller_manager: bool = False
    die_with_parent: bool = True
    start_timeout: float = 60.0
    uncached: tuple[str, ...] = ("secrets",)
    extra_apiserver_args: tuple[str, ...] = ()
    address: str = LOOPBACK
    service_cidr: str = SERVICE_CIDR
    extra_controllers: tuple[str, ...] = ()

    #: Chosen at start-up: etcd's client port and the API server's port.
    etcd_port: int = field(default=0, init=False)
    port: int = field(default=0, init=False)
    _components: list[_Component] = field(default_factory=list, init=False, repr=False)
    _owns_workdir: bool = field(default=False, init=False, repr=False)
    _clients: list[k8s.ApiClient] = field(default_factory=list, init=False, repr=False)
    _ca: CertificateAuthority | None = field(default=None, init=False, repr=False)

    @property
    def processes(self) -> dict[str, subprocess.Popen[bytes] | None]:
        """The running components' processes by name (None for an adopted one)."""
        return {c.name: c.process for c in self._components}

    # ---- life cycle

    def start(self) -> ControlPlane:
        """Start every component and wait (polling, with a deadline) until ready."""
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="fleetkit-cp-"))
            self._owns_workdir = True
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self._write_pki()
            deadline = time.monotonic() + self.start_timeout
            self._with_port_retry(self._start_etcd, deadline)
            self._with_port_retry(self._start_apiserver, deadline)
            if self.controller_manager:
                self._start_controller_manager(deadline)
        except BaseException:
            logs = self.log_tail()
            self.stop()
            if logs:
                sys.stderr.write(f"control plane failed to start; logs:\n{logs}\n")
            raise
        return self

    def stop(self, timeout: float = 15.0) -> None:
        """Terminate the processes (newest first), close clients, remove an owned workdir."""
        for api in self._clients:
            api.close()
        self._clients.clear()
        for component in reversed(self._components):
            _terminate(component, timeout)
        self._components.clear()
        if self._owns_workdir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- addresses and credentials

    @property
    def server(self) -> str:
        return f"https://{self.address}:{self.port}"

    @property
    def _dir(self) -> Path:
        assert self.workdir is not None, "start() the control plane first"
        return self.workdir

    @property
    def ca_file(self) -> Path:
        return self._dir / "pki" / "ca.crt"

    @property
    def admin_kubeconfig(self) -> Path:
        """A kubeconfig for a user in ``system:masters`` (everything allowed)."""
        return self._dir / "admin.kubeconfig"

    def _admin_configuration(self) -> k8s.Configuration:
        pki = self._dir / "pki"
        return k8s.Configuration(
            host=self.server,
            ssl_ca_cert=str(pki / "ca.crt"),
            cert_file=str(pki / "admin.crt"),
            key_file=str(pki / "admin.key"),
        )

    def api_client(self) -> k8s.ApiClient:
        """An admin API client; closed by :meth:`stop`."""
        api = k8s.ApiClient(self._admin_configuration())
        self._clients.append(api)
        return api

    def token_for_service_account(
        self,
        namespace: str,
        name: str,
        *,
        expiration_seconds: int = 3600,
        audiences: Sequence[str] = (),
    ) -> str:
        """A bound token for the ServiceAccount, minted through the TokenRequest API."""
        request = k8s.AuthenticationV1TokenRequest(
            spec=k8s.V1TokenRequestSpec(
                audiences=list(audiences), expiration_seconds=expiration_seconds
            )
        )
        with k8s.ApiClient(self._admin_configuration()) as api:
            response = k8s.CoreV1Api(api).create_namespaced_service_account_token(
                name, namespace, request
            )
        if response.status is None or not response.status.token:
            raise ControlPlaneError(f"TokenRequest for {namespace}/{name} returned no token")
        return response.status.token

    def kubeconfig_for_service_account(
        self, namespace: str, name: str, *, expiration_seconds: int = 3600
    ) -> Path:
        """A kubeconfig that acts as ``system:serviceaccount:NAMESPACE:NAME``, no more.

        A component run with it (the operator under the chart's RBAC, helm, a
        replica) gets exactly the rights that Role/ClusterRole bindings give the
        ServiceAccount, as it would in a pod.
        """
        token = self.token_for_service_account(
            namespace, name, expiration_seconds=expiration_seconds
        )
        return write_kubeconfig(
            self._dir / "kubeconfigs" / f"sa-{namespace}-{name}.kubeconfig",
            server=self.server,
            ca_pem=self.ca_file.read_bytes(),
            user={"token": token},
            name=f"{namespace}-{name}",
            namespace=namespace,
        )

    def api_client_for_service_account(
        self, namespace: str, name: str, *, expiration_seconds: int = 3600
    ) -> k8s.ApiClient:
        """An API client with a ServiceAccount's token; closed by :meth:`stop`."""
        token = self.token_for_service_account(
            namespace, name, expiration_seconds=expiration_seconds
        )
        configuration = k8s.Configuration(
            host=self.server,
            ssl_ca_cert=str(self.ca_file),
            api_key={"BearerToken": token},
            api_key_prefix={"BearerToken": "Bearer"},
        )
        api = k8s.ApiClient(configuration)
        self._clients.append(api)
        return api

    def kubeconfig_for_user(self, user: str, groups: Sequence[str] = ()) -> Path:
        """A kubeconfig with a client certificate for ``user`` in ``groups``.

        For acting as a person rather than a ServiceAccount (RBAC for users,
        ``helm install`` as a namespace admin...). Needs the CA: only a plane
        this process started can issue.
        """
        if self._ca is None:
            raise ControlPlaneError("this control plane was adopted: it has no CA to issue with")
        stem = f"user-{user.replace(':', '-')}"
        self._ca.issue_client(user, tuple(groups)).write(self._dir / "pki", stem)
        return self._kubeconfig_for_cert(stem)

    def helm(self, kubeconfig: Path | None = None) -> Helm:
        """The built helm, talking to this API server (as admin unless told otherwise)."""
        binary = find_tool("helm", self.bin_dir)
        if binary is None:
            raise ControlPlaneError(f"helm is not built in {self.bin_dir}: run `make tools`")
        return Helm(binary, self._dir / "helm", kubeconfig or self.admin_kubeconfig)

    # ---- diagnostics

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of every component's log, headed by its name."""
        parts = []
        for component in self._components:
            text = tail(component.log_path, lines)
            state = "running" if component.alive() else "EXITED"
            parts.append(f"----- {component.name} ({state}) {component.log_path}\n{text}")
        return "\n".join(parts)

    def print_logs(self, lines: int = 40, stream: IO[str] | None = None) -> None:
        print(self.log_tail(lines), file=stream or sys.stdout)

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
        """A raw GET as admin (``/readyz``, ``/version``, ``/metrics``...)."""
        pki = self._dir / "pki"
        context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        conn = http.client.HTTPSConnection(
            self.address, self.port, context=context, timeout=timeout
        )
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def compact_etcd(self) -> int:
        """Compact etcd up to its current revision; returns that revision.

        Every resourceVersion older than that is then gone: a watch of an
        ``uncached`` resource from one gets 410 Gone, as after a long
        disconnection in a real cluster (whose API server compacts every five
        minutes). Other resources' watches are served by the watch cache,
        which keeps its own window of history.
        """

        def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
            conn = http.client.HTTPConnection(LOOPBACK, self.etcd_port, timeout=10)
            try:
                conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
                response = conn.getresponse()
                payload: dict[str, Any] = json.loads(response.read() or b"{}")
                if response.status != 200:
                    raise ControlPlaneError(f"etcd {path}: {response.status} {payload}")
                return payload
            finally:
                conn.close()

        revision = int(post("/v3/maintenance/status", {})["header"]["revision"])
        post("/v3/kv/compaction", {"revision": str(revision), "physical": True})
        return revision

    # ---- internals

    def _write_pki(self) -> None:
        pki = self._dir / "pki"
        pki.mkdir(exist_ok=True)
        ca = self._ca = CertificateAuthority()
        (pki / "ca.crt").write_bytes(ca.cert_pem)
        ca.keypair.write(pki, "ca")
        ca.issue_serving(
            "kube-apiserver",
            dns_names=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"),
            ips=tuple(
                dict.fromkeys((LOOPBACK, self.address, _first_service_ip(self.service_cidr)))
            ),
        ).write(pki, "apiserver")
        ca.issue_client("fleetkit-admin", ("system:masters",)).write(pki, "admin")
        ca.issue_client("system:kube-controller-manager").write(pki, "controller-manager")
        signing = new_signing_key()
        (pki / "sa.key").touch(mode=0o600)
        (pki / "sa.key").write_bytes(key_pem(signing))
        (pki / "sa.pub").write_bytes(public_key_pem(signing))

    def _kubeconfig_for_cert(self, stem: str, path: Path | None = None) -> Path:
        pki = self._dir / "pki"
        return write_kubeconfig(
            path or self._dir / "kubeconfigs" / f"{stem}.kubeconfig",
            server=self.server,
            ca_pem=(pki / "ca.crt").read_bytes(),
            user={
                "client-certificate": str(pki / f"{stem}.crt"),
                "client-key": str(pki / f"{stem}.key"),
            },
        )

    def _binary(self, name: str) -> str:
        path = find_tool(name, self.bin_dir)
        if path is None:
            raise ControlPlaneError(f"{name} is not built in {self.bin_dir}: run `make tools`")
        return str(path)

    def _spawn(self, name: str, args: list[str]) -> _Component:
        log_path = self._dir / "logs" / f"{name}.log"
        log_path.parent.mkdir(exist_ok=True)
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self._dir,
                # Own session: a Ctrl-C at the terminal reaches pytest, which
                # then stops the control plane in order, instead of killing
                # etcd under a running API server.
                start_new_session=True,
                preexec_fn=_die_with_parent if self.die_with_parent else None,
            )
        component = _Component(name, args, log_path, process)
        self._components.append(component)
        return component

    def _with_port_retry(self, start: Callable[[float], None], deadline: float) -> None:
        """Run ``start``; if its port was taken between choosing and binding, choose again."""
        for _ in range(2):
            try:
                start(deadline)
            except _PortTaken:
                continue
            return
        start(deadline)

    def _wait(self, component: _Component, ready: Callable[[], bool], deadline: float) -> None:
        def check() -> bool:
            if not component.alive():
                log = tail(component.log_path)
                if "address already in use" in log:
                    self._components.remove(component)
                    shutil.rmtree(self._dir / component.name, ignore_errors=True)
                    raise _PortTaken(f"{component.name}: a port was taken\n{log}")
                raise ControlPlaneError(f"{component.name} exited during start-up\n{log}")
            try:
                return ready()
            except OSError:
                return False

        try:
            wait_for(
                check,
                timeout=max(0.0, deadline - time.monotonic()),
                interval=0.1,
                what=f"{component.name} to become ready",
            )
        except TimeoutError as exc:
            raise ControlPlaneError(f"{exc}\n{tail(component.log_path)}") from None

    def _start_etcd(self, deadline: float) -> None:
        self.etcd_port = free_port()
        peer_port = free_port()
        client_url = f"http://{LOOPBACK}:{self.etcd_port}"
        peer_url = f"http://{LOOPBACK}:{peer_port}"
        etcd = self._spawn(
            "etcd",
            [
                self._binary("etcd"),
                "--name=fleetkit",
                f"--data-dir={self._dir / 'etcd'}",  # = the component name: see _wait
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=fleetkit={peer_url}",
                # Test data is disposable: skipping fsync makes every write
                # cheap, which the API server notices on a 2-core machine.
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )

        def healthy() -> bool:
            conn = http.client.HTTPConnection(LOOPBACK, self.etcd_port, timeout=2)
            try:
                conn.request("GET", "/health")
                body = conn.getresponse().read()
            finally:
                conn.close()
            return bool(json.loads(body).get("health") == "true")

        self._wait(etcd, healthy, deadline)

    def _start_apiserver(self, deadline: float) -> None:
        self.port = free_port()
        pki = self._dir / "pki"
        disabled = [] if self.controller_manager else ["ServiceAccount"]
        args = [
            self._binary("kube-apiserver"),
            f"--etcd-servers=http://{LOOPBACK}:{self.etcd_port}",
            f"--bind-address={self.address}",
            f"--advertise-address={self.address}",
            f"--secure-port={self.port}",
            f"--cert-dir={self._dir / 'apiserver'}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--service-account-issuer={self.server}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--authorization-mode=RBAC",
            f"--service-cluster-ip-range={self.service_cidr}",
            # No kube-proxy: reach aggregated APIs and webhooks at endpoint
            # addresses (loopback here), never at a ClusterIP.
            "--enable-aggregator-routing=true",
            # The `kubernetes` Service's endpoints would point at loopback,
            # which Endpoints validation refuses: on loopback nothing needs
            # them; on a pod-reachable address they are kept as usual.
            f"--endpoint-reconciler-type={'none' if self.address == LOOPBACK else 'lease'}",
            "--allow-privileged=true",
            "--profiling=false",
        ]
        if disabled:
            args.append(f"--disable-admission-plugins={','.join(disabled)}")
        if self.uncached:
            args.append(f"--watch-cache-sizes={','.join(f'{r}#0' for r in self.uncached)}")
        args += self.extra_apiserver_args
        apiserver = self._spawn("kube-apiserver", args)
        self._kubeconfig_for_cert("admin", self.admin_kubeconfig)

        def ready() -> bool:
            status, _ = self.get("/readyz", timeout=2)
            return status == 200

        self._wait(apiserver, ready, deadline)

    def _start_controller_manager(self, deadline: float) -> None:
        pki = self._dir / "pki"
        kubeconfig = self._kubeconfig_for_cert("controller-manager")
        manager = self._spawn(
            "kube-controller-manager",
            [
                self._binary("kube-controller-manager"),
                f"--kubeconfig={kubeconfig}",
                # As in a real cluster: each controller acts as its own
                # ServiceAccount in kube-system, under the bootstrap RBAC.
                "--use-service-account-credentials=true",
                "--leader-elect=false",
                "--secure-port=0",
                f"--root-ca-file={pki / 'ca.crt'}",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--cluster-signing-cert-file={pki / 'ca.crt'}",
                f"--cluster-signing-key-file={pki / 'ca.key'}",
                f"--service-cluster-ip-range={self.service_cidr}",
                f"--controllers={','.join((*CONTROLLERS, *self.extra_controllers))}",
            ],
        )

        # The serviceaccount controller has run once the default namespace has
        # its "default" ServiceAccount: the manager is up and acting.
        def acting() -> bool:
            status, _ = self.get("/api/v1/namespaces/default/serviceaccounts/default", timeout=2)
            return status == 200

        self._wait(manager, acting, deadline)

    # ---- up / down state

    def state(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "workdir": str(self._dir),
            "admin_kubeconfig": str(self.admin_kubeconfig),
            "components": [
                {
                    "name": c.name,
                    "pid": c.process.pid if c.process else c.pid,
                    "args": c.args,
                    "log": str(c.log_path),
                }
                for c in self._components
            ],
        }

    @classmethod
    def adopt(cls, state: dict[str, Any]) -> ControlPlane:
        """A handle on processes a previous ``up`` started, so ``stop()`` ends them."""
        host, port = state["server"].removeprefix("https://").rsplit(":", 1)
        plane = cls(workdir=Path(state["workdir"]), die_with_parent=False, address=host)
        plane._owns_workdir = True
        plane.port = int(port)
        for c in state["components"]:
            plane._components.append(_Component(c["name"], c["args"], Path(c["log"]), pid=c["pid"]))
        return plane


#: Controllers run by kube-controller-manager: what Deployments, namespaces,
#: ServiceAccounts, garbage collection and Services need; none that expect nodes.
CONTROLLERS = (
    "serviceaccount-token-controller",
    "serviceaccount-controller",
    "root-ca-certificate-publisher-controller",
    "namespace-controller",
    "garbage-collector-controller",
    "clusterrole-aggregation-controller",
    "deployment-controller",
    "replicaset-controller",
    "statefulset-controller",
    "job-controller",
    "cronjob-controller",
    "disruption-controller",
    "horizontal-pod-autoscaler-controller",
    "endpointslice-controller",
    "endpoints-controller",
    "resourcequota-controller",
)


def _first_service_ip(cidr: str) -> str:
    """The ``kubernetes`` Service's ClusterIP: the first address of the range."""
    import ipaddress

    return str(next(ipaddress.ip_network(cidr).hosts()))


def _terminate(component: _Component, timeout: float) -> None:
    if component.process is not None:
        process = component.process
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout)
        return
    pid = component.pid
    if pid is None or not _pid_runs(pid, component.args[0]):
        return
    os.kill(pid, signal.SIGTERM)
    try:
        wait_for(
            lambda: not _pid_runs(pid, component.args[0]),
            timeout=timeout,
            interval=0.1,
            what=f"{component.name} to exit",
        )
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# --------------------------------------------------------------------------- fixtures


def session_control_plane(
    workdir: Path | None = None, *, controller_manager: bool | None = None
) -> Iterator[ControlPlane]:
    """Body of a session-scoped pytest fixture: skip/fail on missing tools, start, stop.

    ``controller_manager=None`` runs kube-controller-manager when it was built.
    Use as ``yield from session_control_plane(tmp_path_factory.mktemp("cp"))``.
    """
    bin_dir = require_tools(REQUIRED_TOOLS)
    if controller_manager is None:
        controller_manager = not missing_tools(OPTIONAL_TOOLS, bin_dir)
    elif controller_manager:
        require_tools(OPTIONAL_TOOLS, bin_dir)
    plane = ControlPlane(bin_dir=bin_dir, workdir=workdir, controller_manager=controller_manager)
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


@contextlib.contextmanager
def temporary_namespace(api: k8s.ApiClient, stem: str) -> Iterator[str]:
    """A fresh namespace ``STEM-xxxxxx``, deleted (without waiting) on exit.

    Deletion completes only where kube-controller-manager runs its namespace
    controller; without it the namespace stays Terminating, which is harmless
    in a throwaway control plane.
    """
    stem = re.sub(r"[^a-z0-9-]+", "-", stem.lower()).strip("-")[:40].strip("-") or "test"
    name = f"{stem}-{uuid.uuid4().hex[:6]}"
    core = k8s.CoreV1Api(api)
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
    try:
        yield name
    finally:
        core.delete_namespace(name)
