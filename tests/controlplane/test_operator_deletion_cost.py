"""The operator keeps each replica Pod's deletion cost current, on the real control plane.

One namespace: the chart's CRDs and operator RBAC (as ``helm template`` renders
them), a Redis, two replica processes with their Pods registered for the
KeyRing's selector, and ``mcpfleet operator`` under the chart's ServiceAccount
with its default deletion-cost settings. Sessions and a paused elicitation are
opened on one replica straight (no router), so which Pod holds what is known;
the cost on each Pod is read back from the API server. Then Redis is stalled
(SIGSTOP): the operator keeps answering, writes no cost, and the Pods keep
their last costs until Redis answers again. Last, a ReplicaSet scaled in by
kube-controller-manager removes, each time, the Pod whose replica holds the least.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import redis
from kubernetes import client as k8s

from fleetkit.clients.rawsession import RawSession, open_sessions
from fleetkit.cluster.controlplane import (
    OPTIONAL_TOOLS,
    ControlPlane,
    require_tools,
    temporary_namespace,
    wait_for,
)
from fleetkit.cluster.cpfleet import cp_diagnostics
from fleetkit.cluster.helm import Helm
from fleetkit.cluster.operatorkit import OperatorEnv, keyring_body, operator_env, ring_body_for
from mcpfleet.contract import Attestation, RedisKeys
from mcpfleet_operator.api import KEYRINGS
from mcpfleet_operator.deletioncost import DELETION_COST_ANNOTATION, WEIGHTS, PatchPolicy

pytestmark = pytest.mark.controlplane

RING = "keys"
#: Seconds the operator has to bring a cost in line (a tick is 1 s, reads 2 s at most each).
BOUND = 30.0
#: Seconds until a cost is exact. A heartbeat taken while one of the test's own requests
#: is served counts it (``inflight``, 5); the operator writes that sample when it differs
#: enough from the Pod's cost, and the request's end, a smaller change, only once it has
#: lasted the policy's ``max_interval`` (30 s) since that write.
EXACT = BOUND + PatchPolicy().max_interval
PATCHED = "mcpfleet_operator_deletion_cost_patches_total"


@pytest.fixture(scope="module")
def env(
    control_plane: ControlPlane,
    admin_api: k8s.ApiClient,
    helm: Helm,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorEnv]:
    with (
        temporary_namespace(admin_api, "operator-deletion-cost") as namespace,
        operator_env(
            control_plane,
            helm,
            admin_api,
            namespace,
            tmp_path_factory.mktemp("operator-deletion-cost"),
            replicas=2,
            routers=0,
        ) as env,
    ):
        env.resources.create(KEYRINGS, ring_body_for(env, RING))
        env.resources.wait_keyring(RING, "Ready", timeout=60)
        yield env


@pytest.fixture(autouse=True)
def _diagnostics_on_failure(request: pytest.FixtureRequest) -> Iterator[None]:
    failed_before = request.session.testsfailed
    yield
    env = request.node.funcargs.get("env")
    if request.session.testsfailed > failed_before and isinstance(env, OperatorEnv):
        print(env.logs())
        print(f"--- costs ---\n{_costs(env)}")
        print(cp_diagnostics(env.fleet, plane_logs=False))


def _costs(env: OperatorEnv) -> dict[str, str | None]:
    """The deletion cost each replica Pod carries, as the API server has it."""
    return {
        pod.metadata.name: (pod.metadata.annotations or {}).get(DELETION_COST_ANNOTATION)
        for pod in env.fleet.pods()
    }


async def _until(condition: Callable[[], Any], what: str, timeout: float = BOUND) -> Any:
    """:func:`wait_for` in a thread: the streams this test holds open keep being read."""
    return await asyncio.to_thread(wait_for, condition, timeout=timeout, interval=0.2, what=what)


async def _costs_are(env: OperatorEnv, wanted: dict[str, int]) -> None:
    expected = {name: str(cost) for name, cost in wanted.items()}
    await _until(lambda: _costs(env) == expected, f"the Pods' costs to be {expected}", EXACT)


async def _end(http: httpx.AsyncClient, sessions: list[RawSession]) -> None:
    for s in sessions:
        resp = await http.delete(
            s.url, headers={"mcp-session-id": s.session, "mcp-protocol-version": "2025-11-25"}
        )
        assert resp.status_code in (200, 202, 204), resp.text


async def test_each_replica_pod_carries_the_cost_of_what_it_holds(env: OperatorEnv) -> None:
    first, second = env.fleet.replica_names()
    await _costs_are(env, {first: 0, second: 0})
    url = f"{env.fleet.members[first].url}/mcp"
    async with httpx.AsyncClient(timeout=30) as http:
        sessions = await open_sessions(url, http, 3)
        await _costs_are(env, {first: 3 * WEIGHTS.session, second: 0})
        # A handshake tool paused on its user: the session, the request, the ask.
        call = await sessions[0].start_elicitation("book_flight", {"destination": "Oslo"})
        try:
            held = 3 * WEIGHTS.session + WEIGHTS.inflight + WEIGHTS.paused
            await _costs_are(env, {first: held, second: 0})
        finally:
            await call.aclose()
        await _end(http, sessions)
    await _costs_are(env, {first: 0, second: 0})


def _healthz(env: OperatorEnv) -> bool:
    url = f"http://127.0.0.1:{env.operator.health_port}/healthz"
    with urllib.request.urlopen(url, timeout=2) as resp:
        return bool(resp.status == 200)


async def test_a_redis_stall_keeps_the_last_costs_and_writes_nothing(env: OperatorEnv) -> None:
    first, second = env.fleet.replica_names()
    url = f"{env.fleet.members[second].url}/mcp"
    op = env.operator
    async with httpx.AsyncClient(timeout=30) as http:
        sessions = await open_sessions(url, http, 2)
        await _costs_are(env, {first: 0, second: 2 * WEIGHTS.session})
        redis = env.fleet.redis
        assert redis is not None and redis.popen is not None
        stale_before = op.metric("mcpfleet_operator_deletion_cost_stale_ticks_total")
        os.kill(redis.popen.pid, signal.SIGSTOP)
        try:
            patched = op.metric(PATCHED, result="patched")
            await _until(
                lambda: op.metric("mcpfleet_operator_deletion_costs_stale", keyring=RING) == 1,
                "the operator to see it cannot read the attestations",
            )
            # The replica is empty now, but the cost cannot be known: it stays.
            await _end(http, sessions)
            await _until(
                lambda: (
                    op.metric("mcpfleet_operator_deletion_cost_stale_ticks_total")
                    >= stale_before + 3
                ),
                "three ticks without Redis",
            )
            assert await asyncio.to_thread(_healthz, env), "the operator hung on Redis"
            assert _costs(env) == {first: "0", second: str(2 * WEIGHTS.session)}
            assert op.metric(PATCHED, result="patched") == patched, "a cost written blind"
        finally:
            os.kill(redis.popen.pid, signal.SIGCONT)
    await _costs_are(env, {first: 0, second: 0})
    assert op.metric("mcpfleet_operator_deletion_costs_stale", keyring=RING) == 0
    # Back from the stall: one write for the one Pod whose cost changed, no burst.
    assert op.metric(PATCHED, result="patched") == patched + 1


# --------------------------------------------------------------------------- a real scale-in


def _replica_set(name: str, replicas: int) -> k8s.V1ReplicaSet:
    labels = {"app": name}
    return k8s.V1ReplicaSet(
        metadata=k8s.V1ObjectMeta(name=name),
        spec=k8s.V1ReplicaSetSpec(
            replicas=replicas,
            selector=k8s.V1LabelSelector(match_labels=labels),
            template=k8s.V1PodTemplateSpec(
                metadata=k8s.V1ObjectMeta(labels=labels),
                spec=k8s.V1PodSpec(
                    containers=[k8s.V1Container(name="server", image="example.invalid/mcp:1")]
                ),
            ),
        ),
    )


def test_a_scale_in_removes_the_pod_whose_replica_holds_the_least(env: OperatorEnv) -> None:
    """The ReplicaSet controller (kube-controller-manager) chooses by the operator's costs.

    No scheduler runs: the Pods stay unscheduled and pending, equal on every rank the
    controller looks at before the deletion cost. What each Pod's replica holds is
    written as its attestation (the record a replica heart-beats, with a long TTL).
    """
    require_tools(OPTIONAL_TOOLS)
    apps, core = k8s.AppsV1Api(env.resources.api), k8s.CoreV1Api(env.resources.api)
    apps.create_namespaced_replica_set(env.namespace, _replica_set("scalein", 3))
    pods = wait_for(
        lambda: len(names := _pod_names(core, env.namespace)) == 3 and names,
        timeout=BOUND,
        what="the ReplicaSet's 3 Pods",
    )
    keys = RedisKeys(env.fleet.fleet)
    admin = redis.Redis(host="127.0.0.1", port=env.fleet.redis_port, socket_timeout=5)
    held = dict(zip(sorted(pods), (5, 1, 9), strict=True))  # sessions each replica holds
    try:
        for name, sessions in held.items():
            record = Attestation(
                name=name, address="http://127.0.0.1:1", state="serving", kids=(),
                heartbeat=time.time(), sessions=sessions,
            )  # fmt: skip
            admin.set(keys.replica(name), record.to_json(), px=300_000)
            admin.sadd(keys.replicas, name)
        body = keyring_body(
            "scalein",
            secret_name="scalein-keys",
            selector={"app": "scalein"},
            fleet=env.fleet.fleet,
            token_ttl="3s",
        )
        env.resources.create(KEYRINGS, body)
        wanted = {n: str(s * WEIGHTS.session) for n, s in held.items()}
        wait_for(
            lambda: _pod_costs(core, env.namespace) == wanted,
            timeout=BOUND,
            what=f"the ReplicaSet's Pods to carry {wanted}",
        )
        order = sorted(held, key=held.__getitem__)
        for replicas, removed in ((2, order[0]), (1, order[1])):
            apps.patch_namespaced_replica_set_scale(
                "scalein", env.namespace, {"spec": {"replicas": replicas}}
            )
            left = wait_for(
                lambda r=replicas: len(n := _pod_names(core, env.namespace)) == r and n,
                timeout=BOUND,
                what=f"the ReplicaSet to scale in to {replicas}",
            )
            assert removed not in left, f"removed {set(pods) - set(left)}, not {removed}"
        assert left == [order[2]]
    finally:
        apps.delete_namespaced_replica_set("scalein", env.namespace)
        env.resources.delete(KEYRINGS, "scalein")
        for name in held:
            admin.delete(keys.replica(name))
            admin.srem(keys.replicas, name)
        admin.close()


def _scalein_pods(core: k8s.CoreV1Api, namespace: str) -> list[k8s.V1Pod]:
    items: list[k8s.V1Pod] = core.list_namespaced_pod(namespace, label_selector="app=scalein").items
    return [p for p in items if p.metadata.deletion_timestamp is None]


def _pod_names(core: k8s.CoreV1Api, namespace: str) -> list[str]:
    return sorted(p.metadata.name for p in _scalein_pods(core, namespace))


def _pod_costs(core: k8s.CoreV1Api, namespace: str) -> dict[str, str | None]:
    return {
        p.metadata.name: (p.metadata.annotations or {}).get(DELETION_COST_ANNOTATION)
        for p in _scalein_pods(core, namespace)
    }
