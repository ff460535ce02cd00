"""Requests without a session: a new session placed by load, the rest spread.

* ``initialize``: to the serving replica with the fewest sessions (those in
  flight to it count, one answered without a session does not); where only
  ``initialize`` requests in flight fill every replica's session cap, it waits
  a moment (:data:`PLACE_WAIT`) for one of them to be answered.
* everything else (modern era, sessionless): to any serving replica, chosen
  by power of two choices on requests in flight, with no Redis on the path.

Either is tried on another replica only while none can have received it
(:func:`~mcpfleet.router.resend.on_replicas`).
"""

from __future__ import annotations

import time

from mcpfleet import tracing
from mcpfleet.answers import ErrorCode
from mcpfleet.config import RouterConfig
from mcpfleet.contract import Attestation
from mcpfleet.limits import Held
from mcpfleet.router.decisions import Candidate, RouteKind, pick_stateless, place_session
from mcpfleet.router.exchange import (
    Exchange,
    RequestOutcome,
    outcome_of,
    outcome_unknown,
    retry_later,
)
from mcpfleet.router.forward import Forwarder
from mcpfleet.router.metrics import RouterMetrics
from mcpfleet.router.refused import RefusedCredentials, refuse
from mcpfleet.router.replicas import ReplicaView
from mcpfleet.router.resend import Resend, on_replicas
from mcpfleet.router.upstream import Failure

#: Seconds a new session waits for a place where only ``initialize`` requests in
#: flight fill every replica's ``--session-cap`` (a refused one gives its place back).
PLACE_WAIT = 1.0


class Spread:
    """The requests that carry no session, each to a serving replica."""

    def __init__(
        self,
        config: RouterConfig,
        view: ReplicaView,
        refused: RefusedCredentials,
        metrics: RouterMetrics,
        forwarder: Forwarder,
    ) -> None:
        self.config = config
        self.view = view
        self.refused = refused
        self.metrics = metrics
        self.forwarder = forwarder

    async def route(self, x: Exchange, kind: RouteKind) -> RequestOutcome | Failure:
        """Route the request of ``x``, of ``kind`` (not a session's), to a serving replica."""

        async def choose(tried: set[str]) -> Candidate | RequestOutcome | None:
            if kind is not RouteKind.INITIALIZE:
                return pick_stateless(self.view.serving(exclude=tried))
            placed = await self._placement(x, tried)
            if isinstance(placed, Held):
                await refuse(x, placed)
                return RequestOutcome.LIMITED
            return placed

        async def attempt(replica: Attestation) -> RequestOutcome | Failure | Resend:
            # An initialize holds a place on the replica until its answer.
            place = self.view.placing(replica.name) if kind is RouteKind.INITIALIZE else None
            try:
                outcome = await self.forwarder.forward(
                    x, kind, replica.name, replica.address, place=place
                )
            finally:
                if place is not None:
                    place.close()
            if isinstance(outcome, Failure) and outcome.nothing_processed:
                return Resend(outcome)
            if outcome is Failure.DROPPED:
                await outcome_unknown(x.send, replica.name)
            return outcome_of(outcome)

        answered: RequestOutcome | Failure | None = await on_replicas(
            self.view, self.config.attempts, choose, attempt, resent=self._resent
        )
        if answered is not None:
            return answered
        full = (
            kind is RouteKind.INITIALIZE
            and self.config.session_cap is not None
            and bool(self.view.serving())
        )
        message = "All replicas are at their session cap" if full else "No serving replica"
        await retry_later(x.send, 503, ErrorCode.SERVER_ERROR, message)
        return RequestOutcome.NO_REPLICA

    async def _placement(self, x: Exchange, tried: set[str]) -> Candidate | Held | None:
        """The replica for the new session of ``x`` (None: every one is full).

        Where only ``initialize`` requests in flight fill the cap, it waits (at most
        :data:`PLACE_WAIT` seconds) for one to be answered: a refused one gives its
        place back at once, and a credential a replica refused meanwhile is refused
        here from memory (the :class:`Held` returned) rather than waiting on.
        """
        cap = self.config.session_cap
        deadline: float | None = None
        while True:
            candidates = self.view.serving(exclude=tried)
            choice = place_session(candidates, cap)
            if choice is not None or not self.view.opening_to(candidates):
                return choice
            now = time.monotonic()
            deadline = now + PLACE_WAIT if deadline is None else deadline
            if now >= deadline:
                return None
            await self.view.place_freed(deadline - now)
            if self.refused.memory and (held := self.refused.held(x)) is not None:
                return held

    def _resent(self, resend: Resend, tried: int) -> None:
        """A request goes to another replica: counted, and noted on its span."""
        self.metrics.retries.labels(resend.why.value).inc()
        if tracing.ON:
            _note_resend(tried, resend.why)


def _note_resend(attempts: int, why: Failure) -> None:
    """A request sent again to another replica: how many times so far, and why."""
    tracing.note("mcpfleet.resend.count", attempts)
    tracing.note("mcpfleet.resend.reason", why.value)
