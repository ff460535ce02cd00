"""The router's decisions, as plain functions of plain data (no I/O).

Which kind of request is this, which replica takes a new session, which takes
a stateless round, and is a client-supplied session id even well-formed. The
proxy (:mod:`mcpfleet.router.proxy`) does the I/O around these.
"""

from __future__ import annotations

import enum
import json
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from mcpfleet.contract import MCP_PATH, PROTOCOL_VERSION_HEADER, SESSION_HEADER
from mcpfleet.jsonbody import is_initialize, load

_SESSION = SESSION_HEADER.lower()
_PROTOCOL_VERSION = PROTOCOL_VERSION_HEADER.lower()

#: Session ids the fleet's replicas mint are 32 hex digits (uuid4().hex); the
#: spec allows visible ASCII. Anything else is refused before any lookup. A comma
#: is refused too: it is how HTTP joins repeated headers, so an id holding one
#: may be two ids, and the router and the replica could read different ones.
MAX_SESSION_ID_LENGTH = 128
_SESSION_ID = re.compile(rf"^[\x21-\x2b\x2d-\x7e]{{1,{MAX_SESSION_ID_LENGTH}}}$")


#: What the router forwards: the MCP endpoint (and the app's trailing-slash
#: form of it), and the OAuth metadata documents an app with auth serves
#: (RFC 9728, RFC 8414). Nothing else of a replica (its /metrics, /readyz,
#: /healthz, an app's other routes) is reachable through the router.
_MCP_PATHS = frozenset({MCP_PATH.encode(), MCP_PATH.encode() + b"/"})
_WELL_KNOWN = b"/.well-known/oauth-"
#: One path segment as a client that means no harm writes it: no percent
#: escapes (no encoded dot or slash to be decoded differently downstream).
_SEGMENT = re.compile(rb"^[A-Za-z0-9_~\-][A-Za-z0-9._~\-]*$")


def forwardable_path(raw_path: bytes) -> bool:
    """Whether a request target's path (as sent, before any decoding) may go to a replica.

    The path must be in normal form as sent: no ``.`` or ``..`` segment, no
    empty segment (``//``), no percent escape, so the router and the replica
    cannot read two different paths from it; and it must be the MCP endpoint or
    an OAuth well-known document. A well-known path's segments may start with
    a dot only for ``.well-known`` itself.
    """
    if raw_path in _MCP_PATHS:
        return True
    if not raw_path.startswith(_WELL_KNOWN):
        return False
    segments = raw_path[len(b"/.well-known/") :].split(b"/")
    return all(_SEGMENT.match(seg) for seg in segments)


class RouteKind(enum.StrEnum):
    STICKY = "sticky"  # carries Mcp-Session-Id: to the owner only
    INITIALIZE = "initialize"  # opens a handshake-era session: placed by load
    STATELESS = "stateless"  # modern era and other sessionless requests: any replica


class Candidate(NamedTuple):
    """A replica as the router sees it when choosing (a tuple: made per request,
    for every serving replica, where a frozen dataclass's ``__init__`` cost more)."""

    name: str
    sessions: int
    inflight: int


def valid_session_id(value: str) -> bool:
    return bool(_SESSION_ID.match(value))


def session_ids(raw_headers: Sequence[tuple[bytes, bytes]]) -> list[str]:
    """Every ``Mcp-Session-Id`` value a request carries, in order (usually none or one)."""
    return [v.decode("latin-1") for k, v in raw_headers if k.lower() == _SESSION.encode()]


def cancellations(body: bytes, reason: str = "The client disconnected") -> bytes:
    """The ``notifications/cancelled`` (a JSON body, one or a batch) for every request
    with an id in ``body``; empty when it holds none (notifications, responses)."""
    try:
        doc = load(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return b""
    items = doc if isinstance(doc, list) else [doc]
    notices = [
        {
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": m["id"], "reason": reason},
        }
        for m in items
        if isinstance(m, dict) and "method" in m and isinstance(m.get("id"), str | int)
    ]
    if not notices:
        return b""
    return json.dumps(notices[0] if len(notices) == 1 else notices).encode()


def era_of(kind: RouteKind, headers: Mapping[str, str]) -> str | None:
    """The protocol era of a request routed as ``kind`` (``headers`` lower-case):
    ``modern`` when its protocol version header names a modern version, ``handshake``
    when it names another or the request belongs to a session (or opens one), else
    None (a sessionless request that names no version)."""
    version = headers.get(_PROTOCOL_VERSION)
    if version in MODERN_PROTOCOL_VERSIONS:
        return "modern"
    if version or kind in (RouteKind.STICKY, RouteKind.INITIALIZE):
        return "handshake"
    return None


def classify(method: str, headers: Mapping[str, str], body: bytes) -> RouteKind:
    """Decide how a request is routed. ``headers`` keys are lower-case."""
    if _SESSION in headers:
        return RouteKind.STICKY
    if headers.get(_PROTOCOL_VERSION, "") in MODERN_PROTOCOL_VERSIONS:
        return RouteKind.STATELESS
    if method == "POST" and is_initialize(body):
        return RouteKind.INITIALIZE
    return RouteKind.STATELESS


def place_session(candidates: Sequence[Candidate], cap: int | None = None) -> Candidate | None:
    """The replica for a new session: fewest live sessions, then fewest in flight.

    Replicas at ``cap`` sessions are skipped; None means every one is full (or none serves).
    Ties break by name so that placement is deterministic for a given view.
    """
    open_ = [c for c in candidates if cap is None or c.sessions < cap]
    if not open_:
        return None
    return min(open_, key=lambda c: (c.sessions, c.inflight, c.name))


def pick_stateless(
    candidates: Sequence[Candidate], rng: random.Random | None = None
) -> Candidate | None:
    """Power of two choices on requests in flight: near-least-loaded without herding.

    Only requests in flight count: a stateless round does not care how many
    handshake sessions a replica holds. Ties go to whichever of the pair was
    drawn first, which is random, so idle replicas share sequential traffic
    evenly rather than the one with the fewest sessions taking every round.
    """
    if not candidates:
        return None
    if len(candidates) == 1:
        return candidates[0]
    draw = (rng or random).random  # two distinct draws; random.sample costs more
    n = len(candidates)
    i = int(draw() * n)
    j = int(draw() * (n - 1))
    if j >= i:
        j += 1
    a, b = candidates[i], candidates[j]
    return a if a.inflight <= b.inflight else b


# --- DNS-rebinding protection ----------------------------------------------------------

#: Host and Origin patterns of a fleet reached on loopback (``mcpfleet dev``, a
#: router bound to 127.0.0.1). ``name:*`` matches the name with any port.
LOOPBACK_HOSTS = ("127.0.0.1", "127.0.0.1:*", "localhost", "localhost:*", "[::1]", "[::1]:*")
LOOPBACK_ORIGINS = tuple(f"http://{h}" for h in LOOPBACK_HOSTS) + tuple(
    f"https://{h}" for h in LOOPBACK_HOSTS
)


@dataclass(frozen=True)
class OriginPolicy:
    """Which ``Host`` and ``Origin`` values a fleet answers, against DNS rebinding.

    A web page on another site that rebinds its name to the fleet's address
    sends its own name as ``Host`` and its own origin as ``Origin``: both must
    be on the lists. ``hosts`` empty means any Host (a router behind a Service
    whose names are not known in advance); an absent ``Origin`` (a non-browser
    client) is always allowed, a present one must be listed.
    """

    hosts: tuple[str, ...] = ()
    origins: tuple[str, ...] = ()

    @classmethod
    def for_bind(
        cls, bind_host: str, hosts: Sequence[str] = (), origins: Sequence[str] = ()
    ) -> OriginPolicy:
        """The policy for a server bound to ``bind_host``: what is configured, else
        loopback names for a loopback bind, else any Host and no browser origin."""
        loopback = bind_host in ("127.0.0.1", "localhost", "::1")
        return cls(
            hosts=tuple(hosts) or (LOOPBACK_HOSTS if loopback else ()),
            origins=tuple(origins) or (LOOPBACK_ORIGINS if loopback else ()),
        )


def _matches(value: str, patterns: Sequence[str]) -> bool:
    for pattern in patterns:
        if value == pattern:
            return True
        if pattern.endswith(":*"):
            base = pattern[:-2]
            port = value[len(base) + 1 :] if value.startswith(base + ":") else ""
            if port.isdigit():
                return True
    return False


def refused_origin(host: str | None, origin: str | None, policy: OriginPolicy) -> str | None:
    """Why a request with these ``Host``/``Origin`` headers is refused, or None if allowed."""
    if policy.hosts and (not host or not _matches(host.lower(), policy.hosts)):
        return "Host not allowed"
    if origin is not None and not _matches(origin.lower(), policy.origins):
        return "Origin not allowed"
    return None
