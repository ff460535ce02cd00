"""Session re-homing (router ``--rehome-sessions``) under faults: SIGKILL mid-tool, Redis SIGSTOP.

A replica SIGKILLed while a session's tool call runs on it: that call is
answered as broken (never re-sent: its side effect ran once), and the
session then gets the spec's 404, never a re-home; an idle session of the
same replica is re-homed. Redis stalled (SIGSTOP) while an idle session's
owner is gone: its request gets a 503 with ``Retry-After`` within the
router's Redis deadline, and is re-homed once Redis answers again.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fleetkit.apps.faultapp import EFFECTS_ENV
from fleetkit.clients.rawsession import metric_sum, open_sessions
from fleetkit.faulttable import FaultTable
from fleetkit.fleet import FleetOptions, ProcessFleet, local_fleet
from mcpfleet.dev.fleet import LocalFleet
from mcpfleet.dev.wait import wait_for

from .routerkit import Effects

REDIS_DEADLINE = 1.0
HOLD = 30.0  # the tool holds its request far past the kill


@pytest.fixture
def rehome_fleet(
    tmp_path: Path, watch_fleet: list[LocalFleet]
) -> Iterator[tuple[ProcessFleet, Effects]]:
    effects = tmp_path / "effects.log"
    options = FleetOptions(
        fleet="rehome-faults",
        app="fleetkit.apps.faultapp:app",
        env={EFFECTS_ENV: str(effects)},
        router_args=("--rehome-sessions", "--redis-deadline", str(REDIS_DEADLINE)),
    )
    with local_fleet(tmp_path / "fleet", options) as lf:
        watch_fleet.append(lf)
        yield lf, Effects(effects)


def rehomed(lf: ProcessFleet) -> float:
    text = httpx.get(f"http://127.0.0.1:{lf.router_ports[0]}/metrics", timeout=5).text
    return metric_sum(text, "mcpfleet_router_sessions_rehomed_total")


async def test_sigkill_mid_tool_ends_that_session_with_404_and_redis_stall_answers_503_then_rehomes(
    rehome_fleet: tuple[ProcessFleet, Effects], fault_table: FaultTable
) -> None:
    lf, effects = rehome_fleet
    row = fault_table.row("replica SIGKILL mid-tool, --rehome-sessions")
    async with httpx.AsyncClient(timeout=60) as http:
        sessions = await open_sessions(lf.url, http, 6)
        victim = sessions[0].replica
        on_victim = [s for s in sessions if s.replica == victim]
        assert len(on_victim) >= 2, Counter(s.replica for s in sessions)
        busy, idle = on_victim[0], on_victim[1]
        call = asyncio.create_task(
            busy.request(
                "tools/call", {"name": "slow_effect", "arguments": {"order": "k1", "seconds": HOLD}}
            )
        )
        await asyncio.to_thread(
            wait_for, lambda: effects.count("effect")["k1"] == 1, timeout=30, what="the tool to run"
        )
        started = time.monotonic()
        lf.kill(victim)
        try:
            answer = await call
            broken = f"{answer.status_code}"
            assert answer.status_code in (200, 404, 502), answer.text  # 200: a stream cut short
        except httpx.HTTPError as exc:
            broken = type(exc).__name__
        row.answered(started)
        row.attempts = 1
        after_busy = await busy.ping()
        after_idle = await idle.ping()
        others = [await s.ping() for s in sessions if s.replica != victim]
        row.double_runs = effects.count("effect")["k1"] - 1
        row.notes = (
            f"running call: {broken}; then busy session {after_busy.status_code}, "
            f"idle one {after_idle.status_code}"
        )
        assert after_busy.status_code == 404, "a session with work in flight is never re-homed"
        assert after_idle.status_code == 200, after_idle.text
        assert all(r.status_code == 200 for r in others)
        assert effects.count("effect")["k1"] == 1, "the call was never re-sent"
        assert rehomed(lf) == 1

        stall = fault_table.row("Redis SIGSTOP during a re-home")
        second = next(s for s in sessions if s.replica not in (victim, ""))
        lf.kill(second.replica)
        assert lf.redis is not None and lf.redis.popen is not None
        pid = lf.redis.popen.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            during = await second.ping()
            waited = stall.answered(started)
        finally:
            os.kill(pid, signal.SIGCONT)
        stall.attempts = 2
        after = await second.ping()
        stall.notes = f"stalled: {during.status_code} in {waited:.2f}s, then {after.status_code}"
        assert during.status_code == 503 and during.headers["retry-after"] == "1", during.text
        assert waited < REDIS_DEADLINE + 2.0
        assert after.status_code == 200, after.text
        assert after.headers.get("mcp-session-id", second.session) == second.session
        assert rehomed(lf) == 2
