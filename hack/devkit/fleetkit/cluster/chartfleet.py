"""The ``Fleet`` interface over a release of the chart: ``helm install`` on a real cluster.

:class:`ChartFleet` is what the end-to-end tier drives: every object comes
from ``charts/mcpfleet`` (replicas, routers, Redis, the operator and its
KeyRing), installed, upgraded, tested and uninstalled with the real helm.
The tests are the router Service's clients (its address from the provider),
read the attestations from the release's Redis, and rotate keys the way a
user does: a KeyRotation created with kubectl, carried out by the operator.
"""

from __future__ import annotations

import base64
import contextlib
import json
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import redis
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from fleetkit.cluster.chartkit import CHART
from fleetkit.cluster.controlplane import Helm, tools_bin_dir, wait_for
from fleetkit.cluster.pods import meta, name_of
from fleetkit.cluster.providers import Cluster
from mcpfleet.contract import KEYRING_FILE, Attestation, RedisKeys
from mcpfleet.keys.ring import KeyRing
from mcpfleet.registry import read_replicas_sync
from mcpfleet_operator.api import rotation_manifest

GROUP, VERSION = "mcpfleet.dev", "v1alpha1"


#: Test releases run without limits per principal (every test client comes through
#: one port-forward: one principal); a test of the limits sets its own values.
NO_LIMITS_VALUES: dict[str, Any] = {
    "server": {"limits": {"sessions": 0, "listen": 0, "rounds": {"rate": 0}}}
}


@dataclass
class ChartFleet:
    """One release of the chart in ``namespace`` of ``cluster``."""

    cluster: Cluster
    namespace: str
    workdir: Path
    release: str = "mcpfleet"
    values: dict[str, Any] = field(default_factory=dict)
    #: The Secret with the Redis users' passwords when the release sets
    #: redis.auth.existingSecret (else the chart's "<fullname>-redis-auth").
    redis_users_secret: str = ""
    _helm: Helm | None = field(default=None, init=False, repr=False)

    # --- names (as the chart's "mcpfleet.fullname" makes them)

    @property
    def fullname(self) -> str:
        return self.release if "mcpfleet" in self.release else f"{self.release}-mcpfleet"

    @property
    def fleet(self) -> str:
        return self.fullname

    @property
    def keyring(self) -> str:
        return f"{self.fullname}-keys"

    @property
    def helm(self) -> Helm:
        if self._helm is None:
            self._helm = Helm(
                tools_bin_dir() / "helm", self.workdir / "helm", kubeconfig=self.cluster.kubeconfig
            )
        return self._helm

    @property
    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.cluster.api)

    @property
    def custom(self) -> k8s.CustomObjectsApi:
        return k8s.CustomObjectsApi(self.cluster.api)

    def selector(self, component: str) -> str:
        return f"app.kubernetes.io/instance={self.release},app.kubernetes.io/component={component}"

    # --- helm

    def values_file(self) -> Path:
        path = self.workdir / "values.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        base = merge(NO_LIMITS_VALUES, self.cluster.values)
        path.write_text(yaml.safe_dump(merge(base, self.values)))
        return path

    def install(self, *args: str, timeout: float = 600) -> str:
        return self.helm.run(
            "install",
            self.release,
            str(CHART),
            "--namespace",
            self.namespace,
            "--create-namespace",
            "-f",
            str(self.values_file()),
            "--wait",
            "--timeout",
            f"{int(timeout)}s",
            *args,
            timeout=timeout + 30,
        ).stdout

    def upgrade(self, *args: str, timeout: float = 600) -> str:
        return self.helm.run(
            "upgrade",
            self.release,
            str(CHART),
            "--namespace",
            self.namespace,
            # New chart defaults, with the values the release was installed with.
            "--reset-then-reuse-values",
            "--wait",
            "--timeout",
            f"{int(timeout)}s",
            *args,
            timeout=timeout + 30,
        ).stdout

    def test(self, *args: str) -> str:
        return self.helm.run(
            "test", self.release, "--namespace", self.namespace, *args, timeout=300
        ).stdout

    def uninstall(self) -> str:
        return self.helm.run(
            "uninstall", self.release, "--namespace", self.namespace, "--wait", timeout=300
        ).stdout

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        kubectl = tools_bin_dir() / "kubectl"
        result = subprocess.run(
            [
                str(kubectl),
                "--kubeconfig",
                str(self.cluster.kubeconfig),
                "-n",
                self.namespace,
                *args,
            ],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout

    # --- the Fleet interface

    @property
    def url(self) -> str:
        host, port = self.cluster.reach(self.namespace, f"{self.fullname}-router", 80)
        return f"http://{host}:{port}/mcp"

    def router_url(self, index: int) -> str:
        return self.url

    def pods(self, component: str = "server") -> list[k8s.V1Pod]:
        items: list[k8s.V1Pod] = self.core.list_namespaced_pod(
            self.namespace, label_selector=self.selector(component)
        ).items
        return items

    def replica_names(self) -> list[str]:
        return sorted(name_of(p) for p in self.pods() if ready(p))

    def redis_client(self) -> redis.Redis:
        """The release's Redis, as the operator's read-only user when auth is on."""
        host, port = self.cluster.reach(self.namespace, f"{self.fullname}-redis", 6379)
        name = self.redis_users_secret or f"{self.fullname}-redis-auth"
        try:
            auth = self.core.read_namespaced_secret(name, self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            return redis.Redis(host=host, port=port, socket_timeout=3)
        assert auth.data is not None, name
        password = base64.b64decode(auth.data["operator"]).decode()
        return redis.Redis(
            host=host, port=port, username="operator", password=password, socket_timeout=3
        )

    def attestations(self) -> dict[str, Attestation]:
        with contextlib.closing(self.redis_client()) as client:
            return read_replicas_sync(client, RedisKeys(self.fleet))

    def ring(self) -> KeyRing:
        secret = self.core.read_namespaced_secret(self.keyring, self.namespace)
        assert secret.data is not None, self.keyring
        return KeyRing.from_document(base64.b64decode(secret.data[KEYRING_FILE]))

    def wait_attested(self, kids: tuple[str, ...], timeout: float = 60.0) -> None:
        def converged() -> bool:
            attested = self.attestations()
            names = self.replica_names()
            return bool(names) and all(n in attested and attested[n].kids == kids for n in names)

        wait_for(converged, timeout=timeout, interval=0.2, what=f"every pod to attest {list(kids)}")

    def wait_serving(self, count: int, timeout: float = 300.0) -> list[str]:
        def serving() -> list[str] | None:
            attested = self.attestations()
            live = [
                n for n in self.replica_names() if n in attested and attested[n].state == "serving"
            ]
            return live if len(live) >= count else None

        result: list[str] = wait_for(
            serving, timeout=timeout, interval=0.5, what=f"{count} serving"
        )
        return result

    def drain(self, name: str) -> None:
        """Delete the pod: the kubelet runs preStop, sends SIGTERM, waits the grace period."""
        self.core.delete_namespaced_pod(name, self.namespace)

    def kill(self, name: str) -> None:
        self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)

    def rotate_step(self, step: str) -> KeyRing:
        raise NotImplementedError("the release's operator owns the Secret: use rotate()")

    def pod_exists(self, name: str) -> bool:
        try:
            self.core.read_namespaced_pod(name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    # --- key rotation, as a user does it

    def rotate(self, timeout: float = 300) -> tuple[str, ...]:
        """Create a KeyRotation with kubectl; wait until it is Complete; the ring's kids."""
        name = f"{self.keyring}-{int(time.time() * 1000)}"
        manifest = rotation_manifest(self.keyring, name=name, reason="e2e")
        self.kubectl("create", "-f", "-", stdin=json.dumps(manifest))

        def complete() -> dict[str, Any] | None:
            obj = cast(
                dict[str, Any],
                self.custom.get_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, "keyrotations", name
                ),
            )
            phase = (obj.get("status") or {}).get("phase")
            if phase in ("Failed", "Aborted"):
                raise AssertionError(f"rotation {name} ended {phase}: {obj.get('status')}")
            return obj if phase == "Complete" else None

        wait_for(complete, timeout=timeout, interval=0.5, what=f"KeyRotation {name} Complete")
        return self.ring().kids

    # --- diagnostics

    def diagnostics(self) -> str:
        out = []
        try:
            for pod in self.core.list_namespaced_pod(self.namespace).items:
                st = pod.status
                assert st is not None, name_of(pod)
                out.append(
                    f"--- pod {name_of(pod)}: phase={st.phase} ip={st.pod_ip} "
                    f"deleting={meta(pod).deletion_timestamp}"
                )
                assert pod.spec is not None, name_of(pod)
                with contextlib.suppress(ApiException):
                    for c in pod.spec.containers:
                        out.append(
                            self.core.read_namespaced_pod_log(
                                name_of(pod), self.namespace, container=c.name, tail_lines=15
                            )
                        )
            events = self.core.list_namespaced_event(self.namespace).items[-25:]
            out += [f"event {e.involved_object.name}: {e.reason}: {e.message}" for e in events]
        except Exception as exc:
            out.append(f"(API not readable: {type(exc).__name__}: {exc})")
        out.append(self.cluster.diagnostics())
        return "\n".join(out)


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` on ``base`` as helm merges values files: maps key by key, the rest replaced."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def ready(pod: k8s.V1Pod) -> bool:
    if meta(pod).deletion_timestamp is not None or pod.status is None:
        return False
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])
