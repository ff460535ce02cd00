"""The replicas a router routes to: the registry's records, refreshed with a local view.

:class:`ReplicaView` refreshes the replica set from the registry in the
background, never on a request's path, and keeps the last known set when
Redis is down (the router is then *degraded*, not closed). The merge of each
read into the view is :func:`merge_registry`, a pure function of plain data
(:class:`ViewState`); an ``initialize`` in flight holds its place on a replica
as a :class:`Placement`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

import redis.asyncio as aioredis

from mcpfleet.contract import Attestation, RedisKeys
from mcpfleet.redisconn import DEFAULT_DEADLINE, within
from mcpfleet.registry import read_replicas
from mcpfleet.router.decisions import Candidate
from mcpfleet.router.health import Health, RedisDown


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
