"""A session's request, to the replica that owns the session.

A request with ``Mcp-Session-Id`` goes along the session's
:class:`~mcpfleet.router.route.SessionRoute`, found in the session table
(:mod:`~mcpfleet.router.table`: the cache, then Redis). An owner that is gone,
unknown, or refuses the connection is the
:class:`~mcpfleet.router.rehome.Rehomer`'s: the spec's 404 at once (the route
dropped, so the client re-initializes), or, re-homing, on along the new route
it returns. Nothing a session's owner may have received is sent elsewhere.

Read top-down: :meth:`Sticky.route` finds the route, :meth:`Sticky._to_owner`
forwards along it (at most twice: the route found, then the one a move
returns), :meth:`Sticky._forward` is one forward and says how the owner was
found gone, if it was.
"""

from __future__ import annotations

from mcpfleet import tracing
from mcpfleet.answers import ErrorCode, jsonrpc_error
from mcpfleet.config import RouterConfig
from mcpfleet.router.decisions import RouteKind, valid_session_id
from mcpfleet.router.exchange import (
    Exchange,
    RequestOutcome,
    outcome_of,
    outcome_unknown,
    respond,
    retry_later,
    session_not_found,
)
from mcpfleet.router.forward import Forwarder
from mcpfleet.router.gone import OwnerGone
from mcpfleet.router.metrics import RouterMetrics
from mcpfleet.router.rehome import Rehomer
from mcpfleet.router.replicas import ReplicaView
from mcpfleet.router.route import SessionRoute, swap_session
from mcpfleet.router.table import LookupSource, SessionTable
from mcpfleet.router.upstream import Failure, Upstream


class Sticky:
    """The requests of handshake-era sessions, each to its session's owner."""

    def __init__(
        self,
        config: RouterConfig,
        sessions: SessionTable,
        view: ReplicaView,
        upstream: Upstream,
        metrics: RouterMetrics,
        rehomer: Rehomer,
        forwarder: Forwarder,
    ) -> None:
        self.config = config
        self.sessions = sessions
        self.view = view
        self.upstream = upstream
        self.metrics = metrics
        self.rehomer = rehomer
        self.forwarder = forwarder

    async def route(self, x: Exchange) -> RequestOutcome | Failure:
        """Route the request of ``x`` (it carries ``Mcp-Session-Id``) to the session's owner."""
        session = x.session
        assert session is not None  # (the request carries Mcp-Session-Id: STICKY)
        if not valid_session_id(session):
            await respond(
                x.send,
                400,
                jsonrpc_error(ErrorCode.INVALID_REQUEST, "Bad Request: malformed Mcp-Session-Id"),
            )
            return RequestOutcome.REJECTED
        route, source = await self.sessions.lookup(session)
        self.metrics.lookups.labels(source).inc()
        if tracing.ON:
            tracing.note("mcpfleet.session.lookup", source.value)
        if route is None:
            if source is LookupSource.BUSY:
                # A burst holds every Redis connection: the session may exist.
                await retry_later(x.send, 503, ErrorCode.SERVER_ERROR, "Router busy; retry")
                return RequestOutcome.UNAVAILABLE
            if source is LookupSource.UNKNOWN:
                # Redis cannot say whether the session exists: a 404 could end a live one.
                await retry_later(
                    x.send, 503, ErrorCode.SERVER_ERROR, "Session directory unavailable; retry"
                )
                return RequestOutcome.UNAVAILABLE
            await session_not_found(x.send)
            return RequestOutcome.CLIENT_ERROR
        return await self._to_owner(x, route)

    async def _to_owner(self, x: Exchange, route: SessionRoute) -> RequestOutcome | Failure:
        """Forward a session's request along its ``route``; an owner found gone is
        the :class:`~mcpfleet.router.rehome.Rehomer`'s: the 404, or, re-homing, on
        along the new route it returns (once: a new route whose owner is gone at
        once gets a 503 from it, never another route)."""
        rehomed = False
        while True:
            forwarded = await self._forward(x, route)
            if not isinstance(forwarded, OwnerGone):
                return forwarded
            if tracing.ON:
                tracing.note("mcpfleet.owner_gone", forwarded.value)
            moved = await self.rehomer.gone(x, route, forwarded, rehomed)
            if isinstance(moved, RequestOutcome):
                return moved
            if tracing.ON:
                tracing.note("mcpfleet.rehomed", True)
            # The client's own headers go along (its session id swapped by _forward).
            route, rehomed = moved, True

    async def _forward(
        self, x: Exchange, route: SessionRoute
    ) -> RequestOutcome | Failure | OwnerGone:
        """Forward a session's request along its ``route``: the outcome, or how its
        owner was found gone (the request went to no other replica)."""
        session = x.session
        assert session is not None  # (a sticky exchange's)
        owner, upstream_id = route.owner, route.upstream_id
        address = await self.view.locate(owner)
        if address is None:
            # Known dead, or absent from the registry for long: it left.
            return OwnerGone.DEREGISTERED
        alias: tuple[bytes, bytes] | None = None
        forwarded = x
        if upstream_id is not None:
            # The owner knows the session by its own id; answers carry the client's.
            forwarded = x.with_headers(swap_session(x.scope["headers"], session, upstream_id))
            alias = (upstream_id.encode("latin-1"), session.encode("latin-1"))
        method: str = x.scope["method"]
        forwarding = self.forwarder.forward(forwarded, RouteKind.STICKY, owner, address, alias)
        if self.config.rehome_sessions and method == "POST":
            # Only a re-homing router counts (a session busy here is not moved).
            outcome = await self.rehomer.in_flight(x, owner, address, forwarding)
        else:
            outcome = await forwarding
        if outcome is Failure.REFUSED:
            self.view.drop_dead(owner)
            return OwnerGone.REFUSED
        if outcome is Failure.TIMEOUT:
            # Overloaded, or unreachable: not proof of death. The client may retry.
            await retry_later(
                x.send, 503, ErrorCode.SERVER_ERROR, "Session owner unavailable; retry"
            )
            return RequestOutcome.UNAVAILABLE
        if outcome is Failure.DRAINING:
            # Only a replica that no longer knows the session (or, draining with
            # the handover, hands it over) answers this way.
            return OwnerGone.UNKNOWN_TO_OWNER
        if outcome is Failure.DROPPED:
            # The owner may have run the request, so it goes nowhere else. An owner
            # that no longer takes connections died with the session: the spec's 404.
            if not await self.upstream.accepts(address):
                self.view.drop_dead(owner)
                return OwnerGone.DIED
            await outcome_unknown(x.send, owner)
            return Failure.DROPPED
        if method == "DELETE" and isinstance(outcome, int) and outcome < 300:
            # Only the session's own credential can end it (anyone else gets a 404).
            await self.sessions.drop(session)
        return outcome_of(outcome)
