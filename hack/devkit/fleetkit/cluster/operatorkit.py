"""The key ring operator on a real control plane: chart rendering, RBAC, the process, the CRs.

What a cluster install does for the operator, done for real with the tools
the control-plane tier runs: ``helm template`` renders ``charts/mcpfleet``;
its CRDs are created and its RBAC objects (ServiceAccount, Role,
RoleBinding) and KopfPeering are applied as rendered; then ``mcpfleet
operator`` runs as a child process with a kubeconfig holding a token of that
ServiceAccount, so it has exactly the chart's rights and no more.

Used by the control-plane tests (``tests/controlplane/test_operator*.py``),
by ``python -m fleetkit.cluster up --fleet N`` and by the bench.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import redis
import yaml
from kubernetes import client as k8s
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from fleetkit.cluster.controlplane import ControlPlane, free_port, repo_root, tail, wait_for
from fleetkit.cluster.cpfleet import ControlPlaneFleet, acl_control_plane_fleet, control_plane_fleet
from fleetkit.cluster.helm import Helm
from fleetkit.cluster.pods import meta
from fleetkit.fleet import FleetOptions
from fleetkit.redisrig import RedisFleet, RedisServer
from mcpfleet.config import DEFAULT_APP
from mcpfleet.contract import RedisKeys
from mcpfleet.registry import read_replicas_sync
from mcpfleet_operator.api import GROUP, KEYRINGS, KEYROTATIONS, VERSION, Mode, rotation_manifest
from mcpfleet_operator.rotation import sealing_is_safe

CHART = repo_root() / "charts" / "mcpfleet"
RELEASE = "mcpfleet"
#: The ServiceAccount the chart gives the operator (release "mcpfleet").
OPERATOR_ACCOUNT = "mcpfleet-operator"
PEERING = "mcpfleet"
#: The kinds of the rendered chart applied for the operator (no Deployment:
#: there is no kubelet to run its image; the process runs here instead).
OPERATOR_KINDS = ("ServiceAccount", "Role", "RoleBinding", "KopfPeering")


# --------------------------------------------------------------------------- chart


def render_chart(helm: Helm, namespace: str, *values: str) -> list[dict[str, Any]]:
    """``helm template`` of the chart (CRDs included, hooks left out), as a list of objects."""
    args = ["template", RELEASE, str(CHART), "--namespace", namespace, "--include-crds"]
    for value in values:
        args += ["--set", value]
    out = helm.run(*args).stdout
    # Hooks (the helm test Pod, the uninstall Job and its account) are not the release's objects.
    return [
        d
        for d in yaml.safe_load_all(out)
        if d and "helm.sh/hook" not in (d["metadata"].get("annotations") or {})
    ]


def apply_crds(api: k8s.ApiClient, docs: Sequence[dict[str, Any]], timeout: float = 60) -> None:
    """Create (or update) the CRDs among ``docs`` and wait until each is Established."""
    ext = k8s.ApiextensionsV1Api(api)
    crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    for crd in crds:
        name = crd["metadata"]["name"]
        try:
            # The client's validate_call makes the model of a dict (here and below).
            ext.create_custom_resource_definition(crd)  # type: ignore[arg-type]
        except ApiException as exc:
            if exc.status != 409:
                raise
            current = ext.read_custom_resource_definition(name)
            crd = {
                **crd,
                "metadata": {
                    **crd["metadata"],
                    "resourceVersion": meta(current).resource_version,
                },
            }
            ext.replace_custom_resource_definition(name, crd)  # type: ignore[arg-type]

    def established(name: str) -> bool:
        status = ext.read_custom_resource_definition(name).status
        assert status is not None, name
        conditions = status.conditions or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    for crd in crds:
        name = crd["metadata"]["name"]
        wait_for(
            functools.partial(established, name), timeout=timeout, what=f"CRD {name} Established"
        )


def apply_operator_objects(
    api: k8s.ApiClient, namespace: str, docs: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Create the operator's ServiceAccount, RBAC and KopfPeering exactly as rendered."""
    core, rbac = k8s.CoreV1Api(api), k8s.RbacAuthorizationV1Api(api)
    custom = k8s.CustomObjectsApi(api)
    applied = []
    for doc in docs:
        kind = doc["kind"]
        if kind not in OPERATOR_KINDS:
            continue
        if kind == "ServiceAccount":
            core.create_namespaced_service_account(namespace, doc)  # type: ignore[arg-type]
        elif kind == "Role":
            rbac.create_namespaced_role(namespace, doc)  # type: ignore[arg-type]
        elif kind == "RoleBinding":
            rbac.create_namespaced_role_binding(namespace, doc)  # type: ignore[arg-type]
        else:
            custom.create_namespaced_custom_object("kopf.dev", "v1", namespace, "kopfpeerings", doc)
        applied.append(doc)
    return applied


# --------------------------------------------------------------------------- process


@dataclass
class OperatorProcess:
    """``mcpfleet operator`` as a child process, acting as the chart's ServiceAccount."""

    kubeconfig: Path
    namespace: str
    redis_url: str
    log: Path
    #: The Redis password, in a file (never in the URL, the environment or argv).
    redis_password_file: Path | None = None
    priority: int = 100
    stall_after: float = 120.0
    tasks_wait_limit: float = 3600.0
    peering_lifetime: int = 3
    metrics_port: int = 0
    health_port: int = 0
    identity: str = ""
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "mcpfleet.cli",
            "operator",
            "--namespace",
            self.namespace,
            "--metrics-host",
            "127.0.0.1",
            "--metrics-port",
            str(self.metrics_port),
            "--health-host",
            "127.0.0.1",
            "--health-port",
            str(self.health_port),
            "--peering",
            PEERING,
            "--priority",
            str(self.priority),
            "--peering-lifetime",
            str(self.peering_lifetime),
            "--stall-after",
            str(self.stall_after),
            "--tasks-wait-limit",
            str(self.tasks_wait_limit),
            *(
                ["--redis-password-file", str(self.redis_password_file)]
                if self.redis_password_file
                else []
            ),
        ]

    def start(self, wait: float = 60.0) -> OperatorProcess:
        self.metrics_port = self.metrics_port or free_port()
        self.health_port = self.health_port or free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBE")}
        env |= {
            "KUBECONFIG": str(self.kubeconfig),
            "MCPFLEET_REDIS_URL": self.redis_url,
            "PYTHONUNBUFFERED": "1",
        }
        if self.identity:
            env["POD_ID"] = self.identity
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as fh:
            self.popen = subprocess.Popen(
                self.argv(),
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        wait_for(self._healthy, timeout=wait, interval=0.1, what="the operator's /healthz")
        return self

    def _healthy(self) -> bool:
        if not self.alive:
            raise RuntimeError(f"the operator exited:\n{self.tail()}")
        return self.healthz()

    def healthz(self) -> bool:
        try:
            url = f"http://127.0.0.1:{self.health_port}/healthz"
            with urllib.request.urlopen(url, timeout=2) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill(self) -> None:
        """SIGKILL: no cleanup, no peering goodbye, exactly a crash."""
        if self.popen is not None and self.alive:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(10)

    def stop(self) -> None:
        if self.popen is None or not self.alive:
            return
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(15)
        except subprocess.TimeoutExpired:
            self.kill()

    def metrics(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        """Every sample on the metrics port, keyed by (name, labels)."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            text = resp.read().decode()
        return {
            (s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    def metric(self, name: str, **labels: str) -> float:
        """The sum of ``name``'s samples whose labels include ``labels`` (0 if none)."""
        wanted = set(labels.items())
        return sum(v for (n, ls), v in self.metrics().items() if n == name and wanted <= ls)

    def tail(self, lines: int = 60) -> str:
        return tail(self.log, lines)


# --------------------------------------------------------------------------- resources


def keyring_body(
    name: str,
    *,
    secret_name: str,
    selector: dict[str, str],
    fleet: str,
    token_ttl: str,
    rotate_every: str | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "secretName": secret_name,
        "selector": {"matchLabels": selector},
        "fleet": fleet,
        "tokenTTL": token_ttl,
    }
    if rotate_every:
        spec["rotateEvery"] = rotate_every
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "KeyRing",
        "metadata": {"name": name},
        "spec": spec,
    }


@dataclass
class Resources:
    """Create, read, wait on and delete KeyRings and KeyRotations in one namespace."""

    api: k8s.ApiClient
    namespace: str

    @property
    def custom(self) -> k8s.CustomObjectsApi:
        return k8s.CustomObjectsApi(self.api)

    def create(self, plural: str, body: dict[str, Any]) -> dict[str, Any]:
        result = cast(
            dict[str, Any],
            self.custom.create_namespaced_custom_object(
                GROUP, VERSION, self.namespace, plural, body
            ),
        )
        return result

    def get(self, plural: str, name: str) -> dict[str, Any] | None:
        try:
            result = cast(
                dict[str, Any],
                self.custom.get_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, plural, name
                ),
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return result

    def status(self, plural: str, name: str) -> dict[str, Any]:
        obj = self.get(plural, name)
        return dict((obj or {}).get("status") or {})

    def keyring(self, name: str) -> dict[str, Any]:
        return self.status(KEYRINGS, name)

    def rotation(self, name: str) -> dict[str, Any]:
        return self.status(KEYROTATIONS, name)

    def rotate(self, name: str, keyring: str, mode: Mode = "Normal", reason: str = "") -> None:
        self.create(KEYROTATIONS, rotation_manifest(keyring, name=name, mode=mode, reason=reason))

    def delete(self, plural: str, name: str) -> None:
        with contextlib.suppress(ApiException):
            self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, self.namespace, plural, name
            )

    def wait_rotation(self, name: str, phase: str, timeout: float = 60) -> dict[str, Any]:
        """Until the rotation reaches ``phase``; a different terminal phase fails at once."""

        def reached() -> dict[str, Any] | None:
            status = self.rotation(name)
            current = status.get("phase")
            if current == phase:
                return status
            if current in ("Complete", "Failed", "Aborted"):
                raise AssertionError(f"rotation {name} ended {current}, not {phase}: {status}")
            return None

        return wait_for(reached, timeout=timeout, interval=0.1, what=f"rotation {name} {phase}")

    def wait_keyring(self, name: str, phase: str, timeout: float = 60) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            status = self.keyring(name)
            return status if status.get("phase") == phase else None

        return wait_for(
            reached,
            timeout=timeout,
            interval=0.1,
            what=f"keyring {name} {phase}",
        )

    def events(self, name: str) -> list[k8s.CoreV1Event]:
        items: list[k8s.CoreV1Event] = (
            k8s.CoreV1Api(self.api)
            .list_namespaced_event(self.namespace, field_selector=f"involvedObject.name={name}")
            .items
        )
        return items

    def event_reasons(self, name: str) -> set[str | None]:
        return {e.reason for e in self.events(name)}


# --------------------------------------------------------------------------- environment


@dataclass
class OperatorEnv:
    """A namespace with the chart's operator RBAC, a fleet fed from a Secret, the operator."""

    plane: ControlPlane
    fleet: ControlPlaneFleet
    resources: Resources
    kubeconfig: Path
    workdir: Path
    stall_after: float
    #: ``--tasks-wait-limit`` of the operators started here.
    tasks_wait_limit: float = 3600.0
    #: What the operator reads attestations with: a read-only Redis account
    #: under ``RedisKeys(fleet).acl_rules("operator")``, its password in a file.
    redis_url: str = ""
    redis_password_file: Path | None = None
    operators: list[OperatorProcess] = field(default_factory=list)
    rendered: list[dict[str, Any]] = field(default_factory=list)
    _starts: int = 0
    _priority: int = 100

    @property
    def namespace(self) -> str:
        return self.fleet.namespace

    @property
    def operator(self) -> OperatorProcess:
        """The operator started last."""
        return self.operators[-1]

    def start_operator(self, priority: int | None = None) -> OperatorProcess:
        """Another operator process; by default with a higher priority than any before.

        A SIGKILLed operator's peering record outlives it by its lifetime; a
        successor of higher priority acts at once instead of waiting that out.
        """
        self._starts += 1
        op = OperatorProcess(
            kubeconfig=self.kubeconfig,
            namespace=self.namespace,
            redis_url=self.redis_url or self.fleet.redis_url,
            redis_password_file=self.redis_password_file if self.redis_url else None,
            log=self.workdir / f"operator-{self._starts}.log",
            priority=priority if priority is not None else self.next_priority(),
            stall_after=self.stall_after,
            tasks_wait_limit=self.tasks_wait_limit,
            identity=f"operator-{self._starts}",
        )
        self.operators.append(op)
        return op.start()

    def next_priority(self) -> int:
        """A peering priority above every one handed out so far."""
        self._priority += 10
        return self._priority

    def stop(self) -> None:
        for op in self.operators:
            op.stop()

    def logs(self) -> str:
        return "\n".join(f"--- {op.log.name} (tail) ---\n{op.tail()}" for op in self.operators)


@contextlib.contextmanager
def operator_env(
    plane: ControlPlane,
    helm: Helm,
    admin: k8s.ApiClient,
    namespace: str,
    workdir: Path,
    *,
    replicas: int = 3,
    routers: int = 1,
    state_ttl: int = 3,
    stall_after: float = 120.0,
    tasks_wait_limit: float = 3600.0,
    fleet: str = "test",
    start: bool = True,
    app: str = DEFAULT_APP,
    app_env: Mapping[str, str] | None = None,
    replica_args: Sequence[str] = (),
    redis_server: RedisServer | None = None,
) -> Iterator[OperatorEnv]:
    """Render the chart, apply its CRDs and operator RBAC, run the fleet and the operator.

    The replicas serve ``app`` (with ``app_env`` in their environment and
    ``replica_args`` after ``--state-ttl``). With ``redis_server`` (started and
    stopped by the caller) every component connects to it under its own ACL user
    (:class:`~fleetkit.cluster.cpfleet.ACLControlPlaneFleet`), the operator under the
    contract's read-only ``operator`` user; without, the fleet runs its own Redis
    and the operator gets a read-only user there.
    """
    docs = render_chart(helm, namespace)
    apply_crds(admin, docs)
    apply_operator_objects(admin, namespace, docs)
    kubeconfig = plane.kubeconfig_for_service_account(namespace, OPERATOR_ACCOUNT)
    options = FleetOptions(
        replicas=replicas,
        routers=routers,
        replica_args=("--state-ttl", str(state_ttl), *replica_args),
        fleet=fleet,
        app=app,
        env=app_env or {},
    )
    fleet_cm: contextlib.AbstractContextManager[ControlPlaneFleet] = (
        control_plane_fleet(plane, namespace, workdir / "fleet", options)
        if redis_server is None
        else acl_control_plane_fleet(plane, namespace, workdir / "fleet", redis_server, options)
    )
    with fleet_cm as cf:
        if isinstance(cf, RedisFleet) and redis_server is not None:
            user, password_file = cf.users["operator"]
            redis_url = f"redis://{user}@127.0.0.1:{redis_server.port}/0"
        else:
            redis_url, password_file = read_only_redis_account(cf.redis_port, fleet, workdir)
        env = OperatorEnv(
            plane=plane,
            fleet=cf,
            redis_url=redis_url,
            redis_password_file=password_file,
            resources=Resources(admin, namespace),
            kubeconfig=kubeconfig,
            workdir=workdir,
            stall_after=stall_after,
            tasks_wait_limit=tasks_wait_limit,
            rendered=docs,
        )
        try:
            if start:
                env.start_operator()
            yield env
        finally:
            env.stop()


#: The read-only Redis account the operator uses in these environments.
READER = "mcpfleet-operator"


def read_only_redis_account(port: int, fleet: str, workdir: Path) -> tuple[str, Path]:
    """Create the operator's Redis ACL user for ``fleet``; return its URL and password file.

    The user has exactly ``RedisKeys(fleet).acl_rules("operator")`` (read-only:
    any write it attempted, a "read" that prunes say, would fail loudly). The
    password is a throwaway in a 0600 file, as a Secret volume would hold it:
    the URL names only the user.
    """
    password = secrets.token_hex(16)
    workdir.mkdir(parents=True, exist_ok=True)
    password_file = workdir / "redis-operator-password"
    password_file.touch(mode=0o600)
    password_file.write_text(password + "\n")
    admin = redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)
    try:
        admin.execute_command(
            "ACL", "SETUSER", READER, "reset", "on", f">{password}",
            *RedisKeys(fleet).acl_rules("operator"),
        )  # fmt: skip
    finally:
        admin.close()
    return f"redis://{READER}@127.0.0.1:{port}/0", password_file


def ring_body_for(env: OperatorEnv, name: str, **kw: Any) -> dict[str, Any]:
    """A KeyRing for the env's fleet: its Secret, its Pods' labels, its Redis fleet, its TTL."""
    cf = env.fleet
    defaults: dict[str, Any] = {
        "secret_name": cf.secret_name,
        "selector": cf.pod_labels(),
        "fleet": cf.fleet,
        "token_ttl": "3s",
    }
    return keyring_body(name, **(defaults | kw))


def until(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())


# --------------------------------------------------------------------------- recording


@dataclass
class Sample:
    #: When the sample's reads had all been answered (monotonic): each read was before it.
    at: float
    #: Serving replicas' loaded kids (ordered), by name.
    rings: dict[str, tuple[str, ...]]
    #: When the sample's reads were sent (monotonic): each read was after it.
    sent: float = 0.0
    #: With ``ledgers``: the live members of each attested kid's task-seal ledger
    #: (counted as the operator counts them), by kid.
    sealed: dict[str, int] = field(default_factory=dict)


class RotationRecorder:
    """Watches a rotation from outside: every Secret version and attestations, sampled.

    - ``secret_rings``: the kids of every version of the Secret, in order, from
      a WATCH (no version is missed, however brief).
    - ``samples``: the serving replicas' attested kids, read from Redis every
      ``interval`` seconds; ``violations`` are the samples where the safety
      invariant (:func:`~mcpfleet_operator.rotation.sealing_is_safe`) fails.
      With ``ledgers``, each sample also counts the live members of the task-seal
      ledger of every kid attested so far (``--tasks-encrypt``), as the operator
      counts them.
    """

    def __init__(
        self,
        fleet: ControlPlaneFleet,
        admin: k8s.ApiClient,
        interval: float = 0.01,
        *,
        ledgers: bool = False,
    ):
        self.fleet = fleet
        self.admin = admin
        self.interval = interval
        self.ledgers = ledgers
        self.samples: list[Sample] = []
        self.violations: list[Sample] = []
        #: (monotonic time the version was seen, its kids)
        self.secret_versions: list[tuple[float, tuple[str, ...]]] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def secret_rings(self) -> list[tuple[str, ...]]:
        rings: list[tuple[str, ...]] = []
        for _, kids in self.secret_versions:
            if not rings or rings[-1] != kids:
                rings.append(kids)
        return rings

    def sequences(self) -> dict[str, list[tuple[str, ...]]]:
        """Each replica's attested rings in the order it loaded them (repeats collapsed)."""
        out: dict[str, list[tuple[str, ...]]] = {}
        for sample in self.samples:
            for name, kids in sample.rings.items():
                seq = out.setdefault(name, [])
                if not seq or seq[-1] != kids:
                    seq.append(kids)
        return out

    def confirmed_before(self, at: float, kids: tuple[str, ...]) -> bool:
        """Whether some sample before ``at`` shows every serving replica on ``kids``."""
        return any(
            s.at < at and s.rings and all(k == kids for k in s.rings.values()) for s in self.samples
        )

    def start(self) -> RotationRecorder:
        for target in (self._sample, self._watch):
            thread = threading.Thread(
                target=target, daemon=True, name=f"recorder-{target.__name__}"
            )
            thread.start()
            self._threads.append(thread)
        wait_for(lambda: self.samples and self.secret_versions, timeout=30, what="the recorder")
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(10)

    def _sample(self) -> None:
        client = (
            self.fleet.redis_admin()  # a Redis with ACL users
            if isinstance(self.fleet, RedisFleet)
            else redis.Redis(host="127.0.0.1", port=self.fleet.redis_port, socket_timeout=2)
        )
        keys = RedisKeys(self.fleet.fleet)
        kids: set[str] = set()
        try:
            while not self._stop.is_set():
                sent = time.monotonic()
                attestations = read_replicas_sync(client, keys)
                rings = {n: a.kids for n, a in attestations.items() if a.state == "serving"}
                sealed = {}
                if self.ledgers:
                    # Every kid attested so far: a retired kid's ledger is still counted.
                    kids.update(kid for ring in rings.values() for kid in ring)
                    sealed = {
                        kid: int(client.zcount(keys.task_seals(kid), time.time(), "+inf"))
                        for kid in sorted(kids)
                    }
                sample = Sample(time.monotonic(), rings, sent, sealed)
                self.samples.append(sample)
                if not sealing_is_safe(rings.values()):
                    self.violations.append(sample)
                self._stop.wait(self.interval)
        finally:
            client.close()

    def _watch(self) -> None:
        core = k8s.CoreV1Api(self.admin)
        name, namespace = self.fleet.secret_name, self.fleet.namespace
        version = ""
        while not self._stop.is_set():
            stream = k8s_watch.Watch()
            try:
                for event in stream.stream(
                    core.list_namespaced_secret,
                    namespace,
                    field_selector=f"metadata.name={name}",
                    timeout_seconds=1,
                    **({"resource_version": version} if version else {}),
                ):
                    secret = event["object"]
                    version = secret.metadata.resource_version
                    ring = self.fleet.ring_of(secret)
                    self.secret_versions.append((time.monotonic(), ring.kids))
                    if self._stop.is_set():
                        break
            except ApiException as exc:
                if exc.status != 410:
                    raise
                version = ""
            finally:
                stream.stop()
