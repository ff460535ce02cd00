"""The control-plane backend of the ``Fleet`` interface: the key ring in a real Secret.

:class:`ControlPlaneFleet` is a :class:`~fleetkit.fleet.ProcessFleet`
(the same redis-server, ``mcpfleet serve`` replica processes and routers on
127.0.0.1) whose key ring lives where it lives in a cluster: in a Secret,
created and rotated through a real kube-apiserver. What a kubelet and the
operator would do around the replicas is played here, through the API:

- the Secret (data key :data:`~mcpfleet.contract.KEYRING_FILE`, the ring
  document) is created by :meth:`ControlPlaneFleet.prepare_keys`, as ``helm
  install`` would;
- each replica reads its OWN key directory (``workdir/volumes/<name>``), fed by
  its own :class:`~fleetkit.cluster.kubelet_secret.SecretVolumeSyncer`, which watches
  the Secret as a ServiceAccount allowed only ``get``/``watch`` on that one
  Secret. The volume is synced before the replica starts and torn down when
  the replica is killed, has drained, or the fleet stops;
- :meth:`ControlPlaneFleet.rotate_step` reads the Secret, applies one
  :class:`~mcpfleet.keys.ring.KeyRing` step and writes it back with an
  update carrying the resourceVersion it read, through the operator's own
  Secret code (:mod:`mcpfleet_operator.secretring`), as a ServiceAccount
  allowed only ``get``/``update`` on it;
- a Pod named like each replica (``replica-0``...), labelled with
  :data:`~mcpfleet.contract.COMPONENT_LABEL` ``server`` and
  :data:`~mcpfleet.contract.KEYRING_LABEL`, mounting the Secret, exists
  while the replica runs and is made Ready with podIP 127.0.0.1 once the
  replica serves, so the operator can match attestations to pods. Creating and
  deleting Pods and writing their status stands in for the ReplicaSet
  controller and the kubelet, and is done as admin.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from fleetkit.cluster.controlplane import LOOPBACK, ControlPlane
from fleetkit.cluster.kubelet_secret import DATA_DIR, SecretVolumeSyncer
from fleetkit.cluster.pods import make_pod_ready, meta, name_of
from fleetkit.cluster.rbac import service_account, service_account_with_rules
from fleetkit.fleet import FleetOptions, ProcessFleet, diagnostics, require_redis, running
from fleetkit.redisrig import RedisFleet, RedisServer, redis_fleet
from mcpfleet.contract import COMPONENT_LABEL, KEYRING_LABEL
from mcpfleet.dev.fleet import NO_LIMITS, FleetError, Proc, ReplicaProcess
from mcpfleet.keys.files import read_ring
from mcpfleet.keys.ring import KeyRing, KeyRingError
from mcpfleet_operator import secretring

#: The component label value of replica Pods.
SERVER_COMPONENT = "server"
#: Where the Pod spec mounts the key ring (documentation: no kubelet mounts it).
KEYS_MOUNT = "/etc/mcpfleet/keys"
#: The volume's ``defaultMode``, in the Pod spec and on disk alike.
KEYS_MODE = 0o440


@dataclass
class _Volume:
    """One replica's Secret volume: its syncer and the API client it owns."""

    syncer: SecretVolumeSyncer
    api: k8s.ApiClient

    def stop(self) -> None:
        try:
            self.syncer.stop()
        finally:
            self.api.close()


@dataclass(kw_only=True)
class ControlPlaneFleet(ProcessFleet):
    """A :class:`ProcessFleet` whose replicas read a Secret through their own volumes.

    :param plane: the running control plane.
    :param namespace: an existing namespace; the Secret, the ServiceAccounts and
        the Pods are created in it.
    :param secret_name: the key ring Secret (and the ``KEYRING_LABEL`` value).
    """

    plane: ControlPlane
    namespace: str
    secret_name: str = "mcpfleet-keys"
    image: str = "example.invalid/mcpfleet-server:dev"
    volumes: dict[str, _Volume] = field(default_factory=dict, repr=False)
    _admin: k8s.ApiClient | None = field(default=None, init=False, repr=False)
    _rotator: k8s.ApiClient | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    # --- accounts and clients -------------------------------------------------------

    @property
    def volume_account(self) -> str:
        """May ``get`` and ``watch`` the Secret: what a kubelet needs for the volume."""
        return f"{self.secret_name}-volume"

    @property
    def rotator_account(self) -> str:
        """May ``get`` and ``update`` the Secret: what a rotation needs."""
        return f"{self.secret_name}-rotator"

    @property
    def server_account(self) -> str:
        """The replica Pods' own ServiceAccount: no rules, no token mounted."""
        return "mcpfleet-server"

    def _client(self, kubeconfig: Path) -> k8s.ApiClient:
        client: k8s.ApiClient = k8s_config.new_client_from_config(
            config_file=str(kubeconfig), persist_config=False
        )
        return client

    def _service_account_client(self, account: str) -> k8s.ApiClient:
        return self._client(self.plane.kubeconfig_for_service_account(self.namespace, account))

    @property
    def admin(self) -> k8s.ApiClient:
        if self._admin is None:
            self._admin = self._client(self.plane.admin_kubeconfig)
        return self._admin

    @property
    def rotator(self) -> k8s.ApiClient:
        if self._rotator is None:
            self._rotator = self._service_account_client(self.rotator_account)
        return self._rotator

    def _ensure_account(self, name: str, verbs: Sequence[str]) -> None:
        """ServiceAccount ``name``, bound to a Role allowing ``verbs`` on the one Secret."""
        rule = k8s.V1PolicyRule(
            api_groups=[""],
            resources=["secrets"],
            resource_names=[self.secret_name],
            verbs=list(verbs),
        )
        service_account_with_rules(self.admin, self.namespace, name, [rule], exist_ok=True)

    # --- hooks of LocalFleet ------------------------------------------------------------

    def prepare_keys(self) -> None:
        """The accounts, and the Secret holding a new ring (an existing one is kept)."""
        self._ensure_account(self.volume_account, ("get", "watch"))
        self._ensure_account(self.rotator_account, ("get", "update"))
        service_account(
            self.admin, self.namespace, self.server_account, automount_token=False, exist_ok=True
        )
        # As `helm install` would: the operator adopts a Secret that holds a valid ring.
        with contextlib.suppress(secretring.SecretConflict):
            secretring.create(
                k8s.CoreV1Api(self.admin),
                self.namespace,
                self.secret_name,
                KeyRing.generate(),
                labels={"app.kubernetes.io/managed-by": "Helm"},
            )

    def replica_keys_dir(self, name: str) -> Path:
        """Replica ``name``'s own volume: nothing but its syncer writes there."""
        return self.workdir / "volumes" / name

    def add_replica(self, name: str, *, wait: bool = True, timeout: float = 60.0) -> ReplicaProcess:
        """Pod (Pending), then its Secret volume (first sync on disk), then the process."""
        self._release(name)  # a previous incarnation of the same name
        self._create_pod(name)
        try:
            volume = self._start_volume(name, wait=min(timeout, 20.0))
        except BaseException:
            self._delete_pod(name)
            raise
        with self._lock:
            self.volumes[name] = volume
        return super().add_replica(name, wait=wait, timeout=timeout)

    def _start_volume(self, name: str, *, wait: float) -> _Volume:
        """Replica ``name``'s Secret volume, synced once on disk (its client closed if not)."""
        api = self._service_account_client(self.volume_account)
        syncer = SecretVolumeSyncer(
            api,
            self.namespace,
            self.secret_name,
            self.replica_keys_dir(name),
            default_mode=KEYS_MODE,
        )
        try:
            syncer.start(wait=wait)
        except BaseException:
            api.close()
            raise
        return _Volume(syncer, api)

    def wait_replica(self, name: str, timeout: float = 60.0) -> None:
        """Until the replica serves and is attested; then its Pod is made Ready."""
        super().wait_replica(name, timeout)
        make_pod_ready(self.admin, self.namespace, name, LOOPBACK)

    def kill(self, name: str) -> None:
        """SIGKILL the replica, then remove its volume and its Pod."""
        super().kill(name)
        self._release(name)

    def drain(self, name: str) -> None:
        """Delete the Pod, as ``kubectl delete pod`` would, and SIGTERM the replica.

        The volume stays until the replica has exited (a kubelet unmounts it
        after the container stops), then goes.
        """
        self._delete_pod(name)
        super().drain(name)
        with self._lock:
            volume = self.volumes.get(name)
        proc = self.members[name].proc
        threading.Thread(
            target=self._release_after_exit,
            args=(name, proc, volume),
            name=f"release-{name}",
            daemon=True,
        ).start()

    def stop(self) -> None:
        super().stop()
        with self._lock:
            names = list(self.volumes)
        for name in names:
            # Teardown goes on even when the API is gone: every volume must stop.
            with contextlib.suppress(Exception):
                self._release(name)
        for api in (self._rotator, self._admin):
            if api is not None:
                api.close()
        self._rotator = self._admin = None

    # --- the Secret ---------------------------------------------------------------------

    def keyring_secret(self) -> k8s.V1Secret:
        """The key ring Secret as the rotator reads it (with its resourceVersion)."""
        return k8s.CoreV1Api(self.rotator).read_namespaced_secret(self.secret_name, self.namespace)

    @staticmethod
    def ring_of(secret: k8s.V1Secret) -> KeyRing:
        read = secretring.ring_of(secret)
        if read.ring is None:
            name = secret.metadata.name if secret.metadata else "?"
            raise FleetError(f"secret {name}: {read.error}")
        return read.ring

    def replace_ring(self, secret: k8s.V1Secret, ring: KeyRing) -> k8s.V1Secret:
        """Write ``ring`` into ``secret`` as read: refused (409) if it changed since.

        The operator's own Secret code (:mod:`mcpfleet_operator.secretring`) does
        the write; a conflict surfaces as the API's 409, as a client sees it.
        """
        try:
            written = secretring.replace(
                k8s.CoreV1Api(self.rotator), secretring.RingSecret(secret, None), ring
            )
        except secretring.SecretConflict as exc:
            raise ApiException(status=409, reason=str(exc)) from None
        return written.secret

    def ring(self) -> KeyRing:
        return self.ring_of(self.keyring_secret())

    def rotate_step(self, step: str) -> KeyRing:
        """Read the Secret, apply stage/promote/retire/abort, update it (resourceVersion)."""
        core = k8s.CoreV1Api(self.rotator)
        current = secretring.read(core, self.namespace, self.secret_name)
        if current is None or current.ring is None:
            what = "does not exist" if current is None else current.error
            raise KeyRingError(f"secret {self.namespace}/{self.secret_name}: {what}")
        written = secretring.write_step(core, current, step)
        assert written.ring is not None, "a ring just written parses"
        return written.ring

    def pause_volume(self, name: str) -> None:
        """Stop replica ``name``'s volume updates: it keeps the ring it has (a stuck kubelet)."""
        with self._lock:
            volume = self.volumes[name]
        volume.syncer.stop()

    def resume_volume(self, name: str) -> None:
        """Sync replica ``name``'s volume again (a fresh GET, then WATCH): a kubelet recovering."""
        with self._lock:
            old = self.volumes[name]
        old.api.close()
        volume = self._start_volume(name, wait=20.0)
        with self._lock:
            self.volumes[name] = volume

    # --- Pods ---------------------------------------------------------------------------

    def pod_labels(self) -> dict[str, str]:
        return {
            "app.kubernetes.io/name": "mcpfleet",
            "app.kubernetes.io/instance": self.fleet,
            COMPONENT_LABEL: SERVER_COMPONENT,
            KEYRING_LABEL: self.secret_name,
        }

    @property
    def pod_selector(self) -> str:
        """A label selector matching this fleet's replica Pods."""
        return ",".join(f"{k}={v}" for k, v in self.pod_labels().items())

    def pods(self) -> list[k8s.V1Pod]:
        core = k8s.CoreV1Api(self.admin)
        items: list[k8s.V1Pod] = core.list_namespaced_pod(
            self.namespace, label_selector=self.pod_selector
        ).items
        return items

    def _create_pod(self, name: str) -> None:
        field_env = [
            ("POD_NAME", "metadata.name"),
            ("POD_IP", "status.podIP"),
        ]
        container = k8s.V1Container(
            name=SERVER_COMPONENT,
            image=self.image,
            args=["serve", "--keys", KEYS_MOUNT, "--fleet", self.fleet, *NO_LIMITS],
            env=[
                k8s.V1EnvVar(
                    name=var,
                    value_from=k8s.V1EnvVarSource(
                        field_ref=k8s.V1ObjectFieldSelector(field_path=path)
                    ),
                )
                for var, path in field_env
            ],
            volume_mounts=[k8s.V1VolumeMount(name="keys", mount_path=KEYS_MOUNT, read_only=True)],
        )
        pod = k8s.V1Pod(
            metadata=k8s.V1ObjectMeta(name=name, labels=self.pod_labels()),
            spec=k8s.V1PodSpec(
                service_account_name=self.server_account,
                automount_service_account_token=False,
                containers=[container],
                volumes=[
                    k8s.V1Volume(
                        name="keys",
                        secret=k8s.V1SecretVolumeSource(
                            secret_name=self.secret_name, default_mode=KEYS_MODE
                        ),
                    )
                ],
            ),
        )
        k8s.CoreV1Api(self.admin).create_namespaced_pod(self.namespace, pod)

    def _delete_pod(self, name: str) -> None:
        """Delete at once: no kubelet will confirm a graceful deletion."""
        try:
            k8s.CoreV1Api(self.admin).delete_namespaced_pod(
                name, self.namespace, grace_period_seconds=0
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    # --- release ------------------------------------------------------------------------

    def _release(self, name: str, only: _Volume | None = None) -> None:
        """Stop replica ``name``'s volume (if it is ``only``, when given) and delete its Pod."""
        with self._lock:
            volume = self.volumes.get(name)
            if volume is None or (only is not None and volume is not only):
                return
            del self.volumes[name]
        volume.stop()
        self._delete_pod(name)

    def _release_after_exit(self, name: str, proc: Proc, volume: _Volume | None) -> None:
        if volume is None:
            return
        if proc.popen is not None:
            proc.popen.wait()  # bounded: the drain deadline, or the fleet's stop()
        # A replica of the same name added since owns a new volume: leave it alone.
        self._release(name, only=volume)

    # --- diagnostics ----------------------------------------------------------------------

    def api_state(self) -> str:
        """The Secret's ring (kids only), the Pods, and each volume as on disk."""
        out = []
        try:
            secret = self.keyring_secret()
            out.append(
                f"secret {self.namespace}/{self.secret_name}"
                f" rv={meta(secret).resource_version}: {self.ring_of(secret)!r}"
            )
        except Exception as exc:
            out.append(f"(secret not readable: {type(exc).__name__}: {exc})")
        try:
            for pod in self.pods():
                status = pod.status
                assert status is not None, name_of(pod)
                ready = [c.status for c in (status.conditions or []) if c.type == "Ready"]
                out.append(
                    f"pod {name_of(pod)}: phase={status.phase} ready={ready}"
                    f" podIP={status.pod_ip} deleting={meta(pod).deletion_timestamp}"
                )
        except Exception as exc:
            out.append(f"(pods not readable: {type(exc).__name__}: {exc})")
        with self._lock:
            volumes = dict(self.volumes)
        for name, volume in volumes.items():
            directory = self.replica_keys_dir(name)
            try:
                on_disk = repr(read_ring(directory))
            except Exception as exc:
                on_disk = f"unreadable ({type(exc).__name__}: {exc})"
            s = volume.syncer
            data = directory / DATA_DIR
            target = data.readlink() if data.is_symlink() else None
            out.append(
                f"volume {name}: {target} {on_disk} writes={s.writes} relists={s.relists}"
                f" rv={s.resource_version} last_error={s.last_error!r}"
            )
        return "\n".join(out)


def cp_diagnostics(cf: ControlPlaneFleet, *, plane_logs: bool = True) -> str:
    """:func:`fleetkit.fleet.diagnostics`, the API's view, and the control plane's logs."""
    parts = [diagnostics(cf), "--- control plane view ---", cf.api_state()]
    if plane_logs:
        parts += ["--- control plane logs (tail) ---", cf.plane.log_tail(20)]
    return "\n".join(parts)


@contextlib.contextmanager
def control_plane_fleet(
    plane: ControlPlane,
    namespace: str,
    workdir: Path,
    options: FleetOptions | None = None,
    *,
    secret_name: str = "mcpfleet-keys",
) -> Iterator[ControlPlaneFleet]:
    """A :class:`ControlPlaneFleet`, torn down on exit (its Pods deleted, volumes stopped)."""
    require_redis()
    cf = ControlPlaneFleet(
        workdir,
        **(options or FleetOptions()).fleet_fields(),
        plane=plane,
        namespace=namespace,
        secret_name=secret_name,
    )
    with running(cf, cp_diagnostics):
        yield cf


@dataclass(kw_only=True)
# ``admin`` is ControlPlaneFleet's (the API client): the Redis admin is ``redis_admin()``.
class ACLControlPlaneFleet(ControlPlaneFleet, RedisFleet):  # type: ignore[misc]
    """A :class:`ControlPlaneFleet` on a Redis the test runs, every component under its own
    ACL user (:class:`~fleetkit.redisrig.RedisFleet`): the replicas and routers with
    exactly ``RedisKeys(fleet).acl_rules(component)`` and a password file, the test's own
    reads through the admin user. ``users["operator"]`` is the operator's read-only user."""


@contextlib.contextmanager
def acl_control_plane_fleet(
    plane: ControlPlane,
    namespace: str,
    workdir: Path,
    server: RedisServer,
    options: FleetOptions | None = None,
    *,
    secret_name: str = "mcpfleet-keys",
) -> Iterator[ACLControlPlaneFleet]:
    """An :class:`ACLControlPlaneFleet` on ``server`` (started, and left running, by the
    caller), torn down on exit (its Pods deleted, volumes stopped)."""
    cf = redis_fleet(
        workdir,
        [server],
        f"redis://127.0.0.1:{server.port}/0",
        server.admin,
        options or FleetOptions(),
        kind=ACLControlPlaneFleet,
        plane=plane,
        namespace=namespace,
        secret_name=secret_name,
        redis_port=server.port,
    )
    assert isinstance(cf, ACLControlPlaneFleet)
    with running(cf, cp_diagnostics):
        yield cf
