"""The request-state key ring: its document format, validation and rotation steps.

A ring is an ordered list of secrets; the first seals, every one unseals (the
contract of ``mcp``'s ``RequestStateSecurity``). It travels as one JSON
document, ``keyring.json`` in a Kubernetes Secret::

    {"version": 1, "phase": "stable",
     "keys": [{"kid": "9f2c41d0", "secret": "<base64url, >= 32 bytes>",
               "created": "2026-11-30T03:21:17Z"}]}

``kid`` is redundant on purpose: it is recomputed from the secret exactly as
``mcp``'s AES-GCM codec computes it, and a mismatch means the document was
corrupted or hand-edited wrongly, so it is refused. ``phase`` records where a
rotation stands so the document alone says what the next step is.

Nothing in this module ever formats a secret into a message: ``KeyRing`` and
``RingKey`` print their kids only.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import json
import secrets
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives.hashes import SHA256
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from mcpfleet.contract import KEYRING_FORMAT_VERSION, RING_PHASES, RingPhase

#: The minimum secret size ``mcp`` accepts, and what ``generate`` makes.
MIN_SECRET_BYTES = 32
SECRET_BYTES = 32
#: A ring never holds more than the two keys of a rotation in flight.
MAX_RING_KEYS = 2
#: Upper bound on the document size: a ring is tiny; anything bigger is not one.
MAX_DOCUMENT_BYTES = 64 * 1024

# These two constants are those of mcp.server.request_state (its private names);
# tests/unit/test_keys_ring.py proves the kid below equals the one mcp's codec puts
# in every token, so a drift in mcp fails the tests rather than the fleet.
_KDF_INFO = b"mcp/request-state/v1/aes-256-gcm"
_KID_INFO = b"mcp/request-state/v1/kid:"


class KeyRingError(ValueError):
    """A key ring document or operation is invalid. The message never holds key material."""


def compute_kid(secret: bytes) -> str:
    """The key id ``mcp``'s AES-GCM codec derives for ``secret``, as 8 hex digits."""
    key = HKDF(algorithm=SHA256(), length=32, salt=None, info=_KDF_INFO).derive(secret)
    return hashlib.sha256(_KID_INFO + key).digest()[:4].hex()


def _b64u(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def _b64u_decode(text: str) -> bytes:
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise KeyRingError("secret is not base64url") from None
    if _b64u(raw) != text:
        raise KeyRingError("secret is not canonical unpadded base64url")
    return raw


def _now_iso() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class RingKey:
    """One secret of the ring with its kid. ``repr`` shows the kid only."""

    secret: bytes = field(repr=False)
    kid: str
    created: str

    @classmethod
    def new(cls, secret: bytes | None = None) -> RingKey:
        material = secrets.token_bytes(SECRET_BYTES) if secret is None else secret
        if len(material) < MIN_SECRET_BYTES:
            raise KeyRingError(
                f"a key must hold at least {MIN_SECRET_BYTES} bytes, this one has {len(material)}"
            )
        return cls(secret=material, kid=compute_kid(material), created=_now_iso())


@dataclass(frozen=True)
class KeyRing:
    """An ordered, validated ring: ``keys[0]`` seals, all unseal."""

    keys: tuple[RingKey, ...]
    phase: RingPhase = "stable"

    def __post_init__(self) -> None:
        if not self.keys:
            raise KeyRingError("a key ring needs at least one key")
        if len(self.keys) > MAX_RING_KEYS:
            raise KeyRingError(f"a key ring holds at most {MAX_RING_KEYS} keys")
        if self.phase not in RING_PHASES:
            raise KeyRingError(f"phase must be one of {RING_PHASES}, got {self.phase!r}")
        kids = [k.kid for k in self.keys]
        if len(set(kids)) != len(kids):
            raise KeyRingError(f"the ring holds the same key twice (kids {kids})")
        for key in self.keys:
            if len(key.secret) < MIN_SECRET_BYTES:
                raise KeyRingError(
                    f"key {key.kid} has {len(key.secret)} bytes; at least "
                    f"{MIN_SECRET_BYTES} bytes of randomness are required"
                )
        expected = 1 if self.phase == "stable" else 2
        if len(self.keys) != expected:
            raise KeyRingError(
                f"a {self.phase} ring holds {expected} key(s), this one holds {len(self.keys)}"
            )

    @property
    def kids(self) -> tuple[str, ...]:
        return tuple(k.kid for k in self.keys)

    @property
    def secrets(self) -> list[bytes]:
        """The secrets in ring order, for building a codec. Never log this."""
        return [k.secret for k in self.keys]

    def __repr__(self) -> str:
        return f"KeyRing(phase={self.phase!r}, kids={list(self.kids)!r})"

    __str__ = __repr__

    # --- document ------------------------------------------------------------------

    def to_document(self) -> bytes:
        doc = {
            "version": KEYRING_FORMAT_VERSION,
            "phase": self.phase,
            "keys": [
                {"kid": k.kid, "secret": _b64u(k.secret), "created": k.created} for k in self.keys
            ],
        }
        return json.dumps(doc, indent=2).encode() + b"\n"

    @classmethod
    def from_document(cls, raw: bytes) -> KeyRing:
        """Parse and validate a ring document; raise KeyRingError with a clear reason."""
        if not raw.strip():
            raise KeyRingError("the key ring document is empty")
        if len(raw) > MAX_DOCUMENT_BYTES:
            raise KeyRingError(f"the key ring document exceeds {MAX_DOCUMENT_BYTES} bytes")
        try:
            doc: Any = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            # The JSON error names a position, never the surrounding text.
            pos = getattr(exc, "pos", None)
            where = f" at byte {pos}" if pos is not None else ""
            raise KeyRingError(f"the key ring document is not valid JSON{where}") from None
        if not isinstance(doc, dict):
            raise KeyRingError("the key ring document must be a JSON object")
        if doc.get("version") != KEYRING_FORMAT_VERSION:
            raise KeyRingError(
                f"unsupported key ring version {doc.get('version')!r}; "
                f"this mcpfleet reads version {KEYRING_FORMAT_VERSION}"
            )
        entries = doc.get("keys")
        if not isinstance(entries, list) or not entries:
            raise KeyRingError("the key ring document needs a non-empty 'keys' list")
        keys: list[RingKey] = []
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict):
                raise KeyRingError(f"keys[{i}] must be an object")
            secret_text, kid = entry.get("secret"), entry.get("kid")
            if not isinstance(secret_text, str) or not isinstance(kid, str):
                raise KeyRingError(f"keys[{i}] needs string 'kid' and 'secret' fields")
            try:
                secret = _b64u_decode(secret_text)
            except KeyRingError as exc:
                raise KeyRingError(f"keys[{i}] ({kid}): {exc}") from None
            if len(secret) < MIN_SECRET_BYTES:
                raise KeyRingError(
                    f"keys[{i}] ({kid}) has {len(secret)} bytes; at least "
                    f"{MIN_SECRET_BYTES} bytes of randomness are required"
                )
            actual = compute_kid(secret)
            if actual != kid:
                raise KeyRingError(
                    f"keys[{i}] says kid {kid} but its secret has kid {actual}: "
                    "the document is corrupt"
                )
            created = entry.get("created", "")
            keys.append(RingKey(secret=secret, kid=kid, created=str(created)))
        phase = doc.get("phase", "stable")
        return cls(keys=tuple(keys), phase=phase)

    # --- rotation steps (pure) ----------------------------------------------------

    @classmethod
    def generate(cls) -> KeyRing:
        return cls(keys=(RingKey.new(),))

    def stage(self, new: RingKey | None = None) -> KeyRing:
        """Step 1: ``[old]`` -> ``[old, new]``; the new key unseals, nothing seals with it."""
        if self.phase != "stable":
            raise KeyRingError(f"stage needs a stable ring; this one is {self.phase}")
        return KeyRing(keys=(self.keys[0], new or RingKey.new()), phase="staged")

    def promote(self) -> KeyRing:
        """Step 3: ``[old, new]`` -> ``[new, old]``; the new key seals."""
        if self.phase != "staged":
            raise KeyRingError(f"promote needs a staged ring; this one is {self.phase}")
        return KeyRing(keys=(self.keys[1], self.keys[0]), phase="promoted")

    def retire(self) -> KeyRing:
        """Step 5: ``[new, old]`` -> ``[new]``; tokens sealed under old no longer unseal."""
        if self.phase != "promoted":
            raise KeyRingError(f"retire needs a promoted ring; this one is {self.phase}")
        return KeyRing(keys=(self.keys[0],), phase="stable")

    def abort(self) -> KeyRing:
        """Undo a staged rotation: ``[old, new]`` -> ``[old]`` (safe: new never sealed)."""
        if self.phase != "staged":
            raise KeyRingError(f"only a staged rotation can be aborted; this ring is {self.phase}")
        return KeyRing(keys=(self.keys[0],), phase="stable")
