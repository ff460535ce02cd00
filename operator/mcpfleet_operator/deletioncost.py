"""The deletion cost of a replica Pod, and when to write it. Pure functions.

A ReplicaSet that scales in removes, among Pods equal on the criteria that come
first (unscheduled, pending, not ready before ready), the one whose
``controller.kubernetes.io/pod-deletion-cost`` annotation is lowest. The
operator keeps that annotation on each replica Pod equal to what the Pod
holds, read from the replica's attestation
(:class:`~mcpfleet.contract.Attestation`), so a scale-in removes the emptiest
replica. The cost is a weighted sum of the counts (:data:`WEIGHTS`), clamped to
the annotation's int32 range.

Writing a Pod is an API server write that every watcher of Pods receives;
Kubernetes asks not to update the annotation with every move of a metric. So
a cost is written only when it moved by a meaningful step, or when it has
differed for :attr:`PatchPolicy.max_interval` since the last write, and never
more than :attr:`PatchPolicy.per_second` writes a second in all
(:class:`TokenBucket`). Nothing here does I/O: the operator's
:mod:`~mcpfleet_operator.costkeeper` reads and writes, these decide.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from mcpfleet.contract import Attestation

#: The Pod annotation the ReplicaSet controller reads (an int32, as a string).
DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class Weights:
    """What one unit of each thing a replica holds costs, if a scale-in removes it.

    The order is what is lost, and for whom:

    * ``paused`` (100): a handshake tool paused on ``ctx.elicit()`` (or a
      sampling or roots request), its user typing an answer. The drain gives it
      the grace period; past it the call is cut and the user's work is lost.
    * ``task`` (50): an MCP task the replica's worker runs. A drain lets it
      finish; past the deadline it is handed back to the queue and runs again
      from its start elsewhere.
    * ``session`` (10): a handshake session. Idle ones are re-homed when the
      router re-homes sessions; without re-homing the client gets a 404 and
      must initialize again.
    * ``inflight`` (5): a request being served; the drain waits for it.
    * ``listen`` (1): a ``subscriptions/listen`` stream. It ends at the drain
      and its client listens again on another replica: cheap, but not free.
    """

    paused: int = 100
    task: int = 50
    session: int = 10
    inflight: int = 5
    listen: int = 1


WEIGHTS = Weights()


def clamp_int32(value: int) -> int:
    """``value`` within the annotation's range (the API server refuses anything else)."""
    return max(INT32_MIN, min(INT32_MAX, value))


def cost_of(record: Attestation, weights: Weights = WEIGHTS) -> int:
    """The deletion cost of the Pod whose replica attests ``record``: 0 when empty."""
    total = (
        weights.paused * record.paused
        + weights.task * record.tasks
        + weights.session * record.sessions
        + weights.inflight * record.inflight
        + weights.listen * record.listens
    )
    return clamp_int32(total)


def parse_cost(raw: str | None) -> int | None:
    """The cost a Pod carries now (its annotation), or None if it has none or it is garbage."""
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        return None
    return value if INT32_MIN <= value <= INT32_MAX else None


@dataclass(frozen=True)
class PatchPolicy:
    """How often the operator may write a Pod's cost (the ``--deletion-cost-*`` flags).

    ``min_step`` and ``relative_step`` say what a meaningful change is: at
    least ``min_step`` (one session's weight by default), and at least
    ``relative_step`` of the cost the Pod carries (10 %: a Pod of a thousand
    sessions is not rewritten for each one). A smaller difference is written
    once it has lasted ``max_interval`` seconds since this Pod's last write.
    ``per_second`` caps the writes of the whole operator.
    """

    min_step: int = 10
    relative_step: float = 0.1
    max_interval: float = 30.0
    per_second: float = 5.0

    def __post_init__(self) -> None:
        if self.min_step < 1:
            raise ValueError("min_step must be at least 1")
        if not 0 <= self.relative_step < 1:
            raise ValueError("relative_step must be in [0, 1)")
        if not self.max_interval > 0:
            raise ValueError("max_interval must be positive")
        if not self.per_second > 0:
            raise ValueError("per_second must be positive")

    def step(self, current: int) -> int:
        """The least change of ``current`` worth a write at once."""
        return max(self.min_step, math.ceil(self.relative_step * abs(current)))


def needs_patch(
    current: int | None, wanted: int, since_write: float | None, policy: PatchPolicy
) -> bool:
    """Whether a Pod carrying ``current`` should be written ``wanted`` now.

    ``since_write`` is the seconds since this operator last wrote the Pod's cost,
    None if it never did (since it started).
    """
    if current is None:
        return True
    if current == wanted:
        return False
    if abs(wanted - current) >= policy.step(current):
        return True
    return since_write is None or since_write >= policy.max_interval


@dataclass(frozen=True)
class PodCost:
    """One Pod as the cost keeper sees it: the cost it carries, the cost it should."""

    pod: str
    current: int | None
    wanted: int


def plan(
    pods: Iterable[PodCost],
    written: Mapping[str, float],
    now: float,
    policy: PatchPolicy,
    budget: int,
) -> tuple[list[PodCost], list[PodCost]]:
    """The Pods to write now (at most ``budget``), and those due but held back.

    ``written`` is when (monotonic seconds) each Pod's cost was last written.
    The most urgent first: a Pod without a cost, then the largest change.
    """
    due = [
        p for p in pods if needs_patch(p.current, p.wanted, _since(written.get(p.pod), now), policy)
    ]
    due.sort(key=lambda p: (p.current is not None, -abs(p.wanted - (p.current or 0)), p.pod))
    budget = max(0, budget)
    return due[:budget], due[budget:]


def _since(at: float | None, now: float) -> float | None:
    return None if at is None else now - at


@dataclass
class TokenBucket:
    """At most ``rate`` writes a second on average, ``rate`` (at least 1) at once.

    Pure: the caller passes the (monotonic) time. A bucket starts full.
    """

    rate: float
    tokens: float = -1.0
    at: float | None = None

    @property
    def capacity(self) -> float:
        return max(1.0, self.rate)

    def available(self, now: float) -> int:
        """Whole writes allowed at ``now`` (refilling first)."""
        if self.tokens < 0 or self.at is None:
            self.tokens, self.at = self.capacity, now
        elapsed = max(0.0, now - self.at)
        self.tokens = min(self.capacity, self.tokens + elapsed * self.rate)
        self.at = now
        return int(self.tokens)

    def take(self, count: int, now: float) -> None:
        """Spend ``count`` writes (never more than are available)."""
        self.available(now)
        self.tokens = max(0.0, self.tokens - count)
