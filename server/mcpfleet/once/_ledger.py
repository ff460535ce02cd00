"""The ledger's protocol: flow ids, records, what a claim and a confirmation say.

Pure data and the :class:`Ledger` protocol both implementations follow
(:mod:`._memory` for one process, :mod:`._redis` for a fleet); no I/O here.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final, Literal, Protocol

from mcpfleet.contract import LABEL_PREFIX

#: The ``_meta`` key of a result returned from the ledger instead of by ``finish``.
ONCE_META_KEY: Final = f"{LABEL_PREFIX}/once"
#: Added to the flow's end for the claim's lifetime: replicas' clocks differ a little.
CLOCK_MARGIN: Final = 60.0
#: Seconds a claim lives before it is confirmed: what a claim that never led to
#: ``finish`` costs its resends at most.
CLAIM_LEASE: Final = 5.0

_FLOW_BYTES = 16
_FLOW_ID = re.compile(r"^[A-Za-z0-9_-]{22}$")


def new_flow_id() -> str:
    """A fresh flow id: 128 random bits, URL-safe base64 (22 characters)."""
    return secrets.token_urlsafe(_FLOW_BYTES)


def valid_flow_id(value: object) -> bool:
    return isinstance(value, str) and _FLOW_ID.match(value) is not None


def claim_lifetime(token_ttl: float, end: float | None, now: float) -> float:
    """How long a confirmed claim must live (pure): past every token of the flow.

    ``end`` is the flow's end as its first round sealed it (wall clock, from
    whichever replica sealed it, with its own TTL); a round after the end is
    refused, so no token of the flow reaches the claim later. A flow sealed
    without an end (an older replica) is covered by this replica's TTL. The
    margin absorbs clock differences between replicas.
    """
    left = token_ttl if end is None else max(token_ttl, end - now)
    return left + CLOCK_MARGIN


def boot_of(started: float) -> str:
    """A replica's incarnation as a claim records it: its attestation's start time."""
    return f"{started:.6f}"


class OnceOutcome(StrEnum):
    """What the ledger said about one final round; the values label ``mcpfleet_once_total``."""

    #: This round took the claim and ran ``finish``.
    CLAIMED = "claimed"
    #: A replay: the stored result was returned, ``finish`` did not run.
    REPLAYED = "replayed"
    #: The ledger could not be asked: the retryable error, nothing ran.
    UNAVAILABLE = "unavailable"
    #: Redis is near its maxmemory: the retryable error, nothing ran.
    FULL = "full"
    #: A replay racing the claimer gave up waiting for its result: the retryable error.
    PENDING = "pending"
    #: A replay of a flow whose result was too large to keep, or that failed.
    UNKEPT = "unkept"
    #: A replay of a flow whose claimer died after starting ``finish``: outcome unknown.
    UNKNOWN = "unknown"


RecordState = Literal["running", "done", "failed", "unkept"]


class LedgerUnavailable(Exception):
    """The ledger could not be asked or written (Redis down, stalled, refused)."""


class LedgerFull(LedgerUnavailable):
    """Redis is near its maxmemory: new once-flows are refused until results expire."""


@dataclass(frozen=True)
class Record:
    """One flow's entry in the ledger (JSON in Redis): a state, a replica, the tool's result.

    Never a key or a credential, nor the user's answers; the result is what the
    tool answered (the app's own data), kept until the claim expires.
    """

    state: RecordState
    replica: str = ""
    #: ``done``: the tool result (content, structured content, meta, is_error).
    result: dict[str, Any] | None = None
    #: ``failed``: the error ``finish`` raised; ``unkept``: why the result was not kept.
    message: str = ""
    #: ``running``: a random token of the claiming round. A claim whose reply was
    #: lost and which was sent again finds its own record: the token says so.
    claim: str = ""
    #: ``running``: the claimer's incarnation (its attestation's start time), so a
    #: replay can tell a claimer that died and came back from one still running.
    boot: str = ""
    #: ``running``: the claim was confirmed and ``finish`` may have started.
    finishing: bool = False

    def to_json(self) -> str:
        data: dict[str, Any] = {"s": self.state, "r": self.replica}
        if self.result is not None:
            data["result"] = self.result
        if self.message:
            data["m"] = self.message
        if self.claim:
            data["c"] = self.claim
        if self.boot:
            data["b"] = self.boot
        if self.finishing:
            data["f"] = 1
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> Record:
        try:
            data = json.loads(raw)
            state = data["s"]
            if state not in ("running", "done", "failed", "unkept"):
                raise ValueError(state)
            result = data.get("result")
            if result is not None and not isinstance(result, dict):
                raise ValueError("result")
            return cls(
                state,
                str(data.get("r", "")),
                result,
                str(data.get("m", "")),
                str(data.get("c", "")),
                str(data.get("b", "")),
                bool(data.get("f", False)),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise LedgerUnavailable(f"unreadable ledger record: {exc}") from None


class Confirmed(StrEnum):
    """What confirming a claim said."""

    #: Still this round's, in time: it is now ``finishing``; ``finish`` may run.
    YES = "yes"
    #: No longer this round's (expired, taken over): nothing runs here.
    LOST = "lost"
    #: This round's, but confirmed later than its deadline: deleted, nothing runs.
    LATE = "late"
    #: Not there at all (its lease ran out, or a failover lost an unreplicated write):
    #: nobody holds the flow, so the round may claim it again.
    GONE = "gone"


class Ledger(Protocol):
    """Where claims and results live: Redis for a fleet, memory for one process."""

    async def claim(self, flow: str, record: Record, lease: float) -> Record | None:
        """Take the claim for ``lease`` seconds (return None) or return the record there."""
        ...

    async def confirm(self, flow: str, mine: Record, lifetime: float, replied: float) -> Confirmed:
        """Mark ``mine`` finishing and make it live ``lifetime`` seconds, if it is still mine
        and this is in time (``replied``: when the claim's reply came, time.monotonic);
        :attr:`Confirmed.GONE` when nothing holds the flow any more."""
        ...

    async def store(self, flow: str, record: Record, lifetime: float) -> None:
        """Replace the claimer's record with the final one (only the claimer calls this)."""
        ...

    async def release(self, flow: str, mine: Record) -> bool:
        """Delete the claim if it is still exactly ``mine``, as claimed or as confirmed (only a
        round that did not run ``finish`` releases); True if deleted."""
        ...

    async def get(self, flow: str) -> Record | None: ...

    async def alive(self, replica: str, boot: str) -> bool:
        """Whether the claimer ``replica`` (incarnation ``boot``) is still in the fleet."""
        ...
