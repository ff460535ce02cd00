"""Who a request counts against: the authenticated principal, or the client's address.

With auth, the principal is a digest of the components the MCP SDK binds a
session to (client id, issuer, subject of the verified access token): the same
digest the replica names to routers for re-homing. Without auth it is the
client's address as the first trusted proxy saw it, hashed: each proxy in front
of the replica (the router is one) appends the address it received the request
from to ``X-Forwarded-For``, so with ``trusted_hops`` proxies in front, the
entry that many places from the right (counting the connection's own peer as
the rightmost) was written by a trusted proxy. Entries further left are the
client's to write and are never read. ``anonymous="shared"`` counts every
unauthenticated request against one principal, for a deployment where no
address can be trusted (a proxy that does not append to the header).
"""

from __future__ import annotations

import hashlib
import json
from typing import Final, Literal

from starlette.types import Scope

__all__ = ["FORWARDED_FOR", "SHARED", "address_of", "principal_digest", "principal_of"]

#: The one principal of every unauthenticated request under ``anonymous="shared"``.
SHARED: Final = "shared"

#: The header proxies append the address they received a request from to (lower-case,
#: as ASGI names headers).
FORWARDED_FOR: Final = b"x-forwarded-for"


def principal_digest(scope: Scope) -> str | None:
    """A digest of the principal a request was authenticated as, or None without auth.

    Routers and Redis see digests only: never a token or a claim.
    """
    token = getattr(scope.get("user"), "access_token", None)
    if token is None:
        return None
    from mcp.server.auth.provider import principal_components

    parts = principal_components(token)
    return hashlib.sha256(json.dumps(list(parts)).encode()).hexdigest()[:32]


def address_of(scope: Scope, trusted_hops: int) -> str:
    """The client's address through ``trusted_hops`` trusted proxies (pure).

    ``X-Forwarded-For`` values (repeated headers joined in order) plus the
    connection's peer make the chain; the entry ``trusted_hops`` places left of
    the peer is the address the outermost trusted proxy saw. A shorter chain
    (a client that came through fewer proxies) gives its leftmost entry.
    """
    client = scope.get("client")
    peer = str(client[0]) if client else ""
    if trusted_hops <= 0:
        return peer
    chain: list[str] = []
    for key, value in scope.get("headers", ()):
        if key == FORWARDED_FOR:
            chain.extend(part.strip() for part in value.decode("latin-1").split(","))
    chain.append(peer)
    index = len(chain) - 1 - trusted_hops
    return chain[max(index, 0)] or peer


def principal_of(
    scope: Scope, trusted_hops: int, anonymous: Literal["address", "shared"] = "address"
) -> str:
    """The principal a request counts against (see the module docstring)."""
    digest = principal_digest(scope)
    if digest is not None:
        return digest
    if anonymous == "shared":
        return SHARED
    address = address_of(scope, trusted_hops)
    return "addr-" + hashlib.sha256(address.encode()).hexdigest()[:24]
