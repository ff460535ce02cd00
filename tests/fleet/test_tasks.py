"""MCP tasks (SEP-2663) across the replicas: one queue, any replica, owned by their user.

Three replicas of ``fleetkit.apps.taskapp`` (an app written for FastMCP's tasks
engine, unchanged) behind the router, with JWT auth (alice and bob, tokens
from :mod:`fleetkit.clients.jwtkit`). Each task is created through the router and
its first ``tasks/get`` forced onto a replica other than the one that
created it. A replica SIGKILLed while its worker runs tasks has a fleet of
its own. Runs where the [tasks] extra is installed (``make test-tasks``).
"""

from __future__ import annotations

import itertools
import re
import signal
import statistics
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from fleetkit import monitoring
from fleetkit.apps.blobtext import blob_text
from fleetkit.clients.jwtkit import TokenIssuer
from fleetkit.clients.taskwire import FINAL, HEADER_MISMATCH, NOT_FOUND, create, rpc, task
from fleetkit.fleet import FleetOptions, local_fleet
from fleetkit.redisrig import RedisServer, acl_log, redis_fleet
from mcpfleet.contract import RedisKeys
from mcpfleet.dev.fleet import LocalFleet, free_port
from mcpfleet.dev.wait import wait_for
from mcpfleet.redisconn import settings as redis_settings
from mcpfleet_operator.rotation import Convergence, Observed, RingView, decide
from mcpfleet_operator.runtime import Runtime

from .conftest import shared, watched

pytest.importorskip("fastmcp_tasks", reason="the [tasks] extra: make venv-tasks, make test-tasks")

pytestmark = [pytest.mark.fleet, pytest.mark.tasks]

APP = "fleetkit.apps.taskapp:app"
#: Tasks created in the spread scenario (the issue's figure).
SPREAD = 200
#: Replicas SIGKILLed in a row while their workers run tasks (the issue's figure).
KILLS = 10
#: Seconds after which a dead worker's task runs again elsewhere (--tasks-redelivery).
REDELIVERY = 2.0


_BY = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
_MATCHER = re.compile(r"(\w+)\s*(?:=~|!~|!=|=)\s*\"")
_METRIC = re.compile(r"\b(mcpfleet_[a-z0-9_]+)")


def _app_env(issuer: TokenIssuer, key: Path, base_url: str, effects: Path) -> dict[str, str]:
    return {
        "TASKAPP_JWT_PUBLIC_KEY_FILE": str(key),
        "TASKAPP_JWT_ISSUER": issuer.issuer,
        "TASKAPP_JWT_AUDIENCE": issuer.audience,
        "TASKAPP_BASE_URL": base_url,
        "MCPFLEET_TEST_EFFECTS": str(effects),
    }


@pytest.fixture(scope="module")
def issuer() -> TokenIssuer:
    return TokenIssuer()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, issuer: TokenIssuer) -> Iterator[LocalFleet]:
    workdir = tmp_path_factory.mktemp("tasks")
    key = issuer.write_public_key(workdir / "jwt-public.pem")
    port = free_port()
    env = _app_env(issuer, key, f"http://127.0.0.1:{port}", workdir / "effects")
    with local_fleet(workdir, FleetOptions(app=APP, env=env, port=port)) as lf, shared(lf):
        yield lf


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=15) as client:
        yield client


def replica_urls(lf: LocalFleet) -> dict[str, str]:
    return {name: f"{r.url}/mcp" for name, r in lf.members.items()}


def elsewhere(lf: LocalFleet, creator: str | None, turn: int) -> tuple[str, str]:
    """A replica other than ``creator`` (the ``turn``-th of them, round robin)."""
    others = sorted(n for n in lf.members if n != creator)
    name = others[turn % len(others)]
    return name, replica_urls(lf)[name]


def status_of(http: httpx.Client, url: str, task_id: str, token: str | None) -> dict[str, Any]:
    answer = task(http, url, "tasks/get", task_id, token=token)
    assert answer.error is None, answer.body
    return answer.result


def wait_final(
    http: httpx.Client, url: str, ids: list[str], token: str | None, timeout: float
) -> dict[str, dict[str, Any]]:
    """Every task's final ``tasks/get`` result, polled through ``url`` until ``timeout``."""
    final: dict[str, dict[str, Any]] = {}

    def all_final() -> bool:
        for task_id in ids:
            if task_id not in final:
                result = status_of(http, url, task_id, token)
                if result["status"] in FINAL:
                    final[task_id] = result
        return len(final) == len(ids)

    wait_for(all_final, timeout=timeout, what=f"{len(ids)} task(s) to end", interval=0.2)
    return final


def effects(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


Sample = tuple[str, tuple[tuple[str, str], ...]]


def scrape(http: httpx.Client, lf: LocalFleet) -> dict[str, dict[Sample, float]]:
    """Each live replica's ``mcpfleet_tasks_*`` samples, by replica."""
    out: dict[str, dict[Sample, float]] = {}
    for name, member in lf.members.items():
        if not member.proc.alive:
            continue
        text = http.get(f"{member.url}/metrics").text
        out[name] = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name.startswith("mcpfleet_tasks_") and not s.name.endswith("_created")
        }
    return out


def fleet_sum(scraped: dict[str, dict[Sample, float]]) -> Counter[Sample]:
    total = Counter[Sample]()
    for samples in scraped.values():
        for key, value in samples.items():
            if key[0].endswith("_total"):
                total[key] += value
    return total


def test_every_task_resolves_at_once_on_another_replica_and_completes_with_its_result(
    fleet: LocalFleet, issuer: TokenIssuer, http: httpx.Client
) -> None:
    alice = issuer.token("alice")
    not_found, creators, forced = 0, Counter[str](), Counter[str]()
    ids: dict[str, int] = {}
    gaps: list[float] = []
    for i in range(SPREAD):
        made = create(http, fleet.url, "double", {"n": i}, token=alice)
        assert made.error is None, made.body
        assert made.result["status"] == "working", made.body
        task_id = made.result["taskId"]
        ids[task_id] = i
        creators[made.replica or "?"] += 1
        other, url = elsewhere(fleet, made.replica, i)
        forced[other] += 1
        started = time.perf_counter()
        # Half with Mcp-Name, half without: a client may omit it.
        got = task(http, url, "tasks/get", task_id, with_name=i % 2 == 0, token=alice)
        gaps.append(time.perf_counter() - started)
        if got.error is not None and got.error["code"] == NOT_FOUND:
            not_found += 1
        else:
            assert got.error is None, got.body
            assert got.result["taskId"] == task_id
    final = wait_final(http, fleet.url, list(ids), alice, timeout=120)
    wrong = {
        t: r
        for t, r in final.items()
        if r.get("result", {}).get("structuredContent") != {"result": 2 * ids[t]}
    }
    p50, p99 = statistics.median(gaps) * 1000, sorted(gaps)[int(0.99 * len(gaps)) - 1] * 1000
    print(
        f"\n{SPREAD} tasks: not found on another replica {not_found}; created on {dict(creators)}; "
        f"first tasks/get forced onto {dict(forced)}; its latency p50 {p50:.1f} ms, "
        f"p99 {p99:.1f} ms"
    )
    assert not_found == 0
    assert not wrong, list(wrong.items())[:3]
    assert len(creators) == len(fleet.members), "the router spread the creations"


def test_a_task_whose_result_is_1_mib_is_read_whole_through_the_router(
    fleet: LocalFleet, issuer: TokenIssuer, http: httpx.Client
) -> None:
    alice = issuer.token("alice")
    size = 1 << 20
    made = create(http, fleet.url, "blob", {"size": size}, token=alice)
    assert made.error is None, made.body
    task_id = made.result["taskId"]
    final = wait_final(http, fleet.url, [task_id], alice, timeout=30)[task_id]
    assert final["status"] == "completed", final["status"]
    for _ in range(20):
        got = task(http, fleet.url, "tasks/get", task_id, token=alice)
        assert got.status == 200 and got.error is None, str(got.body)[:300]
        assert got.result["result"]["content"][0]["text"] == blob_text(size)


def test_the_replicas_count_tasks_by_tool_and_status_and_read_the_queues_depth(
    fleet: LocalFleet, issuer: TokenIssuer, http: httpx.Client
) -> None:
    """Created, completed, error, failed, cancelled and input requests, summed over the
    replicas, match what was done; the queue's depth rises while tasks wait, then falls."""
    alice = issuer.token("alice")
    before = fleet_sum(scrape(http, fleet))
    ids = [create(http, fleet.url, "double", {"n": i}, token=alice) for i in range(4)]
    ids += [create(http, fleet.url, "broken", {"protocol": p}, token=alice) for p in (False, True)]
    asks = create(http, fleet.url, "confirm", {"tag": "counted"}, token=alice)
    slow = create(http, fleet.url, "effect", {"tag": "count-cancel", "seconds": 30.0}, token=alice)
    task_ids = [a.result["taskId"] for a in [*ids, asks, slow]]
    assert task(http, fleet.url, "tasks/cancel", task_ids[-1], token=alice).error is None

    def asking() -> dict[str, Any] | None:
        result = status_of(http, fleet.url, task_ids[-2], alice)
        return result if result["status"] == "input_required" else None

    (key,) = wait_for(asking, timeout=15, what="the task to ask")["inputRequests"]
    answer = {key: {"action": "accept", "content": {"ok": True}}}
    task(http, fleet.url, "tasks/update", task_ids[-2], token=alice, inputResponses=answer)
    final = wait_final(http, fleet.url, task_ids, alice, timeout=30)
    assert [final[t]["status"] for t in task_ids] == [
        *["completed"] * 5,
        "failed",
        "completed",
        "cancelled",
    ], final
    delta = fleet_sum(scrape(http, fleet)) - before

    def n(metric: str, **labels: str) -> float:
        return delta[(metric, tuple(sorted(labels.items())))]

    created = "mcpfleet_tasks_created_total"
    finished = "mcpfleet_tasks_finished_total"
    assert n(created, tool="double") == 4
    assert n(created, tool="broken") == 2
    assert n(created, tool="confirm") == n(created, tool="effect") == 1
    assert n(finished, tool="double", status="completed") == 4
    assert n(finished, tool="broken", status="error") == 1
    assert n(finished, tool="broken", status="failed") == 1
    assert n(finished, tool="confirm", status="completed") == 1
    assert n(finished, tool="effect", status="cancelled") == 1
    assert n("mcpfleet_tasks_input_requests_total", tool="confirm") == 1
    assert sum(v for k, v in delta.items() if k[0] == finished) == 8

    # More tasks than the fleet's workers run at once (3 x 10): some wait in the queue.
    started = time.time()
    waiting = [
        create(http, fleet.url, "double", {"n": i, "seconds": 4.0}, token=alice).result["taskId"]
        for i in range(36)
    ]

    def depth_seen() -> tuple[float, float] | None:
        scraped = scrape(http, fleet).values()
        depth = max(s[("mcpfleet_tasks_queue_depth", ())] for s in scraped)
        running = sum(s[("mcpfleet_tasks_running", ())] for s in scraped)
        return (depth, running) if depth > 0 else None

    depth, running = wait_for(depth_seen, timeout=10, what="a queue depth read above 0")
    print(f"\nqueue depth {depth:.0f} read with {running:.0f} task(s) running")
    assert running > 0
    wait_final(http, fleet.url, waiting, alice, timeout=60)
    depth_key: Sample = ("mcpfleet_tasks_queue_depth", ())
    wait_for(
        lambda: all(s[depth_key] == 0 for s in scrape(http, fleet).values()),
        timeout=10,
        what="every replica to read the queue empty",
    )
    exported: dict[str, set[str]] = {}
    for samples in scrape(http, fleet).values():
        assert samples[("mcpfleet_tasks_queue_read_timestamp_seconds", ())] >= started
        assert samples[("mcpfleet_tasks_running", ())] == 0
        for name, labels in samples:
            exported.setdefault(name, set()).update(k for k, _ in labels)
    # What the dashboard's Tasks row and the task alerts read is what the replicas export
    # (namespace, job and pod are the scrape's own labels).
    exprs = [q.expr for q in monitoring.panel_queries() if q.needs_tasks]
    exprs += [a.expr for a in monitoring.alerts() if monitoring.needs_tasks(a.expr)]
    assert len(exprs) >= 7
    for expr in exprs:
        used = {n.strip() for g in _BY.findall(expr) for n in g.split(",")} | set(
            _MATCHER.findall(expr)
        )
        for metric in {m for m in _METRIC.findall(expr) if m.startswith("mcpfleet_tasks_")}:
            assert metric in exported, (metric, expr)
            assert used - {"namespace", "job", "pod", ""} <= exported[metric] | {"le"}, (used, expr)


def test_a_task_request_whose_mcp_name_names_another_task_is_refused(
    fleet: LocalFleet, issuer: TokenIssuer, http: httpx.Client
) -> None:
    alice = issuer.token("alice")
    made = create(http, fleet.url, "double", {"n": 1}, token=alice)
    task_id = made.result["taskId"]
    wrong = rpc(http, fleet.url, "tasks/get", {"taskId": task_id}, name="another", token=alice)
    assert wrong.error is not None and wrong.error["code"] == HEADER_MISMATCH, wrong.body


def test_another_users_task_id_is_an_unknown_id_on_every_replica_for_each_method(
    fleet: LocalFleet, issuer: TokenIssuer, http: httpx.Client
) -> None:
    alice, bob = issuer.token("alice"), issuer.token("bob")
    made = create(http, fleet.url, "whoami", {"seconds": 1.0}, token=alice)
    task_id = made.result["taskId"]
    unknown = "x" * len(task_id)
    for name, url in replica_urls(fleet).items():
        for method, extra in (
            ("tasks/get", {}),
            ("tasks/update", {"inputResponses": {}}),
            ("tasks/cancel", {}),
        ):
            theirs = task(http, url, method, task_id, token=bob, **extra)
            none = task(http, url, method, unknown, token=bob, **extra)
            assert theirs.error is not None, (name, method, theirs.body)
            assert none.error is not None, (name, method, none.body)
            assert theirs.status == none.status, (name, method)
            assert theirs.error["code"] == none.error["code"] == NOT_FOUND
            assert theirs.error["message"].replace(task_id, "ID") == none.error["message"].replace(
                unknown, "ID"
            ), (name, method)
    # Alice's task is unaffected by bob's cancel, and ran as alice.
    final = wait_final(http, fleet.url, [task_id], alice, timeout=30)[task_id]
    assert final["status"] == "completed", final
    assert final["result"]["structuredContent"] == {"result": "alice"}


def test_no_token_reaches_redis_or_a_log_line(
    fleet: LocalFleet, issuer: TokenIssuer, http: httpx.Client
) -> None:
    carol = issuer.token("carol")
    made = create(http, fleet.url, "whoami", {}, token=carol)
    task_id = made.result["taskId"]
    assert wait_final(http, fleet.url, [task_id], carol, timeout=30)[task_id]["status"] == (
        "completed"
    )
    client = redis.Redis(port=fleet.redis_port, socket_timeout=5)
    stored = []
    for key in client.scan_iter(match=f"{RedisKeys(fleet.fleet).tasks}:*", count=500):
        kind = client.type(key)
        if kind == b"string":
            stored.append(client.get(key) or b"")
        elif kind == b"hash":
            stored.extend(v for kv in client.hgetall(key).items() for v in kv)
    assert stored, "the task's records are in the fleet's Redis"
    secret = carol.encode()
    assert not [v for v in stored if secret in v or secret.split(b".")[2] in v]
    assert all(secret.decode() not in tail for _, tail in fleet.logs())
    assert all(task_id not in tail for _, tail in fleet.logs())


def test_a_task_that_asks_is_answered_through_another_replica_and_completes(
    fleet: LocalFleet, issuer: TokenIssuer, http: httpx.Client
) -> None:
    alice = issuer.token("alice")
    made = create(http, fleet.url, "confirm", {"tag": "asked"}, token=alice)
    task_id = made.result["taskId"]

    def asking() -> tuple[str, dict[str, Any]] | None:
        for name, url in replica_urls(fleet).items():
            result = status_of(http, url, task_id, alice)
            if result["status"] == "input_required":
                return name, result
        return None

    seen_on, asked = wait_for(asking, timeout=15, what="the task to ask")
    (key,) = asked["inputRequests"]
    _, url = elsewhere(fleet, seen_on, 0)
    answer = {key: {"action": "accept", "content": {"ok": True}}}
    updated = task(http, url, "tasks/update", task_id, token=alice, inputResponses=answer)
    assert updated.error is None, updated.body
    final = wait_final(http, fleet.url, [task_id], alice, timeout=30)[task_id]
    assert final["result"]["structuredContent"] == {"result": "asked: confirmed"}, final
    confirmed = [
        ln for ln in effects(fleet.workdir / "effects") if ln.startswith("confirmed asked")
    ]
    assert len(confirmed) == 1


def test_an_ask_then_flow_inside_a_task_is_answered_leg_by_leg_through_other_replicas(
    fleet: LocalFleet, issuer: TokenIssuer, http: httpx.Client
) -> None:
    """mcpfleet's own guard flow in a task: each question parks the task in
    ``input_required``; each ``tasks/update`` goes to a replica other than the
    one the question was read on; the next leg runs on any worker."""
    alice = issuer.token("alice")
    made = create(http, fleet.url, "plan", {"tag": "trip"}, token=alice)
    task_id = made.result["taskId"]
    # The engine names each input request itself (unique over the task's life):
    # the question is told by its message.
    replies = {"Which city?": {"value": "Oslo"}, "How many nights?": {"value": 3}}
    asked_keys: list[str] = []
    for turn in range(len(replies)):

        def asking() -> tuple[str, dict[str, Any]] | None:
            for name, url in replica_urls(fleet).items():
                result = status_of(http, url, task_id, alice)
                assert result["status"] in ("working", "input_required"), result
                keys = list(result.get("inputRequests") or {})
                if result["status"] == "input_required" and keys and keys[0] not in asked_keys:
                    return name, result
            return None

        seen_on, asked = wait_for(asking, timeout=15, what=f"question {turn + 1} of the flow")
        ((key, request),) = asked["inputRequests"].items()
        asked_keys.append(key)
        message = request["params"]["message"]
        _, url = elsewhere(fleet, seen_on, turn)
        answer = {key: {"action": "accept", "content": replies[message]}}
        updated = task(http, url, "tasks/update", task_id, token=alice, inputResponses=answer)
        assert updated.error is None, updated.body
    assert len(set(asked_keys)) == 2
    final = wait_final(http, fleet.url, [task_id], alice, timeout=30)[task_id]
    assert final["status"] == "completed", final
    assert final["result"]["structuredContent"] == {"result": "trip: Oslo for 3 nights"}, final
    planned = [ln for ln in effects(fleet.workdir / "effects") if ln.startswith("planned trip ")]
    assert len(planned) == 1 and planned[0].startswith("planned trip Oslo 3 "), planned


def test_a_task_cancelled_through_another_replica_stops_on_its_worker(
    fleet: LocalFleet, issuer: TokenIssuer, http: httpx.Client
) -> None:
    alice = issuer.token("alice")
    log = fleet.workdir / "effects"
    made = create(http, fleet.url, "effect", {"tag": "cancel-me", "seconds": 2.0}, token=alice)
    task_id = made.result["taskId"]
    wait_for(
        lambda: "start cancel-me" in " ".join(effects(log)), timeout=15, what="the task to run"
    )
    started = time.monotonic()
    _, url = elsewhere(fleet, made.replica, 1)
    cancel = task(http, url, "tasks/cancel", task_id, token=alice)
    assert cancel.error is None, cancel.body
    for other in replica_urls(fleet).values():
        assert status_of(http, other, task_id, alice)["status"] == "cancelled"
    # The tool would have written "done" 2 s after it started: watch past that.
    while time.monotonic() < started + 3.0:
        assert not [ln for ln in effects(log) if ln.startswith("done cancel-me")]
        time.sleep(0.1)


@pytest.mark.timeout(360)
def test_a_replica_killed_mid_task_leaves_no_task_working(
    tmp_path: Path, request: pytest.FixtureRequest, http: httpx.Client
) -> None:
    """Tasks whose worker is SIGKILLed run again on another worker within the bound.

    Delivery is at least once: a killed task's side effect may have started
    twice (docs/tasks.md); each one completes exactly once.
    """
    log = tmp_path / "effects"
    options = FleetOptions(
        app=APP,
        env={"MCPFLEET_TEST_EFFECTS": str(log)},
        replica_args=("--tasks-redelivery", str(REDELIVERY)),
    )
    rounds, per_round, seconds = KILLS, 6, 2.0
    with local_fleet(tmp_path, options) as lf, watched(request, lf):
        killed_tasks = 0
        counter = itertools.count()
        for _ in range(rounds):
            tags = {f"t{next(counter)}" for _ in range(per_round)}
            ids = {}
            for tag in sorted(tags):
                made = create(http, lf.url, "effect", {"tag": tag, "seconds": seconds})
                assert made.error is None, made.body
                ids[tag] = made.result["taskId"]

            def running(tags: set[str] = tags) -> dict[str, str]:
                found = {}
                for line in effects(log):
                    kind, tag, pid = line.split()
                    if kind == "start" and tag in tags:
                        found[tag] = pid.removeprefix("pid=")
                return found if len(found) == len(tags) else {}

            pids = wait_for(running, timeout=30, what="every task to start")
            by_pid = Counter(pids.values())
            victim_pid, victim_load = by_pid.most_common(1)[0]
            victim = next(
                n
                for n, r in lf.members.items()
                if r.proc.popen is not None and str(r.proc.popen.pid) == victim_pid
            )
            killed_at = time.monotonic()
            lf.kill(victim)
            killed_tasks += victim_load
            survivor = next(r for r in lf.members.values() if r.proc.alive)
            bound = REDELIVERY + seconds + 15
            final = wait_final(http, f"{survivor.url}/mcp", list(ids.values()), None, bound)
            took = time.monotonic() - killed_at
            statuses = Counter(r["status"] for r in final.values())
            print(
                f"\nkilled {victim} running {victim_load} of {per_round} tasks; all ended "
                f"{took:.1f} s after the kill: {dict(statuses)}"
            )
            assert statuses == {"completed": per_round}, final
            lf.add_replica(f"replica-new-{next(counter)}")
        lines = effects(log)
        starts = Counter(ln.split()[1] for ln in lines if ln.startswith("start"))
        dones = Counter(ln.split()[1] for ln in lines if ln.startswith("done"))
        total = rounds * per_round
        print(
            f"{rounds} kills, {total} tasks, {killed_tasks} on a killed worker: "
            f"side effects started {sum(starts.values())}, done {sum(dones.values())}, "
            f"started twice {sum(1 for c in starts.values() if c > 1)}"
        )
        assert set(dones) == set(starts) and len(dones) == total
        assert all(c == 1 for c in dones.values()), dones
        assert sum(starts.values()) == total + killed_tasks


def test_tasks_run_with_the_replica_under_exactly_its_acl_rules(
    tmp_path: Path, request: pytest.FixtureRequest, http: httpx.Client
) -> None:
    """The queue's commands, keys and channels are all in the contract's selector.

    Every component connects as its own ACL user with a password file (the
    queue's credentials as a provider, never in its URL); tasks are created,
    run, read on another replica and cancelled; ``ACL LOG`` stays empty.
    """
    server = RedisServer(tmp_path / "redis").start()
    try:
        lf = redis_fleet(
            tmp_path / "fleet",
            [server],
            f"redis://127.0.0.1:{server.port}/0",
            server.admin,
            FleetOptions(
                fleet="acl",
                app=APP,
                env={"MCPFLEET_TEST_EFFECTS": str(tmp_path / "effects")},
                replica_args=("--tasks-redelivery", str(REDELIVERY)),
            ),
        )
        acl_log(server, reset=True)
        with lf, watched(request, lf):
            ids = []
            for i in range(6):
                made = create(http, lf.url, "double", {"n": i})
                assert made.error is None, made.body
                ids.append(made.result["taskId"])
                _, url = elsewhere(lf, made.replica, i)
                assert task(http, url, "tasks/get", ids[-1]).error is None
            # Long enough for its worker to renew its lease (every REDELIVERY / 4).
            long = create(http, lf.url, "double", {"n": 7, "seconds": 2 * REDELIVERY})
            ids.append(long.result["taskId"])
            slow = create(http, lf.url, "effect", {"tag": "acl", "seconds": 5.0})
            assert task(http, lf.url, "tasks/cancel", slow.result["taskId"]).error is None
            try:
                final = wait_final(http, lf.url, ids, None, timeout=30)
            finally:
                replica_user = lf.users["replica"][0]
                log = acl_log(server)
                denied = {
                    (d.get("object"), d.get("reason"))
                    for d in log
                    if d.get("username") == replica_user
                }
                assert denied == set(), denied
            assert {r["status"] for r in final.values()} == {"completed"}
    finally:
        server.stop()


def test_a_stalled_redis_answers_task_requests_within_the_deadline(
    tmp_path: Path, request: pytest.FixtureRequest, http: httpx.Client
) -> None:
    """The engine reads Redis without a timeout; the fleet bounds each task request."""
    deadline = 2.0
    options = FleetOptions(
        app=APP,
        replicas=1,
        env={"MCPFLEET_TEST_EFFECTS": str(tmp_path / "effects")},
        replica_args=("--tasks-deadline", str(deadline)),
    )
    with local_fleet(tmp_path, options) as lf, watched(request, lf):
        (replica,) = lf.members.values()
        url = f"{replica.url}/mcp"
        made = create(http, url, "double", {"n": 4})
        task_id = made.result["taskId"]
        assert wait_final(http, url, [task_id], None, timeout=15)[task_id]["status"] == "completed"
        assert lf.redis is not None
        lf.redis.signal(signal.SIGSTOP)
        try:
            for call in (
                lambda: task(http, url, "tasks/get", task_id),
                lambda: create(http, url, "double", {"n": 5}),
            ):
                started = time.monotonic()
                answer = call()
                took = time.monotonic() - started
                assert answer.error is not None, answer.body
                assert "did not answer within 2 s" in answer.error["message"], answer.body
                assert deadline <= took < deadline + 2.0, took
        finally:
            lf.redis.signal(signal.SIGCONT)
        assert status_of(http, url, task_id, None)["status"] == "completed"


def _starts(log: Path, tags: set[str]) -> dict[str, list[str]]:
    """The pids each tagged task started on, in order."""
    found: dict[str, list[str]] = {}
    for line in effects(log):
        kind, tag, pid = line.split()
        if kind == "start" and tag in tags:
            found.setdefault(tag, []).append(pid.removeprefix("pid="))
    return found


def _victim(lf: LocalFleet, pids: dict[str, list[str]]) -> tuple[str, str, int]:
    """The replica running the most of these tasks: its name, pid and load."""
    pid, load = Counter(p[0] for p in pids.values()).most_common(1)[0]
    name = next(
        n
        for n, r in lf.members.items()
        if r.proc.popen is not None and str(r.proc.popen.pid) == pid
    )
    return name, pid, load


@pytest.mark.timeout(240)
def test_a_draining_replica_takes_no_new_task_and_finishes_or_hands_back_what_it_runs(
    tmp_path: Path, request: pytest.FixtureRequest, http: httpx.Client
) -> None:
    """A real SIGTERM while tasks run, twice.

    Tasks shorter than the drain: the replica finishes them (each started once),
    takes none of those created while it drains, and exits 0. Tasks longer than
    the drain: at its deadline it hands them back, and another worker completes
    them well before the redelivery timeout would have. None lost, none left
    ``working``, each effect finished once.
    """
    log = tmp_path / "effects"
    drain, redelivery = 4.0, 20.0
    options = FleetOptions(
        app=APP,
        env={"MCPFLEET_TEST_EFFECTS": str(log)},
        replica_args=(
            "--drain-timeout",
            str(drain),
            "--tasks-redelivery",
            str(redelivery),
            "--tasks-concurrency",
            "4",
        ),
    )

    def run(tags: list[str], seconds: float) -> dict[str, str]:
        ids = {}
        for tag in tags:
            made = create(http, lf.url, "effect", {"tag": tag, "seconds": seconds})
            assert made.error is None, made.body
            ids[tag] = made.result["taskId"]
        return ids

    with local_fleet(tmp_path, options) as lf, watched(request, lf):
        # Shorter than the drain: finished by the draining replica itself.
        first = run([f"a{i}" for i in range(6)], 1.5)
        pids = wait_for(
            lambda: (p := _starts(log, set(first))) and len(p) == len(first) and p,
            timeout=30,
            what="every task to start",
        )
        victim, victim_pid, load = _victim(lf, pids)
        proc = lf.members[victim].proc
        lf.drain(victim)
        wait_for(
            lambda: "takes no new task" in proc.tail(200), timeout=10, what="the worker to stop"
        )
        later = run([f"n{i}" for i in range(6)], 0.2)
        survivor = next(r for n, r in lf.members.items() if n != victim and r.proc.alive)
        ids = {**first, **later}
        final = wait_final(http, f"{survivor.url}/mcp", list(ids.values()), None, 30)
        assert {r["status"] for r in final.values()} == {"completed"}, final
        assert proc.wait(drain + 10) == 0, "the drained replica exits by itself"
        starts = _starts(log, set(ids))
        assert all(len(p) == 1 for p in starts.values()), starts
        assert not [t for t in later if starts[t] == [victim_pid]], "no new task on it"
        print(f"\ndrained {victim} running {load} task(s): finished them, took none of 6 new")
        lf.add_replica("replica-after-drain")

        # Longer than the drain: handed back at its deadline.
        long = 8.0
        second = run([f"b{i}" for i in range(6)], long)
        pids = wait_for(
            lambda: (p := _starts(log, set(second))) and len(p) == len(second) and p,
            timeout=30,
            what="every task to start",
        )
        victim, victim_pid, load = _victim(lf, pids)
        proc = lf.members[victim].proc
        termed = time.monotonic()
        lf.drain(victim)
        survivor = next(r for n, r in lf.members.items() if n != victim and r.proc.alive)
        final = wait_final(http, f"{survivor.url}/mcp", list(second.values()), None, 60)
        took = time.monotonic() - termed
        assert {r["status"] for r in final.values()} == {"completed"}, final
        assert proc.wait(10) == 0
        assert "handed back" in proc.tail(200)
        lines = effects(log)
        starts = _starts(log, set(second))
        dones = Counter(ln.split()[1] for ln in lines if ln.startswith("done b"))
        handed = [t for t, p in starts.items() if p[0] == victim_pid]
        print(
            f"drained {victim} running {load} task(s) of {long:.0f} s with a {drain:.0f} s "
            f"drain: {len(handed)} handed back, all completed {took:.1f} s after SIGTERM"
        )
        assert len(handed) == load
        assert all(len(starts[t]) == 2 and starts[t][1] != victim_pid for t in handed), starts
        assert dones == Counter(dict.fromkeys(second, 1)), dones
        # Released at once, not left for the redelivery timeout to lapse.
        assert took < drain + 0.75 * redelivery + long, took


@pytest.mark.timeout(240)
def test_a_key_rotation_with_50_encrypted_tasks_in_flight_fails_none(
    tmp_path: Path, request: pytest.FixtureRequest, http: httpx.Client
) -> None:
    """``--tasks-encrypt``: snapshots sealed under the key ring, rotated mid-flight.

    Under the ring's key: a long task (cancelled after the promotion), 50
    tasks, and one that parks asking for input; then the ring is staged and
    promoted while they wait and run; 10 more are created under the new key.
    The old key is retired when the operator's retire step says so: its
    decision (:func:`mcpfleet_operator.rotation.decide`, the token TTL taken
    as passed) fed, as the operator feeds it, with the live tasks of the old
    kid's seal ledger counted the way the operator counts them
    (:meth:`mcpfleet_operator.runtime.Runtime.old_tasks`). It must wait while
    any of them is live (the parked one holds it until it is answered), and
    retire once none is; then 5 more. Every task
    completes, each effect once; every stored snapshot is sealed (none in
    clear), by the key its kid names; both ledgers end empty.
    """
    log = tmp_path / "effects"
    options = FleetOptions(
        app=APP,
        env={"MCPFLEET_TEST_EFFECTS": str(log)},
        replica_args=("--tasks-encrypt", "--tasks-concurrency", "2"),
    )

    def run(prefix: str, count: int, seconds: float) -> dict[str, str]:
        ids = {}
        for i in range(count):
            made = create(http, lf.url, "effect", {"tag": f"{prefix}{i}", "seconds": seconds})
            assert made.error is None, made.body
            ids[f"{prefix}{i}"] = made.result["taskId"]
        return ids

    def sealed_by() -> Counter[str]:
        client = redis.Redis(port=lf.redis_port, socket_timeout=5)
        kids = Counter[str]()
        for key in client.scan_iter(match=f"{RedisKeys(lf.fleet).tasks}:*:snapshot", count=500):
            value = (client.get(key) or b"").decode()
            assert value.startswith("mcpfleet:v1:"), value[:40]
            kids[value.split(":")[2]] += 1
        client.close()
        return kids

    with local_fleet(tmp_path, options) as lf, watched(request, lf):
        (old,) = lf.ring().kids
        # One that runs until cancelled, the 50, and one that parks asking for input.
        dropped = run("dropped", 1, 60.0)["dropped0"]
        wait_for(lambda: "start dropped0" in " ".join(effects(log)), timeout=15, what="it to run")
        first = run("k", 50, 1.0)
        parked = create(http, lf.url, "confirm", {"tag": "parked"}).result["taskId"]
        for step in ("stage", "promote"):
            lf.wait_attested(lf.rotate_step(step).kids)
        new = lf.ring().kids[0]
        assert task(http, lf.url, "tasks/cancel", dropped).error is None
        second = run("m", 10, 0.2)
        in_flight = [
            t for t in first.values() if status_of(http, lf.url, t, None)["status"] == "working"
        ]
        assert sealed_by() == Counter({old: 52, new: 10})
        url = f"redis://127.0.0.1:{lf.redis_port}/0"
        operator = Runtime(api=None, redis_settings=redis_settings(url))  # type: ignore[arg-type]
        assert operator.old_tasks(lf.fleet, new) == 10
        held: list[int] = []

        def retire_step_says_retire() -> bool:
            """One tick of the operator's retire step: whether it retires the old key."""
            ring = lf.ring()
            count = operator.old_tasks(lf.fleet, old)
            decision = decide(
                Observed(
                    uid="u",
                    phase="Waiting",
                    new_kid=new,
                    ring=RingView("promoted", ring.kids, "u"),
                    convergence=Convergence(ring.kids, ("r",), ("r",), ()),
                    ttl_elapsed=True,
                    old_tasks=count,
                )
            )
            held.append(count)
            if decision.action == "retire":
                return True
            assert decision.action == "wait" and decision.old_tasks == count, decision
            return False

        def only_the_parked_one_holds_it() -> dict[str, Any] | None:
            assert not retire_step_says_retire(), "retired under a task parked for input"
            if held[-1] != 1:
                return None
            result = status_of(http, lf.url, parked, None)
            return result if result["status"] == "input_required" else None

        asking = wait_for(only_the_parked_one_holds_it, timeout=90, what="the 50 to end")
        assert status_of(http, lf.url, dropped, None)["status"] == "cancelled"
        (key,) = asking["inputRequests"]
        answer = {key: {"action": "accept", "content": {"ok": True}}}
        assert task(http, lf.url, "tasks/update", parked, inputResponses=answer).error is None
        wait_for(retire_step_says_retire, timeout=30, what="the retire step", interval=0.2)
        live = [
            t
            for t in [*first.values(), parked]
            if status_of(http, lf.url, t, None)["status"] not in FINAL
        ]
        lf.wait_attested(lf.rotate_step("retire").kids)
        third = run("r", 5, 0.2)
        ids = {**first, **second, **third}
        final = wait_final(http, lf.url, [*ids.values(), parked], None, 60)
        statuses = Counter(r["status"] for r in final.values())
        dones = Counter(ln.split()[1] for ln in effects(log) if ln.startswith("done"))
        scraped = fleet_sum(scrape(http, lf))
        unsealed = {
            dict(labels)["kid"]: v
            for (name, labels), v in scraped.items()
            if name == "mcpfleet_tasks_snapshot_unseals_total"
        }
        left = {kid: operator.old_tasks(lf.fleet, kid) for kid in (old, new)}
        print(
            f"\nrotation {old} -> {new} with {len(in_flight)} of 50 tasks still working at "
            f"promote: {dict(statuses)}; snapshots opened by kid {unsealed}; the retire step "
            f"waited {len(held)} ticks, old-key tasks seen {held[0]} -> {held[-1]}; "
            f"ledgers at the end {left}"
        )
        assert held[0] > 0 and held[-1] == 0, "the retire step waited for the old-key tasks"
        assert live == [], "retired with a task under the old key still live"
        assert left == {old: 0, new: 0}, "every ended task left the seal ledger"
        assert in_flight, "the rotation happened with tasks in flight"
        assert statuses == {"completed": 66}, final
        assert dones == Counter(dict.fromkeys(ids, 1)), dones
        # The old key opened the 50, the cancelled one, and both legs of the parked one.
        assert unsealed == {old: 53, new: 15}


def test_the_seal_ledger_survives_a_killed_worker_and_a_stalled_redis_holds_the_retire(
    tmp_path: Path, request: pytest.FixtureRequest, http: httpx.Client
) -> None:
    """The ledger the operator counts errs towards waiting, under both faults.

    ``--tasks-encrypt``, tasks of 2 s (``--tasks-redelivery 2``): the replica
    running most of them is SIGKILLed; its tasks stay in their kid's ledger
    until, redelivered, they complete, and the ledger ends empty. Then Redis
    is SIGSTOPped: the operator's count fails within its client's 2 s timeout
    and its retire step waits, saying the ledger cannot be read.
    """
    log = tmp_path / "effects"
    options = FleetOptions(
        app=APP,
        env={"MCPFLEET_TEST_EFFECTS": str(log)},
        replica_args=("--tasks-encrypt", "--tasks-redelivery", str(REDELIVERY)),
    )
    with local_fleet(tmp_path, options) as lf, watched(request, lf):
        (kid,) = lf.ring().kids
        url = f"redis://127.0.0.1:{lf.redis_port}/0"
        operator = Runtime(api=None, redis_settings=redis_settings(url))  # type: ignore[arg-type]
        tags = {f"s{i}" for i in range(6)}
        ids = {}
        for tag in sorted(tags):
            made = create(http, lf.url, "effect", {"tag": tag, "seconds": 2.0})
            assert made.error is None, made.body
            ids[tag] = made.result["taskId"]

        def all_started() -> dict[str, list[str]] | None:
            found = _starts(log, tags)
            return found if len(found) == len(tags) else None

        pids = wait_for(all_started, timeout=30, what="every task to start")
        victim, _, load = _victim(lf, pids)
        lf.kill(victim)
        after_kill = operator.old_tasks(lf.fleet, kid)
        assert after_kill >= load, (after_kill, load)
        survivor = next(r for r in lf.members.values() if r.proc.alive)
        final = wait_final(http, f"{survivor.url}/mcp", list(ids.values()), None, 30)
        assert Counter(r["status"] for r in final.values()) == {"completed": 6}, final
        assert operator.old_tasks(lf.fleet, kid) == 0
        assert lf.redis is not None
        lf.redis.signal(signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises((redis.RedisError, OSError)):
                operator.old_tasks(lf.fleet, kid)
            took = time.monotonic() - started
        finally:
            lf.redis.signal(signal.SIGCONT)
        ring = ("new", kid)
        decision = decide(
            Observed(
                uid="u",
                phase="Waiting",
                new_kid="new",
                ring=RingView("promoted", ring, "u"),
                convergence=Convergence(ring, ("r",), ("r",), ()),
                ttl_elapsed=True,
                old_tasks=None,
            )
        )
        print(
            f"\nkilled {victim} running {load} of 6 tasks: {after_kill} in the ledger after "
            f"the kill, 0 once all 6 completed; a count under a stalled Redis failed in "
            f"{took:.1f} s"
        )
        assert took < 4.0, took
        assert decision.action == "wait" and "cannot be read" in decision.message
