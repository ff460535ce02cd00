"""The tasks limit per principal on a real fleet: a cap on what one holds, a fair share.

Two replicas of ``fleetkit.apps.taskapp`` (JWT auth: alice and bob, tokens from
:mod:`fleetkit.clients.jwtkit`) behind the router, ``--tasks-concurrency 4``,
the limit given by the replicas' flags (``--limit-tasks``,
``--limit-tasks-running``). Principals are the engine's task scopes (no limit
gate sets one yet): alice's and bob's differ. Runs where the [tasks] extra is
installed (``make test-tasks``).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from fleetkit.clients.jwtkit import TokenIssuer
from fleetkit.clients.taskwire import FINAL, create, task
from fleetkit.fleet import FleetOptions, local_fleet
from fleetkit.redisrig import RedisServer, acl_log, redis_fleet
from mcpfleet.contract import RedisKeys
from mcpfleet.dev.fleet import LocalFleet
from mcpfleet.dev.ports import free_port
from mcpfleet.dev.wait import wait_for

from .conftest import shared, watched

pytest.importorskip("fastmcp_tasks", reason="the [tasks] extra: make venv-tasks, make test-tasks")

pytestmark = [pytest.mark.fleet, pytest.mark.tasks]

APP = "fleetkit.apps.taskapp:app"
#: Each principal's cap in the cap scenarios (--limit-tasks).
CAP = 5
#: Each principal's share of the workers (--limit-tasks-running): 2 of the 8 slots.
RUNNING = 2
#: Alice's backlog in the fairness scenario, and each of its tasks' seconds.
BACKLOG, BACKLOG_SECONDS = 1000, 5.0
#: Bob's task must have started within this many seconds of its creation's answer.
BOB_START_BOUND = 5.0
#: --tasks-redelivery of the cap fleet: a killed worker's task runs again within it.
REDELIVERY = 2.0


def _options(workdir: Path, issuer: TokenIssuer, *args: str) -> FleetOptions:
    key = issuer.write_public_key(workdir / "jwt-public.pem")
    port = free_port()
    env = {
        "TASKAPP_JWT_PUBLIC_KEY_FILE": str(key),
        "TASKAPP_JWT_ISSUER": issuer.issuer,
        "TASKAPP_JWT_AUDIENCE": issuer.audience,
        "TASKAPP_BASE_URL": f"http://127.0.0.1:{port}",
        "MCPFLEET_TEST_EFFECTS": str(workdir / "effects"),
    }
    replica_args = ("--tasks-concurrency", "4", *args)
    return FleetOptions(replicas=2, app=APP, env=env, port=port, replica_args=replica_args)


@pytest.fixture(scope="module")
def issuer() -> TokenIssuer:
    return TokenIssuer()


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=15) as client:
        yield client


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory, issuer: TokenIssuer) -> Iterator[LocalFleet]:
    workdir = tmp_path_factory.mktemp("capped")
    flags = ("--limit-tasks", str(CAP), "--limit-tasks-running", str(RUNNING))
    options = _options(workdir, issuer, *flags, "--tasks-redelivery", str(REDELIVERY))
    with local_fleet(workdir, options) as lf, shared(lf):
        yield lf


def held(lf: LocalFleet) -> int:
    """Places taken under every principal's cap, fleet-wide (read in Redis)."""
    client = redis.Redis(port=lf.redis_port)
    pattern = f"{RedisKeys(lf.fleet).tasks}:mcpfleet-limits:held:*"
    return sum(int(client.zcard(k)) for k in client.scan_iter(match=pattern))


def tasks_stored(lf: LocalFleet) -> int:
    """Tasks the engine holds records of (its ``created_at`` key per task)."""
    client = redis.Redis(port=lf.redis_port)
    pattern = f"{RedisKeys(lf.fleet).tasks}:fastmcp:task:*:created_at"
    return sum(1 for _ in client.scan_iter(match=pattern))


def status(http: httpx.Client, url: str, task_id: str, token: str) -> str:
    answer = task(http, url, "tasks/get", task_id, token=token)
    assert answer.error is None, answer.body
    return str(answer.result["status"])


def started(workdir: Path, tag: str) -> bool:
    path = workdir / "effects"
    return path.exists() and f"start {tag} " in path.read_text()


def test_a_principal_past_its_cap_is_refused_and_a_task_ending_gives_its_place_back(
    capped: LocalFleet, issuer: TokenIssuer, http: httpx.Client
) -> None:
    alice, bob = issuer.token("alice"), issuer.token("bob")
    assert held(capped) == 0
    # First, so that it has one of alice's RUNNING slots (the long ones wait for theirs).
    short = create(http, capped.url, "double", {"n": 9, "seconds": 1}, token=alice)
    assert short.error is None, short.body
    ids = []
    for i in range(CAP - 1):
        made = create(http, capped.url, "double", {"n": i, "seconds": 60}, token=alice)
        assert made.error is None, made.body
        ids.append(made.result["taskId"])
    before = tasks_stored(capped)
    refused = create(http, capped.url, "double", {"n": 10}, token=alice)
    print(f"\nalice's creation past her cap of {CAP}: {refused.error}")
    assert refused.error is not None and refused.error["code"] == -32000, refused.body
    assert "tasks" in refused.error["message"] and str(CAP) in refused.error["message"]
    assert refused.error["data"]["limit"] == "tasks"
    assert 1 <= refused.error["data"]["retryAfter"] <= 2
    assert tasks_stored(capped) == before, "a refused creation stored no task"
    assert held(capped) == CAP
    # Another principal is not refused.
    other = create(http, capped.url, "double", {"n": 1}, token=bob)
    assert other.error is None, other.body
    wait_for(
        lambda: status(http, capped.url, other.result["taskId"], bob) == "completed",
        timeout=30,
        what="bob's task to complete",
    )
    # Alice's short task ends: its place is hers again.
    wait_for(
        lambda: status(http, capped.url, short.result["taskId"], alice) == "completed",
        timeout=30,
        what="alice's short task to complete",
    )
    again = create(http, capped.url, "double", {"n": 11, "seconds": 60}, token=alice)
    assert again.error is None, again.body
    ids.append(again.result["taskId"])
    assert create(http, capped.url, "double", {"n": 12}, token=alice).error is not None
    # A cancelled task gives its place back too.
    cancelled = task(http, capped.url, "tasks/cancel", ids.pop(), token=alice)
    assert cancelled.error is None, cancelled.body
    last = create(http, capped.url, "double", {"n": 13, "seconds": 60}, token=alice)
    assert last.error is None, last.body
    ids.append(last.result["taskId"])
    for task_id in ids:
        assert task(http, capped.url, "tasks/cancel", task_id, token=alice).error is None
    wait_for(lambda: held(capped) == 0, timeout=10, what="every place given back")


def test_a_task_waiting_for_input_keeps_its_place_and_gives_it_back_at_its_end(
    capped: LocalFleet, issuer: TokenIssuer, http: httpx.Client
) -> None:
    """A tool taking ``ctx`` that asks (two legs, each admitted under the share): its
    place is held while it waits for the answer, and given back once it completes."""
    alice = issuer.token("alice")
    made = create(http, capped.url, "confirm", {"tag": "held"}, token=alice)
    assert made.error is None, made.body
    task_id = made.result["taskId"]

    def asking() -> dict[str, Any] | None:
        answer = task(http, capped.url, "tasks/get", task_id, token=alice)
        return answer.result if answer.result.get("status") == "input_required" else None

    asked = wait_for(asking, timeout=15, what="the task to ask")
    assert held(capped) == 1
    (key,) = asked["inputRequests"]
    answer = {key: {"action": "accept", "content": {"ok": True}}}
    updated = task(http, capped.url, "tasks/update", task_id, token=alice, inputResponses=answer)
    assert updated.error is None, updated.body
    wait_for(
        lambda: status(http, capped.url, task_id, alice) == "completed",
        timeout=30,
        what="the task to complete",
    )
    assert held(capped) == 0


def test_a_killed_workers_tasks_leave_their_principals_count_when_they_end_elsewhere(
    capped: LocalFleet, issuer: TokenIssuer, http: httpx.Client
) -> None:
    """A replica SIGKILLed while it runs alice's tasks: they run again on the other
    replica (after --tasks-redelivery) and end there, and her count comes back to 0."""
    alice = issuer.token("alice")
    workdir = capped.workdir
    tags = [f"kill-{i}" for i in range(RUNNING)]
    ids = {}
    for tag in tags:
        made = create(http, capped.url, "effect", {"tag": tag, "seconds": 4}, token=alice)
        assert made.error is None, made.body
        ids[tag] = made.result["taskId"]
    wait_for(lambda: all(started(workdir, t) for t in tags), timeout=30, what="tasks to start")
    lines = (workdir / "effects").read_text().splitlines()
    pids = {ln.split()[2].removeprefix("pid=") for ln in lines if ln.split()[1] in tags}
    victim = next(
        n for n, r in capped.members.items() if r.proc.popen and str(r.proc.popen.pid) in pids
    )
    assert held(capped) == RUNNING
    killed_at = time.monotonic()
    capped.kill(victim)
    survivor = next(r for r in capped.members.values() if r.proc.alive)
    url = f"{survivor.url}/mcp"
    bound = REDELIVERY * 1.5 + 4 + 20
    wait_for(lambda: held(capped) == 0, timeout=bound, what="alice's count back to 0")
    took = time.monotonic() - killed_at
    final = {t: status(http, url, i, alice) for t, i in ids.items()}
    print(f"\nkilled {victim}; alice's count back to 0 {took:.1f} s after the kill: {final}")
    assert set(final.values()) == {"completed"}


@pytest.fixture(scope="module")
def shared_out(
    tmp_path_factory: pytest.TempPathFactory, issuer: TokenIssuer
) -> Iterator[LocalFleet]:
    workdir = tmp_path_factory.mktemp("shared")
    options = _options(workdir, issuer, "--limit-tasks-running", str(RUNNING))
    with local_fleet(workdir, options) as lf, shared(lf):
        yield lf


def _create_many(url: str, token: str, count: int, seconds: float) -> list[str]:
    counter = itertools.count()

    def one(_: int) -> str:
        with httpx.Client(timeout=30) as client:
            made = create(client, url, "double", {"n": next(counter), "seconds": seconds}, token)
        assert made.error is None, made.body
        return str(made.result["taskId"])

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, range(count)))


def test_a_principal_with_one_short_task_does_not_wait_behind_anothers_backlog(
    shared_out: LocalFleet, issuer: TokenIssuer, http: httpx.Client
) -> None:
    alice, bob = issuer.token("alice"), issuer.token("bob")
    began = time.monotonic()
    backlog = _create_many(shared_out.url, alice, BACKLOG, BACKLOG_SECONDS)
    created_in = time.monotonic() - began
    made = create(http, shared_out.url, "effect", {"tag": "bob", "seconds": 0.1}, token=bob)
    answered = time.monotonic()
    assert made.error is None, made.body
    start = wait_for(
        lambda: started(shared_out.workdir, "bob") and time.monotonic(),
        timeout=60,
        what="bob's task to start",
        interval=0.02,
    )
    done = wait_for(
        lambda: (
            status(http, shared_out.url, made.result["taskId"], bob) in FINAL and time.monotonic()
        ),
        timeout=60,
        what="bob's task to end",
        interval=0.02,
    )
    final = status(http, shared_out.url, made.result["taskId"], bob)
    running = _alice_running(http, shared_out.url, backlog[:20], alice)
    print(
        f"\nalice's {BACKLOG} tasks of {BACKLOG_SECONDS:g} s created in {created_in:.1f} s; "
        f"bob's task of 0.1 s started {start - answered:.2f} s and ended ({final}) "
        f"{done - answered:.2f} s after its creation was answered; of alice's first 20, "
        f"{running}"
    )
    assert final == "completed"
    assert start - answered <= BOB_START_BOUND
    slots, parked = _shares(shared_out)
    print(f"slots held per principal {sorted(slots.values())}, parked {sorted(parked.values())}")
    assert slots and all(n <= RUNNING for n in slots.values()), slots
    assert len(parked) == 1 and next(iter(parked.values())) >= BACKLOG // 2, parked


def _shares(lf: LocalFleet) -> tuple[dict[str, int], dict[str, int]]:
    """Each principal's slots held and tasks parked (pydocket's keys of the share)."""
    client = redis.Redis(port=lf.redis_port)
    prefix = f"{RedisKeys(lf.fleet).tasks}:mcpfleet-share:concurrency:_mcpfleet_share:"
    slots, parked = {}, {}
    for raw in client.scan_iter(match=f"{prefix}*"):
        key = raw.decode()
        principal = key.removeprefix(prefix)
        if principal.endswith(":waiters"):
            parked[principal.removesuffix(":waiters")] = int(client.xlen(key))
        else:
            slots[principal] = int(client.zcard(key))
    return slots, parked


def _alice_running(http: httpx.Client, url: str, ids: list[str], token: str) -> dict[str, Any]:
    statuses = [status(http, url, i, token) for i in ids]
    return {s: statuses.count(s) for s in set(statuses)}


def test_the_limits_scripts_run_under_exactly_the_replicas_acl_rules(
    tmp_path: Path, request: pytest.FixtureRequest, http: httpx.Client
) -> None:
    """Every component its own ACL user: the cap's scripts and the share's (pydocket's)
    run within the queue's selector; ``ACL LOG`` stays empty. Anonymous tasks: one
    principal, ``shared``."""
    server = RedisServer(tmp_path / "redis").start()
    try:
        flags = ("--limit-tasks", "3", "--limit-tasks-running", "1")
        lf = redis_fleet(
            tmp_path / "fleet",
            [server],
            f"redis://127.0.0.1:{server.port}/0",
            server.admin,
            FleetOptions(fleet="acl", replicas=2, app=APP, replica_args=flags),
        )
        acl_log(server, reset=True)
        with lf, watched(request, lf):
            made = [create(http, lf.url, "double", {"n": i, "seconds": 1}) for i in range(3)]
            assert all(m.error is None for m in made), [m.body for m in made]
            refused = create(http, lf.url, "double", {"n": 3})
            assert refused.error is not None and refused.error["code"] == -32000
            ids = [m.result["taskId"] for m in made]
            assert task(http, lf.url, "tasks/cancel", ids[-1]).error is None

            def ended() -> bool:
                return all(
                    task(http, lf.url, "tasks/get", i).result.get("status") in FINAL for i in ids
                )

            try:
                wait_for(ended, timeout=30, what="the tasks to end")
            finally:
                replica_user = lf.users["replica"][0]
                denied = {
                    (d.get("object"), d.get("reason"))
                    for d in acl_log(server)
                    if d.get("username") == replica_user
                }
                assert denied == set(), denied
    finally:
        server.stop()
