"""Re-homing an idle handshake session whose replica is gone (router ``--rehome-sessions``).

When a session's owner is gone and the session had no work in flight, the
router opens the session again on a live replica (:mod:`~mcpfleet.router.move`:
``initialize`` with the parameters kept at the session's start and the current
request's credentials, then ``notifications/initialized``), records the route
as the new owner and the new owner's session id (a
:class:`~mcpfleet.router.route.SessionRoute`), and forwards the request with
the session id swapped (:func:`~mcpfleet.router.route.swap_session`); answers
carry the client's id back. docs/rehome.md tells what a client sees, and what
this does not cover.

:class:`Rehomer` decides what becomes of a session whose owner is gone
(:meth:`Rehomer.verdict`, a value: the spec's 404 through
:class:`~mcpfleet.router.move.SessionEnd`, a 503, or the move its
:class:`~mcpfleet.router.move.Mover` leads) and keeps this router's books for
it: the requests of each session in flight here. The sticky route
(:mod:`~mcpfleet.router.sticky`) hands it each forward it counts
(:meth:`Rehomer.in_flight`) and each owner found gone (:meth:`Rehomer.gone`),
and forwards along the route a move returns. The Redis records live in
:class:`~mcpfleet.router.table.SessionTable`.
"""

from __future__ import annotations

from collections.abc import Awaitable

from mcpfleet.answers import ErrorCode
from mcpfleet.config import RouterConfig
from mcpfleet.contract import PRINCIPAL_HEADER, REHOME_HEADER
from mcpfleet.router.decisions import cancellations
from mcpfleet.router.exchange import Exchange, RequestOutcome, retry_later
from mcpfleet.router.gone import Lost, OwnerGone, answers_gone_work
from mcpfleet.router.h1client import Response
from mcpfleet.router.health import Health, RedisDown
from mcpfleet.router.metrics import RouterMetrics
from mcpfleet.router.move import Mover, SessionEnd
from mcpfleet.router.reinit import InitRecord, initialize_params
from mcpfleet.router.replicas import ReplicaView
from mcpfleet.router.route import SessionRoute
from mcpfleet.router.table import SessionTable
from mcpfleet.router.upstream import Failure, Upstream

__all__ = ["Lost", "OwnerGone", "Rehomer", "answers_gone_work"]


class Rehomer:
    """What becomes of a session whose owner is gone, and this router's books for it.

    With re-homing off, a gone owner's session gets the spec's 404 (its route
    dropped, counted by :class:`~mcpfleet.router.gone.OwnerGone`). With it on,
    a session with work in flight gets the same 404 (counted by
    :class:`~mcpfleet.router.gone.Lost`); an idle one moves to a live replica,
    and :meth:`gone` returns its new route.

    The books: this router's requests (POSTs) in flight per session
    (:meth:`in_flight`, through :meth:`enter` and :meth:`leave`; a session busy
    here is never moved); the moves it leads are its
    :class:`~mcpfleet.router.move.Mover`'s.
    """

    def __init__(
        self,
        config: RouterConfig,
        sessions: SessionTable,
        view: ReplicaView,
        upstream: Upstream,
        metrics: RouterMetrics,
        health: Health,
    ) -> None:
        self.config = config
        self.sessions = sessions
        self.view = view
        self.upstream = upstream
        #: How a session whose owner is gone ends (the 404, counted).
        self.end = SessionEnd(sessions, metrics)
        #: The moves this router leads.
        self.health = health
        self.mover = Mover(config, sessions, view, upstream, metrics, health, self.end)
        #: Requests (POST) in flight per session on this router, counted when
        #: re-homing: a session with one when its owner went is not re-homed.
        self._busy: dict[str, int] = {}

    # --- what the router keeps at a session's start ------------------------------------

    def init_record(self, response: Response, body: bytes) -> str | None:
        """What re-opens a session the ``initialize`` ``body`` opened (``response``
        its answer) elsewhere, when re-homing is on and the app allows it."""
        if not self.config.rehome_sessions or response.headers.get(REHOME_HEADER) == "0":
            return None
        params = initialize_params(body)
        if params is None:
            return None
        return InitRecord(params, response.headers.get(PRINCIPAL_HEADER) or "").to_json()

    # --- the session's requests in flight on this router -------------------------------

    async def in_flight(
        self, x: Exchange, owner: str, address: str, forwarding: Awaitable[int | Failure]
    ) -> int | Failure:
        """Await ``forwarding``, the forward of ``x`` (a POST of a session) to its
        ``owner`` at ``address``, counted in flight on this router meanwhile (a
        session busy here is never moved); a request that had work and may have
        been cut short with its owner marks the session lost (:meth:`ended`) while
        it still counts."""
        session = x.session
        assert session is not None  # (a sticky exchange's)
        self.enter(session)
        try:
            outcome = await forwarding
            if cancellations(x.body):
                await self.ended(session, owner, address, outcome)
        finally:
            self.leave(session)
        return outcome

    def enter(self, session: str) -> None:
        """A request (POST) of ``session`` starts on this router."""
        self._busy[session] = self._busy.get(session, 0) + 1

    def leave(self, session: str) -> None:
        """A request of ``session`` counted by :meth:`enter` is over."""
        left = self._busy[session] - 1
        if left:
            self._busy[session] = left
        else:
            del self._busy[session]

    async def ended(self, session: str, owner: str, address: str, outcome: int | Failure) -> None:
        """A request of ``session`` that had work (a request id) ended so on ``owner``.

        If it may have been cut short with its owner, the session is marked lost
        in Redis: whichever router the client turns to next must not re-home it
        (its work is gone). Called while the request still counts in flight
        here, so this router never re-homes it in between.

        A broken or dropped answer may have been cut: it counts at once, whether
        or not the owner lives on (the mark matters only once the owner is gone,
        and a SIGKILLed owner's port may still take a connection for an
        instant). So may any end on a draining owner whose port then no longer
        takes connections: its shutdown may end a running request's stream cleanly.
        """
        if outcome not in (Failure.UPSTREAM_BROKE, Failure.DROPPED):
            att = self.view.get(owner)
            if not isinstance(outcome, int) or att is None or att.state != "draining":
                return
            if await self.upstream.accepts(address):
                return
        await self.sessions.mark_lost(session, Lost.REQUEST_BROKE)

    # --- the owner is gone -------------------------------------------------------------

    async def gone(
        self, x: Exchange, route: SessionRoute, cause: OwnerGone, rehomed: bool
    ) -> SessionRoute | RequestOutcome:
        """The owner on ``route`` of ``x``'s session is gone: the answer's outcome
        (the 404, a 503 to retry), or, re-homing, the session's new route, along
        which the caller forwards ``x``. ``rehomed``: ``route`` was just made."""
        verdict = self.verdict(x, cause, rehomed)
        if verdict is None:
            return await self.mover.move(x, route, cause)
        if isinstance(verdict, RequestOutcome):
            # The replica just chosen went at once: the session stays re-homable.
            await retry_later(
                x.send, 503, ErrorCode.SERVER_ERROR, "Session owner unavailable; retry"
            )
            return verdict
        if x.scope["method"] == "DELETE" and self.config.rehome_sessions and not rehomed:
            # This router's cached route may be stale: a session another router
            # moved is ended where it lives now, not answered 404 here.
            moved = await self._moved_elsewhere(x, route)
            if moved is not None:
                return moved
        return await self.end.answer(x, route, verdict)

    async def _moved_elsewhere(
        self, x: Exchange, route: SessionRoute
    ) -> SessionRoute | RequestOutcome | None:
        """The session's route in Redis when another router moved it off ``route``
        (cached by the table); a 503 to retry when Redis cannot say; else None."""
        session = x.session
        assert session is not None  # (a sticky exchange's)
        try:
            current = await self.sessions.route(session, route)
        except RedisDown as exc:
            self.health.fail(exc)
            await retry_later(
                x.send, 503, ErrorCode.SERVER_ERROR, "Session directory unavailable; retry"
            )
            return RequestOutcome.UNAVAILABLE
        return current if current is not None and current != route else None

    def verdict(
        self, x: Exchange, cause: OwnerGone, rehomed: bool
    ) -> Lost | OwnerGone | RequestOutcome | None:
        """What becomes of ``x``'s session, its owner gone (``cause``): it ends with
        the 404, counted by why (a :class:`Lost` reason, or the ``cause``); a
        re-homed route's owner gone at once gets a 503 (``UNAVAILABLE``); None:
        it moves."""
        session = x.session
        assert session is not None  # (a sticky exchange's)
        method = x.scope["method"]
        rehoming = self.config.rehome_sessions
        if rehoming and cause is OwnerGone.DIED and method != "GET":
            # It dropped the request and died: the request may have run. Only a
            # stream's opening request (a GET) has no effect to repeat.
            return Lost.REQUEST_BROKE
        if not rehoming or method == "DELETE":
            return cause
        if rehomed:
            return RequestOutcome.UNAVAILABLE
        if self._busy.get(session):
            return Lost.IN_FLIGHT
        if method == "POST" and answers_gone_work(x.body):
            return Lost.ANSWER_ORPHANED
        return None
