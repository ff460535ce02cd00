"""The router's decisions, as plain functions of plain data (no I/O).

Which kind of request is this, which replica takes a new session, which takes
a stateless round, and is a client-supplied session id even well-formed. The
proxy (:mod:`mcpfleet.server.router`) does the I/O around these.
"""

from __future__ import annotations

import enum
import json
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mcp_types.version import MODERN_PROTOCOL_VERSIONS

#: Session ids the fleet's replicas mint are 32 hex digits (uuid4().hex); the
#: spec allows visible ASCII. Anything else is refused before any lookup.
MAX_SESSION_ID_LENGTH = 128
_SESSION_ID = re.compile(rf"^[\x21-\x7e]{{1,{MAX_SESSION_ID_LENGTH}}}$")


class RouteKind(enum.StrEnum):
    STICKY = "sticky"  # carries Mcp-Session-Id: to the owner only
    INITIALIZE = "initialize"  # opens a handshake-era session: placed by load
    STATELESS = "stateless"  # modern era and other sessionless requests: any replica


@dataclass(frozen=True)
class Candidate:
    """A replica as the router sees it when choosing."""

    name: str
    sessions: int
    inflight: int


def valid_session_id(value: str) -> bool:
    return bool(_SESSION_ID.match(value))


def parses_as_json(body: bytes) -> bool:
    try:
        json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return False
    return True


def is_initialize(body: bytes) -> bool:
    """True if a POST body is a JSON-RPC ``initialize`` request (or a batch holding one)."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return False
    items = doc if isinstance(doc, list) else [doc]
    return any(isinstance(m, dict) and m.get("method") == "initialize" for m in items)


def classify(method: str, headers: Mapping[str, str], body: bytes) -> RouteKind:
    """Decide how a request is routed. ``headers`` keys are lower-case."""
    if "mcp-session-id" in headers:
        return RouteKind.STICKY
    if headers.get("mcp-protocol-version", "") in MODERN_PROTOCOL_VERSIONS:
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
    """Power of two choices on requests in flight: near-least-loaded without herding."""
    if not candidates:
        return None
    if len(candidates) == 1:
        return candidates[0]
    r = rng or random
    a, b = r.sample(list(candidates), 2)
    return a if (a.inflight, a.sessions) <= (b.inflight, b.sessions) else b
