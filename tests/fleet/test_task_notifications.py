"""Task status as ``notifications/tasks`` across the replicas, to its owner only.

Three replicas of ``fleetkit.apps.taskapp`` behind the router, JWT auth
(alice and bob). Alice's task runs on one replica's worker; her listen streams,
one on each replica and one through the router, name it in ``taskIds``: each
hears every status change (so the streams on the two replicas that do not run
it hear what happened on the third). Bob's stream names the same id and is
granted nothing, hears nothing. Polling ``tasks/get`` answers as before.
Runs where the [tasks] extra is installed (``make test-tasks``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleetkit.clients.jwtkit import TokenIssuer
from fleetkit.clients.listen import HEADERS, Listener, listen_body, listening
from fleetkit.clients.taskwire import TASK_META, TASKS, create, task
from fleetkit.fleet import FleetOptions, local_fleet
from mcpfleet.dev.fleet import LocalFleet
from mcpfleet.dev.ports import free_port

from .conftest import shared

pytest.importorskip("fastmcp_tasks", reason="the [tasks] extra: make venv-tasks, make test-tasks")

pytestmark = [pytest.mark.fleet, pytest.mark.tasks]

APP = "fleetkit.apps.taskapp:app"
SUB = "io.modelcontextprotocol/subscriptionId"


@pytest.fixture(scope="module")
def issuer() -> TokenIssuer:
    return TokenIssuer()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, issuer: TokenIssuer) -> Iterator[LocalFleet]:
    workdir = tmp_path_factory.mktemp("tasknotify")
    key = issuer.write_public_key(workdir / "jwt-public.pem")
    port = free_port()
    env = {
        "TASKAPP_JWT_PUBLIC_KEY_FILE": str(key),
        "TASKAPP_JWT_ISSUER": issuer.issuer,
        "TASKAPP_JWT_AUDIENCE": issuer.audience,
        "TASKAPP_BASE_URL": f"http://127.0.0.1:{port}",
        "MCPFLEET_TEST_EFFECTS": str(workdir / "effects"),
    }
    with local_fleet(workdir, FleetOptions(app=APP, env=env, port=port)) as lf, shared(lf):
        yield lf


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(15, read=None)) as client:
        yield client


async def statuses_until(listener: Listener, final: str, timeout: float) -> list[dict[str, Any]]:
    """The ``notifications/tasks`` params a stream gets, until one with status ``final``."""
    got: list[dict[str, Any]] = []
    async with asyncio.timeout(timeout):
        while not got or got[-1]["status"] != final:
            frame = await listener.next_event(timeout)
            assert frame.method == "notifications/tasks", frame.message
            got.append(frame.message["params"])  # type: ignore[index]
    return got


async def test_a_tasks_status_reaches_its_owners_streams_on_every_replica_and_no_one_elses(
    fleet: LocalFleet, issuer: TokenIssuer, http: httpx.AsyncClient
) -> None:
    alice, bob = issuer.token("alice"), issuer.token("bob")
    with httpx.Client(timeout=15) as sync:
        made = await asyncio.to_thread(create, sync, fleet.url, "confirm", {"tag": "heard"}, alice)
    task_id = made.result["taskId"]
    urls = [f"{m.url}/mcp" for m in fleet.members.values()] + [fleet.url]
    async with contextlib.AsyncExitStack() as stack:
        streams = [
            await stack.enter_async_context(
                listening(http, url, 10 + i, token=alice, meta=TASK_META, taskIds=[task_id])
            )
            for i, url in enumerate(urls)
        ]
        other = await stack.enter_async_context(
            listening(http, urls[0], 99, token=bob, meta=TASK_META, taskIds=[task_id])
        )
        for listener in [*streams, other]:
            ack = await listener.next_event(10)
            assert ack.method == "notifications/subscriptions/acknowledged", ack.message
            granted = ack.message["params"]["notifications"].get("taskIds")  # type: ignore[index]
            assert granted == ([] if listener is other else [task_id])
        asked = [await statuses_until(s, "input_required", 20) for s in streams]
        for frames in asked:
            assert all(f["taskId"] == task_id for f in frames)
            assert frames[-1]["inputRequests"], frames[-1]
        (key,) = asked[0][-1]["inputRequests"]
        answer = {key: {"action": "accept", "content": {"ok": True}}}
        with httpx.Client(timeout=15) as sync:
            updated = await asyncio.to_thread(
                task, sync, urls[1], "tasks/update", task_id, token=alice, inputResponses=answer
            )
        assert updated.error is None, updated.body
        for i, listener in enumerate(streams):
            frames = await statuses_until(listener, "completed", 30)
            done = frames[-1]
            assert done["result"]["structuredContent"] == {"result": "heard: confirmed"}, done
            assert done["_meta"] == {SUB: 10 + i}
            assert "resultType" not in done
        # Polling answers as before, on every replica.
        with httpx.Client(timeout=15) as sync:
            for url in urls:
                polled = await asyncio.to_thread(task, sync, url, "tasks/get", task_id, token=alice)
                assert polled.result["status"] == "completed", polled.body
        await asyncio.sleep(0.5)  # a frame for bob would have arrived with alice's
        assert [f.message for f in other.pending_events()] == []


async def test_task_ids_without_the_extension_declared_are_refused(
    fleet: LocalFleet, issuer: TokenIssuer, http: httpx.AsyncClient
) -> None:
    headers = {**HEADERS, "authorization": f"Bearer {issuer.token('alice')}"}
    body = json.dumps(listen_body(5, taskIds=["any"]))
    answer = await http.post(fleet.url, content=body, headers=headers)
    error = answer.json()["error"]
    assert error["code"] == -32021, error
    assert error["data"] == {"requiredCapabilities": {"extensions": {TASKS: {}}}}


def test_the_fleet_stays_clean(fleet: LocalFleet, tmp_path: Path) -> None:
    """Every replica is alive after the scenarios (no listen stream took one down)."""
    assert all(m.proc.alive for m in fleet.members.values())
