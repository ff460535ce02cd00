"""Re-homing an idle handshake session whose replica is gone (router ``--rehome-sessions``).

When a session's owner is gone and the session had no work in flight, the
router opens the session again on a live replica
(:func:`~mcpfleet.router.reinit.reopen`: ``initialize`` with the parameters
kept at the session's start and the current request's credentials, then
``notifications/initialized``), records the route as the new owner and the
new owner's session id (a :class:`~mcpfleet.router.route.SessionRoute`), and
forwards the request with the session id swapped (:func:`swap_session`);
answers carry the client's id back. docs/rehome.md tells what a client sees,
and what this does not cover.

:class:`Rehomer` decides what becomes of a session whose owner is gone (the
spec's 404, or the move) and keeps this router's books for it: the requests
of each session in flight here and the moves it leads. The router
(:class:`~mcpfleet.router.proxy.Router`) tells it when a request starts and
ends and when an owner is found gone, and forwards along the route a move
returns. The Redis records live in :class:`~mcpfleet.router.table.SessionTable`.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import time
from dataclasses import dataclass, replace

from starlette.types import Message, Scope, Send

from mcpfleet.config import RouterConfig
from mcpfleet.contract import (
    CLIENT_SESSION_HEADER,
    LOST_AT_DRAIN_DEADLINE,
    PRINCIPAL_HEADER,
    REHOME_HEADER,
    SESSION_HEADER,
    Attestation,
)
from mcpfleet.httpio import ErrorCode, send_whole
from mcpfleet.router.decisions import place_session
from mcpfleet.router.exchange import Exchange, RequestOutcome, retry_later, session_not_found
from mcpfleet.router.h1 import Broken, ConnectFailed, Response
from mcpfleet.router.health import Health, RedisDown
from mcpfleet.router.metrics import RouterMetrics
from mcpfleet.router.reinit import (
    InitRecord,
    Reopened,
    close_session,
    initialize_params,
    reopen,
)
from mcpfleet.router.replicas import ReplicaView
from mcpfleet.router.route import SessionRoute
from mcpfleet.router.table import SessionTable
from mcpfleet.router.upstream import Failure, Upstream

log = logging.getLogger("mcpfleet.router")

_SESSION = SESSION_HEADER.lower().encode()
_CLIENT_SESSION = CLIENT_SESSION_HEADER.lower().encode()


class OwnerGone(enum.StrEnum):
    """Why a session's owner counts as gone: the ``reason`` of ``owner_gone_total``
    (and the ``cause`` of ``sessions_rehomed_total``)."""

    DEREGISTERED = "deregistered"  # known dead, or absent from the registry too long
    REFUSED = "refused"  # its address refused the connection
    UNKNOWN_TO_OWNER = "unknown_to_owner"  # it answered that it no longer has the session
    DIED = "died"  # it dropped a request mid-way and then refused connections


class Lost(enum.StrEnum):
    """Why a session whose owner went was ended with the 404 instead of re-homed:
    the ``reason`` of ``mcpfleet_router_sessions_lost_total``."""

    #: This router had a request of the session in flight on the gone owner.
    IN_FLIGHT = "in_flight"
    #: A router's forwarded request of the session broke when the owner went
    #: (marked in Redis before that router answered).
    REQUEST_BROKE = "request_broke"
    #: The request answers (or cancels) a request of the gone owner: an
    #: elicitation's answer, a ``notifications/cancelled``.
    ANSWER_ORPHANED = "answer_orphaned"
    #: The live replica refused to open the session again (not a credential's 401/403).
    REFUSED = "refused"
    #: Its replica's drain deadline cut a request of the session (the replica
    #: marked it in Redis before it stopped, whatever the router saw of the end).
    DRAIN_DEADLINE = LOST_AT_DRAIN_DEADLINE


def answers_gone_work(body: bytes) -> bool:
    """Whether a POST body answers or cancels something the gone owner asked or ran:
    a JSON-RPC response (an elicitation's answer) or ``notifications/cancelled``.
    Such a session had work in flight: it is not re-homed."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return False
    items = doc if isinstance(doc, list) else [doc]
    for item in items:
        if not isinstance(item, dict):
            continue
        if "method" not in item and ("result" in item or "error" in item):
            return True
        if item.get("method") == "notifications/cancelled":
            return True
    return False


def swap_session(
    raw_headers: list[tuple[bytes, bytes]], old: str, new: str
) -> list[tuple[bytes, bytes]]:
    """``raw_headers`` with the session id ``old`` replaced by ``new``."""
    old_b, new_b = old.encode("latin-1"), new.encode("latin-1")
    return [(k, new_b if k.lower() == _SESSION and v == old_b else v) for k, v in raw_headers]


def client_session_line(session: str) -> bytes:
    """The header line naming a re-homed session's own (client's) id to its replica."""
    return b"%s: %s\r\n" % (_CLIENT_SESSION, session.encode("latin-1"))


#: How often a router that waits for another router's move reads the route.
MOVE_POLL = 0.05


@dataclass(frozen=True, slots=True)
class Move:
    """One re-home this router leads, as its steps pass it on."""

    #: The request that found the owner gone (its answer goes through ``x.send``).
    x: Exchange
    #: The client's session id (``x.session``).
    session: str
    #: The route whose owner is gone.
    route: SessionRoute
    cause: OwnerGone
    #: What re-opens the session, once read from Redis.
    record: InitRecord | None = None


class Rehomer:
    """What becomes of a session whose owner is gone, and this router's books for it.

    With re-homing off, a gone owner's session gets the spec's 404 (its route
    dropped, counted by :class:`OwnerGone`). With it on, a session with work in
    flight gets the same 404 (counted by :class:`Lost`); an idle one moves to a
    live replica, and :meth:`gone` returns its new route.

    The books: this router's requests (POSTs) in flight per session
    (:meth:`enter`, :meth:`leave`; a session busy here is never moved), and the
    moves this router leads, which concurrent requests of the same session
    share.
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
        self.metrics = metrics
        self.health = health
        #: Requests (POST) in flight per session on this router, counted when
        #: re-homing: a session with one when its owner went is not re-homed.
        self._busy: dict[str, int] = {}
        #: Re-homes this router runs now, by session: the new route, or None.
        self._moving: dict[str, asyncio.Future[SessionRoute | None]] = {}

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
        session = x.session
        assert session is not None  # (a sticky exchange's)
        owner = route.owner
        method = x.scope["method"]
        rehoming = self.config.rehome_sessions
        if rehoming and cause is OwnerGone.DIED and method != "GET":
            # It dropped the request and died: the request may have run. Only a
            # stream's opening request (a GET) has no effect to repeat.
            return await self._lose(x.send, session, owner, Lost.REQUEST_BROKE)
        if not rehoming or method == "DELETE":
            return await self._owner_gone(x.send, session, owner, cause)
        if rehomed:
            # The replica just chosen went at once: the session stays re-homable.
            await retry_later(
                x.send, 503, ErrorCode.SERVER_ERROR, "Session owner unavailable; retry"
            )
            return RequestOutcome.UNAVAILABLE
        if self._busy.get(session):
            return await self._lose(x.send, session, owner, Lost.IN_FLIGHT)
        if method == "POST" and answers_gone_work(x.body):
            return await self._lose(x.send, session, owner, Lost.ANSWER_ORPHANED)
        return await self._move(Move(x, session, route, cause))

    async def _move(self, move: Move) -> SessionRoute | RequestOutcome:
        """Re-home ``session``: its new route, or the outcome of the answer sent instead.

        Concurrent requests of the session on this router share one re-home;
        across routers, one claim in Redis lets one router move it while the
        others wait for the new route (each wait bounded by ``rehome_timeout``).
        """
        x, session = move.x, move.session
        for _ in range(self.config.attempts):
            pending = self._moving.get(session)
            if pending is None:
                break
            try:
                moved = await asyncio.wait_for(asyncio.shield(pending), self.config.rehome_timeout)
            except TimeoutError:
                await retry_later(x.send, 503, ErrorCode.SERVER_ERROR, "Session moving; retry")
                return RequestOutcome.UNAVAILABLE
            if moved is not None:
                return moved
            # The other request's re-home failed (its credential, say): try with ours.
        else:
            await retry_later(x.send, 503, ErrorCode.SERVER_ERROR, "Session moving; retry")
            return RequestOutcome.UNAVAILABLE
        future: asyncio.Future[SessionRoute | None] = asyncio.get_running_loop().create_future()
        self._moving[session] = future
        result: SessionRoute | RequestOutcome | None = None
        try:
            result = await self._lead(move)
            return result
        finally:
            del self._moving[session]
            # A route for the requests that wait on this move; None when it ended
            # in an answer: each tries its own.
            future.set_result(None if isinstance(result, RequestOutcome) else result)

    async def _lead(self, move: Move) -> SessionRoute | RequestOutcome:
        """This router's move of the session: what Redis holds of it decides, then
        the claim (another router's claim: wait for its move)."""
        x, session, route, owner = move.x, move.session, move.route, move.route.owner
        try:
            current_route, init_raw, lost_raw = await self.sessions.rehome_state(session)
        except RedisDown as exc:
            return await self._directory_down(x.send, exc)
        if lost_raw is not None:
            reason = lost_raw.decode() if isinstance(lost_raw, bytes) else str(lost_raw)
            return await self._lose(
                x.send, session, owner, Lost(reason) if reason in set(Lost) else Lost.REQUEST_BROKE
            )
        if current_route is None:
            # Ended meanwhile (a DELETE, an expiry): the session is unknown.
            await self.sessions.drop(session)
            await session_not_found(x.send)
            return RequestOutcome.OWNER_GONE
        if current_route != route:
            # Another router moved it already (this router's cache was stale).
            self.sessions.remember(session, current_route)
            return current_route
        record = InitRecord.from_json(init_raw)
        if record is None:
            # Not re-homable (opened before the mode, the app opted out, too large).
            return await self._owner_gone(x.send, session, owner, move.cause)
        try:
            claimed = await self.sessions.claim_move(session, self.config.rehome_timeout)
        except RedisDown as exc:
            return await self._directory_down(x.send, exc)
        if not claimed:
            return await self._await_move(x.send, session, route)
        return await self._claimed(replace(move, record=record))

    async def _claimed(self, move: Move) -> SessionRoute | RequestOutcome:
        """The move, with the claim held: within ``rehome_timeout``; the claim
        released before any answer, or at the end of a move that failed."""
        x = move.x
        released = False

        async def release() -> None:
            nonlocal released
            if not released:
                released = True
                await self.sessions.release_move(move.session)

        async def send_released(message: Message) -> None:
            # The claim goes before any answer: the client's next request must
            # find the session free to re-home, not held by this one.
            if message["type"] == "http.response.start":
                await release()
            await x.send(message)

        moved = False
        try:
            async with asyncio.timeout(self.config.rehome_timeout):
                result = await self._reopen(replace(move, x=replace(x, send=send_released)))
            moved = not isinstance(result, RequestOutcome)  # the move released the claim
            return result
        except TimeoutError:
            log.warning("re-home of a session of %s timed out", move.route.owner)
            await retry_later(
                send_released, 503, ErrorCode.SERVER_ERROR, "Session re-home timed out; retry"
            )
            return RequestOutcome.UNAVAILABLE
        finally:
            if not moved:
                await release()

    async def _await_move(
        self, send: Send, session: str, route: SessionRoute
    ) -> SessionRoute | RequestOutcome:
        """Another router holds the session's move: its new route once written
        (read every :data:`MOVE_POLL` s, for at most ``rehome_timeout``), else a
        503 to retry."""
        deadline = time.monotonic() + self.config.rehome_timeout
        while time.monotonic() < deadline:
            try:
                current = await self.sessions.route(session)
            except RedisDown as exc:
                self.health.fail(exc)
                break
            if current is None:
                await session_not_found(send)
                return RequestOutcome.OWNER_GONE
            if current != route:
                self.sessions.remember(session, current)
                return current
            await asyncio.sleep(MOVE_POLL)
        await retry_later(send, 503, ErrorCode.SERVER_ERROR, "Session moving; retry")
        return RequestOutcome.UNAVAILABLE

    async def _reopen(self, move: Move) -> SessionRoute | RequestOutcome:
        """Open the session again on a live replica (the claim is held): its new route."""
        x, record = move.x, move.record
        assert record is not None  # (read before the claim)
        tried = {move.route.owner}
        for _ in range(self.config.attempts):
            choice = place_session(self.view.serving(exclude=tried), self.config.session_cap)
            if choice is None:
                break
            tried.add(choice.name)
            replica = self.view.get(choice.name)
            if replica is None:
                continue
            try:
                with self.view.placing(choice.name) as place:
                    reopened = await reopen(
                        self.upstream.pool, replica.address, x.scope["headers"], record
                    )
                    if reopened.upstream_id is not None:
                        place.opened()
            except ConnectFailed:
                if await self.view.after_refusal(replica.name, replica.address):
                    tried.discard(replica.name)  # restarted elsewhere: it may take it
                continue
            except (TimeoutError, Broken) as exc:
                # An initialize has no effect but a session, which idles out unused.
                log.info("re-home on %s failed: %s", replica.name, type(exc).__name__)
                continue
            if reopened.status == 503:
                continue  # draining, or at its session limit: another replica
            return await self._adopt(move, replica, reopened)
        await retry_later(x.send, 503, ErrorCode.SERVER_ERROR, "No serving replica")
        return RequestOutcome.NO_REPLICA

    async def _adopt(
        self, move: Move, replica: Attestation, reopened: Reopened
    ) -> SessionRoute | RequestOutcome:
        """``replica`` answered the re-home's ``initialize`` (not a 503): the
        session's new route there, or the answer that says why not."""
        x, session, owner, cause = move.x, move.session, move.route.owner, move.cause
        assert move.record is not None  # (read before the claim)
        if reopened.status in (401, 403):
            # The current credential does not open sessions: the client hears why.
            extra = [
                (k, v)
                for k, v in reopened.raw_headers
                if k.lower() in (b"www-authenticate", b"content-type")
            ]
            await send_whole(x.send, reopened.status, reopened.body, headers=extra)
            return RequestOutcome.CLIENT_ERROR
        if reopened.upstream_id is None:
            return await self._lose(x.send, session, owner, Lost.REFUSED)
        if not reopened.allowed or reopened.principal != move.record.principal:
            # Another principal's credential (or an app that no longer allows
            # it): the same 404 as an unknown session; the original is untouched.
            await self._close_quietly(replica.address, x.scope, reopened.upstream_id)
            if not reopened.allowed:
                return await self._owner_gone(x.send, session, owner, cause)
            log.info("re-home refused: the credential is not the session owner's")
            await session_not_found(x.send)
            return RequestOutcome.OWNER_GONE
        try:
            lost = await self.sessions.lost(session)
            if lost is None:
                new_route = SessionRoute(replica.name, reopened.upstream_id)
                await self.sessions.move(session, new_route)
        except RedisDown as exc:
            self.health.fail(exc)
            await self._close_quietly(replica.address, x.scope, reopened.upstream_id)
            await retry_later(
                x.send, 503, ErrorCode.SERVER_ERROR, "Session directory unavailable; retry"
            )
            return RequestOutcome.UNAVAILABLE
        if lost is not None:
            # A router marked it lost while this one re-opened it.
            await self._close_quietly(replica.address, x.scope, reopened.upstream_id)
            return await self._lose(x.send, session, owner, Lost.REQUEST_BROKE)
        self.metrics.rehomed.labels(cause).inc()
        log.info("session of %s re-homed on %s (%s)", owner, replica.name, cause)
        return new_route

    async def _close_quietly(self, address: str, scope: Scope, upstream_id: str) -> None:
        """DELETE a session the router opened and will not use; failures only logged."""
        try:
            async with asyncio.timeout(self.config.connect_timeout + 1.0):
                await close_session(self.upstream.pool, address, scope["headers"], upstream_id)
        except (ConnectFailed, Broken, TimeoutError) as exc:
            log.info("unused re-home session not closed: %s", type(exc).__name__)

    async def _directory_down(self, send: Send, exc: BaseException) -> RequestOutcome:
        """Redis could not answer a step of the move: a 503 to retry (still re-homable)."""
        self.health.fail(exc)
        await retry_later(send, 503, ErrorCode.SERVER_ERROR, "Session directory unavailable; retry")
        return RequestOutcome.UNAVAILABLE

    async def _lose(self, send: Send, session: str, owner: str, reason: Lost) -> RequestOutcome:
        """The session had work in flight when its owner went (or cannot be opened
        again): it ends with the spec's 404, counted by reason."""
        log.info("session of %s ended, not re-homed: %s", owner, reason)
        self.metrics.lost.labels(reason).inc()
        await self.sessions.drop(session)
        await session_not_found(send)
        return RequestOutcome.OWNER_GONE

    async def _owner_gone(
        self, send: Send, session: str, owner: str, reason: OwnerGone
    ) -> RequestOutcome:
        """The session ends with its owner: the spec's 404, counted by how the
        owner's absence was noticed."""
        log.info("session of %s answered 404: owner %s", owner, reason)
        await self.sessions.drop(session)
        self.metrics.owner_gone.labels(reason).inc()
        await session_not_found(send)
        return RequestOutcome.OWNER_GONE
