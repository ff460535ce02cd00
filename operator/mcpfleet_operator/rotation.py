"""The rotation state machine: which step a KeyRotation takes next. Pure functions.

The protocol (docs/operator.md, "Operator"), each step confirmed before the next::

    Pending   -> write [old, new]          (stage: new unseals, nothing seals with it)
    Staging   -> every serving replica attests [old, new]  -> write [new, old]
    Promoting -> every serving replica attests [new, old]  -> start the TTL clock
    Waiting   -> one token TTL has passed, and no live task's snapshot is
                 sealed under the old key (or the tasks wait limit passed;
                 Emergency: both skipped)                   -> write [new]
    Retiring  -> every serving replica attests [new]       -> Complete

Nothing here does I/O. The operator observes the world (the Secret's ring and
the rotation that owns it, which Pods can serve and what each attests, the
rotation's recorded phase) into an :class:`Observed`, and :func:`decide`
says what to do. Because the phase that matters is derived from the Secret
first and the recorded status second, an operator killed between writing
the Secret and recording the status resumes where the Secret says, never
repeating a write and never skipping a confirmation: a confirmation is
always re-checked against live attestations before the next write.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from mcpfleet.contract import RingPhase
from mcpfleet_operator.api import ACTIVE_PHASES, TERMINAL_PHASES, RotationPhase, parse_time

#: Default seconds, after the token TTL, a rotation waits for live MCP tasks
#: sealed under the old key before it retires that key anyway (the operator's
#: ``--tasks-wait-limit``, the chart's ``operator.tasksWaitLimit``).
TASKS_WAIT_LIMIT = 3600.0


@dataclass(frozen=True)
class PodView:
    """A Pod of a KeyRing's selector, as far as a rotation cares."""

    name: str
    #: Running and not terminating: it may serve, so it must confirm each step.
    serving: bool


@dataclass(frozen=True)
class Convergence:
    """Which serving Pods attest the expected ring, and which lag."""

    expected: tuple[str, ...]
    desired: tuple[str, ...]
    converged: tuple[str, ...]
    lagging: tuple[str, ...]

    @property
    def done(self) -> bool:
        """Every serving Pod attests ``expected``, and there is at least one."""
        return bool(self.desired) and not self.lagging

    @property
    def ratio(self) -> str:
        return f"{len(self.converged)}/{len(self.desired)}"


def converge(
    pods: Iterable[PodView], attested: Mapping[str, Sequence[str]], expected: Sequence[str]
) -> Convergence:
    """Compare what each serving Pod attests (by Pod name) with ``expected`` (ordered)."""
    want = tuple(expected)
    desired = sorted(p.name for p in pods if p.serving)
    converged = [n for n in desired if tuple(attested.get(n, ())) == want]
    lagging = [n for n in desired if n not in converged]
    return Convergence(want, tuple(desired), tuple(converged), tuple(lagging))


def sealing_is_safe(rings: Iterable[Sequence[str]]) -> bool:
    """The safety invariant: every replica's sealing kid is one every other replica holds.

    ``rings`` are the ordered kids of the serving replicas at one moment. If it
    is False, a token one replica seals can land on a replica that cannot
    unseal it.
    """
    loaded = [tuple(r) for r in rings if r]
    return all(a[0] in b for a in loaded for b in loaded)


@dataclass(frozen=True)
class RingView:
    """The Secret's ring as the rotation sees it: phase, kids, and which rotation owns it."""

    phase: RingPhase
    kids: tuple[str, ...]
    #: The uid of the rotation named on the Secret ('' when none).
    owner: str = ""


@dataclass(frozen=True)
class QueueEntry:
    """Another KeyRotation of the same KeyRing (from the operator's index)."""

    name: str
    uid: str
    created: str
    phase: RotationPhase
    stalled: bool = False
    #: When it completed ('' unless Complete).
    completed: str = ""


def active_of(queue: Iterable[QueueEntry]) -> QueueEntry | None:
    """The rotation of a KeyRing's queue that owns its ring now, if any (at most one does)."""
    return next((q for q in queue if q.phase in ACTIVE_PHASES), None)


def turn(uid: str, created: str, name: str, queue: Iterable[QueueEntry]) -> tuple[bool, str]:
    """Whether a pending rotation may start: none other active, and it is first in line.

    First in line is the oldest pending rotation (by creation time, then name),
    so two pending rotations agree on which goes first without talking.
    """
    others = [q for q in queue if q.uid != uid]
    for q in others:
        if q.phase in ACTIVE_PHASES:
            return False, f"waiting for rotation {q.name} ({q.phase}) to finish"
    ahead = sorted(
        (
            q
            for q in others
            if q.phase not in TERMINAL_PHASES and (q.created, q.name) < (created, name)
        ),
        key=lambda q: (q.created, q.name),
    )
    if ahead:
        return False, f"queued behind rotation {ahead[0].name}"
    return True, ""


Action = Literal["none", "wait", "stage", "promote", "start-ttl", "retire", "complete", "fail"]


@dataclass(frozen=True)
class Observed:
    """Everything :func:`decide` needs, observed by the operator at one moment."""

    uid: str
    #: The phase recorded in the rotation's status ('' or Pending when new).
    phase: RotationPhase | Literal[""]
    new_kid: str
    ring: RingView
    #: Convergence of the serving Pods on ``ring.kids`` as they are now.
    convergence: Convergence
    emergency: bool = False
    #: Waiting only: whether one token TTL has passed on this operator's clock.
    ttl_elapsed: bool = False
    #: Pending only: from :func:`turn`.
    my_turn: bool = True
    blocked: str = ""
    #: Waiting only: live MCP tasks whose stored snapshot the old key sealed
    #: (the fleet's seal ledger, ``--tasks-encrypt``); None when it could not be read.
    old_tasks: int | None = 0
    #: Waiting only: whether the tasks wait limit (counted from the end of the
    #: token TTL) has passed on this operator's clock.
    tasks_wait_over: bool = False


@dataclass(frozen=True)
class Decision:
    """What to do now. ``phase`` is where the rotation stands; after a successful
    write (``stage``/``promote``/``retire``) or ``start-ttl``/``complete``, it is
    ``next_phase``."""

    action: Action
    phase: RotationPhase
    next_phase: RotationPhase
    message: str
    lagging: tuple[str, ...] = ()
    #: Live tasks under the old key, when this decision is the retire step's task
    #: wait (-1: the ledger could not be read); None otherwise.
    old_tasks: int | None = None
    #: A retire forced by the tasks wait limit: how many tasks it fails (-1: unknown).
    abandoned: int | None = None


def _wait(phase: RotationPhase, message: str, conv: Convergence | None = None) -> Decision:
    lagging = conv.lagging if conv is not None else ()
    return Decision("wait", phase, phase, message, lagging)


def _awaiting(phase: RotationPhase, conv: Convergence) -> Decision:
    if not conv.desired:
        return _wait(phase, "the selector matches no serving Pod: nothing can confirm", conv)
    return _wait(
        phase,
        f"waiting for {len(conv.lagging)} of {len(conv.desired)} replica(s) to attest "
        f"[{', '.join(conv.expected)}]: {', '.join(conv.lagging)}",
        conv,
    )


def decide(o: Observed) -> Decision:
    """The next step of one rotation (see the module docstring)."""
    recorded: RotationPhase = o.phase or "Pending"
    if recorded in TERMINAL_PHASES:
        return Decision("none", recorded, recorded, "")
    ring, conv = o.ring, o.convergence
    if ring.owner != o.uid:
        if recorded in ACTIVE_PHASES:
            return Decision(
                "fail",
                "Failed",
                "Failed",
                f"the Secret no longer belongs to this rotation (ring {ring.phase} "
                f"[{', '.join(ring.kids)}]): it was changed outside the operator",
            )
        if not o.my_turn:
            return _wait("Pending", o.blocked)
        if ring.phase != "stable":
            return _wait(
                "Pending",
                f"the ring is {ring.phase} by another rotation; waiting for it to finish",
            )
        if not conv.done:
            return _awaiting("Pending", conv)
        return Decision("stage", "Pending", "Staging", "staging a new key")
    # The ring is this rotation's: the Secret says how far it got.
    if ring.phase == "staged":
        if o.new_kid and ring.kids[1] != o.new_kid:
            return _fail(f"the staged key is {ring.kids[1]}, not this rotation's {o.new_kid}")
        if not conv.done:
            return _awaiting("Staging", conv)
        return Decision("promote", "Staging", "Promoting", "every replica holds the new key")
    if ring.phase == "promoted":
        if o.new_kid and ring.kids[0] != o.new_kid:
            return _fail(f"the sealing key is {ring.kids[0]}, not this rotation's {o.new_kid}")
        if recorded == "Waiting":
            if not conv.done:
                # A replica appeared or regressed: its tokens need the TTL too.
                return _awaiting("Waiting", conv)
            if o.emergency:
                return Decision("retire", "Waiting", "Retiring", "the old key's tokens expired")
            if not o.ttl_elapsed:
                return _wait("Waiting", "waiting one token TTL before dropping the old key", conv)
            return _retire_after_tasks(o)
        if not conv.done:
            return _awaiting("Promoting", conv)
        if o.emergency:
            return Decision(
                "retire", "Promoting", "Retiring", "Emergency: retiring without the TTL wait"
            )
        return Decision("start-ttl", "Promoting", "Waiting", "every replica seals with the new key")
    # A stable ring this rotation owns: retired (or, after an abort, back to old).
    if o.new_kid and ring.kids == (o.new_kid,):
        if not conv.done:
            return _awaiting("Retiring", conv)
        return Decision("complete", "Retiring", "Complete", "every replica holds only the new key")
    return _fail(
        f"the ring [{', '.join(ring.kids)}] is not where this rotation left it: "
        "it was changed outside the operator"
    )


def _retire_after_tasks(o: Observed) -> Decision:
    """Waiting, the token TTL passed: retire once no live task needs the old key.

    A task whose stored snapshot the old key sealed (queued, running, parked
    for input) reads it again at its next start; retiring the key fails it.
    The wait is bounded: past the tasks wait limit the key is retired anyway,
    and the decision says how many tasks that fails.
    """
    old = o.ring.kids[1] if len(o.ring.kids) > 1 else "the old key"
    if o.old_tasks == 0:
        return Decision(
            "retire",
            "Waiting",
            "Retiring",
            "the old key's tokens expired and no live task's snapshot is sealed under it",
            old_tasks=0,
        )
    held = "an unknown number of" if o.old_tasks is None else str(o.old_tasks)
    count = -1 if o.old_tasks is None else o.old_tasks
    if o.tasks_wait_over:
        return Decision(
            "retire",
            "Waiting",
            "Retiring",
            f"the tasks wait limit passed: dropping {old} with {held} live task(s) "
            "sealed under it, which fail",
            old_tasks=count,
            abandoned=count,
        )
    why = (
        "the seal ledger cannot be read"
        if o.old_tasks is None
        else f"{o.old_tasks} live task(s) hold a snapshot sealed under {old}"
    )
    return Decision(
        "wait",
        "Waiting",
        "Waiting",
        f"the old key's tokens expired; waiting before dropping it: {why}",
        old_tasks=count,
    )


def _fail(message: str) -> Decision:
    return Decision("fail", "Failed", "Failed", message)


def resumed_kids(uid: str, ring: RingView) -> tuple[str, str] | None:
    """(old, new) kids of the ring this rotation staged, read back from the Secret.

    For an operator that crashed between the stage write and the status that
    records the new kid: the Secret says which keys this rotation staged.
    None unless the ring is this rotation's and mid-rotation.
    """
    if ring.owner != uid or ring.phase == "stable":
        return None
    old, new = ring.kids if ring.phase == "staged" else ring.kids[::-1]
    return old, new


DeleteAction = Literal["release", "abort", "finish"]


def on_delete(uid: str, ring: RingView | None, new_kid: str = "") -> DeleteAction:
    """What deleting a rotation means, from the Secret (and the new kid, once known).

    Before promotion (the new key never sealed) the ring goes back to
    ``[old]``: always safe. After promotion, tokens are sealed with the new
    key and the old one may still be in use, so the rotation finishes first,
    through its last confirmation (every replica on ``[new]``).
    """
    if ring is None or ring.owner != uid:
        return "release"
    if ring.phase == "staged":
        return "abort"
    if ring.phase == "promoted":
        return "finish"
    if new_kid and ring.kids == (new_kid,):
        return "finish"  # retired; Complete once every replica attests it
    return "release"


def is_stalled(decision: Decision, waited: float, stall_after: float) -> bool:
    """Whether a rotation is stalled: an active step held up by lagging replicas too long.

    ``waited`` is how long the rotation has stood in ``decision.phase`` (on
    the operator's monotonic clock). Only waits on replicas count: the TTL
    wait with every replica converged is the protocol, not a stall.
    """
    return (
        decision.action == "wait"
        and decision.phase in ACTIVE_PHASES
        and bool(decision.lagging)
        and waited >= stall_after
    )


@dataclass(frozen=True)
class Schedule:
    """When a KeyRing's next scheduled rotation is due, and whether to create it now."""

    due: dt.datetime
    start: bool

    @property
    def due_text(self) -> str:
        """``status.nextRotationAt``: RFC 3339 UTC to the second."""
        return self.due.strftime("%Y-%m-%dT%H:%M:%SZ")

    def rotation_name(self, keyring: str) -> str:
        """Derived from the due time: a second creation of it (another tick, another
        operator) meets 409 instead of making a duplicate rotation."""
        return f"{keyring}-scheduled-{int(self.due.timestamp())}"[:253]


def schedule(
    every: float,
    queue: Iterable[QueueEntry],
    key_created: dt.datetime | None,
    keyring_created: dt.datetime | None,
    now: dt.datetime,
) -> Schedule | None:
    """``spec.rotateEvery`` after the last completed rotation (else the sealing key's
    creation, else the KeyRing's), started when due and no other rotation is open."""
    entries = list(queue)
    completed = [parse_time(q.completed) for q in entries if q.completed]
    last = max((c for c in completed if c is not None), default=None)
    base = last or key_created or keyring_created
    if base is None:
        return None
    due = base + dt.timedelta(seconds=every)
    idle = all(q.phase in TERMINAL_PHASES for q in entries)
    return Schedule(due=due, start=idle and now >= due)
