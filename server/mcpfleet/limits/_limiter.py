"""Checking limits on a request's path: from memory when it can, Redis when it must.

:class:`Limiter` answers "may this principal send this round?" and "may it open
another session?". It holds the rules in force (swapped whole on a reload) and:

* **rounds**: a lease of a few requests' worth taken at once from the
  principal's fleet-wide bucket in Redis (:class:`~mcpfleet.limits._store.RateStore`),
  answered from memory until it is spent or :data:`LEASE_LIFE` passes. The
  round that spends a lease asks Redis for the next one and goes on without
  waiting for it (while the bucket held another whole lease, and a lease is
  more than one round: :meth:`Limiter._spend`), so a principal well under its
  rate waits on Redis for its first round on a replica only (and after a lease
  lapsed); a round that comes while the next lease is on its way waits for that
  one (at most the deadline). A
  refused principal is refused from memory until its retry time: a flood costs
  Redis one call per refusal window, not one per request. A lease is taken out
  of the bucket: a principal never gets more than its rate fleet-wide, and
  gets less only by what a replica's unspent lease loses when it expires (a
  lease taken ahead for a principal that does not come back is lost so). A
  replica holds one lease of a principal at a time: the next is asked for only
  once the last is spent. In any window the rounds allowed are at most what
  the bucket allows in it plus the leases the replicas hold when it starts (a
  tenth of a second of the rate each, :func:`batch_of`), whatever
  :data:`LEASE_LIFE` is;
* **listen streams**: a place like a session's, held for the stream's whole
  life (:meth:`Limiter.admit_listen`, given back by :meth:`Limiter.release_listen`,
  renewed with the sessions' places);
* **sessions**: a place in the principal's fleet-wide holdings
  (:class:`~mcpfleet.limits._store.CapStore`) for an ``initialize`` in flight,
  turned into the session's once it opened, renewed by :meth:`Limiter.renew_sessions`
  while the session lives here, given back when it ends.

Redis failing (an error, or no answer within the deadline) never blocks a request:
rounds fall back to a bucket in this replica's memory with the same rate (so a
principal gets at most the rate per replica while Redis is away), sessions to
this replica's own count of the principal's sessions against the same cap (the
replicas' session caps still bound the fleet). After a failure Redis is left
alone for :data:`REDIS_BACKOFF` seconds, so a stalled Redis costs one deadline,
not one per request. Each fallback is counted (``observer.failed``). A lease
asked for ahead while Redis stalls is waited for by the principal's rounds that
come before it is given up (one deadline after it was asked for); the command
was sent, so Redis takes that lease out of the bucket when it resumes, and it
is lost.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from typing import Any, Final, Protocol

from mcpfleet.contract import RedisKeys
from mcpfleet.limits._refusals import RefusalMemory
from mcpfleet.limits._refused import Refusal, Refusals
from mcpfleet.limits._rules import LimitRules, Rate
from mcpfleet.limits._store import CapStore, RateStore

__all__ = [
    "LEASE_LIFE",
    "REDIS_BACKOFF",
    "SESSION_LEASE",
    "LimitObserver",
    "Limiter",
]

log = logging.getLogger("mcpfleet.limits")

#: Seconds a replica answers rounds from a lease before it asks Redis again. Long
#: enough that a flow's answer round, sent once its user answered, and a principal
#: that comes back every few seconds find the lease their earlier round took: a
#: lease's rounds were taken out of the bucket when it was made, so how long it
#: lives never lets a principal past its rate (the bound is in the module docstring).
LEASE_LIFE: Final = 30.0
#: Seconds Redis is left alone after a limit check failed on it.
REDIS_BACKOFF: Final = 1.0
#: Seconds a held session's place lasts unless renewed (renewed every third of it):
#: a replica killed gives its sessions' places back within this.
SESSION_LEASE: Final = 30.0
#: Leases and local buckets held at once; past it the oldest half is forgotten.
MAX_ENTRIES: Final = 100_000


class LimitObserver(Protocol):
    def limited(self, limit: str, tool: str) -> None: ...
    def failed(self, limit: str) -> None: ...


class _Lease:
    __slots__ = ("ahead", "next", "refused_until", "tokens", "until")

    def __init__(self) -> None:
        self.tokens = 0
        self.until = 0.0
        self.refused_until = 0.0
        #: Whether the next lease is taken ahead, once this one is spent: a lease of
        #: more than one round, after which the bucket held another whole lease.
        self.ahead = False
        #: The next lease, being taken from Redis (:meth:`Limiter._spend`), or None.
        self.next: asyncio.Task[None] | None = None

    def usable(self, now: float) -> bool:
        """Whether a round may be taken from this lease at ``now``."""
        return self.tokens > 0 and self.until > now

    def fill(self, granted: int, wait: float, left: int, batch: int, now: float) -> None:
        """What Redis (or the local bucket) granted: ``granted`` rounds, or a refusal
        for ``wait`` seconds; ``left`` rounds were still in the bucket after it."""
        if granted:
            self.tokens, self.until, self.refused_until = granted, now + LEASE_LIFE, 0.0
            self.ahead = batch > 1 and left >= batch
        else:
            self.tokens, self.refused_until, self.ahead = 0, now + wait, False


def batch_of(rate: Rate) -> int:
    """Requests' worth taken from Redis at once: a tenth of a second of the rate,
    at most half the burst, at least one."""
    return max(1, min(rate.effective_burst() // 2, int(rate.rate * 0.1)))


class _LocalBuckets:
    """GCRA buckets in this process's memory: the fallback while Redis is away."""

    def __init__(self) -> None:
        self.tat: dict[str, float] = {}

    def take(self, key: str, rate: Rate, now: float) -> float:
        """0.0 if a request is allowed now, else seconds until one is."""
        interval = 1.0 / rate.rate
        tat = max(self.tat.get(key, now), now)
        if tat - now > (rate.effective_burst() - 1) * interval:
            return tat - (rate.effective_burst() - 1) * interval - now
        self.tat[key] = tat + interval
        if len(self.tat) > MAX_ENTRIES:
            self.tat = {k: v for k, v in self.tat.items() if v > now}
        return 0.0


class Limiter:
    """See the module docstring. One per replica; rules replaced with :meth:`set_rules`."""

    def __init__(
        self,
        rules: LimitRules,
        keys: RedisKeys,
        *,
        observer: LimitObserver | None = None,
        deadline: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rules = rules
        self.keys = keys
        self.observer = observer
        self.deadline = deadline
        self.clock = clock
        self.rates: RateStore | None = None
        self.caps: CapStore | None = None
        self._leases: dict[tuple[str, str], _Lease] = {}
        #: Leases being taken from Redis: held here until they end.
        self._taking: set[asyncio.Task[None]] = set()
        self._local = _LocalBuckets()
        self._redis_back = 0.0
        #: Sessions opened here with a limit on: session id -> principal.
        self.sessions: dict[str, str] = {}
        self._held: dict[str, int] = {}
        #: Sessions that ended here whose places Redis has not been told of yet.
        self._ended: dict[str, list[str]] = {}
        #: What a refused principal is told; its refusals logged once a window.
        self.refusals = Refusals(clock, max_keys=MAX_ENTRIES)
        #: Listen streams open here with a limit on: place -> principal.
        self.listens: dict[str, str] = {}
        self._listen_held: dict[str, int] = {}
        #: Tokens refused under a rate, refused again before the app's token check
        #: until their time (mcpfleet.limits._refusals).
        self.credentials = RefusalMemory()

    def attach(self, client: Any) -> None:
        """Count fleet-wide in the Redis ``client`` reaches (anything with ``eval``)."""
        self.rates = RateStore(client)
        self.caps = CapStore(client)

    def set_rules(self, rules: LimitRules) -> None:
        """Put ``rules`` in force; leases taken and credentials refused under the old
        ones are dropped."""
        self.rules = rules
        self._leases.clear()
        self.credentials.clear()

    # -- rounds ------------------------------------------------------------------

    def round_from_lease(self, principal: str) -> bool:
        """Whether a round of ``principal`` is allowed now from what this replica holds:
        its rate unlimited, or a round of the lease held here (taken). False says only
        that :meth:`round` must decide (no lease, a lapsed or spent one, a refusal held,
        or rates per tool in force). No I/O: the common round's check without a
        coroutine."""
        if self.rules.tools:
            return False
        rate = self.rules.rounds_for(principal)
        if rate.unlimited:
            return True
        lease = self._leases.get((principal, ""))
        now = self.clock()
        if lease is None or not lease.usable(now):
            return False
        self._spend(lease, principal, "", rate, now)
        return True

    async def round(self, principal: str, tool: str | None = None) -> Refusal | None:
        """None if ``principal`` may send a round (of ``tool``) now, else the refusal."""
        rate = self.rules.rounds_for(principal)
        if not rate.unlimited:
            refused = await self._take(principal, "", rate)
            if refused is not None:
                return self.refusals.over_rate("rounds", principal, refused, rate, tool, wide=True)
        if tool is not None and self.rules.tools:
            tool_rate = self.rules.tool_rate(tool)
            if tool_rate is not None and not tool_rate.unlimited:
                refused = await self._take(principal, tool, tool_rate)
                if refused is not None:
                    return self.refusals.over_rate("rounds", principal, refused, tool_rate, tool)
        return None

    async def _take(self, principal: str, bucket: str, rate: Rate) -> float | None:
        now = self.clock()
        lease = self._leases.get((principal, bucket))
        if lease is None:
            if len(self._leases) >= MAX_ENTRIES:
                self._prune(now)
            lease = self._leases[(principal, bucket)] = _Lease()
        elif lease.next is not None:
            # The next lease is on its way (asked for when the last was spent).
            await asyncio.shield(lease.next)
            now = self.clock()
        if lease.usable(now):
            self._spend(lease, principal, bucket, rate, now)
            return None
        if lease.refused_until > now:
            return lease.refused_until - now
        granted, wait, left = await self._take_fleet(principal, bucket, rate, now)
        lease.fill(granted, wait, left, batch_of(rate), now)
        if granted:
            self._spend(lease, principal, bucket, rate, now)
            return None
        return wait

    def _spend(self, lease: _Lease, principal: str, bucket: str, rate: Rate, now: float) -> None:
        """One round of ``lease``; the lease spent, the next is asked of Redis while the
        round runs, when the bucket had another lease to spare (and Redis answers, not
        in a backoff). Near its limit a principal's leases are taken as its rounds come,
        and a lease of one round (a rate under 20/s, or a burst under 4) never ahead: a
        lease held ahead on a replica the principal's rounds no longer reach is lost to
        it, and one round of a small bucket is a share that shows."""
        lease.tokens -= 1
        if lease.tokens or not lease.ahead or lease.next is not None:
            return
        if self.rates is None or now < self._redis_back:
            return
        task = asyncio.get_running_loop().create_task(
            self._lease_into(lease, principal, bucket, rate)
        )
        lease.next = task
        self._taking.add(task)
        task.add_done_callback(self._taking.discard)

    async def _lease_into(self, lease: _Lease, principal: str, bucket: str, rate: Rate) -> None:
        """The next lease taken into ``lease`` (or its refusal, held until its time)."""
        try:
            granted, wait, left = await self._take_fleet(principal, bucket, rate, self.clock())
            lease.fill(granted, wait, left, batch_of(rate), self.clock())
        finally:
            lease.next = None

    @property
    def leases_on_their_way(self) -> int:
        """Leases being taken ahead from Redis now."""
        return sum(not task.done() for task in self._taking)

    async def aclose(self) -> None:
        """Leases still being taken ahead are given up (at shutdown)."""
        for task in self._taking:
            task.cancel()
        await asyncio.gather(*self._taking, return_exceptions=True)

    async def _take_fleet(
        self, principal: str, bucket: str, rate: Rate, now: float
    ) -> tuple[int, float, int]:
        """(rounds granted, seconds until one more when none was, rounds left in the
        bucket after the grant: 0 from the local bucket, which is never taken ahead)."""
        name = f"rounds:{bucket}" if bucket else "rounds"
        if self.rates is not None and now >= self._redis_back:
            key = self.keys.limit(name, principal)
            try:
                # asyncio.timeout, not wait_for: no task made per call on the round's path.
                async with asyncio.timeout(self.deadline):
                    return await self.rates.take(
                        key, rate.rate, rate.effective_burst(), batch_of(rate)
                    )
            except Exception as e:  # an error of any driver, or the deadline
                self._redis_failed("rounds", e)
        wait = self._local.take(f"{name}:{principal}", rate, now)
        return (0, wait, 0) if wait > 0 else (1, 0.0, 0)

    def _prune(self, now: float) -> None:
        live = {k: v for k, v in self._leases.items() if v.until > now or v.refused_until > now}
        if len(live) >= MAX_ENTRIES // 2:
            live = dict(list(live.items())[len(live) // 2 :])
        self._leases = live

    # -- sessions ----------------------------------------------------------------

    async def admit_session(self, principal: str) -> tuple[Refusal | None, str | None]:
        """May ``principal`` open one more session? (refusal, pending place to settle).

        The place is held under a pending member until :meth:`session_opened` or
        :meth:`session_failed` settles it (its lease bounds an initialize that dies).
        """
        cap = self.rules.sessions_for(principal)
        if not cap:
            return None, None
        if self._held.get(principal, 0) >= cap:
            return self.refusals.at_cap("sessions", principal, cap, SESSION_LEASE / 3), None
        if self.caps is None or self.clock() < self._redis_back:
            if self.caps is not None:
                self._failed("sessions")
            return None, None
        pending = "pending-" + secrets.token_hex(8)
        key = self.keys.limit("sessions", principal)
        try:
            wait = await asyncio.wait_for(
                self.caps.admit(key, cap, pending, SESSION_LEASE), self.deadline
            )
        except Exception as e:
            self._redis_failed("sessions", e)
            return None, None
        if wait > 0:
            return self.refusals.at_cap("sessions", principal, cap, wait), None
        return None, pending

    def session_opened(self, session: str, principal: str) -> None:
        """Session ``session`` opened for ``principal``: it holds a place from now on."""
        if session not in self.sessions:
            self.sessions[session] = principal
            self._held[principal] = self._held.get(principal, 0) + 1

    async def settle(self, principal: str, pending: str | None, session: str | None) -> None:
        """Turn a pending place into ``session``'s (or give it back: None)."""
        if self.caps is None or pending is None:
            return
        key = self.keys.limit("sessions", principal)
        held = [session] if session is not None else []
        try:
            await asyncio.wait_for(
                self.caps.renew(key, held, [pending], SESSION_LEASE), self.deadline
            )
        except Exception as e:
            self._redis_failed("sessions", e)

    def session_ended(self, session: str) -> None:
        """``session`` ended here: its place is given back at the next :meth:`renew_sessions`."""
        principal = self.sessions.pop(session, None)
        if principal is None:
            return
        self._ended.setdefault(principal, []).append(session)
        left = self._held.get(principal, 1) - 1
        if left > 0:
            self._held[principal] = left
        else:
            self._held.pop(principal, None)

    async def renew_sessions(self, live: set[str] | None = None) -> None:
        """Renew the places of the sessions held here (those still in ``live``, when
        given), re-adding any a Redis that restarted empty lost, and give back the
        places of sessions that ended; then the open listen streams' places. Raises
        what Redis raised (the caller retries)."""
        if live is not None:
            for session in [s for s in self.sessions if s not in live]:
                self.session_ended(session)
        if self.caps is None:
            self._ended.clear()
            return
        by_principal: dict[str, list[str]] = {}
        for session, principal in self.sessions.items():
            by_principal.setdefault(principal, []).append(session)
        ended, self._ended = self._ended, {}
        try:
            for principal in set(by_principal) | set(ended):
                key = self.keys.limit("sessions", principal)
                held, dropped = by_principal.get(principal, []), ended.pop(principal, [])
                await asyncio.wait_for(
                    self.caps.renew(key, held, dropped, SESSION_LEASE), self.deadline
                )
        finally:
            for principal, dropped in ended.items():  # not sent: next time
                self._ended.setdefault(principal, []).extend(dropped)
        await self._renew_listens()

    # -- listen streams ------------------------------------------------------------

    async def admit_listen(self, principal: str) -> tuple[Refusal | None, str | None]:
        """May ``principal`` open one more listen stream? (refusal, the stream's place).

        The place is held until :meth:`release_listen` and renewed with the sessions'
        (:meth:`renew_sessions`); a replica killed stops renewing it. Redis away: this
        replica's own count against the same cap (counted ``failed``).
        """
        cap = self.rules.listen_for(principal)
        if not cap:
            return None, None
        if self._listen_held.get(principal, 0) >= cap:
            return self.refusals.at_cap("listen", principal, cap, SESSION_LEASE / 3), None
        place = "listen-" + secrets.token_hex(8)
        if self.caps is not None and self.clock() >= self._redis_back:
            try:
                async with asyncio.timeout(self.deadline):
                    wait = await self.caps.admit(
                        self.keys.limit("listen", principal), cap, place, SESSION_LEASE
                    )
            except Exception as e:
                self._redis_failed("listen", e)
            else:
                if wait > 0:
                    return self.refusals.at_cap("listen", principal, cap, wait), None
        elif self.caps is not None:
            self._failed("listen")
        self.listens[place] = principal
        self._listen_held[principal] = self._listen_held.get(principal, 0) + 1
        return None, place

    async def release_listen(self, place: str) -> None:
        """The stream holding ``place`` ended: its place is given back now (bounded; on a
        failure its lease ends it)."""
        principal = self.listens.pop(place, None)
        if principal is None:
            return
        left = self._listen_held.get(principal, 1) - 1
        if left > 0:
            self._listen_held[principal] = left
        else:
            self._listen_held.pop(principal, None)
        if self.caps is None:
            return
        try:
            async with asyncio.timeout(self.deadline):
                await self.caps.renew(self.keys.limit("listen", principal), [], [place], 1.0)
        except Exception as e:
            self._redis_failed("listen", e)

    async def _renew_listens(self) -> None:
        caps = self.caps
        if caps is None:
            return
        by_principal: dict[str, list[str]] = {}
        for place, principal in self.listens.items():
            by_principal.setdefault(principal, []).append(place)
        for principal, held in by_principal.items():
            key = self.keys.limit("listen", principal)
            await asyncio.wait_for(caps.renew(key, held, [], SESSION_LEASE), self.deadline)

    # -- refusals ------------------------------------------------------------------

    def limited_recently(self, limit: str, now: float | None = None) -> int:
        """Principals refused under ``limit`` within the last ``LOG_WINDOW`` seconds
        (:mod:`mcpfleet.limits._refused`)."""
        return self.refusals.recent(limit, now)

    def _failed(self, limit: str) -> None:
        if self.observer is not None:
            self.observer.failed(limit)

    def _redis_failed(self, limit: str, error: BaseException) -> None:
        self._redis_back = self.clock() + REDIS_BACKOFF
        self._failed(limit)
        log.warning(
            "limit %s: Redis failed (%s); checked in this replica's memory for %.0f s",
            limit,
            type(error).__name__,
            REDIS_BACKOFF,
        )
