"""MCP tasks on kind: a worker lost while its replica runs tasks loses none of them.

The chart installed with an app with tasks, as a user installs one: the
example app ``mcpfleet_examples.tasks:app`` in the image made for apps with
tasks (``make image-tasks``: ``localhost/mcpfleet:<version>-tasks``, the
[tasks] extra's locked set), ``server.tasks.redelivery`` 10 s, three replicas
spread over the two workers. Tasks of 30 s are created through the router;
once every one is running (its status message names the replica's Pod), the
worker whose replicas run the most is frozen (``podman pause`` of its node
container: a machine that hangs or drops off the network; its processes
neither die nor renew anything). Every task must then end ``completed``
within a bound derived from the redelivery timeout (printed), none lost
(``tasks/get`` never answers "not found"), none left ``working``; the tasks
the frozen replicas ran start again elsewhere (at least once: docs/tasks.md)
and the others run once. The node is thawed afterwards and must be Ready, its
kubelet must finish deleting the evicted replicas, and the release must serve
on three replicas again, so the modules after this one (the multi-node ones,
which stop a worker for good) see every node: the tier runs this module
before them (``BRINGS_THE_NODE_BACK``, tests/e2e/conftest.py).

The node is frozen rather than stopped because it must come back: podman
gives a stopped kind node's container a new address when it starts again,
which its kubelet's ``--node-ip`` and the CNI's BGP peers do not follow.

The routers, Redis and the operator run on the control-plane node (as in
tests/e2e/test_multinode.py), so losing a worker loses replicas, not the way
in; the replicas tolerate an unreachable node for 10 s.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from kubernetes import client as k8s

from fleetkit.clients.taskwire import FINAL, NOT_FOUND, create, task
from fleetkit.cluster import kind
from fleetkit.cluster.chartfleet import ChartFleet, ready
from fleetkit.cluster.controlplane import wait_for
from fleetkit.cluster.node import Images
from fleetkit.cluster.providers import Cluster

pytestmark = pytest.mark.timeout(1200)

NAMESPACE = "mcpfleet-tasks"
CONTROL_PLANE_LABEL = "node-role.kubernetes.io/control-plane"
#: This module freezes a worker and thaws it again: the tier runs it after the
#: modules that need every node and before those that stop one for good.
TAKES_A_NODE_AWAY = True
BRINGS_THE_NODE_BACK = True

APP = "mcpfleet_examples.tasks:app"
#: server.tasks.redelivery: seconds after which a lost worker's task runs elsewhere.
REDELIVERY = 10
#: Tasks created, and the steps of each (one a second): as many tasks as one
#: replica's worker runs at once (server.tasks.concurrency, 10), so the
#: replicas left can start every redelivered task at once.
TASKS = 10
STEPS, STEP_SECONDS = 30, 1.0
#: After the freeze, a task's lease (renewed every quarter of the redelivery
#: timeout) lapses within REDELIVERY; another worker's sweep (every quarter,
#: jittered) takes it within half a timeout more; it runs STEPS * STEP_SECONDS
#: again; SLACK covers the polls and a loaded machine.
SLACK = 30.0
BOUND = 1.5 * REDELIVERY + STEPS * STEP_SECONDS + SLACK

_ON_THE_CONTROL_PLANE: dict[str, Any] = {
    "nodeSelector": {CONTROL_PLANE_LABEL: ""},
    "tolerations": [{"key": CONTROL_PLANE_LABEL, "operator": "Exists", "effect": "NoSchedule"}],
}
_STEP = re.compile(r"step (\d+)/(\d+) on (\S+)")


def workers(cluster: Cluster) -> list[str]:
    nodes = k8s.CoreV1Api(cluster.api).list_node().items
    return sorted(
        n.metadata.name
        for n in nodes
        if CONTROL_PLANE_LABEL not in (n.metadata.labels or {}) and not n.spec.unschedulable
    )


def values(images: Images) -> dict[str, Any]:
    repository, tag = images.tasks.rsplit(":", 1)
    return {
        "router": _ON_THE_CONTROL_PLANE,
        "redis": _ON_THE_CONTROL_PLANE,
        "operator": _ON_THE_CONTROL_PLANE,
        "server": {
            "app": APP,
            "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
            "tasks": {"redelivery": REDELIVERY},
            # Sealed request states live 5 s, so the uninstall's wait for the
            # operator to release the KeyRing is short.
            "stateTTL": 5,
            "tolerations": [
                {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 10}
                for key in ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")
            ],
        },
    }


@pytest.fixture(scope="module")
def frozen() -> list[str]:
    """The nodes this module froze and has not thawed yet."""
    return []


@pytest.fixture(scope="module")
def release(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    frozen: list[str],
) -> Iterator[ChartFleet]:
    provider = request.config.getoption("--cluster-provider")
    if provider != "kind":
        pytest.skip(f"cluster provider {provider} is one node; this needs --cluster-provider kind")
    images = Images()
    if not images.tasks_archive.is_file():
        message = f"no {images.tasks_archive}: make image-tasks"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and {message}", pytrace=False)
        pytest.skip(message)
    e2e_cluster: Cluster = request.getfixturevalue("e2e_cluster")
    found = workers(e2e_cluster)
    if len(found) < 2:
        pytest.skip(f"{len(found)} schedulable worker(s); a worker lost needs 2")
    started = time.monotonic()
    # The replicas run on the workers only: the tasks image goes there.
    kind.load_archive(e2e_cluster.kind_name, images.tasks_archive, found)
    print(f"\nthe tasks image loaded into {found} in {time.monotonic() - started:.0f} s")
    fleet = ChartFleet(
        e2e_cluster, NAMESPACE, tmp_path_factory.mktemp("tasks-node"), values=values(images)
    )
    yield fleet
    # A failed test may have left its node frozen: thaw it before the next module.
    unpause = e2e_cluster.unpause_node
    for node in list(frozen):
        if unpause is not None:
            with contextlib.suppress(Exception):
                unpause(node)
        frozen.remove(node)
    with contextlib.suppress(Exception):
        fleet.uninstall()


def placement(fleet: ChartFleet) -> Counter[str]:
    return Counter(p.spec.node_name for p in fleet.pods("server") if ready(p))


def _node_ready(fleet: ChartFleet, node: str) -> bool:
    conditions = fleet.core.read_node(node).status.conditions or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def running_on(result: dict[str, Any]) -> str | None:
    """The Pod a working task's last status message names (``step k/n on <pod>``)."""
    match = _STEP.fullmatch(result.get("statusMessage") or "")
    return match[3] if match else None


def test_install_runs_the_task_app_from_the_tasks_image_on_both_workers(
    release: ChartFleet,
) -> None:
    release.install()
    release.wait_serving(3)
    on = placement(release)
    assert set(on) == set(workers(release.cluster)), (
        f"topology spread left a worker without a replica: {dict(on)}"
    )
    for pod in release.pods("server"):
        server = next(c for c in pod.spec.containers if c.name == "server")
        assert server.image == Images().tasks, server.image
        assert f"--app={APP}" in server.args, server.args
        assert f"--tasks-redelivery={REDELIVERY}" in server.args, server.args


def test_a_worker_lost_while_its_replicas_run_tasks_loses_no_task(
    release: ChartFleet, frozen: list[str]
) -> None:
    pause = release.cluster.pause_node
    assert pause is not None, "the kind provider can freeze a node"
    node_of = {p.metadata.name: p.spec.node_name for p in release.pods("server") if ready(p)}
    arguments = {"steps": STEPS, "step_seconds": STEP_SECONDS}
    # Short reads: a poll that reached a frozen replica (before the routers
    # drop it, one heartbeat TTL) would otherwise hang.
    with httpx.Client(timeout=httpx.Timeout(5.0, connect=3.0)) as http:
        topics: dict[str, str] = {}
        for n in range(TASKS):
            made = create(http, release.url, "build_report", {"topic": f"r{n}", **arguments})
            assert made.error is None, made.body
            assert made.result["status"] == "working", made.body
            topics[made.result["taskId"]] = f"r{n}"

        first: dict[str, str] = {}  # task id -> the Pod it first ran on

        def all_running() -> bool:
            for task_id in topics.keys() - first.keys():
                got = task(http, release.url, "tasks/get", task_id)
                assert got.error is None, got.body
                assert got.result["status"] == "working", got.result
                pod = running_on(got.result)
                if pod is not None:
                    first[task_id] = pod
            return len(first) == len(topics)

        wait_for(all_running, timeout=60, interval=0.5, what=f"{TASKS} tasks running")
        by_node = Counter(node_of[pod] for pod in first.values())
        lost = by_node.most_common(1)[0][0]
        doomed = {t for t, pod in first.items() if node_of[pod] == lost}
        print(
            f"\n{TASKS} tasks of {STEPS * STEP_SECONDS:.0f} s running: by Pod "
            f"{dict(Counter(first.values()))}; freezing {lost} (runs {len(doomed)}); "
            f"bound {BOUND:.0f} s (1.5 x redelivery {REDELIVERY} s + the task's "
            f"{STEPS * STEP_SECONDS:.0f} s + {SLACK:.0f} s)"
        )

        frozen_at = time.monotonic()
        pause(lost)
        frozen.append(lost)
        final: dict[str, tuple[dict[str, Any], float]] = {}
        again: dict[str, tuple[str, float]] = {}  # a doomed task seen running elsewhere
        failed_polls = Counter[str]()

        def all_final() -> bool:
            for task_id in topics.keys() - final.keys():
                try:
                    got = task(http, release.url, "tasks/get", task_id)
                except httpx.HTTPError as exc:
                    failed_polls[type(exc).__name__] += 1
                    continue
                if got.error is not None:
                    assert got.error["code"] != NOT_FOUND, f"task {task_id} lost: {got.body}"
                    failed_polls[f"error {got.error['code']}"] += 1
                    continue
                now = time.monotonic() - frozen_at
                if got.result["status"] in FINAL:
                    final[task_id] = (got.result, now)
                    continue
                pod = running_on(got.result)
                if pod is not None and pod != first[task_id] and task_id not in again:
                    again[task_id] = (pod, now)
            return len(final) == len(topics)

        wait_for(all_final, timeout=BOUND, interval=0.5, what=f"{TASKS} tasks to end")
    took = max(at for _, at in final.values())
    statuses = Counter(result["status"] for result, _ in final.values())
    built_by = {
        t: result["result"]["structuredContent"]["built_by"]
        for t, (result, _) in final.items()
        if result["status"] == "completed"
    }
    twice = {t for t in built_by if built_by[t] != first[t]}
    restarts = sorted(at for _, at in again.values())
    print(
        f"all {TASKS} ended {took:.1f} s after the freeze (bound {BOUND:.0f} s): "
        f"{dict(statuses)}; the {len(doomed)} on {lost} started again elsewhere "
        f"{', '.join(f'{at:.1f}' for at in restarts)} s after it; ran twice (finished on "
        f"another Pod than the one they started on): {len(twice)}; polls that failed while "
        f"the routers dropped the frozen replicas: {dict(failed_polls) or 0}"
    )
    assert statuses == {"completed": TASKS}, {t: r for t, (r, _) in final.items()}
    for task_id, (result, _) in final.items():
        report = result["result"]["structuredContent"]
        assert report["topic"] == topics[task_id] and report["steps"] == STEPS, report
    # The lost node's tasks were finished by a replica on another node; the
    # others by the replica that started them: redelivery took only the lost.
    assert all(node_of.get(built_by[t]) != lost for t in doomed), built_by
    assert twice == doomed, (twice, doomed)


def test_the_frozen_worker_comes_back_and_the_release_serves_on_three_replicas(
    release: ChartFleet, frozen: list[str]
) -> None:
    unpause = release.cluster.unpause_node
    assert unpause is not None and frozen, "the previous test froze a node"
    node = frozen[0]
    gone = [p.metadata.name for p in release.pods("server") if p.spec.node_name == node]
    unpause(node)
    frozen.remove(node)
    wait_for(lambda: _node_ready(release, node), timeout=180, interval=1, what=f"{node} Ready")

    def cleaned() -> bool:
        names = {p.metadata.name for p in release.pods("server")}
        return not names & set(gone)

    # The thawed kubelet finishes deleting the replicas the node's loss evicted.
    wait_for(cleaned, timeout=180, interval=1, what=f"the evicted replicas on {node} deleted")
    release.wait_serving(3, timeout=300)
