"""A replica SIGKILLed while a tool runs: the router answers, it never re-sends.

The fault app (``fleetkit.apps.faultapp``) records each side effect with the pid
that ran it. Each round sends modern-era plain tool calls, once-flow final
rounds and handshake-session calls through the router, waits until every one
of them is running on some replica, then SIGKILLs every replica that holds
one. A request a dead replica read must then be answered by the router (a 502
marked ``X-Mcpfleet-Router-Error``; for a session the spec's 404, or the
broken stream of an SSE response already under way), and its side effect must
have run exactly once: a re-send to another replica shows as a second effect,
or as a 200 from a replica that did not die.
"""

from __future__ import annotations

import concurrent.futures
import functools
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleetkit.apps.faultapp import EFFECTS_ENV
from fleetkit.faulttable import FaultTable
from fleetkit.fleet import FleetOptions, ProcessFleet, local_fleet
from mcpfleet.dev.fleet import LocalFleet
from mcpfleet.dev.wait import wait_for

from .routerkit import (
    Effects,
    Reply,
    modern_body,
    modern_headers,
    once_state,
    open_session,
    post,
    session_call,
    session_headers,
)

REPLICAS = 4
KILLS = 20
HOLD = 30.0  # how long each tool holds its request: far past the kill


@pytest.fixture
def kill_fleet(
    tmp_path: Path, watch_fleet: list[LocalFleet]
) -> Iterator[tuple[ProcessFleet, Effects]]:
    effects = tmp_path / "effects.log"
    options = FleetOptions(
        replicas=REPLICAS, app="fleetkit.apps.faultapp:app", env={EFFECTS_ENV: str(effects)}
    )
    with local_fleet(tmp_path / "fleet", options) as lf:
        watch_fleet.append(lf)
        yield lf, Effects(effects)


def _restart(lf: ProcessFleet, names: set[str]) -> None:
    """Start the killed replicas again (same names, new ports), and wait until the
    registry and the router have the new ones."""
    for name in names:
        lf.add_replica(name, wait=False)
    for name in names:
        lf.wait_replica(name)

    def registered() -> bool:
        att = lf.attestations()
        return all(
            att[n].address.endswith(f":{lf.members[n].port}") for n in names if n in att
        ) and all(n in att for n in names)

    wait_for(registered, timeout=30, what="the restarted replicas to register")
    wait_for(
        lambda: lf._router_serving(lf.router_ports[0]) >= REPLICAS,
        timeout=30,
        what="the router to see every replica serving",
        retry_on=(OSError, ValueError, KeyError),
    )


def _settled(effects: Effects, futures: dict[str, concurrent.futures.Future[Any]]) -> bool:
    """Every call is running (its effect recorded) or already answered."""
    running = set(effects.pids("effect"))
    return all(order in running or f.done() for order, f in futures.items())


def _timed(call: Callable[[], Reply]) -> tuple[Reply, float]:
    reply = call()
    return reply, time.monotonic()


@pytest.mark.timeout(240)
def test_a_replica_killed_mid_tool_never_has_its_request_sent_again(
    kill_fleet: tuple[ProcessFleet, Effects], fault_table: FaultTable
) -> None:
    lf, effects = kill_fleet
    plain_row = fault_table.row("replica SIGKILL mid-tool: plain tool (modern)")
    once_row = fault_table.row("replica SIGKILL mid-tool: once=True final round")
    session_row = fault_table.row("replica SIGKILL mid-tool: handshake session")
    kills = 0
    rnd = 0
    sent: dict[str, str] = {}  # order -> kind
    replies: dict[str, Reply] = {}
    waited: dict[str, float] = {}
    skipped: list[str] = []
    with (
        httpx.Client(timeout=HOLD + 30) as http,
        concurrent.futures.ThreadPoolExecutor(16) as pool,
    ):
        while kills < KILLS or min(Counter(sent.values())[k] for k in ("plain", "once")) < KILLS:
            rnd += 1
            calls: dict[str, Callable[[], Reply]] = {}
            for i in range(REPLICAS):
                order = f"r{rnd}-plain{i}"
                args = {"order": order, "seconds": HOLD}
                body = modern_body("slow_effect", args)
                calls[order] = lambda b=body: post(http, lf.url, b, modern_headers("slow_effect"))
                sent[order] = "plain"
            for i in range(REPLICAS):
                order = f"r{rnd}-once{i}"
                state = once_state(http, lf.url, order, HOLD)
                body = modern_body("slow_charge", {"order": order, "seconds": HOLD}, state, True)
                calls[order] = lambda b=body: post(http, lf.url, b, modern_headers("slow_charge"))
                sent[order] = "once"
            sessions: dict[str, str] = {}
            for i in range(2):
                order = f"r{rnd}-session{i}"
                session, _ = open_session(http, lf.url, f"kill-{order}")
                sessions[order] = session
                body = session_call("slow_effect", {"order": order, "seconds": HOLD})
                calls[order] = lambda b=body, s=session: post(http, lf.url, b, session_headers(s))
                sent[order] = "session"
            started = time.monotonic()
            futures = {order: pool.submit(_timed, call) for order, call in calls.items()}

            wait_for(
                functools.partial(_settled, effects, dict(futures)),
                timeout=20,
                what="every call of the round to run or be answered",
            )
            for order in list(calls):
                if order not in effects.pids("effect"):
                    # Answered before it ran (the ledger's retryable "unavailable" on a
                    # loaded machine): nothing ran, so nothing to kill; not counted.
                    reply, _ = futures.pop(order).result()
                    skipped.append(f"{order}: {reply.body.get('error') or reply}")
                    del calls[order], sent[order]
            pids = {effects.pids("effect")[o] for o in calls}
            if not pids:
                continue
            victims = {m.name for m in lf.members.values() if m.proc.popen.pid in pids}  # type: ignore[union-attr]
            killed_at: dict[int, float] = {}
            for name in victims:
                pid = lf.members[name].proc.popen.pid  # type: ignore[union-attr]
                killed_at[pid] = time.monotonic()
                lf.kill(name)
            kills += len(victims)
            for order, future in futures.items():
                replies[order], answered = future.result(timeout=HOLD + 30)
                waited[order] = answered - killed_at[effects.pids("effect")[order]]
            # A session whose owner died is gone: its next request gets the 404 at once.
            for order, session in sessions.items():
                again = session_call("slow_effect", {"order": f"{order}-after", "seconds": 0}, 3)
                after = post(http, lf.url, again, session_headers(session))
                assert after.status == 404, (order, after)
            assert time.monotonic() - started < HOLD, "every answer came before any tool ended"
            _restart(lf, victims)

    effect_counts = effects.count("effect")
    rows = {"plain": plain_row, "once": once_row, "session": session_row}
    bad: list[str] = []
    for order, kind in sent.items():
        row = rows[kind]
        row.attempts += 1
        reply = replies[order]
        row.worst_seconds = max(row.worst_seconds, waited[order])
        if effect_counts[order] != 1:
            row.double_runs += effect_counts[order] > 1
            bad.append(f"{order}: side effect ran {effect_counts[order]} times")
        if reply.completed:
            row.double_runs += 1
            bad.append(f"{order}: a 200 from another replica: {reply}")
            continue
        if kind == "session":
            # An SSE response was under way (200 relayed): its stream broke. Or the 404.
            broken = reply.error == "RemoteProtocolError"
            ok = broken or (reply.status == 404 and reply.router_error)
        else:
            ok = reply.status == 502 and reply.router_error
        if not ok:
            row.lost += 1
            bad.append(f"{order}: not the documented answer: {reply}")
    for row in rows.values():
        row.notes = f"{kills} replica SIGKILLs in {rnd} rounds of {REPLICAS} replicas"
        if skipped:
            row.notes += f"; {len(skipped)} call(s) answered retryable before running"
    assert all("retryable" in str(reason) for reason in skipped), skipped
    assert effects.count("done") == {}, "no tool outlived its replica"
    assert not bad, "\n".join(bad)
    assert plain_row.attempts >= KILLS and once_row.attempts >= KILLS
