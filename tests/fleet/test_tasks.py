"""MCP tasks (SEP-2663) across the replicas: one queue, any replica, owned by their user.

Three replicas of ``fleetkit.apps.taskapp`` (an app written for FastMCP's tasks
engine, unchanged) behind the router, with JWT auth (alice and bob, tokens
from :mod:`fleetkit.clients.jwtkit`). Each task is created through the router and
its first ``tasks/get`` forced onto a replica other than the one that
created it. The scenarios with a fleet of their own are beside this file:
a worker killed or drained (``test_tasks_kill_drain.py``), Redis' ACL and a
stalled Redis (``test_tasks_redis.py``), encrypted tasks through a key
rotation (``test_tasks_encrypt.py``). Runs where the [tasks] extra is installed
(``make test-tasks``).
"""

from __future__ import annotations

import re
import statistics
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from fleetkit import monitoring
from fleetkit.apps.blobtext import blob_text
from fleetkit.clients.jwtkit import TokenIssuer
from fleetkit.clients.taskwire import HEADER_MISMATCH, NOT_FOUND, create, rpc, task
from fleetkit.fleet import FleetOptions, local_fleet
from mcpfleet.contract import RedisKeys
from mcpfleet.dev.fleet import LocalFleet
from mcpfleet.dev.ports import free_port
from mcpfleet.dev.wait import wait_for

from .conftest import shared
from .taskfleet import (
    APP,
    Sample,
    effects,
    elsewhere,
    fleet_sum,
    replica_urls,
    scrape,
    status_of,
    wait_final,
)

pytest.importorskip("fastmcp_tasks", reason="the [tasks] extra: make venv-tasks, make test-tasks")

pytestmark = [pytest.mark.fleet, pytest.mark.tasks]


#: Tasks created in the spread scenario (the issue's figure).
SPREAD = 200


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
