"""The re-send rule: a request tried on one replica after another while none can have received it.

A request goes to another replica only when no replica can have received it:
the connection was refused, or a draining replica answered 503 before it read
the body (docs/faults.md). :func:`on_replicas` is that loop, once, for every
request the router places: a new session's ``initialize`` and a stateless
request (:mod:`~mcpfleet.router.spread`), and a re-home's ``initialize``
(:mod:`~mcpfleet.router.move`). Each caller says how a replica is chosen and
what one attempt does; an attempt that ends in a :class:`Resend` passes the
request on.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from mcpfleet.contract import Attestation
from mcpfleet.router.decisions import Candidate
from mcpfleet.router.replicas import ReplicaView
from mcpfleet.router.upstream import Failure

_R = TypeVar("_R")
_S = TypeVar("_S")


@dataclass(frozen=True, slots=True)
class Resend:
    """An attempt no replica can have acted on: the next replica may take the request."""

    #: Why (a refused connection: the replica may be back at another address).
    why: Failure


async def on_replicas(
    view: ReplicaView,
    attempts: int,
    choose: Callable[[set[str]], Awaitable[Candidate | _S | None]],
    attempt: Callable[[Attestation], Awaitable[_R | Resend]],
    *,
    tried: set[str] | None = None,
    resent: Callable[[Resend, int], None] | None = None,
) -> _R | _S | None:
    """The first answer of ``attempt`` on the replicas ``choose`` names in turn, at
    most ``attempts`` of them; None once none is left to try.

    ``choose`` is given the names tried so far (``tried``: those never to try)
    and names a replica, or returns an answer that ends the loop at once (a
    credential refused while waiting for a place). A replica that refused the
    connection but is back at another address (restarted under its name) may
    be tried again. ``resent`` hears of each :class:`Resend` and how many
    replicas are tried by then.
    """
    tried = set() if tried is None else tried
    for _ in range(attempts):
        choice = await choose(tried)
        if choice is None:
            break
        if not isinstance(choice, Candidate):
            return choice
        tried.add(choice.name)
        replica = view.get(choice.name)
        if replica is None:
            continue
        result = await attempt(replica)
        if not isinstance(result, Resend):
            return result
        if result.why is Failure.REFUSED and await view.after_refusal(
            replica.name, replica.address
        ):
            tried.discard(replica.name)  # restarted elsewhere: it may take it
        if resent is not None:
            resent(result, len(tried))
    return None
