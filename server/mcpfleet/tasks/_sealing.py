"""What a task's stored snapshot may hold: credentials scrubbed, sealed under the key ring.

The engine stores, per task, a snapshot of its caller's context (so that any
worker can restore it). :class:`ScrubbingCodec` drops the caller's credentials
from it before it is encoded; :class:`RingSnapshotCodec` (``--tasks-encrypt``)
seals it under the replica's request-state key ring. The engine reaches both
through the replacement of its codec hook (:mod:`._engine_hooks`).
"""

from __future__ import annotations

import base64
import contextvars
import hashlib
import json
from collections.abc import Callable
from typing import Any

from mcpfleet.keys.ring import KeyRing, RingKey
from mcpfleet.tasks._trace import read_creator, with_creator

#: Request headers a task's stored snapshot never carries (lower case).
CREDENTIAL_HEADERS = frozenset({"authorization", "cookie", "proxy-authorization"})

#: The ring key the snapshot being saved in this context is sealed with: chosen,
#: and its ledger entry written, before the engine stores the snapshot.
PINNED: contextvars.ContextVar[RingKey | None] = contextvars.ContextVar(
    "mcpfleet_task_seal_key", default=None
)


def scrub_snapshot(payload: str) -> str:
    """A task context snapshot (the engine's JSON) without the caller's credentials.

    Headers named in :data:`CREDENTIAL_HEADERS` are dropped; the access
    token's ``token`` (the bearer string) is emptied, its identity kept.
    Anything not shaped as expected is returned with those parts removed
    where found, never with them kept.
    """
    data = json.loads(payload)
    if not isinstance(data, dict):
        return payload
    headers = data.get("http_headers")
    if isinstance(headers, dict):
        data["http_headers"] = {
            k: v for k, v in headers.items() if str(k).lower() not in CREDENTIAL_HEADERS
        } or None
    token_json = data.get("access_token_json")
    if isinstance(token_json, str):
        token = json.loads(token_json)
        if isinstance(token, dict) and "token" in token:
            token["token"] = ""
        data["access_token_json"] = json.dumps(token)
    return json.dumps(data)


class ScrubbingCodec:
    """A snapshot codec that scrubs credentials before the engine's codec encodes (and,
    tracing on, adds the creating request's trace context: :mod:`._trace`)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.protected = inner.protected

    def encode(self, payload: str) -> str:
        # The creating request's trace context travels inside what is sealed.
        return str(self.inner.encode(with_creator(scrub_snapshot(payload))))

    def decode(self, stored: str | bytes) -> str:
        payload = str(self.inner.decode(stored))
        read_creator(payload)
        return payload


def task_member(task_scope: str | None, task_id: str) -> str:
    """A task's member in a seal ledger: a hash of its scope and id, never the id itself."""
    return hashlib.sha256(f"{task_scope or ''}\n{task_id}".encode()).hexdigest()[:32]


#: How a snapshot the fleet sealed is stored: ``mcpfleet:v1:<kid>:<Fernet token>``.
SEALED_PREFIX = "mcpfleet:v1:"
#: HKDF's info for a ring key's snapshot key: a key of its own, never the one
#: request-state tokens are sealed with.
SNAPSHOT_KEY_INFO = b"mcpfleet/tasks/snapshot/v1"


class RingSnapshotCodec:
    """Task snapshots sealed under the replica's key ring (``--tasks-encrypt``).

    The engine's own encryption reads one key from an environment variable;
    the fleet puts no secret there. This codec takes its keys from the
    request-state key ring the replica already loads from its Secret volume
    (written by the operator, hot-reloaded): a Fernet key per ring key,
    derived with HKDF-SHA256 (info :data:`SNAPSHOT_KEY_INFO`). It seals with
    the ring's first key and names that key's kid in the stored value; it
    opens a value with the key its kid names, if the ring holds it. So a
    rotation (stage, promote, retire) loses no task as long as the old key is
    retired only after no snapshot it sealed is still to be read. Anything
    else fails closed: a plaintext snapshot, one sealed by a key the ring no
    longer holds, or a tampered one fails its task rather than run it as
    someone else (the engine's contract for a protected codec).
    """

    protected = True

    def __init__(
        self, ring: Callable[[], KeyRing], observe: Callable[[str, str], None] | None = None
    ) -> None:
        self._ring = ring
        self._observe = observe
        self._fernets: dict[tuple[str, int], Any] = {}

    def _fernet(self, key: RingKey) -> Any:
        from cryptography.fernet import Fernet
        from cryptography.hazmat.primitives.hashes import SHA256
        from cryptography.hazmat.primitives.kdf.hkdf import HKDF

        cached = self._fernets.get((key.kid, id(key)))
        if cached is None:
            derived = HKDF(SHA256(), 32, salt=None, info=SNAPSHOT_KEY_INFO).derive(key.secret)
            cached = Fernet(base64.urlsafe_b64encode(derived))
            self._fernets = {k: v for k, v in self._fernets.items() if k[0] in self._kids()}
            self._fernets[(key.kid, id(key))] = cached
        return cached

    def _kids(self) -> tuple[str, ...]:
        return self._ring().kids

    def kids(self) -> tuple[str, ...]:
        """The kids of the ring as loaded now (first seals)."""
        return self._ring().kids

    def sealing_key(self) -> RingKey:
        """The key a snapshot stored now is sealed with (the ring's first)."""
        return self._ring().keys[0]

    def encode(self, payload: str) -> str:
        key = PINNED.get() or self._ring().keys[0]
        token = self._fernet(key).encrypt(payload.encode()).decode()
        if self._observe is not None:
            self._observe("seal", key.kid)
        return f"{SEALED_PREFIX}{key.kid}:{token}"

    def decode(self, stored: str | bytes) -> str:
        from cryptography.fernet import InvalidToken
        from fastmcp_tasks.encryption import SnapshotDecryptionError

        text = stored.decode() if isinstance(stored, bytes) else stored
        if not text.startswith(SEALED_PREFIX):
            raise SnapshotDecryptionError(
                "The stored task snapshot is not sealed by the fleet (--tasks-encrypt): refused."
            )
        kid, _, token = text[len(SEALED_PREFIX) :].partition(":")
        ring = self._ring()
        key = next((k for k in ring.keys if k.kid == kid), None)
        if key is None:
            raise SnapshotDecryptionError(
                f"The stored task snapshot was sealed with key {kid}, which this replica's "
                f"key ring ({', '.join(ring.kids)}) no longer holds."
            )
        try:
            payload = str(self._fernet(key).decrypt(token.encode()).decode())
        except InvalidToken as exc:
            raise SnapshotDecryptionError(
                f"The stored task snapshot does not open with key {kid}: tampered."
            ) from exc
        if self._observe is not None:
            self._observe("unseal", kid)
        return payload
