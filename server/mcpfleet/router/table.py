"""What the router knows: live replicas and session owners, from Redis with local caches.

:class:`ReplicaView` refreshes the replica set from the registry in the
background, never on a request's path, and keeps the last known set when
Redis is down (the router is then *degraded*, not closed).

:class:`SessionTable` maps a handshake-era session to the replica that owns
it. A session never moves, so a cached owner stays valid until that owner
leaves; Redis is read on a cache miss only, and written when a session opens.
Entries expire with the session idle timeout, refreshed at most every quarter
of it. Sessions opened while Redis was down are written once it returns.
With re-homing on (:mod:`mcpfleet.router.rehome`), each session also has an
``init`` record beside its route (written in the same round trip), a ``lost``
mark once its owner went with work in flight, and a ``moving`` claim while
one router re-homes it; a re-homed session's route names its new owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import logging
import time
from collections import OrderedDict
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from mcpfleet.contract import Attestation, RedisKeys
from mcpfleet.redisconn import (
    DEFAULT_DEADLINE,
    DEFAULT_FAILOVER_WAIT,
    describe,
    mget_by_slot,
    pool_full,
    ride_through,
    within,
)
from mcpfleet.registry import read_replicas
from mcpfleet.router.decisions import Candidate
from mcpfleet.router.route import SessionRoute

log = logging.getLogger("mcpfleet.router")

RedisDown = (RedisError, OSError, asyncio.TimeoutError)

#: The most session lookups one ``MGET`` carries.
LOOKUP_BATCH = 256


@dataclass
class Health:
    """Redis reachability as the router last saw it."""

    degraded: bool = False
    since: float = 0.0
    reason: str = ""

    def fail(self, exc: BaseException) -> None:
        """Redis could not be used. A full connection pool is the router being busy,
        not Redis down: it changes nothing here (the next call tries again)."""
        if pool_full(exc):
            return
        if not self.degraded:
            log.error(
                "Redis unreachable (%s): degraded, routing from cache and the last known "
                "replica set",
                describe(exc),
            )
            self.degraded, self.since = True, time.monotonic()
        self.reason = type(exc).__name__

    def ok(self) -> None:
        if self.degraded:
            log.warning(
                "Redis reachable again after %.1fs: no longer degraded",
                time.monotonic() - self.since,
            )
        self.degraded, self.reason = False, ""


@dataclass(frozen=True)
class ViewState:
    """Everything a router knows about the replicas, as plain data.

    Bounded: every table is keyed by replicas in the registry, or missing
    from it for less than a grace or the owner-absent limit; nothing keeps a
    name forever. No wall clock of another machine is compared with this
    one's: the replicas' heartbeats are only compared with each other, and
    the local times here are monotonic.
    """

    replicas: dict[str, Attestation] = field(default_factory=dict)
    #: When (monotonic) a replica was first missed from the registry.
    missing: dict[str, float] = field(default_factory=dict)
    #: Replicas whose connection was refused: the heartbeat of the record then.
    dead: dict[str, float] = field(default_factory=dict)
    #: Where, and when (monotonic), each replica was last in the registry.
    last_seen: dict[str, tuple[str, float]] = field(default_factory=dict)
    #: How many distinct attestations of each replica this router has seen.
    generation: dict[str, int] = field(default_factory=dict)
    #: Sessions this router placed, per replica: the generation at each placement.
    placed: dict[str, list[int]] = field(default_factory=dict)


#: A placement is counted until this many newer attestations of its replica
#: arrived: the first may have been published before the session existed,
#: the second a heartbeat later, after it.
PLACEMENT_GENERATIONS = 2


class Placement:
    """One ``initialize`` forwarded to a replica, as the replica's session count sees it.

    While it is in flight it holds a place on the replica (:attr:`ReplicaView.opening`):
    a burst of them cannot overshoot the session cap, since each one forwarded
    counts before the next is placed. It ends one of two ways, once: the replica
    answered with a session (:meth:`opened`: the place becomes a placement,
    counted until the replica's attestations include it), or anything else
    (:meth:`close`: a refusal, an error, a dropped connection; the place is
    given back at once). A refused ``initialize`` so never counts as a session.
    """

    __slots__ = ("_view", "name", "settled")

    def __init__(self, view: ReplicaView, name: str) -> None:
        self._view = view
        self.name = name
        self.settled = False
        view.opening[name] = view.opening.get(name, 0) + 1

    def _settle(self) -> bool:
        if self.settled:
            return False
        self.settled = True
        view = self._view
        left = view.opening.get(self.name, 1) - 1
        if left > 0:
            view.opening[self.name] = left
        else:
            view.opening.pop(self.name, None)
        # Whoever waits for a place looks again (ReplicaView.place_freed).
        freed, view._freed = view._freed, asyncio.Event()
        freed.set()
        return True

    def opened(self) -> None:
        """The replica answered with a session: it counts as one from now on."""
        if self._settle():
            self._view.note_placement(self.name)

    def close(self) -> None:
        """The ``initialize`` ended without a session (or was counted already)."""
        self._settle()

    def __enter__(self) -> Placement:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def merge_registry(
    state: ViewState,
    registry: dict[str, Attestation],
    now: float,
    *,
    missing_grace: float,
    absent_limit: float,
) -> ViewState:
    """The view after reading ``registry`` at monotonic time ``now`` (pure)."""
    merged: dict[str, Attestation] = {}
    dead: dict[str, float] = {}
    last_seen = {n: seen for n, seen in state.last_seen.items() if now - seen[1] < absent_limit}
    generation: dict[str, int] = {}
    for name, att in registry.items():
        refused_at = state.dead.get(name)
        if refused_at is not None and att.heartbeat <= refused_at:
            dead[name] = refused_at  # the record predates the refused connection
            continue
        merged[name] = att
        last_seen[name] = (att.address, now)
        before = state.replicas.get(name)
        bump = before is None or before.heartbeat != att.heartbeat
        generation[name] = state.generation.get(name, 0) + (1 if bump else 0)
    missing: dict[str, float] = {}
    for name, att in state.replicas.items():
        if name in merged or name in dead:
            continue
        if att.state == "draining":
            # A draining replica withdraws its record when it exits: gone at once,
            # its last address with it (a deleted pod's address may not even
            # refuse a connection: every request would wait out the connect).
            last_seen.pop(name, None)
            continue
        since = state.missing.get(name, now)
        if now - since < missing_grace:
            merged[name] = att
            missing[name] = since
            generation[name] = state.generation.get(name, 0)
    placed: dict[str, list[int]] = {}
    for name, gens in state.placed.items():
        current = generation.get(name)
        fresh = [g for g in gens if current is not None and current - g < PLACEMENT_GENERATIONS]
        if fresh:
            placed[name] = fresh
    return ViewState(merged, missing, dead, last_seen, generation, placed)


@dataclass
class ReplicaView:
    """The replicas a router routes to, refreshed from the registry.

    A replica that vanishes from the registry is kept for ``missing_grace``
    seconds (longer than one heartbeat): a Redis that restarted empty loses
    every record at once, and the replicas write theirs back within a
    heartbeat. One last seen draining is gone at once: a drain ends with the
    replica withdrawing its record. One whose connection was refused is dropped at once and stays
    dropped until it heart-beats again. The merge itself is
    :func:`merge_registry`, a pure function.
    """

    client: aioredis.Redis
    keys: RedisKeys
    health: Health
    missing_grace: float = 2.0
    absent_limit: float = 10.0
    #: Seconds each Redis call may take, whatever the client does inside it.
    deadline: float = DEFAULT_DEADLINE
    state: ViewState = field(default_factory=ViewState)
    inflight: dict[str, int] = field(default_factory=dict)
    #: ``initialize`` requests in flight per replica (:class:`Placement`): each
    #: holds a place against the session cap until its answer.
    opening: dict[str, int] = field(default_factory=dict)
    #: Set (and replaced) whenever an ``initialize`` in flight is answered.
    _freed: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    refreshed: float = 0.0
    _refreshing: asyncio.Future[None] | None = field(default=None, repr=False)

    @property
    def replicas(self) -> dict[str, Attestation]:
        return self.state.replicas

    async def refresh(self) -> None:
        try:
            registry = await within(self.deadline, read_replicas(self.client, self.keys))
        except RedisDown as exc:
            self.health.fail(exc)
            return
        self.health.ok()
        now = time.monotonic()
        self.state = merge_registry(
            self.state,
            registry,
            now,
            missing_grace=self.missing_grace,
            absent_limit=self.absent_limit,
        )
        # Requests in flight are counted per name while they run; idle names go.
        self.inflight = {n: c for n, c in self.inflight.items() if c or n in self.replicas}
        self.refreshed = now

    def note_placement(self, name: str) -> None:
        """Count a session placed on ``name`` until its attestations include it."""
        self.state.placed.setdefault(name, []).append(self.state.generation.get(name, 0))

    def placing(self, name: str) -> Placement:
        """An ``initialize`` forwarded to ``name`` now: its place, settled by the answer."""
        return Placement(self, name)

    def opening_to(self, candidates: list[Candidate]) -> bool:
        """Whether an ``initialize`` is in flight to any of ``candidates``."""
        return any(c.name in self.opening for c in candidates)

    async def place_freed(self, timeout: float) -> None:
        """Return once an ``initialize`` in flight is answered (its place may be free
        again), or after ``timeout`` seconds."""
        freed = self._freed
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await freed.wait()

    def get(self, name: str) -> Attestation | None:
        return self.state.replicas.get(name)

    def knows(self, name: str) -> bool:
        """Whether this router has seen ``name`` at all: serving, recently seen, or dead."""
        return (
            name in self.state.replicas or name in self.state.last_seen or name in self.state.dead
        )

    async def locate(self, name: str) -> str | None:
        """:meth:`owner_address`, after one registry refresh if ``name`` is new here.

        Another router may have placed a session on a replica that registered
        after this router's last refresh (a new pod during a rolling update):
        such an owner is not gone, only not seen yet. Concurrent callers share
        one refresh, and only sessions that exist in Redis get here, so a
        client cannot make the router read the registry at will.
        """
        address = self.owner_address(name)
        if address is None and not self.knows(name):
            await self.refresh_shared()
            address = self.owner_address(name)
        return address

    async def refresh_shared(self) -> None:
        """One registry read now, shared by every caller while it runs (bounded
        by :attr:`deadline`, like every refresh)."""
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.ensure_future(self.refresh())
        await asyncio.shield(self._refreshing)

    async def after_refusal(self, name: str, address: str) -> bool:
        """``name`` refused a connection at ``address``: drop it, read the registry
        once (shared), and say whether it is back at another address.

        A replica restarted under the same name (a process on a new port) has
        written its new record before this router's next periodic refresh; the
        refused connection proves the view stale, so the router reads the
        registry at once rather than answering 503 from a stale view. Only a
        refused connection gets here, never a request a replica may have read.
        """
        self.drop_dead(name)
        await self.refresh_shared()
        back = self.state.replicas.get(name)
        return back is not None and back.address != address

    def owner_address(self, name: str) -> str | None:
        """Where a session's owner was last seen, unless it is known dead or long gone.

        An owner missing from the registry for less than ``absent_limit`` seconds
        may be alive but late with its heartbeat (an overloaded event loop); the
        router then asks it directly, and a refused connection settles it.
        """
        att = self.state.replicas.get(name)
        if att is not None:
            return att.address
        seen = self.state.last_seen.get(name)
        if seen is None or name in self.state.dead:
            return None
        address, at = seen
        return address if time.monotonic() - at < self.absent_limit else None

    def drop_dead(self, name: str) -> None:
        """Drop a replica seen dead (refused connection) until it heart-beats again."""
        att = self.state.replicas.pop(name, None)
        self.state.last_seen.pop(name, None)
        if att is not None:
            self.state.dead[name] = att.heartbeat

    def serving(self, exclude: set[str] | frozenset[str] = frozenset()) -> list[Candidate]:
        """The serving replicas, each with its sessions as this router counts them:
        those it attested, those this router saw it open since, and the ``initialize``
        requests in flight to it."""
        return [
            Candidate(
                a.name,
                a.sessions + len(self.state.placed.get(a.name, ())) + self.opening.get(a.name, 0),
                self.inflight.get(a.name, 0),
            )
            for a in self.state.replicas.values()
            if a.state == "serving" and a.name not in exclude
        ]


class LookupSource(enum.StrEnum):
    """Where a session's owner was found; the values label ``session_lookups_total``."""

    CACHE = "cache"
    REDIS = "redis"
    #: Redis answered: no such session.
    MISS = "miss"
    #: Redis could not be asked: the session may exist.
    UNKNOWN = "unknown"
    #: Redis answered "no such session" less than ``negative_ttl`` seconds ago.
    MISS_CACHED = "miss_cached"
    #: Every Redis connection of this router stayed busy for the pool wait: the
    #: router is overloaded, Redis is not down.
    BUSY = "busy"


class SessionTable:
    def __init__(
        self,
        client: aioredis.Redis,
        keys: RedisKeys,
        health: Health,
        *,
        ttl: float,
        cache_size: int = 200_000,
        deadline: float = DEFAULT_DEADLINE,
        failover_wait: float = DEFAULT_FAILOVER_WAIT,
        negative_ttl: float = 2.0,
        negative_size: int = 50_000,
    ) -> None:
        self.deadline = deadline
        self.failover_wait = failover_wait
        self.client = client
        self.keys = keys
        self.health = health
        self.ttl = ttl
        self.cache_size = cache_size
        self.negative_ttl = negative_ttl
        self.negative_size = negative_size
        self._cache: OrderedDict[str, tuple[SessionRoute, float]] = OrderedDict()
        #: Ids Redis said it does not know, and when (monotonic): a burst of
        #: repeated unknown ids costs one lookup each per ``negative_ttl``.
        #: Session ids are random: no live session was ever one of these.
        self._unknown: OrderedDict[str, float] = OrderedDict()
        self._unsaved: dict[str, SessionRoute] = {}
        #: Lookups waiting for the next ``MGET``, by session id.
        self._pending: dict[str, list[asyncio.Future[bytes | str | None]]] = {}
        self._flush_soon = False
        self._tasks: set[asyncio.Task[None]] = set()
        #: Whether sessions have ``init`` records to keep alive and drop (re-homing on).
        self.rehome = False

    def _remember(self, session: str, route: SessionRoute, touched: float) -> None:
        self._cache[session] = (route, touched)
        self._cache.move_to_end(session)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)

    def cached(self, session: str) -> SessionRoute | None:
        hit = self._cache.get(session)
        return hit[0] if hit else None

    async def lookup(self, session: str) -> tuple[SessionRoute | None, LookupSource]:
        """The route of ``session`` and where it came from (:class:`LookupSource`)."""
        hit = self._cache.get(session)
        if hit is not None:
            route, touched = hit
            now = time.monotonic()
            if now - touched > self.ttl / 4:
                self._remember(session, route, now)
                self._spawn(self._touch(session))
            return route, LookupSource.CACHE
        missed = self._unknown.get(session)
        if missed is not None and time.monotonic() - missed < self.negative_ttl:
            return None, LookupSource.MISS_CACHED
        try:
            raw = await self._get(session)
        except RedisDown as exc:
            if pool_full(exc):
                return None, LookupSource.BUSY
            self.health.fail(exc)
            return None, LookupSource.UNKNOWN
        if raw is None:
            self._note_unknown(session)
            return None, LookupSource.MISS
        route = SessionRoute.from_redis(raw)
        self._remember(session, route, time.monotonic())
        return route, LookupSource.REDIS

    async def _get(self, session: str) -> bytes | str | None:
        """``GET`` of one session's route, batched: every lookup that misses the
        cache within one event-loop turn shares one ``MGET`` (and one pooled
        connection), so a burst of lookups never queues for the pool one by one."""
        future: asyncio.Future[bytes | str | None] = asyncio.get_running_loop().create_future()
        self._pending.setdefault(session, []).append(future)
        if not self._flush_soon:
            self._flush_soon = True
            asyncio.get_running_loop().call_soon(self._flush_pending)
        return await future

    def _flush_pending(self) -> None:
        self._flush_soon = False
        while self._pending:
            batch = dict(itertools.islice(self._pending.items(), LOOKUP_BATCH))
            for session in batch:
                del self._pending[session]
            self._spawn(self._mget(batch))

    async def _mget(self, batch: dict[str, list[asyncio.Future[bytes | str | None]]]) -> None:
        keys = [self.keys.session(s) for s in batch]
        try:
            # A read, safe to ask again: through Sentinel it waits out a failover.
            values = await ride_through(
                self.client,
                lambda: mget_by_slot(self.client, keys),
                deadline=self.deadline,
                failover_wait=self.failover_wait,
            )
        except BaseException as exc:
            for waiters in batch.values():
                for future in waiters:
                    if future.done():
                        continue
                    if isinstance(exc, Exception):
                        future.set_exception(exc)
                    else:
                        future.cancel()  # the router is shutting down
            if not isinstance(exc, Exception):
                raise
            return
        for waiters, value in zip(batch.values(), values, strict=True):
            for future in waiters:
                if not future.done():
                    future.set_result(value)

    def _note_unknown(self, session: str) -> None:
        if self.negative_ttl <= 0:
            return
        self._unknown[session] = time.monotonic()
        self._unknown.move_to_end(session)
        while len(self._unknown) > self.negative_size:
            self._unknown.popitem(last=False)

    @property
    def unsaved(self) -> bool:
        """Sessions opened while Redis (or this router's pool) could not take them."""
        return bool(self._unsaved)

    async def record(self, session: str, route: SessionRoute, init: str | None = None) -> None:
        """Remember a new session's route (and its ``init`` record, to re-home it);
        written to Redis before the client hears of it, in one round trip."""
        self._remember(session, route, time.monotonic())
        self._unknown.pop(session, None)
        px = int(self.ttl * 1000)
        stored = route.to_redis()
        try:
            if init is None:
                await within(
                    self.deadline, self.client.set(self.keys.session(session), stored, px=px)
                )
            else:
                pipe = self.client.pipeline(transaction=False)
                pipe.set(self.keys.session(session), stored, px=px)
                pipe.set(self.keys.session_init(session), init, px=px)
                await within(self.deadline, pipe.execute())
        except RedisDown as exc:
            self.health.fail(exc)
            self._unsaved[session] = route

    async def rehome_state(
        self, session: str
    ) -> tuple[SessionRoute | None, bytes | str | None, bytes | str | None]:
        """The route as Redis holds it now (not the cache), the ``init`` record and
        the ``lost`` mark of ``session``, in one round trip (raises RedisDown)."""
        keys = [
            self.keys.session(session),
            self.keys.session_init(session),
            self.keys.session_lost(session),
        ]
        route, init, lost = await within(self.deadline, self.client.mget(keys))
        return (None if route is None else SessionRoute.from_redis(route)), init, lost

    async def lost(self, session: str) -> bytes | str | None:
        """The ``lost`` mark of ``session``, if any (raises RedisDown)."""
        mark: bytes | str | None = await within(
            self.deadline, self.client.get(self.keys.session_lost(session))
        )
        return mark

    async def mark_lost(self, session: str, reason: str) -> None:
        """Mark ``session`` lost: no router re-homes it; its next request gets the 404.
        Best effort within the deadline (a Redis that cannot take it is logged)."""
        try:
            await within(
                self.deadline,
                self.client.set(self.keys.session_lost(session), reason, px=int(self.ttl * 1000)),
            )
        except RedisDown as exc:
            self.health.fail(exc)
            log.warning("session lost (%s), but the mark could not be written: %s", reason, exc)

    async def claim_move(self, session: str, seconds: float) -> bool:
        """Claim the re-home of ``session`` for ``seconds``; False if another router holds it."""
        claimed = await within(
            self.deadline,
            self.client.set(
                self.keys.session_moving(session), b"1", nx=True, px=max(1, int(seconds * 1000))
            ),
        )
        return bool(claimed)

    async def release_move(self, session: str) -> None:
        try:
            await within(self.deadline, self.client.delete(self.keys.session_moving(session)))
        except RedisDown as exc:
            self.health.fail(exc)

    async def route(self, session: str) -> SessionRoute | None:
        """The route of ``session`` as Redis holds it now, not the cache (raises RedisDown)."""
        raw = await within(self.deadline, self.client.get(self.keys.session(session)))
        return None if raw is None else SessionRoute.from_redis(raw)

    async def move(self, session: str, route: SessionRoute) -> None:
        """Point ``session`` at its new route (re-homed), refreshing its ``init`` record;
        the claim is released in the same round trip (raises RedisDown)."""
        px = int(self.ttl * 1000)
        pipe = self.client.pipeline(transaction=False)
        pipe.set(self.keys.session(session), route.to_redis(), px=px)
        pipe.pexpire(self.keys.session_init(session), px)
        pipe.delete(self.keys.session_moving(session))
        await within(self.deadline, pipe.execute())
        self._remember(session, route, time.monotonic())

    def remember(self, session: str, route: SessionRoute) -> None:
        """Cache the route another router gave ``session`` (it re-homed it)."""
        self._remember(session, route, time.monotonic())

    async def drop(self, session: str) -> None:
        """The session ended (or its owner is gone): its route goes from the cache and Redis."""
        self._cache.pop(session, None)
        self._unsaved.pop(session, None)
        keys = [self.keys.session(session)]
        if self.rehome:
            keys += [self.keys.session_init(session), self.keys.session_lost(session)]
        try:
            await within(self.deadline, self.client.delete(*keys))
        except RedisDown as exc:
            self.health.fail(exc)

    async def republish(self) -> None:
        """Write every cached session back to Redis (only where absent).

        Runs when Redis answers again after an outage: it may have restarted
        empty, and sessions opened meanwhile were never written. A session
        never moves but by a re-home, so the cached route is still right; ``NX``
        leaves entries another router wrote alone.
        """
        entries = [(s, route) for s, (route, _) in self._cache.items()]
        entries += [(s, route) for s, route in self._unsaved.items() if s not in self._cache]
        if not entries:
            return
        try:
            pipe = self.client.pipeline(transaction=False)
            for session, route in entries:
                pipe.set(
                    self.keys.session(session), route.to_redis(), px=int(self.ttl * 1000), nx=True
                )
            written = await pipe.execute()
        except RedisDown as exc:
            self.health.fail(exc)
            return
        self._unsaved.clear()
        log.info(
            "republished %d of %d known session(s) to Redis", sum(map(bool, written)), len(entries)
        )

    async def _touch(self, session: str) -> None:
        try:
            if self.rehome:
                pipe = self.client.pipeline(transaction=False)
                pipe.pexpire(self.keys.session(session), int(self.ttl * 1000))
                pipe.pexpire(self.keys.session_init(session), int(self.ttl * 1000))
                await pipe.execute()
                return
            await self.client.pexpire(self.keys.session(session), int(self.ttl * 1000))
        except RedisDown as exc:
            self.health.fail(exc)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
