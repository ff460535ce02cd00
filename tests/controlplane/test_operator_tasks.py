"""The real operator rotates the key ring under real MCP tasks sealed with it.

Everything is the real thing: a kube-apiserver with the chart's CRDs and
operator RBAC, ``mcpfleet operator`` under the chart's ServiceAccount, a
Redis where every component is its own ACL user (the operator's read-only),
three replicas of ``fleetkit.apps.taskapp`` with ``--tasks-encrypt``, each reading
the key ring from its own kubelet-style volume of the Secret the operator
writes, and the router. The KeyRotation is created through the API while 50
tasks sealed under the old key wait and run, and one is parked asking for
input; the test answers that one only once the operator says it is the last
task holding the old key. Runs in ``.venv-tasks`` (``make test-tasks``).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client as k8s
from prometheus_client.parser import text_string_to_metric_families

from fleetkit.clients.taskwire import FINAL, create, task
from fleetkit.cluster.controlplane import ControlPlane, temporary_namespace, wait_for
from fleetkit.cluster.cpfleet import cp_diagnostics
from fleetkit.cluster.helm import Helm
from fleetkit.cluster.operatorkit import OperatorEnv, RotationRecorder, operator_env, ring_body_for
from fleetkit.redisrig import RedisServer, acl_log
from mcpfleet.contract import RedisKeys
from mcpfleet_operator.api import KEYRINGS

pytest.importorskip("fastmcp_tasks", reason="the [tasks] extra: make venv-tasks, make test-tasks")

pytestmark = [pytest.mark.controlplane, pytest.mark.tasks]

APP = "fleetkit.apps.taskapp:app"
#: Token TTL (the replicas' --state-ttl and the KeyRing's tokenTTL), seconds.
STATE_TTL = 1
RING = "keys"
ROTATION = "under-tasks"
#: Tasks sealed under the old key (the issue's figure), each SECONDS long, run
#: CONCURRENCY at a time per replica: about 50 * 1.5 / 6 = 12.5 s of work, which
#: outlasts the rotation's stage, promotion and token TTL.
TASKS = 50
SECONDS = 1.5
CONCURRENCY = 2
#: Tasks created once every replica seals with the new key.
NEW_TASKS = 5


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """The fleet's Redis: the default user off, each component its own ACL user."""
    server = RedisServer(tmp_path_factory.mktemp("optasks-redis")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def env(
    control_plane: ControlPlane,
    admin_api: k8s.ApiClient,
    helm: Helm,
    server: RedisServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorEnv]:
    workdir = tmp_path_factory.mktemp("optasks")
    with (
        temporary_namespace(admin_api, "operator-tasks") as namespace,
        operator_env(
            control_plane,
            helm,
            admin_api,
            namespace,
            workdir,
            state_ttl=STATE_TTL,
            app=APP,
            app_env={"MCPFLEET_TEST_EFFECTS": str(workdir / "effects")},
            replica_args=("--tasks-encrypt", "--tasks-concurrency", str(CONCURRENCY)),
            redis_server=server,
        ) as env,
    ):
        env.resources.create(KEYRINGS, ring_body_for(env, RING, token_ttl=f"{STATE_TTL}s"))
        env.resources.wait_keyring(RING, "Ready", timeout=60)
        yield env


@pytest.fixture(autouse=True)
def _diagnostics_on_failure(request: pytest.FixtureRequest) -> Iterator[None]:
    failed_before = request.session.testsfailed
    yield
    env = request.node.funcargs.get("env")
    if request.session.testsfailed > failed_before and isinstance(env, OperatorEnv):
        print(env.logs())
        print(f"--- keyring {RING} ---\n{env.resources.keyring(RING)}")
        print(f"--- keyrotation {ROTATION} ---\n{env.resources.rotation(ROTATION)}")
        print(cp_diagnostics(env.fleet, plane_logs=False))


class Poller:
    """Calls ``read`` every ``interval`` s in a thread; keeps (monotonic time, value)."""

    def __init__(self, read: Callable[[], Any], interval: float) -> None:
        self.read, self.interval = read, interval
        self.seen: list[tuple[float, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="poller")

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):  # a read that failed: the next one
                value = self.read()
                self.seen.append((time.monotonic(), value))
            self._stop.wait(self.interval)

    def __enter__(self) -> Poller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def effect_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def first_seen(poller: Poller) -> dict[str, float]:
    """When each effect line (``done k3``, ``confirmed parked``) was first read."""
    out: dict[str, float] = {}
    for at, lines in poller.seen:
        for line in lines:
            out.setdefault(" ".join(line.split()[:2]), at)
    return out


def replica_samples(http: httpx.Client, env: OperatorEnv) -> Counter[tuple[str, str]]:
    """``mcpfleet_tasks_*`` counters summed over the replicas, by (name, the label that
    matters: kid or status)."""
    total = Counter[tuple[str, str]]()
    for member in env.fleet.members.values():
        text = http.get(f"{member.url}/metrics").text
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name.startswith("mcpfleet_tasks_") and s.name.endswith("_total"):
                    label = s.labels.get("kid") or s.labels.get("status") or ""
                    total[(s.name, label)] += s.value
    return total


@pytest.mark.timeout(300)  # the control plane, the chart and the fleet start in its setup
def test_a_rotation_by_the_operator_under_50_live_encrypted_tasks_fails_none(
    env: OperatorEnv, server: RedisServer
) -> None:
    """0 failed tasks, each effect once; the old key retired only once its ledger is empty.

    The operator's status must show the old key's tasks while they run
    (``oldKeyTasks`` above 1: more than the parked one), the parked one alone
    holding the key until it is answered, and ``TasksDrained`` True at the end;
    the old kid's ledger, sampled every 50 ms, is never above 0 in a read sent
    after the Secret lost the old key. Prints the timeline.
    """
    cf, res, op = env.fleet, env.resources, env.operator
    effects = cf.workdir.parent / "effects"
    (old,) = cf.ring().kids
    keys = RedisKeys(cf.fleet)
    acl_log(server, reset=True)
    rotation = Poller(lambda: dict(res.rotation(ROTATION)), 0.1)
    lines = Poller(lambda: effect_lines(effects), 0.05)
    rec = RotationRecorder(cf, res.api, interval=0.05, ledgers=True).start()
    http = httpx.Client(timeout=15)
    try:
        with rotation, lines:
            # Sealed under the old key: 50 tasks, and one that parks asking for input.
            old_ids = {}
            for i in range(TASKS):
                made = create(http, cf.url, "effect", {"tag": f"k{i}", "seconds": SECONDS})
                assert made.error is None, made.body
                old_ids[f"k{i}"] = made.result["taskId"]
            parked = create(http, cf.url, "confirm", {"tag": "parked"})
            assert parked.error is None, parked.body
            parked_id = parked.result["taskId"]
            started = time.monotonic()
            res.rotate(ROTATION, RING, reason="tasks in flight")

            # Every replica seals with the new key once the rotation waits: more tasks.
            waiting = res.wait_rotation(ROTATION, "Waiting", 60)
            new = waiting["newKid"]
            new_ids = {}
            for i in range(NEW_TASKS):
                made = create(http, cf.url, "effect", {"tag": f"n{i}", "seconds": 0.2})
                assert made.error is None, made.body
                new_ids[f"n{i}"] = made.result["taskId"]

            # The operator counts the old key's tasks; the parked one holds it last.
            def parked_alone() -> dict[str, Any] | None:
                status = res.rotation(ROTATION)
                assert status.get("phase") == "Waiting", status
                return status if status.get("oldKeyTasks") == 1 else None

            wait_for(parked_alone, timeout=90, what="only the parked task to hold the key")
            assert cf.ring().kids == (new, old), "the old key stays while a task needs it"
            asking = task(http, cf.url, "tasks/get", parked_id)
            assert asking.result["status"] == "input_required", asking.body
            (key,) = asking.result["inputRequests"]
            answer = {key: {"action": "accept", "content": {"ok": True}}}
            answered = time.monotonic()
            updated = task(http, cf.url, "tasks/update", parked_id, inputResponses=answer)
            assert updated.error is None, updated.body
            status = res.wait_rotation(ROTATION, "Complete", 60)

            ids = [*old_ids.values(), parked_id, *new_ids.values()]
            final: dict[str, dict[str, Any]] = {}

            def all_final() -> bool:
                for task_id in ids:
                    if task_id not in final:
                        got = task(http, cf.url, "tasks/get", task_id)
                        assert got.error is None, got.body
                        if got.result["status"] in FINAL:
                            final[task_id] = got.result
                return len(final) == len(ids)

            wait_for(all_final, timeout=60, interval=0.2, what="every task to end")
    finally:
        rec.stop()
        http_metrics = replica_samples(http, env)
        http.close()

    # --- what happened, when (seconds after the KeyRotation was created)
    firsts: dict[tuple[str, ...], float] = {}
    for at, kids in rec.secret_versions:
        firsts.setdefault(kids, at)
    staged, promoted, retired = firsts[(old, new)], firsts[(new, old)], firsts[(new,)]
    seen = first_seen(lines)
    old_done = [seen[f"done k{i}"] for i in range(TASKS) if f"done k{i}" in seen]
    last_old = max([*old_done, seen.get("confirmed parked", 0.0)])
    counted = [
        (at, s["oldKeyTasks"]) for at, s in rotation.seen if s.get("oldKeyTasks") is not None
    ]
    waiting_counts = [n for _, n in counted if n > 0]
    working_at_promote = sum(
        1 for i in range(TASKS) if f"done k{i}" not in seen or seen[f"done k{i}"] > promoted
    )
    ledger_after_retire = [s.sealed.get(old, 0) for s in rec.samples if s.sent > retired]
    ledger_nonzero = [s.at for s in rec.samples if s.sealed.get(old, 0) > 0]

    def rel(t: float) -> str:
        return f"{t - started:+6.2f} s"

    print(
        f"\nrotation {old} -> {new} by the operator, {TASKS} tasks of {SECONDS} s "
        f"(+1 parked) under {old}, {NEW_TASKS} under {new}:"
        f"\n  staged {rel(staged)}, promoted {rel(promoted)} ({working_at_promote} of {TASKS} "
        f"not yet done), last of the {TASKS} done {rel(max(old_done))}"
        f"\n  oldKeyTasks reported {waiting_counts[0] if waiting_counts else None} first, "
        f"then down to {waiting_counts[-1] if waiting_counts else None} "
        f"({len(waiting_counts)} reads above 0); parked answered {rel(answered)}, "
        f"its leg done {rel(seen.get('confirmed parked', 0.0))}"
        f"\n  the last old-key task ended {rel(last_old)}; the old kid's ledger last seen "
        f"above 0 {rel(max(ledger_nonzero))}; retired {rel(retired)}, "
        f"{retired - last_old:.2f} s after that task ended"
        f"\n  tasks: {dict(Counter(r['status'] for r in final.values()))}"
    )

    # 0 failed: every task completed, each side effect once.
    assert Counter(r["status"] for r in final.values()) == {"completed": len(ids)}, final
    assert final[parked_id]["result"]["structuredContent"] == {"result": "parked: confirmed"}
    done = Counter(
        " ".join(ln.split()[:2]) for ln in effect_lines(effects) if not ln.startswith("start")
    )
    assert done == Counter([*(f"done {t}" for t in [*old_ids, *new_ids]), "confirmed parked"]), done
    assert http_metrics[("mcpfleet_tasks_finished_total", "failed")] == 0
    assert http_metrics[("mcpfleet_tasks_finished_total", "error")] == 0
    # The old key opened the 50 and both legs of the parked one; the new key its 5.
    assert http_metrics[("mcpfleet_tasks_snapshot_unseals_total", old)] == TASKS + 2
    assert http_metrics[("mcpfleet_tasks_snapshot_unseals_total", new)] == NEW_TASKS

    # The operator waited for live tasks, and retired the old key only at 0.
    assert working_at_promote > 0, "the rotation ran with tasks in flight"
    assert max(waiting_counts) > 1, "the operator saw more than the parked task live"
    assert waiting_counts[-1] == 1, "the parked task held the old key last"
    assert answered < retired, "retired before the parked task was answered"
    assert ledger_nonzero and max(ledger_nonzero) < retired
    assert ledger_after_retire and not any(ledger_after_retire), ledger_after_retire
    assert status["oldKeyTasks"] == 0 and "tasksAbandoned" not in status, status
    assert status["covers"] == ["request-state", "task-snapshots"]
    assert res.keyring(RING)["covers"] == ["request-state", "task-snapshots"]
    drained = {c["type"]: c for c in status["conditions"]}["TasksDrained"]
    assert (drained["status"], drained["reason"]) == ("True", "NoneLeft"), drained
    assert op.metric("mcpfleet_operator_old_key_tasks", keyring=RING) == 0
    assert op.metric("mcpfleet_operator_tasks_abandoned_total", keyring=RING) == 0
    # Each step after every replica attested the one before; never an unsafe mix.
    assert rec.secret_rings == [(old,), (old, new), (new, old), (new,)]
    assert rec.violations == []
    for before, after in itertools.pairwise(rec.secret_rings):
        assert rec.confirmed_before(firsts[after], before), (before, after)
    # Every component within its ACL rules; both ledgers empty at the end.
    assert acl_log(server) == []
    admin = server.admin()
    try:
        left = {kid: admin.zcount(keys.task_seals(kid), time.time(), "+inf") for kid in (old, new)}
    finally:
        admin.close()
    assert left == {old: 0, new: 0}
