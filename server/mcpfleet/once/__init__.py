"""Exactly-once final rounds: the fleet-wide ledger of guard flows that ended.

On the modern era every round of a guard flow is an independent request, and
the sealed ``request_state`` that carries a flow's answers is a bearer token:
a client (or a proxy retrying for it) may send the final round again, to any
replica. Principal, TTL and request binding do not make a token single-use;
the spec leaves one-time actions to the server. ``ask_then(..., once=True)``
enforces them here:

* the flow's first round mints a flow id (128 random bits) into the sealed
  envelope, with the flow's **end** (the first round's time plus the sealing
  replica's token TTL): every later round names both, nobody can forge them,
  and no round of the flow is served after its end;
* when the flow ends, the replica **claims** the flow id in the fleet's ledger:
  one atomic ``SET key running NX GET PX lease`` in Redis, which either takes
  the claim or returns who holds it. The claim is a short **lease**
  (:data:`CLAIM_LEASE`): a claim that never leads to ``finish`` (Redis
  stalled and applied it late, the claimer died, the round failed) blocks
  resends for seconds, not for the token's lifetime;
* just before ``finish`` runs, the claimer **confirms** the claim: one script
  that checks the claim is still its own (its random token) and was confirmed
  within the call's deadline of the claim's reply (the lease's remaining time
  says so: no clocks compared), then marks it ``finishing`` and extends it to
  the flow's end plus a margin. The claim then outlives every token of the
  flow, whatever TTL each replica was started with. A confirmation that came
  too late deletes the claim instead;
* the claimer runs ``finish``, answers, and stores the result with the claim
  (bounded in size, retried until stored; off the answer's path);
* a replay of the final round, on any replica, returns that stored result,
  marked in its ``_meta`` (:data:`ONCE_META_KEY`), without running
  ``finish``; a replay racing the claimer waits (bounded) for the result;
* a replay that finds ``finishing`` left by a claimer that is no longer in
  the registry (it died between starting ``finish`` and storing the result)
  gets :class:`FlowOutcomeUnknown`: a distinct, non-retryable JSON-RPC error
  (:data:`OUTCOME_UNKNOWN_CODE`). The fleet cannot know whether the side
  effect happened; it never runs it a second time;
* a ledger that cannot be asked (Redis down, stalled past the deadline, or a
  Sentinel failover longer than its wait) fails the round closed with a
  retryable JSON-RPC error (:class:`FlowUnavailable`): ``finish`` never runs
  unclaimed. A claim that may have landed anyway is released in the
  background once Redis answers again. The claim and its confirmation ride
  through a Sentinel failover; a claim the failover lost (written to the old
  master, never replicated) is found gone at the confirmation and claimed
  again while the round's wait lasts;
* a Redis near its ``maxmemory`` (the share :data:`DEFAULT_MEMORY_LIMIT`)
  refuses new once-flows with the retryable "ledger is full" error rather
  than filling the memory heartbeats and routes need.

Semantics are at most once. Standalone (no Redis), :class:`MemoryLedger` does
the same job for one process. The ledger holds no keys or credentials: a claim
is a state, a replica name and the tool's result.

The package, by seam: the ledger's protocol and records (``_ledger``), its two
implementations (``_memory``, ``_redis`` with its Lua scripts), what a result
is kept as (``_results``), the errors a round is answered with (``_errors``),
an app's once-flows and their state (``_flows``) and the round itself
(``_run``). This module re-exports what the rest of mcpfleet uses.
"""

from mcpfleet.once._errors import (
    OUTCOME_UNKNOWN_CODE,
    RETRY_CODE,
    FlowOutcomeUnknown,
    FlowUnavailable,
    OnceMiddleware,
)
from mcpfleet.once._flows import (
    DEFAULT_RESULT_LIMIT,
    flow_end,
    install_ledger,
    ledger_for,
    settle,
)
from mcpfleet.once._ledger import (
    CLAIM_LEASE,
    CLOCK_MARGIN,
    ONCE_META_KEY,
    Confirmed,
    Ledger,
    LedgerFull,
    LedgerUnavailable,
    OnceOutcome,
    Record,
    claim_lifetime,
    new_flow_id,
    valid_flow_id,
)
from mcpfleet.once._memory import MemoryLedger
from mcpfleet.once._redis import DEFAULT_MEMORY_LIMIT, RedisLedger
from mcpfleet.once._run import run_once

__all__ = [
    "CLAIM_LEASE",
    "CLOCK_MARGIN",
    "DEFAULT_MEMORY_LIMIT",
    "DEFAULT_RESULT_LIMIT",
    "ONCE_META_KEY",
    "OUTCOME_UNKNOWN_CODE",
    "RETRY_CODE",
    "Confirmed",
    "FlowOutcomeUnknown",
    "FlowUnavailable",
    "Ledger",
    "LedgerFull",
    "LedgerUnavailable",
    "MemoryLedger",
    "OnceMiddleware",
    "OnceOutcome",
    "Record",
    "RedisLedger",
    "claim_lifetime",
    "flow_end",
    "install_ledger",
    "ledger_for",
    "new_flow_id",
    "run_once",
    "settle",
    "valid_flow_id",
]
