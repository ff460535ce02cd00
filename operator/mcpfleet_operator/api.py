"""The operator's API: the KeyRing and KeyRotation resources as plain data.

The CRDs (``charts/mcpfleet/crds/``) are the contract with users; this module
is the one place the operator reads them, turning a resource body into typed,
validated values. The API server already enforces the schema; parsing again
here gives a clear message for anything the schema cannot say (a selector
that is empty in effect, a TTL of zero) and keeps the handlers free of dict
plumbing.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

from mcpfleet.contract import DEFAULT_FLEET, LABEL_PREFIX, check_fleet_name

GROUP = "mcpfleet.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KEYRINGS = "keyrings"
KEYROTATIONS = "keyrotations"

#: Annotations the operator writes on the key ring Secret, next to the ring:
#: which rotation owns a ring that is mid-rotation. Written in the same
#: resourceVersion-guarded update as the ring, so ownership and content never
#: disagree, and a restarted operator knows whose rotation a staged ring is.
ROTATION_ANNOTATION = f"{LABEL_PREFIX}/rotation"
ROTATION_UID_ANNOTATION = f"{LABEL_PREFIX}/rotation-uid"
#: Label on a KeyRotation naming its KeyRing (set by ``mcpfleet rotate`` and
#: scheduled rotations; informative, the spec is what counts).
KEYRING_REF_LABEL = f"{LABEL_PREFIX}/keyring"
#: The operator's finalizer: it holds a KeyRotation's deletion until that is
#: safe, and lets the per-object timers stop cleanly.
FINALIZER = f"{LABEL_PREFIX}/operator"

RotationPhase = Literal[
    "Pending", "Staging", "Promoting", "Waiting", "Retiring", "Complete", "Failed", "Aborted"
]
#: Phases in which a rotation owns its KeyRing's ring.
ACTIVE_PHASES: tuple[RotationPhase, ...] = ("Staging", "Promoting", "Waiting", "Retiring")
TERMINAL_PHASES: tuple[RotationPhase, ...] = ("Complete", "Failed", "Aborted")
KeyRingPhase = Literal["Ready", "Rotating", "Degraded", "Invalid"]
Mode = Literal["Normal", "Emergency"]

_DURATION = re.compile(r"^(?:\d+(?:\.\d+)?(?:ms|s|m|h))+$")
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


class SpecError(ValueError):
    """A resource's spec cannot be acted on; the message says why."""


def parse_duration(text: str) -> float:
    """Seconds in a duration such as ``10m``, ``1h30m`` or ``4s`` (Go's notation, no sign)."""
    if not isinstance(text, str) or not _DURATION.match(text):
        raise SpecError(f"{text!r} is not a duration such as 10m, 1h30m or 4s")
    return sum(float(n) * _UNIT[u] for n, u in _PART.findall(text))


def selector_string(selector: Mapping[str, Any]) -> str:
    """A label selector object as the ``labelSelector`` query string of a list call."""
    parts = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In":
            parts.append(f"{key} in ({','.join(values)})")
        elif op == "NotIn":
            parts.append(f"{key} notin ({','.join(values)})")
        elif op == "Exists":
            parts.append(key)
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
        else:
            raise SpecError(f"unknown selector operator {op!r}")
    if not parts:
        raise SpecError("spec.selector matches every Pod: give matchLabels or matchExpressions")
    return ",".join(parts)


@dataclass(frozen=True)
class KeyRingSpec:
    name: str
    secret_name: str
    selector: str
    fleet: str
    token_ttl: float
    rotate_every: float | None

    @classmethod
    def parse(cls, name: str, spec: Mapping[str, Any]) -> KeyRingSpec:
        try:
            fleet = check_fleet_name(str(spec.get("fleet") or DEFAULT_FLEET))
        except ValueError as exc:
            raise SpecError(f"spec.fleet: {exc}") from None
        ttl = parse_duration(str(spec.get("tokenTTL") or "10m"))
        if ttl <= 0:
            raise SpecError("spec.tokenTTL must be longer than zero")
        every_text = spec.get("rotateEvery")
        every = parse_duration(str(every_text)) if every_text else None
        if every is not None and every <= 0:
            raise SpecError("spec.rotateEvery must be longer than zero")
        return cls(
            name=name,
            secret_name=str(spec.get("secretName") or name),
            selector=selector_string(spec.get("selector") or {}),
            fleet=fleet,
            token_ttl=ttl,
            rotate_every=every,
        )


@dataclass(frozen=True)
class RotationSpec:
    key_ring: str
    mode: Mode
    reason: str

    @property
    def emergency(self) -> bool:
        return self.mode == "Emergency"

    @classmethod
    def parse(cls, spec: Mapping[str, Any]) -> RotationSpec:
        key_ring = spec.get("keyRing")
        if not isinstance(key_ring, str) or not key_ring:
            raise SpecError("spec.keyRing is required")
        mode = spec.get("mode") or "Normal"
        if mode in ("Normal", "Emergency"):
            return cls(
                key_ring=key_ring, mode=cast(Mode, mode), reason=str(spec.get("reason") or "")
            )
        raise SpecError(f"spec.mode must be Normal or Emergency, got {mode!r}")


def parse_time(text: str | None) -> dt.datetime | None:
    """An RFC 3339 timestamp as written by the API server or this operator, else None."""
    if not text:
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def rotation_manifest(
    keyring: str,
    *,
    name: str = "",
    generate_name: str = "",
    mode: Mode = "Normal",
    reason: str = "",
) -> dict[str, Any]:
    """A KeyRotation of ``keyring``, as ``mcpfleet rotate``, a schedule or a test creates it.

    Named ``name``, or by the API server from ``generate_name``; labelled with
    its KeyRing (:data:`KEYRING_REF_LABEL`); ``spec.reason`` only when given.
    """
    if bool(name) == bool(generate_name):
        raise ValueError("a KeyRotation needs exactly one of name and generate_name")
    meta: dict[str, Any] = {"name": name} if name else {"generateName": generate_name}
    meta["labels"] = {KEYRING_REF_LABEL: keyring}
    spec: dict[str, Any] = {"keyRing": keyring, "mode": mode}
    if reason:
        spec["reason"] = reason
    return {"apiVersion": API_VERSION, "kind": "KeyRotation", "metadata": meta, "spec": spec}
