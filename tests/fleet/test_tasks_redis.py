"""MCP tasks and their Redis: the replicas under exactly the contract's ACL rules, and
a stalled Redis answered within ``--tasks-deadline``.

Each scenario has a fleet of ``fleetkit.apps.taskapp`` of its own. Runs where the
[tasks] extra is installed (``make test-tasks``).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx
import pytest

from fleetkit.clients.taskwire import create, task
from fleetkit.fleet import FleetOptions, local_fleet
from fleetkit.redisrig import RedisServer, acl_log, redis_fleet

from .conftest import watched
from .taskfleet import APP, REDELIVERY, elsewhere, status_of, wait_final

pytest.importorskip("fastmcp_tasks", reason="the [tasks] extra: make venv-tasks, make test-tasks")

pytestmark = [pytest.mark.fleet, pytest.mark.tasks]


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
