"""The router's memory of rate refusals: a refused credential is refused here until its time.

A replica that refuses a principal under its own rate marks its ``429`` with
``X-Mcpfleet-Refused`` (mcpfleet.limits._refusals): the seconds until the
principal may send again, the limit, and whether the principal is its token or
its address. :class:`RefusedCredentials` learns each such answer on its way to
the client and, until that time, answers the next requests carrying the same
credential itself: a ``429`` with ``Retry-After`` and the JSON-RPC error a
replica gives, with no forward, no token check and no Redis. Only requests are
refused so (a ``method`` and an ``id``): notifications and a client's answers
to the server's own requests pass, as they do at a replica. Caps (sessions,
listen streams, tasks) are never remembered: they end when something the
principal holds ends, which the router does not see.

The router cannot verify a token, so it keys by what the request carries: the
``Authorization`` value for a principal that is its token; for one that is
its address, ``Authorization`` (if any), every ``X-Forwarded-For`` value and
the connection's peer, which is all a replica reads the address from. The same
key is then the same principal. A credential never refused is never held: it
pays a digest and a lookup or two while the memory holds something, nothing
when it is empty.
"""

from __future__ import annotations

from mcpfleet.answers import ErrorCode, jsonrpc_error
from mcpfleet.jsonbody import is_request, load
from mcpfleet.limits import (
    FORWARDED_FOR,
    REFUSED_HEADER,
    Held,
    RefusalMemory,
    address_key,
    credential_key,
    parse_refused,
)
from mcpfleet.router.exchange import Exchange, respond
from mcpfleet.router.h1client import Response

__all__ = ["RefusedCredentials"]


class RefusedCredentials:
    """See the module docstring. One per router."""

    def __init__(self, memory: RefusalMemory | None = None) -> None:
        self.memory = memory if memory is not None else RefusalMemory()

    def held(self, x: Exchange) -> Held | None:
        """The refusal a POST of ``x`` is under now, or None (also for anything that is
        not a request)."""
        memory = self.memory
        if not len(memory) or x.scope["method"] != "POST":
            return None
        authorization = x.headers.get("authorization", "").encode("latin-1")
        held = memory.held(credential_key(authorization)) if authorization else None
        if held is None:
            held = memory.held(_address_key(x, authorization))
        if held is None or not is_request(x.body):
            return None
        return held

    def learn(self, x: Exchange, upstream: Response) -> None:
        """A replica answered ``x`` with a 429: remember its credential if the refusal
        holds for every request of the principal until a time."""
        self.learn_header(x, upstream.headers.get(REFUSED_HEADER))

    def learn_header(self, x: Exchange, value: str | None) -> None:
        """:meth:`learn` from the ``X-Mcpfleet-Refused`` value of the 429 (None: none)."""
        refused = parse_refused(value)
        if refused is None:
            return
        seconds, limit, by = refused
        authorization = x.headers.get("authorization", "").encode("latin-1")
        if by == "token" and authorization:
            key = credential_key(authorization)
        else:
            key = _address_key(x, authorization)
        self.memory.remember(key, seconds, limit)


async def refuse(x: Exchange, held: Held) -> None:
    """The 429 of a request refused from memory, as a replica words it."""
    seconds = held.retry_seconds
    payload = jsonrpc_error(
        ErrorCode.SERVER_ERROR,
        f"Rate limited: {held.limit} over this principal's rate; retry after {seconds} s",
        data={"limit": held.limit, "retryAfter": seconds},
        request_id=_request_id(x.body),
    )
    await respond(x.send, 429, payload, [(b"retry-after", str(seconds).encode())])


def _address_key(x: Exchange, authorization: bytes) -> bytes:
    forwarded = b",".join(v for k, v in x.scope["headers"] if k.lower() == FORWARDED_FOR)
    client = x.scope.get("client")
    peer = str(client[0]).encode("latin-1") if client else b""
    return address_key(authorization, forwarded, peer)


def _request_id(body: bytes) -> str | int | None:
    try:
        doc = load(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if isinstance(doc, dict):
        rid = doc.get("id")
        if isinstance(rid, str | int) and not isinstance(rid, bool):
            return rid
    return None
