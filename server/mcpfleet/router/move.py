"""What becomes of a session whose owner is gone: the 404 that ends it, or its move.

:class:`SessionEnd` ends it with the spec's 404, its route dropped, counted by
why (:class:`~mcpfleet.router.gone.OwnerGone`, :class:`~mcpfleet.router.gone.Lost`).

:class:`Mover` runs the moves this router leads, one per session however many
of its requests found the owner gone (they share it). What Redis holds of the
session decides first (ended, lost, moved by another router already, not
re-homable); then one router in the fleet claims the move in Redis while the
others wait for the route it writes. With the claim held, the session is
opened again (:func:`~mcpfleet.router.reinit.reopen`) on a replica chosen as
for a new session, tried in turn under the re-send rule
(:func:`~mcpfleet.router.resend.on_replicas`), and its new
:class:`~mcpfleet.router.route.SessionRoute` is written. Whether a session may
move at all is :class:`~mcpfleet.router.rehome.Rehomer`'s to decide.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, replace

from starlette.types import Message, Scope, Send

from mcpfleet.answers import ErrorCode, send_whole
from mcpfleet.config import RouterConfig
from mcpfleet.contract import Attestation
from mcpfleet.router.decisions import Candidate, place_session
from mcpfleet.router.exchange import Exchange, RequestOutcome, retry_later, session_not_found
from mcpfleet.router.gone import Lost, OwnerGone
from mcpfleet.router.h1client import Broken, ConnectFailed
from mcpfleet.router.health import Health, RedisDown
from mcpfleet.router.metrics import RouterMetrics
from mcpfleet.router.reinit import InitRecord, Reopened, close_session, reopen
from mcpfleet.router.replicas import ReplicaView
from mcpfleet.router.resend import Resend, on_replicas
from mcpfleet.router.route import SessionRoute
from mcpfleet.router.table import SessionTable
from mcpfleet.router.upstream import Failure, Upstream

log = logging.getLogger("mcpfleet.router")

#: How often a router that waits for another router's move reads the route.
MOVE_POLL = 0.05


class SessionEnd:
    """The spec's 404 for the session of an exchange whose owner is gone: its route
    dropped from the cache and Redis, the end counted by why."""

    def __init__(self, sessions: SessionTable, metrics: RouterMetrics) -> None:
        self.sessions = sessions
        self.metrics = metrics

    async def answer(
        self, x: Exchange, route: SessionRoute, why: Lost | OwnerGone
    ) -> RequestOutcome:
        """The session ends with the spec's 404, counted by ``why``: a :class:`Lost`
        reason (it had work in flight when its owner went, or cannot be opened
        again), or how the owner's absence was noticed (:class:`OwnerGone`: the
        session ends with its owner)."""
        assert x.session is not None  # (a sticky exchange's)
        if isinstance(why, Lost):
            log.info("session of %s ended, not re-homed: %s", route.owner, why)
            self.metrics.lost.labels(why).inc()
            await self.sessions.drop(x.session)
        else:
            log.info("session of %s answered 404: owner %s", route.owner, why)
            await self.sessions.drop(x.session)
            self.metrics.owner_gone.labels(why).inc()
        await session_not_found(x.send)
        return RequestOutcome.OWNER_GONE


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


class Mover:
    """The re-homes this router leads, each shared by the session's requests here."""

    def __init__(
        self,
        config: RouterConfig,
        sessions: SessionTable,
        view: ReplicaView,
        upstream: Upstream,
        metrics: RouterMetrics,
        health: Health,
        end: SessionEnd,
    ) -> None:
        self.config = config
        self.sessions = sessions
        self.view = view
        self.upstream = upstream
        self.metrics = metrics
        self.health = health
        self.end = end
        #: Re-homes this router runs now, by session: the new route, or None.
        self._moving: dict[str, asyncio.Future[SessionRoute | None]] = {}

    async def move(
        self, x: Exchange, route: SessionRoute, cause: OwnerGone
    ) -> SessionRoute | RequestOutcome:
        """Re-home the session of ``x``, whose owner on ``route`` is gone (so):
        its new route, or the outcome of the answer sent instead.

        Concurrent requests of the session on this router share one re-home;
        across routers, one claim in Redis lets one router move it while the
        others wait for the new route (each wait bounded by ``rehome_timeout``).
        """
        session = x.session
        assert session is not None  # (a sticky exchange's)
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
            result = await self._lead(Move(x, session, route, cause))
            return result
        finally:
            del self._moving[session]
            # A route for the requests that wait on this move; None when it ended
            # in an answer: each tries its own.
            future.set_result(None if isinstance(result, RequestOutcome) else result)

    async def _lead(self, move: Move) -> SessionRoute | RequestOutcome:
        """This router's move of the session: what Redis holds of it decides, then
        the claim (another router's claim: wait for its move)."""
        x, session, route = move.x, move.session, move.route
        try:
            current_route, init_raw, lost_raw = await self.sessions.rehome_state(session, route)
        except RedisDown as exc:
            return await self._directory_down(x.send, exc)
        if lost_raw is not None:
            return await self.end.answer(x, route, _lost_reason(lost_raw))
        if current_route is None:
            # Ended meanwhile (a DELETE, an expiry): the session is unknown.
            await self.sessions.drop(session)
            await session_not_found(x.send)
            return RequestOutcome.OWNER_GONE
        if current_route != route:
            # Another router moved it already (this router's cache was stale, and
            # now holds the new route).
            return current_route
        record = InitRecord.from_json(init_raw)
        if record is None:
            # Not re-homable (opened before the mode, the app opted out, too large).
            return await self.end.answer(x, route, move.cause)
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
            await release()  # (before the answer, as send_released does)
            await retry_later(
                x.send, 503, ErrorCode.SERVER_ERROR, "Session re-home timed out; retry"
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
                current = await self.sessions.route(session, route)
            except RedisDown as exc:
                self.health.fail(exc)
                break
            if current is None:
                await session_not_found(send)
                return RequestOutcome.OWNER_GONE
            if current != route:  # (now in the cache)
                return current
            await asyncio.sleep(MOVE_POLL)
        await retry_later(send, 503, ErrorCode.SERVER_ERROR, "Session moving; retry")
        return RequestOutcome.UNAVAILABLE

    async def _reopen(self, move: Move) -> SessionRoute | RequestOutcome:
        """Open the session again on a live replica (the claim is held): its new route."""
        x, record = move.x, move.record
        assert record is not None  # (read before the claim)
        # What each attempt sends: the client's headers (its credentials) and the
        # record; the session's own id is the new replica's to give.
        headers = x.scope["headers"]

        async def choose(tried: set[str]) -> Candidate | None:
            return place_session(self.view.serving(exclude=tried), self.config.session_cap)

        async def attempt(replica: Attestation) -> tuple[Attestation, Reopened] | Resend:
            try:
                with self.view.placing(replica.name) as place:
                    reopened = await reopen(self.upstream.pool, replica.address, headers, record)
                    if reopened.upstream_id is not None:
                        place.opened()
            except ConnectFailed:
                return Resend(Failure.REFUSED)
            except (TimeoutError, Broken) as exc:
                # An initialize has no effect but a session, which idles out unused.
                log.info("re-home on %s failed: %s", replica.name, type(exc).__name__)
                return Resend(Failure.UPSTREAM_BROKE)
            if reopened.status == 503:
                # Draining, or at its session limit: another replica.
                return Resend(Failure.DRAINING)
            return replica, reopened

        answered = await on_replicas(
            self.view, self.config.attempts, choose, attempt, tried={move.route.owner}
        )
        if answered is None:
            await retry_later(x.send, 503, ErrorCode.SERVER_ERROR, "No serving replica")
            return RequestOutcome.NO_REPLICA
        return await self._adopt(move, *answered)

    async def _adopt(
        self, move: Move, replica: Attestation, reopened: Reopened
    ) -> SessionRoute | RequestOutcome:
        """``replica`` answered the re-home's ``initialize`` (not a 503): the
        session's new route there, or the answer that says why not."""
        x, session, cause = move.x, move.session, move.cause
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
            return await self.end.answer(x, move.route, Lost.REFUSED)
        if not reopened.allowed or reopened.principal != move.record.principal:
            # Another principal's credential (or an app that no longer allows
            # it): the same 404 as an unknown session; the original is untouched.
            await self._close_quietly(replica.address, x.scope, reopened.upstream_id)
            if not reopened.allowed:
                return await self.end.answer(x, move.route, cause)
            log.info("re-home refused: the credential is not the session owner's")
            await session_not_found(x.send)
            return RequestOutcome.OWNER_GONE
        new_route = SessionRoute(replica.name, reopened.upstream_id)
        try:
            lost = await self.sessions.move(session, new_route)
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
            return await self.end.answer(x, move.route, Lost.REQUEST_BROKE)
        self.metrics.rehomed.labels(cause).inc()
        log.info("session of %s re-homed on %s (%s)", move.route.owner, replica.name, cause)
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


def _lost_reason(mark: bytes | str) -> Lost:
    """The reason a ``lost`` mark in Redis gives (one this router does not know: a
    request broke)."""
    reason = mark.decode() if isinstance(mark, bytes) else str(mark)
    return Lost(reason) if reason in set(Lost) else Lost.REQUEST_BROKE
