"""A handshake session's route: where its requests go, as one value.

The client knows a session by its own id (``Mcp-Session-Id``: the router calls
it ``session`` everywhere). Its route names the replica that owns it and, for
a re-homed session (:mod:`~mcpfleet.router.rehome`), the owner's own id for
it, which differs from the client's. :class:`SessionRoute` is that pair; it is
read from and written to its Redis string here and nowhere else.

The stored form is shared by every router of a fleet, old and new alike during
a rolling upgrade: the owner alone (``"replica-0"``), or the owner, one space
and the owner's id (``"replica-1 3f2a..."``). Replica names and session ids
hold no space (a session id is visible ASCII,
:func:`~mcpfleet.router.decisions.valid_session_id`).

A request goes along a re-homed route under the owner's id
(:func:`swap_session`), and the owner is told the client's own
(:func:`client_session_line`).
"""

from __future__ import annotations

from dataclasses import dataclass

from mcpfleet.contract import CLIENT_SESSION_HEADER, SESSION_HEADER

_SESSION = SESSION_HEADER.lower().encode()
_CLIENT_SESSION = CLIENT_SESSION_HEADER.lower().encode()


@dataclass(frozen=True, slots=True)
class SessionRoute:
    """The replica that owns a session, and its own id for the session if not the client's.

    Made when a session opens, when a move re-homes it, and when its stored
    form is read from Redis (:meth:`from_redis`); cached by the session table,
    so a request on the common path makes none.
    """

    #: The owning replica's name (its registry name).
    owner: str
    #: The owner's session id, when it differs from the client's (a re-homed
    #: session); None: the owner knows the session by the client's own id.
    upstream_id: str | None = None

    @classmethod
    def from_redis(cls, raw: bytes | str) -> SessionRoute:
        """The route of a session's stored form (as ``GET`` returns it)."""
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        owner, _, upstream_id = text.partition(" ")
        return cls(owner, upstream_id or None)

    def to_redis(self) -> str:
        """The stored form: the owner, and the owner's own id when it differs."""
        return self.owner if self.upstream_id is None else f"{self.owner} {self.upstream_id}"


def swap_session(
    raw_headers: list[tuple[bytes, bytes]], old: str, new: str
) -> list[tuple[bytes, bytes]]:
    """``raw_headers`` with the session id ``old`` replaced by ``new``."""
    old_b, new_b = old.encode("latin-1"), new.encode("latin-1")
    return [(k, new_b if k.lower() == _SESSION and v == old_b else v) for k, v in raw_headers]


def client_session_line(session: str) -> bytes:
    """The header line naming a re-homed session's own (client's) id to its replica."""
    return b"%s: %s\r\n" % (_CLIENT_SESSION, session.encode("latin-1"))
