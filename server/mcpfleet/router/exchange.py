"""One client request through the router: the value it travels as, and how it ends.

:class:`Exchange` is what admission (:mod:`~mcpfleet.router.admission`) makes
of a request it lets through, and what every step after it takes: dispatch and
forwarding (:mod:`~mcpfleet.router.proxy`), re-homing
(:mod:`~mcpfleet.router.rehome`). The answers the router makes itself (never
mistaken for a replica's), and :class:`RequestOutcome`, the books' name for
how an exchange ended, are here too, so that each step writes them the same way.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from starlette.types import Receive, Scope, Send

from mcpfleet.answers import ErrorCode, jsonrpc_error, send_whole
from mcpfleet.contract import ROUTER_ERROR_HEADER
from mcpfleet.router.upstream import Failure


@dataclass(slots=True)
class Exchange:
    """A request the router admitted, and the way to answer it.

    Built once per request, by admission, as its result, and never changed
    after: the request a re-homed session forwards under its owner's session
    id is another exchange (:meth:`with_headers`). Not frozen: a frozen
    dataclass's ``__init__`` sets each field through ``object.__setattr__``,
    several times the cost of a plain one, on every request.
    """

    scope: Scope
    receive: Receive
    send: Send
    #: The request's headers by lower-cased name (the last value of a repeated one).
    headers: dict[str, str]
    #: The whole request body (routing needs it).
    body: bytes
    #: ``time.perf_counter()`` at the request's arrival.
    started: float
    #: The client's ``Mcp-Session-Id`` (validated where it is routed by), or None.
    session: str | None

    def with_headers(self, raw_headers: list[tuple[bytes, bytes]]) -> Exchange:
        """The same exchange, forwarded with other raw headers."""
        return Exchange(
            {**self.scope, "headers": raw_headers},
            self.receive,
            self.send,
            self.headers,
            self.body,
            self.started,
            self.session,
        )


class RequestOutcome(enum.StrEnum):
    """How the router ended a request: the ``outcome`` label of ``mcpfleet_router_requests_total``.

    A :class:`Failure` of the last forward attempt is an outcome too.
    """

    OK = "ok"  # relayed a 1xx-3xx answer
    CLIENT_ERROR = "client_error"  # relayed (or, for an unknown session, made) a 4xx
    UPSTREAM_ERROR = "upstream_error"  # relayed a 5xx
    REJECTED = "rejected"  # refused by the router: bad or hostile input
    OWNER_GONE = "owner_gone"  # the session's owner is gone: the spec's 404
    UNAVAILABLE = "unavailable"  # the owner or the session directory cannot answer now
    NO_REPLICA = "no_replica"  # no serving replica (or all at their session cap)
    LIMITED = "limited"  # refused by the router: its credential is rate-limited (429)


def outcome_of(result: int | Failure) -> RequestOutcome | Failure:
    """The outcome of a forward that relayed status ``result`` (or failed so)."""
    if isinstance(result, Failure):
        return result
    if result < 400:
        return RequestOutcome.OK
    return RequestOutcome.CLIENT_ERROR if result < 500 else RequestOutcome.UPSTREAM_ERROR


_ROUTER_ERROR = (ROUTER_ERROR_HEADER.lower().encode(), b"1")


async def respond(
    send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    """An answer the router made itself: marked so, never mistaken for a replica's."""
    await send_whole(send, status, body, headers=[_ROUTER_ERROR, *(extra or [])])


async def retry_later(send: Send, status: int, code: int, message: str) -> None:
    """A JSON-RPC error the client may retry in a second (503 or 502 with Retry-After)."""
    await respond(send, status, jsonrpc_error(code, message), [(b"retry-after", b"1")])


async def session_not_found(send: Send) -> None:
    """The spec's 404 for a session the fleet does not have (any more): the client
    opens a new one."""
    await respond(send, 404, jsonrpc_error(ErrorCode.INVALID_REQUEST, "Session not found"))


async def outcome_unknown(send: Send, replica: str) -> None:
    """The 502 for a request a replica may have run: no Retry-After, it is not a hint
    that sending it again is safe (a once-flow's replay is; a plain tool's may not be)."""
    message = (
        f"Replica {replica} dropped the connection before answering: "
        "the request may have run; it was not sent again"
    )
    await respond(send, 502, jsonrpc_error(ErrorCode.INTERNAL_ERROR, message))
