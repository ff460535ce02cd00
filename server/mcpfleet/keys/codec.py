"""A request-state codec whose key ring can be swapped while the server runs.

``RequestStateSecurity(codec=...)`` accepts any object with ``seal``/``unseal``.
This one delegates to ``mcp``'s own AES-256-GCM codec, rebuilt for every ring,
and swaps the reference in one assignment: a round in flight uses either the
old ring or the new one, never half of each. Seal and unseal outcomes are
reported to an observer (metrics) by kid and reason, never with token bytes.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable

from mcp.server.request_state import AESGCMRequestStateCodec, InvalidRequestState

from mcpfleet.keys.ring import KeyRing

_PREFIX = "v1."

#: Called with ("seal", kid) for each token sealed, ("unseal", kid) for each token
#: opened and ("reject", reason) for each refused. Kids are public key ids.
Observer = Callable[[str, str], None]


def token_kid(token: str) -> str | None:
    """The kid a ``v1.`` token claims (hex), or None if it is not shaped like one."""
    if not token.startswith(_PREFIX):
        return None
    body = token[len(_PREFIX) : len(_PREFIX) + 8]
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    except (binascii.Error, ValueError):
        return None
    return raw[:4].hex() if len(raw) >= 4 else None


class ReloadableCodec:
    """Seals with the current ring's first key; unseals with any key of the current ring."""

    def __init__(self, ring: KeyRing, observer: Observer | None = None) -> None:
        self._observer = observer
        self._codec = AESGCMRequestStateCodec(ring.secrets)
        self._ring = ring

    @property
    def kids(self) -> tuple[str, ...]:
        return self._ring.kids

    @property
    def ring(self) -> KeyRing:
        return self._ring

    def swap(self, ring: KeyRing) -> None:
        """Adopt ``ring``. The new codec is built first, so a failure leaves the old one."""
        codec = AESGCMRequestStateCodec(ring.secrets)
        self._codec, self._ring = codec, ring

    def seal(self, payload: bytes) -> str:
        token = self._codec.seal(payload)
        if self._observer is not None:
            self._observer("seal", token_kid(token) or "unknown")
        return token

    def unseal(self, token: str) -> bytes:
        try:
            payload = self._codec.unseal(token)
        except InvalidRequestState as exc:
            if self._observer is not None:
                self._observer("reject", str(exc).replace(" ", "_"))
            raise
        if self._observer is not None:
            self._observer("unseal", token_kid(token) or "unknown")
        return payload
