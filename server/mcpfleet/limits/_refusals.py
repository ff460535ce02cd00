"""Rate refusals remembered by credential, so a refused principal's next requests cost nothing.

A replica that refuses a principal under a rate (its ``rounds`` bucket: every
request of the principal is refused until the bucket refills) says so on its
``429`` with :data:`REFUSED_HEADER`: the seconds until the principal may send
again, the limit, and what the principal was read from (``by=token``: the
verified access token; ``by=address``: an unauthenticated client's address).
Whoever holds a :class:`RefusalMemory` (each router; each replica, for tokens)
then refuses the next requests carrying the same credential itself, from
memory, until that time: no forward, no token check, no Redis.

The key is a digest of the credential as the request carries it, never the
principal (a router cannot verify a token, so it cannot name one):

* ``by=token``: the ``Authorization`` header's value (:func:`credential_key`). The
  same value is the same token, so the same principal: it stays refused until
  then. Another token of the same principal is not known here and goes through
  (the replica refuses it from its own memory of the principal).
* ``by=address``: the ``Authorization`` value (or none), every ``X-Forwarded-For``
  value and the connection's peer, as the router received them
  (:func:`address_key`). The replica reads the client's address from these and
  nothing else, so the same key is the same principal; a client that writes a
  new ``X-Forwarded-For`` each time only gets a new key, and meets the replica's
  own refusal instead.

A key is a keyed BLAKE2b digest (16 bytes) under a random key made when the
process starts: it never leaves the process and means nothing elsewhere.

Bounded: at most :data:`MAX_REMEMBERED` keys (past it, those whose time passed
go, then the oldest eighth), each for at most :data:`MAX_SECONDS`. A credential
that was not refused is never in the memory, so it pays one dictionary lookup
when the memory holds anything, and nothing when it is empty.
"""

from __future__ import annotations

import hashlib
import math
import secrets
import time
from collections.abc import Callable
from typing import Final, NamedTuple

__all__ = [
    "MAX_REMEMBERED",
    "MAX_SECONDS",
    "REFUSED_HEADER",
    "Held",
    "RefusalMemory",
    "address_key",
    "credential_key",
    "format_refused",
    "parse_refused",
]

#: On a replica's 429 under a rate: ``<seconds>; limit=<name>; by=token|address``.
REFUSED_HEADER: Final = "X-Mcpfleet-Refused"
#: Credentials remembered at once (about 200 bytes each: 2 MB at most).
MAX_REMEMBERED: Final = 10_000
#: The longest a credential is remembered, whatever a refusal says.
MAX_SECONDS: Final = 60.0

_KEY: Final = secrets.token_bytes(32)


def _digest(*parts: bytes) -> bytes:
    h = hashlib.blake2b(key=_KEY, digest_size=16)
    for part in parts:
        h.update(len(part).to_bytes(4, "big"))
        h.update(part)
    return h.digest()


def credential_key(authorization: bytes) -> bytes:
    """The key of a request whose principal is its token: its ``Authorization`` value."""
    return _digest(b"token", authorization)


def address_key(authorization: bytes, forwarded: bytes, peer: bytes) -> bytes:
    """The key of an unauthenticated request: what its address is read from (the
    ``X-Forwarded-For`` values joined, the peer), and its ``Authorization`` if any."""
    return _digest(b"address", authorization, forwarded, peer)


class Held(NamedTuple):
    """A remembered refusal: the limit, and the seconds left until it ends."""

    limit: str
    seconds: float

    @property
    def retry_seconds(self) -> int:
        """``Retry-After`` as HTTP states it: whole seconds, at least 1."""
        return max(1, math.ceil(self.seconds))


def format_refused(seconds: float, limit: str, by: str) -> bytes:
    """The :data:`REFUSED_HEADER` value of a refusal."""
    return f"{seconds:.3f}; limit={limit}; by={by}".encode()


def parse_refused(value: str | None) -> tuple[float, str, str] | None:
    """``(seconds, limit, by)`` of a :data:`REFUSED_HEADER` value; None if it is not one."""
    if not value:
        return None
    head, _, rest = value.partition(";")
    fields = dict(part.strip().partition("=")[::2] for part in rest.split(";"))
    try:
        seconds = float(head)
    except ValueError:
        return None
    limit, by = fields.get("limit", ""), fields.get("by", "")
    if not (0 < seconds < math.inf) or not limit.isidentifier() or by not in ("token", "address"):
        return None
    return min(seconds, MAX_SECONDS), limit, by


class RefusalMemory:
    """Keys refused until a time (monotonic): see the module docstring."""

    def __init__(
        self, size: int = MAX_REMEMBERED, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.size = size
        self.clock = clock
        self._until: dict[bytes, tuple[float, str]] = {}

    def __len__(self) -> int:
        return len(self._until)

    def remember(self, key: bytes, seconds: float, limit: str) -> None:
        """Refuse ``key`` under ``limit`` for ``seconds`` (at most :data:`MAX_SECONDS`)."""
        now = self.clock()
        until = now + min(seconds, MAX_SECONDS)
        held = self._until.pop(key, None)
        if held is not None:
            until = max(until, held[0])
        elif len(self._until) >= self.size:
            self._make_room(now)
        self._until[key] = (until, limit)

    def held(self, key: bytes) -> Held | None:
        """The refusal ``key`` is under now, or None."""
        entry = self._until.get(key)
        if entry is None:
            return None
        left = entry[0] - self.clock()
        if left <= 0:
            del self._until[key]
            return None
        return Held(entry[1], left)

    def clear(self) -> None:
        self._until.clear()

    def _make_room(self, now: float) -> None:
        """Forget what ended; if the memory is still full, the oldest eighth (kept in
        the order remembered), so a full memory is scanned once per eighth of it."""
        live = {k: v for k, v in self._until.items() if v[0] > now}
        if len(live) >= self.size:
            live = dict(list(live.items())[len(live) - (self.size - max(1, self.size // 8)) :])
        self._until = live
