"""The tasks limit per principal: a cap on the tasks it holds, a share of the workers.

Two parts, both read from the rules in force (:class:`~mcpfleet.limits.LimitRules`,
``tasks_for(principal)``, a :class:`~mcpfleet.limits.Count`):

* **the cap** (``cap``): the tasks a principal holds, queued, running or
  waiting for input, fleet-wide. Each live task is a member of a sorted set of
  its principal's (``<tasks>:mcpfleet-limits:held:<principal>``, under the
  queue's name so that the replica's ACL selector for the queue covers it); a
  member is a hash of the task's scope and id (:func:`task_member`), never the
  id. A creation is admitted, or refused, by one Lua script (:data:`ADMIT`)
  that drops expired members, counts and adds, atomically on the fleet's
  Redis, with Redis's own clock (``TIME``): replicas' clocks never enter a
  score. A task's member is scored by its expiry: its records' TTL in the
  engine (slid, like the records, when the task is polled), the longest a
  task can exist without anyone asking for it. It leaves the set when the
  task ends (completed, failed, cancelled); a task whose end is never seen (a
  Redis error at that moment) is counted until that expiry: a count can only
  be too high, and not for longer than the task could have lived. A worker
  that dies mid-task does not leak: the task runs again elsewhere and that
  run's end removes it.
* **the share** (``running``): how many of a principal's tasks the fleet's
  workers run at once; the others wait parked, taking no worker, while other
  principals' tasks run. pydocket's own ``ConcurrencyLimit`` does it
  (:class:`_engine_hooks.PrincipalShare <mcpfleet.tasks._engine_hooks>`).

Who the principal is: what the replica's limit gate set for the request
(:data:`~mcpfleet.limits.CURRENT_PRINCIPAL`), else :func:`task_principal` of
the engine's task scope. A worker has no request: it finds the principal a
task was counted under in ``<tasks>:mcpfleet-limits:owner:<member>``
(written at the admission), else derives it from the task's scope.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from mcp.shared.exceptions import MCPError

from mcpfleet.limits import CURRENT_PRINCIPAL, LimitRules
from mcpfleet.logthrottle import LogThrottle
from mcpfleet.tasks._sealing import task_member

log = logging.getLogger("mcpfleet.tasks")

#: The principal of every anonymous task (no auth: one shared principal).
SHARED: Final = "shared"
#: The error code of a refusal (the spec's implementation-defined server error).
LIMITED_CODE: Final = -32000
#: The limit's name, in the error's ``data.limit`` and the metrics hook.
LIMIT: Final = "tasks"
#: Seconds a client is told to wait before it tries again, at most: a place frees
#: when one of its tasks ends, which nothing can predict.
RETRY_AFTER: Final = 2.0
#: Seconds a reservation made before the engine's creation counts, past the
#: creation's own bound (``--tasks-deadline``): a replica lost mid-creation
#: leaves it to expire.
RESERVATION_SLACK: Final = 10.0

#: Drop the expired, count, and (below the cap) add: KEYS[1] the principal's set;
#: ARGV: cap, member, seconds it counts. Returns {admitted 0/1, held, ms until the
#: earliest member expires}. Redis's TIME is the clock; the key expires with its
#: last member.
ADMIT: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local held = redis.call('ZCARD', KEYS[1])
if held >= tonumber(ARGV[1]) then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  local wait = 0
  if first[2] then wait = math.floor((tonumber(first[2]) - now) * 1000) end
  return {0, held, wait}
end
local until_ = now + tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], until_, ARGV[2])
if redis.call('PTTL', KEYS[1]) < math.ceil(tonumber(ARGV[3]) * 1000) then
  redis.call('PEXPIRE', KEYS[1], math.ceil(tonumber(ARGV[3]) * 1000))
end
return {1, held + 1, 0}
"""

#: The creation went through: its reservation becomes the task's member, scored by
#: the task's TTL, and the principal is recorded for the worker that ends it.
#: KEYS: the principal's set, the task's owner key; ARGV: reservation, member,
#: TTL seconds, principal.
CONFIRM: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local ttl = tonumber(ARGV[3])
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[1], now + ttl, ARGV[2])
if redis.call('PTTL', KEYS[1]) < ttl * 1000 then
  redis.call('PEXPIRE', KEYS[1], ttl * 1000)
end
redis.call('SET', KEYS[2], ARGV[4], 'EX', ttl)
return 1
"""


#: A polled task's expiry slides: KEYS: the principal's set, the owner key; ARGV:
#: member, TTL seconds.
SLIDE: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
if redis.call('ZADD', KEYS[1], 'XX', 'GT', 'CH', now + tonumber(ARGV[2]), ARGV[1]) == 1 then
  redis.call('EXPIRE', KEYS[2], ARGV[2])
  if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) * 1000 then
    redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]) * 1000)
  end
end
return 1
"""


def task_principal(task_scope: str | None) -> str:
    """The principal of a task whose request named none: ``shared`` for an anonymous
    task, else a digest of the engine's task scope (client id and ``sub``), never
    the scope itself (it names the user)."""
    if task_scope is None:
        return SHARED
    return hashlib.sha256(f"mcpfleet/task-scope\n{task_scope}".encode()).hexdigest()[:32]


def request_principal(task_scope: str | None) -> str:
    """The principal a creation is counted under: the limit gate's, else :func:`task_principal`."""
    return CURRENT_PRINCIPAL.get() or task_principal(task_scope)


def held_key(prefix: str, principal: str) -> str:
    """The sorted set of ``principal``'s live tasks, under the queue's key ``prefix``."""
    return f"{prefix}:mcpfleet-limits:held:{principal}"


def owner_key(prefix: str, member: str) -> str:
    """The principal a task (its member) was counted under, for the worker that ends it."""
    return f"{prefix}:mcpfleet-limits:owner:{member}"


def capped(rules: LimitRules) -> bool:
    """Whether any principal has a tasks cap (else nothing is counted, nothing removed)."""
    return rules.tasks.cap > 0 or any(
        r.tasks is not None and r.tasks.cap > 0 for r in rules.principals.values()
    )


def shared_out(rules: LimitRules) -> bool:
    """Whether any principal has a share of the workers (else no task is held back)."""
    return rules.tasks.running > 0 or any(
        r.tasks is not None and r.tasks.running > 0 for r in rules.principals.values()
    )


@dataclass(frozen=True)
class Admission:
    """What :data:`ADMIT` answered."""

    admitted: bool
    #: The principal's tasks held, this one included when admitted.
    held: int
    #: Milliseconds until the principal's earliest entry expires (refused only).
    earliest_ms: int = 0

    @classmethod
    def of(cls, answer: Any) -> Admission:
        admitted, held, earliest = (int(x) for x in answer)
        return cls(bool(admitted), held, earliest)

    def retry_after(self) -> float:
        """Seconds the client is told to wait: :data:`RETRY_AFTER`, or less when the
        earliest entry expires sooner; at least one second."""
        soonest = self.earliest_ms / 1000 if self.earliest_ms > 0 else RETRY_AFTER
        return float(max(1, math.ceil(min(RETRY_AFTER, soonest))))


def limited_error(cap: int, held: int, retry_after: float) -> MCPError:
    """The refusal a client gets: ``-32000``, the limit and the cap named, when to retry."""
    return MCPError(
        code=LIMITED_CODE,
        message=(
            f"Limit 'tasks' reached: {held} task(s) of this principal are queued, running "
            f"or waiting for input, and its cap is {cap}; retry after {retry_after:g} s"
        ),
        data={"limit": LIMIT, "retryAfter": retry_after},
    )


RulesProvider = Callable[[], LimitRules]


def no_limits() -> LimitRules:
    """The rules provider when the replica passes none: nothing limited."""
    return _NO_LIMITS


_NO_LIMITS: Final = LimitRules()


#: Called with a limit's name and a tool's on each refusal (the replica counts it).
LimitedHook = Callable[[str, str], None]
#: How often (seconds) at most the replica logs admissions that failed open.
_UNCHECKED_LOG_EVERY = 60.0


@dataclass(frozen=True)
class Reservation:
    """A place taken before the engine creates the task (its id is not known yet)."""

    principal: str
    #: The principal's sorted set.
    key: str
    #: A random member, replaced by the task's own once created.
    member: str


class TaskLimiter:
    """The cap's Redis side for one replica: admit, confirm, release, slide.

    Every call is bounded by ``deadline`` seconds and never raises for Redis:
    an admission that fails or passes its bound is let through uncounted (the
    fleet's capacity still bounds a principal: its tasks wait for the same
    workers), counted in :attr:`unchecked` and logged at most once a minute.
    """

    def __init__(
        self,
        rules: RulesProvider,
        deadline: float,
        on_limited: LimitedHook | None = None,
    ) -> None:
        self.rules = rules
        self.deadline = deadline
        self.on_limited = on_limited
        #: Admissions let through because Redis failed or did not answer in time.
        self.unchecked = 0
        self._unchecked_log = LogThrottle[str](_UNCHECKED_LOG_EVERY)

    async def admit(self, docket: Any, tool: str, task_scope: str | None) -> Reservation | None:
        """Take a place for a task of ``tool`` before its creation, or refuse it.

        None when the principal has no cap or Redis did not answer (fail open);
        raises the ``-32000`` refusal (:func:`limited_error`) past the cap.
        """
        principal = request_principal(task_scope)
        cap = self.rules().tasks_for(principal).cap
        if cap <= 0 or docket is None:
            return None
        held = held_key(prefix_of(docket), principal)
        placeholder = f"reserved:{secrets.token_hex(16)}"
        lease = 2 * self.deadline + RESERVATION_SLACK
        try:
            async with asyncio.timeout(self.deadline), docket.redis() as redis:
                answer = Admission.of(await redis.eval(ADMIT, 1, held, cap, placeholder, lease))
        except Exception as exc:  # Redis down, stalled, refusing: fail open
            self._failed_open(exc)
            return None
        if not answer.admitted:
            if self.on_limited is not None:
                self.on_limited(LIMIT, tool)
            raise limited_error(cap, answer.held, answer.retry_after())
        return Reservation(principal, held, placeholder)

    async def confirm(
        self, docket: Any, reservation: Reservation, task_scope: str | None, task_id: str, ttl: int
    ) -> None:
        """The task exists: its member replaces the reservation, counted for ``ttl`` s."""
        member = task_member(task_scope, task_id)
        owner = owner_key(prefix_of(docket), member)
        keys = (reservation.key, owner)
        args = (reservation.member, member, ttl, reservation.principal)
        await self._bounded(docket, lambda r: r.eval(CONFIRM, 2, *keys, *args), "confirmed")

    async def record(self, docket: Any, task_scope: str | None, task_id: str, ttl: int) -> None:
        """A task created with no place to take (no cap): when the workers share and the
        limit gate named a principal other than the scope's, the worker must find it:
        it is recorded in the task's owner key."""
        principal = CURRENT_PRINCIPAL.get()
        if principal is None or principal == task_principal(task_scope):
            return
        if not shared_out(self.rules()):
            return
        owner = owner_key(prefix_of(docket), task_member(task_scope, task_id))
        await self._bounded(docket, lambda r: r.set(owner, principal, ex=ttl), "recorded")

    async def cancel(self, docket: Any, reservation: Reservation) -> None:
        """The creation failed: its place is given back."""
        await self._bounded(
            docket, lambda r: r.zrem(reservation.key, reservation.member), "given back"
        )

    async def release(self, docket: Any, task_scope: str | None, task_id: str) -> None:
        """The task ended: its member leaves its principal's set (found through its
        owner key; else the request's principal, else the scope's)."""
        rules = self.rules()
        if docket is None or not (capped(rules) or shared_out(rules)):
            return
        member = task_member(task_scope, task_id)
        owner = owner_key(prefix_of(docket), member)

        async def drop(redis: Any) -> None:
            raw = await redis.get(owner)
            principal = raw.decode() if isinstance(raw, bytes) else raw
            key = held_key(prefix_of(docket), principal or request_principal(task_scope))
            async with redis.pipeline(transaction=False) as pipe:
                pipe.zrem(key, member)
                pipe.delete(owner)
                await pipe.execute()

        await self._bounded(docket, drop, "released")

    async def slide(self, docket: Any, task_scope: str | None, task_id: str, ttl: int) -> None:
        """A polled task's records had their TTL slid: its expiry here slides with them
        (only later, only for a member already there: polls are its owner's)."""
        if docket is None or not capped(self.rules()):
            return
        member = task_member(task_scope, task_id)
        keys = (
            held_key(prefix_of(docket), request_principal(task_scope)),
            owner_key(prefix_of(docket), member),
        )
        await self._bounded(docket, lambda r: r.eval(SLIDE, 2, *keys, member, ttl), "slid")

    async def principal_of(self, docket: Any, execution_key: str) -> str:
        """The principal a queue execution's task was created under (a worker has no
        request): its owner key when its creation recorded one, else its scope's."""
        from fastmcp_tasks.keys import parse_task_key

        parts = parse_task_key(execution_key)
        scope, task_id = parts["task_scope"], str(parts["client_task_id"])
        try:
            async with asyncio.timeout(self.deadline), docket.redis() as redis:
                raw = await redis.get(owner_key(prefix_of(docket), task_member(scope, task_id)))
            if raw:
                return raw.decode() if isinstance(raw, bytes) else str(raw)
        except Exception as exc:  # the scope's principal: right unless the gate set another
            log.warning("tasks: a task's principal was not read: %s", exc_name(exc))
        return task_principal(scope)

    async def share_of(self, docket: Any, execution_key: str) -> tuple[str, int]:
        """The principal of an execution's share of the workers, and the share (0: none).

        Keyed by the task's scope, which every leg carries in its key: a worker may
        take a task before its creation recorded the owner, and one principal's
        tasks must never be split over two keys. The share's override per
        principal is by the first principal that holds it, else the scope's.
        """
        from fastmcp_tasks.keys import parse_task_key

        principal = task_principal(parse_task_key(execution_key)["task_scope"])
        owner = await self.principal_of(docket, execution_key)
        rules = self.rules()
        running = rules.tasks_for(owner).running or rules.tasks_for(principal).running
        return principal, running

    async def _bounded(self, docket: Any, call: Callable[[Any], Any], what: str) -> None:
        if docket is None:
            return
        try:
            async with asyncio.timeout(self.deadline), docket.redis() as redis:
                await call(redis)
        except Exception as exc:  # counted too long (until it expires), never too short
            log.warning("tasks: a task's place under its cap was not %s: %s", what, exc_name(exc))

    def _failed_open(self, exc: BaseException) -> None:
        self.unchecked += 1
        if self._unchecked_log.due("unchecked"):
            log.warning(
                "tasks: a creation was let through without its principal's cap checked "
                "(%s; %d so far): the workers still bound it",
                exc_name(exc),
                self.unchecked,
            )


def prefix_of(docket: Any) -> str:
    """The queue's key prefix (its name; hash-tagged on a Redis Cluster, so that a
    script's keys share the queue's slot)."""
    return str(docket.prefix)


def exc_name(exc: BaseException) -> str:
    return "deadline passed" if isinstance(exc, TimeoutError) else type(exc).__name__
