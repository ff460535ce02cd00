"""The session table: each handshake-era session's route, from Redis with a local cache.

:class:`SessionTable` maps a session (the client's ``Mcp-Session-Id``) to its
:class:`~mcpfleet.router.route.SessionRoute`, the replica that owns it. A
session never moves but by a re-home, so a cached route stays valid until its
owner leaves; Redis is read on a cache miss only, and written when a session
opens. Entries expire with the session idle timeout, refreshed at most every
quarter of it. Sessions opened while Redis was down are written once it
returns. With re-homing on (:mod:`mcpfleet.router.rehome`), each session also
has an ``init`` record beside its route (written in the same round trip), a
``lost`` mark once its owner went with work in flight, and a ``moving`` claim
while one router re-homes it; a re-homed session's route names its new owner.
Each call names the session's keys once (:meth:`~mcpfleet.contract.RedisKeys.session_keys`).
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
import time
from collections import OrderedDict
from collections.abc import Coroutine
from typing import Any

import redis.asyncio as aioredis

from mcpfleet.contract import RedisKeys
from mcpfleet.redisconn import (
    DEFAULT_DEADLINE,
    DEFAULT_FAILOVER_WAIT,
    mget_by_slot,
    pool_full,
    ride_through,
    within,
)
from mcpfleet.router.health import Health, RedisDown
from mcpfleet.router.route import SessionRoute

log = logging.getLogger("mcpfleet.router")

#: The most session lookups one ``MGET`` carries.
LOOKUP_BATCH = 256


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
        keys = self.keys.session_keys(session)
        try:
            if init is None:
                await within(self.deadline, self.client.set(keys.route, stored, px=px))
            else:
                pipe = self.client.pipeline(transaction=False)
                pipe.set(keys.route, stored, px=px)
                pipe.set(keys.init, init, px=px)
                await within(self.deadline, pipe.execute())
        except RedisDown as exc:
            self.health.fail(exc)
            self._unsaved[session] = route

    async def rehome_state(
        self, session: str, known: SessionRoute
    ) -> tuple[SessionRoute | None, bytes | str | None, bytes | str | None]:
        """The route as Redis holds it now (not the cache), the ``init`` record and
        the ``lost`` mark of ``session``, in one round trip (raises RedisDown). A
        route other than ``known`` of a session not lost (another router moved it)
        is cached."""
        keys = self.keys.session_keys(session)
        raw, init, lost = await within(
            self.deadline, self.client.mget([keys.route, keys.init, keys.lost])
        )
        route = None if raw is None else SessionRoute.from_redis(raw)
        if lost is None and route is not None and route != known:
            self._remember(session, route, time.monotonic())
        return route, init, lost

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

    async def route(self, session: str, known: SessionRoute) -> SessionRoute | None:
        """The route of ``session`` as Redis holds it now, not the cache (raises
        RedisDown); one other than ``known`` (another router moved it) is cached."""
        raw = await within(self.deadline, self.client.get(self.keys.session(session)))
        route = None if raw is None else SessionRoute.from_redis(raw)
        if route is not None and route != known:
            self._remember(session, route, time.monotonic())
        return route

    async def move(self, session: str, route: SessionRoute) -> bytes | str | None:
        """Point ``session`` at its new route (re-homed), refreshing its ``init`` record;
        the claim is released in the same round trip. Unless it was marked lost
        meanwhile: then nothing is written, and the ``lost`` mark is returned (read
        first, in a round trip of its own). Raises RedisDown."""
        keys = self.keys.session_keys(session)
        lost: bytes | str | None = await within(self.deadline, self.client.get(keys.lost))
        if lost is not None:
            return lost
        px = int(self.ttl * 1000)
        pipe = self.client.pipeline(transaction=False)
        pipe.set(keys.route, route.to_redis(), px=px)
        pipe.pexpire(keys.init, px)
        pipe.delete(keys.moving)
        await within(self.deadline, pipe.execute())
        self._remember(session, route, time.monotonic())
        return None

    async def drop(self, session: str) -> None:
        """The session ended (or its owner is gone): its route goes from the cache and Redis."""
        self._cache.pop(session, None)
        self._unsaved.pop(session, None)
        names = self.keys.session_keys(session)
        keys = [names.route, names.init, names.lost] if self.rehome else [names.route]
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
        keys = self.keys.session_keys(session)
        try:
            if self.rehome:
                pipe = self.client.pipeline(transaction=False)
                pipe.pexpire(keys.route, int(self.ttl * 1000))
                pipe.pexpire(keys.init, int(self.ttl * 1000))
                await pipe.execute()
                return
            await self.client.pexpire(keys.route, int(self.ttl * 1000))
        except RedisDown as exc:
            self.health.fail(exc)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
