"""Key rotations driven by the operator, on the real control plane with a real fleet.

One namespace serves the module: the chart's CRDs and operator RBAC (as
``helm template`` renders them), a Redis, three replicas each reading its own
kubelet-style volume of the key ring Secret (with Pods registered and
labelled for the KeyRing's selector), a router, and ``mcpfleet operator`` as
a process under the chart's ServiceAccount. Tokens live ``STATE_TTL``
seconds, which is also the KeyRing's ``tokenTTL``: every wait here is a few
seconds at most.

The tests run in file order and each leaves the fleet as it found it: three
serving replicas on a stable ring, one operator acting.
"""

from __future__ import annotations

import datetime as dt
import itertools
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from kubernetes import client as k8s

from fleetkit import scenarios
from fleetkit.cluster.controlplane import ControlPlane, temporary_namespace, wait_for
from fleetkit.cluster.cpfleet import cp_diagnostics
from fleetkit.cluster.helm import Helm
from fleetkit.cluster.operatorkit import (
    PEERING,
    OperatorEnv,
    RotationRecorder,
    operator_env,
    ring_body_for,
)
from mcpfleet.contract import RedisKeys
from mcpfleet_operator.api import KEYRINGS, KEYROTATIONS

pytestmark = pytest.mark.controlplane

STATE_TTL = 3
STALL_AFTER = 2.0
#: The operator's --tasks-wait-limit here: seconds after the token TTL.
TASKS_WAIT_LIMIT = 8.0
RING = "keys"
PHASES = ("Staging", "Promoting", "Waiting", "Retiring", "Complete")


@pytest.fixture(scope="module")
def env(
    control_plane: ControlPlane,
    admin_api: k8s.ApiClient,
    helm: Helm,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorEnv]:
    with (
        temporary_namespace(admin_api, "operator-rotation") as namespace,
        operator_env(
            control_plane,
            helm,
            admin_api,
            namespace,
            tmp_path_factory.mktemp("operator-rotation"),
            state_ttl=STATE_TTL,
            stall_after=STALL_AFTER,
            tasks_wait_limit=TASKS_WAIT_LIMIT,
        ) as env,
    ):
        env.resources.create(KEYRINGS, ring_body_for(env, RING, token_ttl=f"{STATE_TTL}s"))
        env.resources.wait_keyring(RING, "Ready", timeout=60)
        yield env


@pytest.fixture(autouse=True)
def _diagnostics_on_failure(request: pytest.FixtureRequest) -> Iterator[None]:
    """The operators' logs, the rotations' status, the fleet and the Secret on failure."""
    failed_before = request.session.testsfailed
    yield
    env = request.node.funcargs.get("env")
    if request.session.testsfailed > failed_before and isinstance(env, OperatorEnv):
        print(env.logs())
        print(f"--- keyring {RING} ---\n{env.resources.keyring(RING)}")
        items = env.resources.custom.list_namespaced_custom_object(
            "mcpfleet.dev", "v1alpha1", env.namespace, KEYROTATIONS
        )["items"]
        for item in items:
            print(f"--- keyrotation {item['metadata']['name']} ---\n{item.get('status')}")
        print(cp_diagnostics(env.fleet, plane_logs=False))


def _mcpfleet_argv() -> list[str]:
    return [sys.executable, "-m", "mcpfleet.cli"]


def _mcpfleet_env(env: OperatorEnv) -> dict[str, str]:
    return {**os.environ, "KUBECONFIG": str(env.plane.admin_kubeconfig)}


def _mcpfleet(
    env: OperatorEnv, *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``mcpfleet ARGS`` as a person runs it, with the admin kubeconfig."""
    return subprocess.run(
        [*_mcpfleet_argv(), *args],
        env=_mcpfleet_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _protocol(old: tuple[str, ...], new: str) -> list[tuple[str, ...]]:
    return [old, (old[0], new), (new, old[0]), (new,)]


def _assert_confirmed_steps(rec: RotationRecorder, old: tuple[str, ...], new: str) -> None:
    """The Secret went through exactly the protocol, each step after every replica attested."""
    rings = _protocol(old, new)
    assert rec.secret_rings == rings
    assert rec.violations == [], "a replica sealed with a key another could not unseal"
    firsts = {}
    for at, kids in rec.secret_versions:
        firsts.setdefault(kids, at)
    for before, after in itertools.pairwise(rings):
        assert rec.confirmed_before(firsts[after], before), (
            f"{list(after)} was written before every replica attested {list(before)}"
        )


async def test_a_full_rotation_under_load_fails_no_round(env: OperatorEnv) -> None:
    cf, res, op = env.fleet, env.resources, env.operator
    old = cf.ring().kids
    rec = RotationRecorder(cf, res.api).start()
    status: dict[str, Any] = {}

    def rotate() -> tuple[str, ...]:
        res.rotate("under-load", RING, reason="routine")
        status.update(res.wait_rotation("under-load", "Complete", 90))
        return cf.ring().kids

    try:
        # Modern bookings only, as this test always ran: the recorder samples Redis
        # from this process every 10 ms, and with a handshake user beside the
        # bookings it has missed the brief moment in which every replica attests a
        # step before the operator writes the next one.
        await scenarios.operator_rotation_under_load(cf, rotate, workers=4, handshakes=0, after=10)
    finally:
        rec.stop()
    new = status["newKid"]
    assert status["oldKid"] == old[0] and new not in old
    _assert_confirmed_steps(rec, old, new)
    sequences = rec.sequences()
    for name in cf.replica_names():
        assert sequences[name] == _protocol(old, new), f"{name} skipped a step"
    # Status, Events and metrics show each phase.
    assert set(PHASES) <= set(status["phaseTimestamps"])
    assert status["convergence"] == "3/3" and status["lagging"] == []
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert conditions == {
        "Progressing": "False",
        "Degraded": "False",
        "Complete": "True",
        "TasksDrained": "True",
    }
    assert status["covers"] == ["request-state", "task-snapshots"]
    assert status["oldKeyTasks"] == 0
    wait_for(
        lambda: set(PHASES) | {"Requested"} <= res.event_reasons("under-load"),
        timeout=15,
        what="an Event for each phase",
    )
    assert op.metric("mcpfleet_operator_rotations_total", keyring=RING, result="complete") == 1
    for phase in ("staging", "promoting", "waiting", "retiring"):
        assert op.metric("mcpfleet_operator_phase_duration_seconds_count", phase=phase) >= 1
    waited = op.metric("mcpfleet_operator_phase_duration_seconds_sum", phase="waiting")
    assert waited >= STATE_TTL, "the old key was kept one token TTL after the promotion"
    ring = res.wait_keyring(RING, "Ready")
    assert ring["kids"] == [new] and ring["lastRotation"]["name"] == "under-load"
    assert op.metric("mcpfleet_operator_rotation_phase", keyring=RING, phase="idle") == 1
    assert op.metric("mcpfleet_operator_replicas", keyring=RING, state="converged") == 3
    # The key age is the sealing key's: the new key was created before the
    # one-TTL wait, and no earlier than keyCreatedAt (whole seconds, rounded down).
    age = op.metric("mcpfleet_operator_key_age_seconds", keyring=RING)
    created = dt.datetime.fromisoformat(ring["keyCreatedAt"].replace("Z", "+00:00"))
    since_created = (dt.datetime.now(dt.UTC) - created).total_seconds()
    assert STATE_TTL <= age <= since_created + 0.01, (age, since_created)
    # After each write the Pods were nudged with the Secret's resourceVersion.
    version = cf.keyring_secret().metadata.resource_version
    for pod in cf.pods():
        assert pod.metadata.annotations["mcpfleet.dev/keyring-generation"] == version


def test_a_replica_that_ignores_the_new_ring_stalls_the_rotation_until_it_catches_up(
    env: OperatorEnv,
) -> None:
    cf, res, op = env.fleet, env.resources, env.operator
    cf.pause_volume("replica-1")
    try:
        res.rotate("stalled", RING)
        status = wait_for(
            lambda: (s := res.rotation("stalled")).get("stalled") and s,
            timeout=60,
            what="the rotation to report a stall",
        )
        assert status["phase"] == "Staging" and status["lagging"] == ["replica-1"]
        assert status["convergence"] == "2/3"
        degraded = {c["type"]: c for c in status["conditions"]}["Degraded"]
        assert degraded["status"] == "True" and degraded["reason"] == "Stalled"
        ring = res.wait_keyring(RING, "Degraded")
        assert "stalled" in ring["message"] and ring["replicas"]["lagging"] == ["replica-1"]
        wait_for(lambda: "Stalled" in res.event_reasons("stalled"), timeout=15, what="Event")
        assert op.metric("mcpfleet_operator_stalled", keyring=RING) == 1
        assert op.metric("mcpfleet_operator_stalls_total", keyring=RING) >= 1
        assert cf.ring().phase == "staged", "nothing was promoted past the lagging replica"
    finally:
        cf.resume_volume("replica-1")
    status = res.wait_rotation("stalled", "Complete", 90)
    assert not status["stalled"] and status["convergence"] == "3/3"
    assert op.metric("mcpfleet_operator_stalled", keyring=RING) == 0
    res.wait_keyring(RING, "Ready")


def test_operator_killed_after_each_step_resumes_without_skipping_a_confirmation(
    env: OperatorEnv,
) -> None:
    cf, res = env.fleet, env.resources
    old = cf.ring().kids
    rec = RotationRecorder(cf, res.api).start()
    try:
        res.rotate("crashes", RING)
        for phase in ("staged", "promoted", "stable"):
            wait_for(
                lambda p=phase: (r := cf.ring()).phase == p and r.kids != old,
                timeout=60,
                interval=0.01,
                what=f"the ring to be {phase}",
            )
            env.operator.kill()
            env.start_operator()
        status = res.wait_rotation("crashes", "Complete", 90)
    finally:
        rec.stop()
    _assert_confirmed_steps(rec, old, status["newKid"])
    for name in cf.replica_names():
        assert rec.sequences()[name] == _protocol(old, status["newKid"])


def test_a_second_rotation_waits_pending_until_the_first_completes(env: OperatorEnv) -> None:
    cf, res = env.fleet, env.resources
    cf.pause_volume("replica-2")  # holds the first rotation in Staging
    try:
        res.rotate("first", RING)
        res.wait_rotation("first", "Staging")
        res.rotate("second", RING)
        waiting = wait_for(
            lambda: "rotation first" in (s := res.rotation("second")).get("message", "") and s,
            timeout=30,
            what="the second rotation to say what it waits for",
        )
        assert waiting["phase"] == "Pending"
        assert "Staging" not in waiting.get("phaseTimestamps", {})
    finally:
        cf.resume_volume("replica-2")
    first = res.wait_rotation("first", "Complete", 90)
    second = res.wait_rotation("second", "Complete", 90)
    assert second["oldKid"] == first["newKid"]
    assert second["phaseTimestamps"]["Staging"] > first["phaseTimestamps"]["Complete"]


def _seal_ledger(env: OperatorEnv, kid: str) -> tuple[redis.Redis, str]:
    """The fleet's seal ledger of ``kid``, as replicas running tasks with
    --tasks-encrypt keep it (these replicas run none: the test writes it)."""
    client = redis.Redis(host="127.0.0.1", port=env.fleet.redis_port, socket_timeout=5)
    return client, RedisKeys(env.fleet.fleet).task_seals(kid)


def test_the_retire_step_waits_until_no_live_task_is_sealed_under_the_old_key(
    env: OperatorEnv,
) -> None:
    cf, res, op = env.fleet, env.resources, env.operator
    (old,) = cf.ring().kids
    client, ledger = _seal_ledger(env, old)
    until = time.time() + 600
    client.zadd(ledger, {f"task-{i}": until for i in range(50)})
    client.zadd(ledger, {"expired": time.time() - 1})  # a lost replica's, long expired
    try:
        res.rotate("tasks-held", RING)
        held = wait_for(
            lambda: (s := res.rotation("tasks-held")).get("oldKeyTasks") == 50 and s,
            timeout=60,
            what="the retire step to wait for 50 tasks",
        )
        assert held["phase"] == "Waiting" and cf.ring().kids[1] == old
        drained = {c["type"]: c for c in held["conditions"]}["TasksDrained"]
        assert (drained["status"], drained["reason"]) == ("False", "Waiting")
        assert f"50 live task(s) hold a snapshot sealed under {old}" in held["message"]
        assert op.metric("mcpfleet_operator_old_key_tasks", keyring=RING) == 50
        # Exported at 0 before any abandonment: the alert's increase() needs the 0.
        abandoned = [
            value
            for (name, labels), value in op.metrics().items()
            if name == "mcpfleet_operator_tasks_abandoned_total" and ("keyring", RING) in labels
        ]
        assert abandoned == [0.0]
        assert not held.get("stalled"), "waiting for tasks is not a stall"
        # The tasks end one by one; the key stays until the last has.
        client.zrem(ledger, *[f"task-{i}" for i in range(49)])
        wait_for(
            lambda: res.rotation("tasks-held").get("oldKeyTasks") == 1,
            timeout=30,
            what="the count to follow",
        )
        assert cf.ring().kids[1] == old
        client.zrem(ledger, "task-49")
        status = res.wait_rotation("tasks-held", "Complete", 60)
    finally:
        client.delete(ledger)
        client.close()
    assert status["oldKeyTasks"] == 0 and "tasksAbandoned" not in status
    drained = {c["type"]: c for c in status["conditions"]}["TasksDrained"]
    assert (drained["status"], drained["reason"]) == ("True", "NoneLeft")
    assert op.metric("mcpfleet_operator_old_key_tasks", keyring=RING) == 0


def test_a_task_that_never_ends_holds_the_retire_only_until_the_tasks_wait_limit(
    env: OperatorEnv,
) -> None:
    res, op = env.resources, env.operator
    (old,) = env.fleet.ring().kids
    client, ledger = _seal_ledger(env, old)
    client.zadd(ledger, {"stuck-1": time.time() + 600, "stuck-2": time.time() + 600})
    try:
        res.rotate("tasks-stuck", RING)
        status = res.wait_rotation("tasks-stuck", "Complete", 60)
    finally:
        client.delete(ledger)
        client.close()
    times = {
        p: dt.datetime.fromisoformat(t.replace("Z", "+00:00"))
        for p, t in status["phaseTimestamps"].items()
    }
    waited = (times["Retiring"] - times["Waiting"]).total_seconds()
    assert waited >= STATE_TTL + TASKS_WAIT_LIMIT - 0.5, waited
    assert status["tasksAbandoned"] == 2 and status["oldKeyTasks"] == 2
    drained = {c["type"]: c for c in status["conditions"]}["TasksDrained"]
    assert (drained["status"], drained["reason"]) == ("False", "WaitLimitExceeded")
    assert "2 live task(s)" in drained["message"]
    wait_for(
        lambda: "TasksWaitExpired" in res.event_reasons("tasks-stuck"),
        timeout=15,
        what="the TasksWaitExpired Event",
    )
    assert op.metric("mcpfleet_operator_tasks_abandoned_total", keyring=RING) == 2


def test_emergency_mode_skips_the_ttl_wait_and_says_so(env: OperatorEnv) -> None:
    res = env.resources
    res.rotate("emergency", RING, mode="Emergency", reason="key leaked")
    status = res.wait_rotation("emergency", "Complete", 60)
    assert status["ttlSkipped"] is True
    assert "Waiting" not in status["phaseTimestamps"]
    wait_for(
        lambda: {"TTLWaitSkipped", "Requested"} <= res.event_reasons("emergency"),
        timeout=15,
        what="the Emergency Event",
    )


def test_deleting_a_rotation_before_promotion_aborts_it_back_to_the_old_ring(
    env: OperatorEnv,
) -> None:
    cf, res, op = env.fleet, env.resources, env.operator
    old = cf.ring().kids
    aborted_before = op.metric("mcpfleet_operator_rotations_total", result="aborted")
    cf.pause_volume("replica-2")  # holds the rotation in Staging
    # Requested as a person would, following it with --wait.
    follower = subprocess.Popen(
        [*_mcpfleet_argv(), "rotate", RING, "-n", env.namespace, "--wait"],
        env=_mcpfleet_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert follower.stdout is not None
        first = follower.stdout.readline()
        assert first.endswith(" created\n"), first
        name = first.split("/", 1)[1].split()[0]
        res.wait_rotation(name, "Staging")
        assert cf.ring().phase == "staged"
        res.delete(KEYROTATIONS, name)
        wait_for(lambda: res.get(KEYROTATIONS, name) is None, timeout=30, what="deletion")
        out, _ = follower.communicate(timeout=60)
    finally:
        cf.resume_volume("replica-2")
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    assert follower.returncode == 1, out
    assert f"{name}: deleted (aborted)" in out
    ring = cf.ring()
    assert ring.phase == "stable" and ring.kids == old
    cf.wait_attested(old, timeout=30)
    wait_for(lambda: "Aborted" in res.event_reasons(name), timeout=15, what="Event")
    assert op.metric("mcpfleet_operator_rotations_total", result="aborted") == aborted_before + 1
    res.wait_keyring(RING, "Ready")


def test_a_secret_changed_behind_the_operator_fails_the_rotation_and_loses_no_key(
    env: OperatorEnv,
) -> None:
    cf, res, op = env.fleet, env.resources, env.operator
    old = cf.ring().kids
    failed_before = op.metric("mcpfleet_operator_rotations_total", result="failed")
    cf.pause_volume("replica-0")  # holds the rotation in Staging
    try:
        res.rotate("overruled", RING)
        res.wait_rotation("overruled", "Staging")
        cf.rotate_step("abort")  # a person puts the old ring back by hand
        status = res.wait_rotation("overruled", "Failed")
    finally:
        cf.resume_volume("replica-0")
    assert "changed outside the operator" in status["message"]
    assert cf.ring().kids == old, "the operator did not overwrite the person's ring"
    assert op.metric("mcpfleet_operator_rotations_total", result="failed") == failed_before + 1
    wait_for(lambda: "Failed" in res.event_reasons("overruled"), timeout=15, what="Event")
    # The next rotation starts from the ring as it is.
    res.rotate("after-overruled", RING, mode="Emergency")
    assert res.wait_rotation("after-overruled", "Complete", 60)["oldKid"] == old[0]


def test_deleting_a_rotation_after_promotion_finishes_it_first(env: OperatorEnv) -> None:
    cf, res = env.fleet, env.resources
    res.rotate("finish-me", RING)
    status = res.wait_rotation("finish-me", "Waiting")
    res.delete(KEYROTATIONS, "finish-me")
    held = res.get(KEYROTATIONS, "finish-me")
    assert held is not None and held["metadata"].get("deletionTimestamp"), "held by a finalizer"
    wait_for(lambda: res.get(KEYROTATIONS, "finish-me") is None, timeout=60, what="deletion")
    ring = cf.ring()
    assert ring.phase == "stable" and ring.kids == (status["newKid"],)
    cf.wait_attested(ring.kids, timeout=30)
    wait_for(
        lambda: {"DeletionHeld", "Retiring", "Complete"} <= res.event_reasons("finish-me"),
        timeout=15,
        what=f"the Events of the held deletion, not {res.event_reasons('finish-me')}",
    )


def test_a_scheduled_rotation_starts_rotate_every_after_the_last_one(env: OperatorEnv) -> None:
    res, custom = env.resources, env.resources.custom
    before = res.keyring(RING)["kids"]
    patch = {"spec": {"rotateEvery": "4s"}}
    custom.patch_namespaced_custom_object(
        "mcpfleet.dev", "v1alpha1", env.namespace, KEYRINGS, RING, patch
    )
    try:

        def scheduled() -> str | None:
            items = custom.list_namespaced_custom_object(
                "mcpfleet.dev", "v1alpha1", env.namespace, KEYROTATIONS
            )["items"]
            names = [i["metadata"]["name"] for i in items]
            return next((n for n in names if "-scheduled-" in n), None)

        name = wait_for(scheduled, timeout=60, what="a scheduled KeyRotation")
        status = res.wait_rotation(name, "Complete", 60)
    finally:
        unset = {"spec": {"rotateEvery": None}}
        custom.patch_namespaced_custom_object(
            "mcpfleet.dev", "v1alpha1", env.namespace, KEYRINGS, RING, unset
        )
    assert status["oldKid"] == before[0]
    ring = res.wait_keyring(RING, "Ready")
    assert ring["kids"] == [status["newKid"]]
    # the schedule restarts from this completion: no second rotation right away
    assert ring["lastRotation"]["name"] == name


def test_mcpfleet_rotate_wait_follows_the_rotation_and_exits_zero_on_complete(
    env: OperatorEnv,
) -> None:
    before = env.fleet.ring().kids
    done = _mcpfleet(env, "rotate", RING, "-n", env.namespace, "--reason", "cli", "--wait")
    assert done.returncode == 0, done.stderr + done.stdout
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"keyrotation {env.namespace}/{RING}-") and lines[0].endswith(
        " created"
    )
    seen = " ".join(lines[1:])
    for phase in ("Staging", "Promoting", "Waiting", "Retiring", "Complete"):
        assert f": {phase}" in seen, done.stdout
    assert "converged 3/3" in seen
    after = env.fleet.ring().kids
    assert after != before and len(after) == 1

    status = _mcpfleet(env, "rotate", "--status", RING, "-n", env.namespace)
    assert status.returncode == 0, status.stderr
    assert f"kids: {after[0]} (first seals; ring stable)" in status.stdout
    assert "replicas: 3/3 converged" in status.stdout
    assert "Complete" in status.stdout and "- cli" in status.stdout

    missing = _mcpfleet(env, "rotate", "no-such-ring", "-n", env.namespace)
    assert missing.returncode == 2 and "no KeyRing no-such-ring" in missing.stderr


def test_two_operators_only_one_acts_and_the_standby_finishes_when_it_dies(
    env: OperatorEnv,
) -> None:
    """Last in the module: it leaves the standby as the module's operator."""
    cf, res = env.fleet, env.resources
    env.operator.stop()
    active = env.start_operator(priority=env.next_priority() + 10)
    standby = env.start_operator(priority=env.next_priority() - 100)

    def peers() -> set[str]:
        peering = res.custom.get_namespaced_custom_object(
            "kopf.dev", "v1", env.namespace, "kopfpeerings", PEERING
        )
        return set(peering.get("status") or {})

    wait_for(
        lambda: {active.identity, standby.identity} <= peers(),
        timeout=30,
        what="both operators in the peering object",
    )
    assert "Resuming operations" not in standby.tail(500), "the standby stays paused"
    old = cf.ring().kids
    cf.pause_volume("replica-0")  # hold the rotation in Staging while both run
    try:
        res.rotate("peered", RING)
        res.wait_rotation("peered", "Staging")
        writes = "mcpfleet_operator_secret_writes_total"
        assert active.metric(writes, keyring=RING, step="stage") == 1
        assert standby.metric(writes) == 0, "the standby wrote nothing"
        active.kill()
    finally:
        cf.resume_volume("replica-0")
    status = res.wait_rotation("peered", "Complete", 90)
    assert "Resuming operations" in standby.tail(500), "the standby took over"
    assert status["oldKid"] == old[0]
    assert standby.metric(writes, keyring=RING, step="promote") == 1
    assert standby.metric(writes, keyring=RING, step="retire") == 1
    assert cf.ring().kids == (status["newKid"],)
