"""The key ring Secret: read, create and update it, every write guarded by resourceVersion.

The Secret is the source of truth of a rotation: its ``keyring.json`` is the
ring every replica loads, and its annotations name the rotation that owns a
ring in flight (:data:`~mcpfleet_operator.api.ROTATION_ANNOTATION`). Every
update carries the resourceVersion that was read, so a write based on a
stale read (another operator, a person with kubectl, a second rotation) is
refused by the API server with 409 instead of silently losing a key.

Used by the operator's handlers and by the test rig (``fleetkit.cluster.cpfleet``),
with any ``kubernetes`` API client: the rights it needs are ``get``,
``create`` and ``update`` on Secrets.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from mcpfleet.contract import KEYRING_FILE, KEYRING_LABEL
from mcpfleet.keys.ring import KeyRing, KeyRingError
from mcpfleet_operator.api import ROTATION_ANNOTATION, ROTATION_UID_ANNOTATION
from mcpfleet_operator.rotation import RingView


class SecretConflict(RuntimeError):
    """The Secret changed since it was read (409): read again and decide again."""


@dataclass(frozen=True)
class RingSecret:
    """One read of the Secret: the ring (or why it is not one) and what guards a write."""

    secret: k8s.V1Secret
    ring: KeyRing | None
    error: str = ""

    @property
    def resource_version(self) -> str:
        meta = self.secret.metadata
        return str(meta.resource_version) if meta is not None else ""

    @property
    def owner(self) -> tuple[str, str]:
        """(name, uid) of the rotation named on the Secret, or ('', '')."""
        annotations = (self.secret.metadata.annotations if self.secret.metadata else None) or {}
        return (
            str(annotations.get(ROTATION_ANNOTATION, "")),
            str(annotations.get(ROTATION_UID_ANNOTATION, "")),
        )

    def view(self) -> RingView:
        if self.ring is None:
            raise KeyRingError(self.error)
        return RingView(phase=self.ring.phase, kids=self.ring.kids, owner=self.owner[1])


def ring_of(secret: k8s.V1Secret) -> RingSecret:
    """Parse the Secret's ring; a Secret that holds none is reported, never raised."""
    data = secret.data or {}
    if KEYRING_FILE not in data:
        return RingSecret(secret, None, f"the Secret has no {KEYRING_FILE}")
    try:
        raw = base64.b64decode(data[KEYRING_FILE], validate=True)
    except (binascii.Error, ValueError):
        return RingSecret(secret, None, f"{KEYRING_FILE} is not base64")
    try:
        return RingSecret(secret, KeyRing.from_document(raw))
    except KeyRingError as exc:
        return RingSecret(secret, None, str(exc))


def read(core: k8s.CoreV1Api, namespace: str, name: str) -> RingSecret | None:
    """The Secret as it is now, or None when it does not exist."""
    try:
        secret = core.read_namespaced_secret(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return ring_of(secret)


def create(
    core: k8s.CoreV1Api,
    namespace: str,
    name: str,
    ring: KeyRing,
    *,
    keyring: str = "",
    labels: dict[str, str] | None = None,
) -> RingSecret:
    """Create the Secret with ``ring``; :class:`SecretConflict` if it appeared meanwhile."""
    body = k8s.V1Secret(
        metadata=k8s.V1ObjectMeta(
            name=name,
            labels={
                "app.kubernetes.io/name": "mcpfleet",
                "app.kubernetes.io/managed-by": "mcpfleet-operator",
                KEYRING_LABEL: keyring or name,
                **(labels or {}),
            },
        ),
        type="Opaque",
        data={KEYRING_FILE: _b64(ring.to_document())},
    )
    try:
        return ring_of(core.create_namespaced_secret(namespace, body))
    except ApiException as exc:
        if exc.status == 409:
            raise SecretConflict(f"secret {namespace}/{name} was created meanwhile") from None
        raise


def replace(
    core: k8s.CoreV1Api,
    current: RingSecret,
    ring: KeyRing,
    *,
    owner: tuple[str, str] | None = None,
) -> RingSecret:
    """Write ``ring`` over the Secret as read in ``current``; 409 -> :class:`SecretConflict`.

    ``owner`` (rotation name, uid) is recorded in the same update, so the ring
    and the name of the rotation it belongs to change together.
    """
    secret = current.secret
    meta = secret.metadata
    if meta is None or not meta.resource_version or not meta.name or not meta.namespace:
        raise ValueError("a Secret update needs the resourceVersion it was read at")
    secret.data = {**(secret.data or {}), KEYRING_FILE: _b64(ring.to_document())}
    if owner is not None:
        meta.annotations = {
            **(meta.annotations or {}),
            ROTATION_ANNOTATION: owner[0],
            ROTATION_UID_ANNOTATION: owner[1],
        }
    try:
        result = core.replace_namespaced_secret(meta.name, meta.namespace, secret)
    except ApiException as exc:
        if exc.status == 409:
            raise SecretConflict(
                f"secret {meta.namespace}/{meta.name} changed since resourceVersion "
                f"{meta.resource_version}"
            ) from None
        raise
    return ring_of(result)


#: The rotation steps a Secret write can carry (the methods of :class:`KeyRing` of these names).
STEPS = ("stage", "promote", "retire", "abort")


def write_step(
    core: k8s.CoreV1Api,
    current: RingSecret,
    step: str,
    *,
    owner: tuple[str, str] | None = None,
) -> RingSecret:
    """Apply ``stage``/``promote``/``retire``/``abort`` to the ring read in ``current``; write it.

    The one function that writes a rotation step: the operator's handlers and
    the test rig both go through it. Guarded by the resourceVersion of the
    read: a concurrent change makes it fail with :class:`SecretConflict`,
    never overwrite.
    """
    if step not in STEPS:
        raise ValueError(f"unknown rotation step {step!r}")
    if current.ring is None:
        raise KeyRingError(current.error)
    ring: KeyRing = getattr(current.ring, step)()
    return replace(core, current, ring, owner=owner)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
