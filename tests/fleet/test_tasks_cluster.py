"""MCP tasks on a Redis Cluster: the fleet's one queue on the cluster its routes are on.

Three replicas of ``fleetkit.apps.taskapp`` connect with ``redis+cluster://``
under the replica's ACL user (the cluster's rules: the queue's keys and
channels under ``{mcpfleet:<fleet>:tasks}``, the queue library's hash tag);
tasks are created, read on another replica, run (one long enough for its
worker to renew its lease) and one cancelled; every key of the queue sits in
one slot, and ``ACL LOG`` stays empty on every node. Runs where the [tasks]
extra is installed (``make test-tasks``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from redis.crc import key_slot

from fleetkit.clients.taskwire import FINAL, create, task
from fleetkit.clusterrig import RedisClusterRig, cluster_fleet, redis_cluster
from fleetkit.fleet import FleetOptions
from fleetkit.redisrig import acl_log
from mcpfleet.dev.wait import wait_for

from .conftest import watched

pytest.importorskip("fastmcp_tasks", reason="the [tasks] extra: make venv-tasks, make test-tasks")

pytestmark = [pytest.mark.fleet, pytest.mark.tasks]

APP = "fleetkit.apps.taskapp:app"
REDELIVERY = 2.0


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[RedisClusterRig]:
    with redis_cluster(tmp_path / "cluster") as each:
        for node in each.nodes:
            acl_log(node, reset=True)
        yield each


def test_tasks_run_on_a_cluster_under_the_replicas_acl_user(
    rig: RedisClusterRig, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    options = FleetOptions(
        fleet="tasks",
        app=APP,
        env={"MCPFLEET_TEST_EFFECTS": str(tmp_path / "effects")},
        replica_args=("--tasks-redelivery", str(REDELIVERY)),
    )
    with (
        cluster_fleet(tmp_path, options, rig) as lf,
        watched(request, lf),
        httpx.Client(timeout=15) as http,
    ):
        ids = []
        for i in range(6):
            made = create(http, lf.url, "double", {"n": i})
            assert made.error is None, made.body
            ids.append(made.result["taskId"])
            other = sorted(n for n in lf.members if n != made.replica)[i % 2]
            got = task(http, f"{lf.members[other].url}/mcp", "tasks/get", ids[-1])
            assert got.error is None, got.body
        long = create(http, lf.url, "double", {"n": 7, "seconds": 2 * REDELIVERY})
        ids.append(long.result["taskId"])
        slow = create(http, lf.url, "effect", {"tag": "cluster", "seconds": 5.0})
        assert task(http, lf.url, "tasks/cancel", slow.result["taskId"]).error is None
        final: dict[str, dict[str, object]] = {}

        def all_final() -> bool:
            for task_id in ids:
                if task_id not in final:
                    answer = task(http, lf.url, "tasks/get", task_id)
                    assert answer.error is None, answer.body
                    if answer.result["status"] in FINAL:
                        final[task_id] = answer.result
            return len(final) == len(ids)

        wait_for(all_final, timeout=60, what="every task to end", interval=0.2)
        assert {str(r["status"]) for r in final.values()} == {"completed"}
        assert [r.get("result", {}).get("structuredContent") for r in final.values()] == [
            {"result": 2 * n} for n in (*range(6), 7)
        ]
        with contextlib.closing(rig.admin()) as admin:
            queue = [k.decode() for k in admin.scan_iter(match=f"{lf.keys.tasks_prefix}:*")]
        assert queue, "the queue's keys are under its hash tag"
        assert len({key_slot(k.encode()) for k in queue}) == 1
        replica_user = lf.users["replica"][0]
        for node in rig.nodes:
            denied = {
                (d.get("object"), d.get("reason"))
                for d in acl_log(node)
                if d.get("username") == replica_user
            }
            assert denied == set(), (node.name, denied)
