"""The node backend of the ``Fleet`` interface: replicas are real pods of the real image.

:class:`NodeFleet` runs the replicas as the chart's Deployment
(``helm install`` of ``charts/mcpfleet`` with only the replicas on, the images
``make image`` built) on a :class:`~fleetkit.cluster.node.Node`: the kubelet mounts the key
ring from a real Secret (a volume, no ``subPath``, so updates reach the files),
runs the readiness (``/readyz``) and liveness (``/healthz``) probes, and sends
SIGTERM when a pod is deleted. The replicas run as UID 10001 with a read-only
root filesystem and no capabilities.

Redis and the routers are processes on this machine, as in the other backends:

- Redis listens on loopback and on the bridge's gateway address, so the pods
  reach it there and the tests read attestations on loopback;
- the routers run on 127.0.0.1 and reach each replica at the address it
  attests (its pod IP, routed through the bridge). The scenarios measure what
  the router does with real pods behind it; a router pod would add only a
  port-forward in front of the same code. (The chart's router pods, Redis
  and operator are installed by the e2e tier, ``tests/e2e``.)

The operations a scenario may do map onto what happens to pods in a cluster:

- :meth:`NodeFleet.kill`: SIGKILL the replica's container (through containerd),
  as the OOM killer would: no drain. The kubelet restarts it in the same pod;
- :meth:`NodeFleet.force_delete`: delete the pod with no grace period;
- :meth:`NodeFleet.drain`: delete the pod; the kubelet sends SIGTERM and waits
  ``terminationGracePeriodSeconds``; the ReplicaSet makes a replacement;
- :meth:`NodeFleet.rotate_step`: write the Secret (read-modify-update with its
  resourceVersion, as the operator does), then, when ``nudge`` is on, bump the
  :data:`~mcpfleet.contract.KEYRING_NUDGE_ANNOTATION` on every replica
  pod so the kubelet refreshes the volume now rather than at its next sync.
"""

from __future__ import annotations

import base64
import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from fleetkit.cluster.chartkit import CHART
from fleetkit.cluster.controlplane import Helm, tools_bin_dir, wait_for
from fleetkit.cluster.node import GATEWAY, Node
from fleetkit.cluster.pods import meta, name_of
from fleetkit.fleet import ProcessFleet, diagnostics, require_redis, running
from mcpfleet.contract import (
    COMPONENT_LABEL,
    KEYRING_FILE,
    KEYRING_LABEL,
    KEYRING_NUDGE_ANNOTATION,
)
from mcpfleet.dev.fleet import FleetError
from mcpfleet.keys.ring import KeyRing

SERVER_COMPONENT = "server"
#: The helm release of the chart in the fleet's namespace ("<release>-server" is the Deployment).
RELEASE = "mcpfleet"
KEYS_MOUNT = "/etc/mcpfleet/keys"
KEYS_MODE = 0o440
REPLICA_PORT = 8001
#: The replica's own drain deadline, and the kubelet's: the chart's preStop pause
#: (1 s), the deadline, the drain linger (2 s) and 5 s.
DRAIN_TIMEOUT = 30
GRACE_SECONDS = 1 + DRAIN_TIMEOUT + 2 + 5


@dataclass(kw_only=True)
class NodeFleet(ProcessFleet):
    """Replica pods on a real node, Redis and routers on this machine.

    :param node: a started :class:`~fleetkit.cluster.node.Node`.
    :param namespace: an existing namespace for the Secret and the Deployment.
    :param nudge: bump the pods' annotation after each Secret write.
    """

    node: Node
    namespace: str
    secret_name: str = "mcpfleet-keys"
    deployment: str = f"{RELEASE}-server"
    nudge: bool = True
    _api: k8s.ApiClient | None = field(default=None, init=False, repr=False)

    # --- clients ----------------------------------------------------------------------

    @property
    def api(self) -> k8s.ApiClient:
        if self._api is None:
            self._api = self.node.api_client()
        return self._api

    @property
    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.api)

    @property
    def apps(self) -> k8s.AppsV1Api:
        return k8s.AppsV1Api(self.api)

    @property
    def pod_redis_url(self) -> str:
        """Redis as the pods reach it: on the bridge's gateway address."""
        return f"redis://{GATEWAY}:{self.redis_port}/0"

    # --- life cycle -------------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.prepare_keys()
        self.start_redis(timeout)
        self.install_chart()
        self.wait_serving(self.replicas, timeout)
        self.start_routers(timeout)

    #: redis-server on loopback and on the gateway address (the pods' way in).
    redis_bind = ("127.0.0.1", GATEWAY)

    def stop(self) -> None:
        for proc in self.router_procs:
            proc.stop(10)
        with contextlib.suppress(Exception):
            self.helm.run("uninstall", RELEASE, "--namespace", self.namespace, timeout=120)
        with contextlib.suppress(ApiException):
            self.core.delete_collection_namespaced_pod(
                self.namespace, label_selector=self.pod_selector, grace_period_seconds=0
            )
        if self.redis is not None:
            self.redis.stop()
        if self._api is not None:
            self._api.close()
            self._api = None

    # --- the chart ----------------------------------------------------------------------

    def pod_labels(self) -> dict[str, str]:
        """The chart's selector labels of the replica pods."""
        return {
            "app.kubernetes.io/name": "mcpfleet",
            "app.kubernetes.io/instance": RELEASE,
            COMPONENT_LABEL: SERVER_COMPONENT,
        }

    @property
    def pod_selector(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.pod_labels().items())

    @property
    def helm(self) -> Helm:
        return Helm(
            tools_bin_dir() / "helm", self.workdir / "helm", kubeconfig=self.node.admin_kubeconfig
        )

    def chart_values(self) -> dict[str, Any]:
        """The chart's replicas alone: Redis and the routers run here, the test does the
        operator's Secret writes, so neither the operator nor a KeyRing is installed."""
        args = list(self.replica_args)
        values: dict[str, Any] = {
            **self.node.images.helm_values(),
            "fleet": self.fleet,
            "server": {
                "app": self.app,
                "replicas": self.replicas,
                "port": REPLICA_PORT,
                "drain": {"timeout": DRAIN_TIMEOUT},
                # Requests only: a busy 2-core machine must not throttle the pods.
                "resources": {"requests": {"cpu": "50m", "memory": "96Mi"}},
                "extraArgs": args,
                # Every test client is one principal: no limits per principal.
                "limits": {"sessions": 0, "rounds": {"rate": 0}},
            },
            "keyRing": {"create": False, "secretName": self.secret_name},
            "operator": {"enabled": False},
            "router": {"enabled": False},
            "redis": {"enabled": False, "external": {"url": self.pod_redis_url}},
            "monitoring": {"dashboards": {"enabled": False}},
        }
        return values

    def install_chart(self) -> None:
        """``helm install`` of charts/mcpfleet: the replicas' Deployment is the chart's."""
        path = self.workdir / "values.yaml"
        path.write_text(yaml.safe_dump(self.chart_values()))
        self.helm.run(
            "install", RELEASE, str(CHART), "--namespace", self.namespace, "-f", str(path),
            timeout=300,
        )  # fmt: skip

    def prepare_keys(self) -> None:
        """The key ring Secret, as the operator would have made it."""
        secret = {
            "metadata": {
                "name": self.secret_name,
                "labels": {"app.kubernetes.io/name": "mcpfleet", KEYRING_LABEL: self.secret_name},
            },
            "type": "Opaque",
            "data": {KEYRING_FILE: _b64(KeyRing.generate().to_document())},
        }
        # The client's validate_call makes the V1Secret of the dict.
        self.core.create_namespaced_secret(self.namespace, secret)  # type: ignore[arg-type]

    # --- pods ---------------------------------------------------------------------------

    def pods(self) -> list[k8s.V1Pod]:
        items: list[k8s.V1Pod] = self.core.list_namespaced_pod(
            self.namespace, label_selector=self.pod_selector
        ).items
        return items

    def replica_names(self) -> list[str]:
        """Replica pods that are Ready and not being deleted."""
        return sorted(name_of(p) for p in self.pods() if _ready(p))

    def wait_serving(self, count: int, timeout: float = 180.0) -> list[str]:
        """Until ``count`` replica pods are Ready and each is attested in Redis."""

        def serving() -> list[str] | None:
            self._check_pods()
            names = self.replica_names()
            attested = self.attestations()
            live = [n for n in names if n in attested and attested[n].state == "serving"]
            return live if len(live) >= count else None

        result: list[str] = wait_for(
            serving, timeout=timeout, interval=0.5, what=f"{count} serving replica pods"
        )
        return result

    def _check_pods(self) -> None:
        """Fail at once on what will never become ready (bad image, crash loop)."""
        for pod in self.pods():
            for status in (pod.status.container_statuses or []) if pod.status else []:
                waiting = status.state.waiting if status.state else None
                if waiting and waiting.reason in ("ErrImageNeverPull", "CrashLoopBackOff"):
                    raise FleetError(
                        f"pod {name_of(pod)}: {waiting.reason}: {waiting.message}\n"
                        f"{self.pod_log(name_of(pod), previous=True)}"
                    )

    def pod_log(self, name: str, *, lines: int = 40, previous: bool = False) -> str:
        """The replica's output, read through the kubelet (what ``kubectl logs`` shows)."""
        try:
            text: str = self.core.read_namespaced_pod_log(
                name, self.namespace, tail_lines=lines, previous=previous
            )
        except ApiException as exc:
            return f"(no log: {exc.status} {exc.reason})"
        return text

    def container_id(self, name: str) -> str:
        pod = self.core.read_namespaced_pod(name, self.namespace)
        assert pod.status is not None and pod.status.container_statuses is not None, name
        (status,) = pod.status.container_statuses
        if not status.container_id:
            raise FleetError(f"pod {name} has no running container")
        return str(status.container_id).removeprefix("containerd://")

    def restarts(self, name: str) -> int:
        pod = self.core.read_namespaced_pod(name, self.namespace)
        assert pod.status is not None, name
        return sum(s.restart_count or 0 for s in pod.status.container_statuses or [])

    def kill(self, name: str) -> None:
        """SIGKILL the replica's container: no drain. Returns once it is dead."""
        container = self.container_id(name)
        self.node.ctr("tasks", "kill", "--signal", "SIGKILL", container)

        def dead() -> bool:
            lines = self.node.ctr("tasks", "ls").splitlines()[1:]
            return not any(line.split()[0] == container and "RUNNING" in line for line in lines)

        wait_for(dead, timeout=15, interval=0.1, what=f"{name}'s container to die")

    def force_delete(self, name: str) -> None:
        """Delete the pod with no grace period (it leaves the API at once)."""
        self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)

    def drain(self, name: str) -> None:
        """Delete the pod: the kubelet sends SIGTERM and gives it the grace period."""
        self.core.delete_namespaced_pod(name, self.namespace)

    def pod_exists(self, name: str) -> bool:
        try:
            self.core.read_namespaced_pod(name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    # --- the key ring -------------------------------------------------------------------

    def keyring_secret(self) -> k8s.V1Secret:
        secret: k8s.V1Secret = self.core.read_namespaced_secret(self.secret_name, self.namespace)
        return secret

    def ring(self) -> KeyRing:
        data = self.keyring_secret().data or {}
        return KeyRing.from_document(base64.b64decode(data[KEYRING_FILE]))

    def rotate_step(self, step: str) -> KeyRing:
        """Read the Secret, apply one step, update it (resourceVersion), then nudge the pods."""
        secret = self.keyring_secret()
        assert secret.data is not None, self.secret_name
        ring: KeyRing = getattr(
            KeyRing.from_document(base64.b64decode(secret.data[KEYRING_FILE])), step
        )()
        secret.data = {**secret.data, KEYRING_FILE: _b64(ring.to_document())}
        written = self.core.replace_namespaced_secret(self.secret_name, self.namespace, secret)
        if self.nudge:
            self.nudge_pods(str(meta(written).resource_version))
        return ring

    def nudge_pods(self, generation: str) -> None:
        """Bump the annotation on every replica pod: the kubelet syncs a pod that changed."""
        body = {"metadata": {"annotations": {KEYRING_NUDGE_ANNOTATION: generation}}}
        for pod in self.pods():
            if meta(pod).deletion_timestamp is None:
                with contextlib.suppress(ApiException):  # gone meanwhile
                    self.core.patch_namespaced_pod(name_of(pod), self.namespace, body)

    def wait_attested(self, kids: tuple[str, ...], timeout: float = 30.0) -> None:
        """Until every Ready replica pod attests exactly ``kids``."""

        def converged() -> bool:
            attested = self.attestations()
            names = self.replica_names()
            return bool(names) and all(n in attested and attested[n].kids == kids for n in names)

        wait_for(converged, timeout=timeout, interval=0.1, what=f"every pod to attest {list(kids)}")

    # --- diagnostics --------------------------------------------------------------------

    def logs(self) -> Iterator[tuple[str, str]]:
        if self.redis is not None:
            yield "redis", self.redis.tail(10)
        try:
            pods = self.pods()
        except Exception as exc:
            yield "pods", f"(not readable: {type(exc).__name__}: {exc})"
            pods = []
        for pod in pods:
            yield name_of(pod), self.pod_log(name_of(pod))
        for proc in self.router_procs:
            yield proc.name, proc.tail()

    def api_state(self) -> str:
        out = []
        try:
            for pod in self.pods():
                st = pod.status
                assert st is not None, name_of(pod)
                statuses = [
                    (s.name, s.ready, s.restart_count, s.state.to_dict() if s.state else None)
                    for s in st.container_statuses or []
                ]
                out.append(
                    f"pod {name_of(pod)}: phase={st.phase} ip={st.pod_ip}"
                    f" deleting={meta(pod).deletion_timestamp} containers={statuses}"
                )
            events = self.core.list_namespaced_event(self.namespace).items[-20:]
            out += [f"event {e.involved_object.name}: {e.reason}: {e.message}" for e in events]
        except Exception as exc:
            out.append(f"(API not readable: {type(exc).__name__}: {exc})")
        return "\n".join(out)


def _ready(pod: k8s.V1Pod) -> bool:
    if meta(pod).deletion_timestamp is not None or pod.status is None:
        return False
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def node_diagnostics(nf: NodeFleet) -> str:
    """The fleet's (Redis, pod logs through the kubelet, routers), pods and events, node logs."""
    return "\n".join(
        [
            diagnostics(nf),
            "--- pods and events ---",
            nf.api_state(),
            "--- node logs (tail) ---",
            nf.node.log_tail(15),
        ]
    )


@contextlib.contextmanager
def node_fleet(
    node: Node,
    namespace: str,
    workdir: Path,
    *,
    replicas: int = 3,
    routers: int = 1,
    replica_args: Sequence[str] = (),
    router_args: Sequence[str] = (),
    fleet: str = "test",
    nudge: bool = True,
) -> Iterator[NodeFleet]:
    """A :class:`NodeFleet`, torn down on exit (Deployment and pods deleted)."""
    require_redis()
    nf = NodeFleet(
        workdir,
        replicas=replicas,
        routers=routers,
        fleet=fleet,
        replica_args=tuple(replica_args),
        router_args=tuple(router_args),
        node=node,
        namespace=namespace,
        nudge=nudge,
    )
    with running(nf, node_diagnostics):
        yield nf


def wait_gone(nf: NodeFleet, name: str, timeout: float) -> float:
    """Seconds until pod ``name`` has left the API (its containers stopped)."""
    start = time.monotonic()
    wait_for(lambda: not nf.pod_exists(name), timeout=timeout, interval=0.2, what=f"{name} gone")
    return time.monotonic() - start
