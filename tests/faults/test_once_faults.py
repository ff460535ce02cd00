"""Once-flows under replica kills and mixed token TTLs: never a second run, never stuck.

* A replica SIGKILLed after it confirmed a flow's claim, before its side effect
  (``charge_slow`` waiting in ``before``), and after its side effect, before
  the result was stored (waiting in ``after``): a resend on another replica
  gets the documented "outcome unknown" error (the fleet cannot know whether
  the action happened), never a second run, never "pending" for minutes.
* Replicas started with different ``--state-ttl``: a token sealed by the
  long-TTL replica and claimed by the short-TTL one; the claim must outlive
  the token (the flow's end travels in the envelope), so no replay after the
  short TTL can run ``finish`` again.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from fleetkit.apps.onceapp import EFFECTS_ENV
from fleetkit.clients.wire import Answer
from fleetkit.faulttable import FaultTable
from fleetkit.fleet import FleetOptions, ProcessFleet, local_fleet
from mcpfleet.contract import HEARTBEAT_TTL, RedisKeys
from mcpfleet.dev.fleet import LocalFleet
from mcpfleet.dev.wait import wait_for
from mcpfleet.once import ONCE_META_KEY

from .oncewire import ask, charged, count, final, outcome_unknown, started

LONG_TTL, SHORT_TTL = 600, 5


@pytest.fixture(scope="module")
def effects(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("effects") / "effects.log"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, effects: Path) -> Iterator[ProcessFleet]:
    options = FleetOptions(
        app="fleetkit.apps.onceapp:app",
        replicas=3,
        fleet="oncefaults",
        env={EFFECTS_ENV: str(effects)},
    )
    with local_fleet(tmp_path_factory.mktemp("oncefaults"), options) as lf:
        yield lf


def kill_mid_finish(
    lf: ProcessFleet, effects: Path, victim: str, witness: str, order: str, **waits: float
) -> tuple[Answer, float, int]:
    """Final round on ``victim``, SIGKILLed inside finish; resent on ``witness``."""
    state = ask(f"{lf.members[victim].url}/mcp", order, "charge_slow", **waits)

    def first_round() -> None:
        # The victim dies under it: the connection drops, no answer.
        with contextlib.suppress(httpx.HTTPError):
            final(f"{lf.members[victim].url}/mcp", order, state, "charge_slow", **waits)

    call = threading.Thread(target=first_round)
    call.start()
    ran = (lambda: count(effects, order) == 1) if "after" in waits else None
    wait_for(
        ran or (lambda: started(effects, order)),
        timeout=15,
        what=f"finish of {order} to reach the kill point",
    )
    lf.kill(victim)
    call.join(timeout=15)
    killed = time.monotonic()
    resent = final(f"{lf.members[witness].url}/mcp", order, state, "charge_slow", **waits)
    took = time.monotonic() - killed
    return resent, took, count(effects, order)


@pytest.mark.timeout(120)
def test_a_claimer_killed_inside_finish_is_outcome_unknown_on_resend_never_a_second_run(
    fleet: ProcessFleet, effects: Path, fault_table: FaultTable, watch_fleet: list[LocalFleet]
) -> None:
    watch_fleet.append(fleet)
    before, after = {"before": 30.0}, {"after": 30.0}
    cases = [
        ("replica SIGKILL between claim and finish", "replica-0", "kill-before", before),
        ("replica SIGKILL between finish and stored result", "replica-1", "kill-after", after),
    ]
    answers = []
    for fault, victim, order, waits in cases:
        resent, took, effects_seen = kill_mid_finish(
            fleet, effects, victim, "replica-2", order, **waits
        )
        row = fault_table.row(fault)
        row.attempts = 1
        row.double_runs = max(0, effects_seen - 1)
        row.lost = 0 if outcome_unknown(resent) else 1
        row.worst_seconds = took
        row.notes = f"resend: {describe(resent)}; side effects {effects_seen}"
        print(f"{fault}: resend answered in {took:.2f}s: {describe(resent)}")
        answers.append((fault, resent, took, effects_seen))
    for fault, resent, took, effects_seen in answers:
        assert outcome_unknown(resent), f"{fault}: {resent.body}"
        assert effects_seen == (0 if "claim and finish" in fault else 1), fault
        # The claimer drops out of the registry within its heartbeat TTL; the resend
        # waits at most the replay wait (5 s) for it.
        assert took < HEARTBEAT_TTL + 5.0, f"{fault}: the resend took {took:.1f}s"


def describe(answer: Answer) -> str:
    err = answer.error
    if err:
        return f"error {err['code']} ({(err.get('data') or {}).get('reason')})"
    return f"{answer.status} {str(answer.result)[:80]}"


def test_a_token_sealed_with_a_longer_ttl_outlives_the_claim_of_a_shorter_ttl_replica(
    tmp_path: Path, effects: Path, fault_table: FaultTable, watch_fleet: list[LocalFleet]
) -> None:
    options = FleetOptions(
        app="fleetkit.apps.onceapp:app",
        replicas=1,
        fleet="mixedttl",
        replica_args=("--state-ttl", str(LONG_TTL)),
        env={EFFECTS_ENV: str(effects)},
    )
    with local_fleet(tmp_path / "mixed", options) as lf:
        watch_fleet.append(lf)
        lf.replica_args = ("--state-ttl", str(SHORT_TTL))
        lf.add_replica("short-ttl")
        long_url = f"{lf.members['replica-0'].url}/mcp"
        short_url = f"{lf.members['short-ttl'].url}/mcp"
        order = "mixed-ttl"
        state = ask(long_url, order)  # sealed for 600 s
        assert charged(final(short_url, order, state), order)  # claimed by the 5 s replica
        keys = RedisKeys(lf.fleet)
        client = redis.Redis(host="127.0.0.1", port=lf.redis_port, socket_timeout=2)
        try:
            flows = list(client.scan_iter(match=keys.once("*")))
            assert len(flows) == 1
            claim_left = client.pttl(flows[0]) / 1000
        finally:
            client.close()
        replays = [final(url, order, state) for url in (short_url, long_url, short_url)]
        runs = count(effects, order)
        row = fault_table.row(f"mixed --state-ttl ({LONG_TTL} s sealer, {SHORT_TTL} s claimer)")
        row.attempts = 1 + len(replays)
        row.double_runs = max(0, runs - 1)
        row.notes = f"claim lives {claim_left:.0f}s (the token: {LONG_TTL}s)"
        print(f"mixed TTL: the claim lives {claim_left:.0f}s, the token {LONG_TTL}s")
        assert claim_left >= LONG_TTL - 10, (
            f"the claim expires after {claim_left:.0f}s, the token after {LONG_TTL}s: "
            "a replay in between would run finish again"
        )
        assert all(r.result["_meta"][ONCE_META_KEY] == {"replayed": True} for r in replays)
        assert runs == 1
