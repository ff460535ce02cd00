"""The operator under the chart's RBAC, and what it does with bad input: clear status, no key lost.

One operator process serves the module, in a namespace of its own with the
chart's CRDs, ServiceAccount, Role, RoleBinding and KopfPeering applied as
``helm template`` rendered them, and a Redis (no replicas: these KeyRings'
selectors match no Pod, or the input is refused before any Pod matters).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from redis.exceptions import NoPermissionError

from fleetkit.cluster.controlplane import ControlPlane, temporary_namespace, wait_for
from fleetkit.cluster.helm import Helm
from fleetkit.cluster.operatorkit import (
    CHART,
    OPERATOR_ACCOUNT,
    READER,
    OperatorEnv,
    keyring_body,
    operator_env,
    render_chart,
)
from mcpfleet.contract import KEYRING_FILE, RedisKeys
from mcpfleet.keys.ring import KeyRing, compute_kid
from mcpfleet.registry import read_replicas_sync
from mcpfleet_operator.api import GROUP, KEYRINGS, KEYROTATIONS, VERSION

pytestmark = pytest.mark.controlplane

SELECTOR = {"app.kubernetes.io/name": "nothing-runs-this"}
MATCH = {"matchLabels": {"a": "b"}}


@pytest.fixture(scope="module")
def env(
    control_plane: ControlPlane,
    admin_api: k8s.ApiClient,
    helm: Helm,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorEnv]:
    with (
        temporary_namespace(admin_api, "operator-bad-input") as namespace,
        operator_env(
            control_plane,
            helm,
            admin_api,
            namespace,
            tmp_path_factory.mktemp("operator-bad-input"),
            replicas=0,
            routers=0,
        ) as env,
    ):
        yield env


@pytest.fixture(autouse=True)
def _operator_logs_on_failure(request: pytest.FixtureRequest) -> Iterator[None]:
    failed_before = request.session.testsfailed
    yield
    env = request.node.funcargs.get("env")
    if request.session.testsfailed > failed_before and isinstance(env, OperatorEnv):
        print(env.logs())


def _ring(env: OperatorEnv, name: str, **spec: Any) -> dict[str, Any]:
    body = keyring_body(
        name, secret_name=name, selector=SELECTOR, fleet=env.fleet.fleet, token_ttl="3s"
    )
    body["spec"].update(spec)
    return body


def _secret(env: OperatorEnv, name: str) -> k8s.V1Secret:
    return k8s.CoreV1Api(env.resources.api).read_namespaced_secret(name, env.namespace)


def test_the_operator_runs_with_exactly_the_charts_rbac(env: OperatorEnv) -> None:
    rendered = {d["kind"]: d for d in env.rendered if d["kind"] in ("Role", "RoleBinding")}
    role = k8s.RbacAuthorizationV1Api(env.resources.api).read_namespaced_role(
        rendered["Role"]["metadata"]["name"], env.namespace
    )
    assert [r.resources for r in role.rules] == [r["resources"] for r in rendered["Role"]["rules"]]
    assert rendered["RoleBinding"]["subjects"][0]["name"] == OPERATOR_ACCOUNT
    # The process acts with that ServiceAccount's token, nothing else.
    api = env.plane.api_client_for_service_account(env.namespace, OPERATOR_ACCOUNT)
    core = k8s.CoreV1Api(api)
    refused = {
        "list secrets": lambda: core.list_namespaced_secret(env.namespace),
        "delete a secret": lambda: core.delete_namespaced_secret("any", env.namespace),
        "list pods elsewhere": lambda: core.list_namespaced_pod("default"),
        "list namespaces": lambda: core.list_namespace(),
    }
    for what, call in refused.items():
        with pytest.raises(ApiException) as excinfo:
            call()
        assert excinfo.value.status == 403, what
    assert env.operator.healthz()


def test_a_new_keyring_gets_a_secret_with_a_fresh_one_key_ring(env: OperatorEnv) -> None:
    env.resources.create(KEYRINGS, _ring(env, "fresh"))
    status = wait_for(
        lambda: (s := env.resources.keyring("fresh")).get("kids") and s,
        timeout=60,
        what="the fresh KeyRing's status",
    )
    ring = KeyRing.from_document(base64.b64decode(_secret(env, "fresh").data[KEYRING_FILE]))
    assert ring.phase == "stable" and len(ring.kids) == 1
    assert status["kids"] == list(ring.kids) and status["sealingKid"] == ring.kids[0]
    assert "Created" in env.resources.event_reasons("fresh")


def test_a_keyring_whose_selector_matches_no_pod_says_so_and_never_rotates(
    env: OperatorEnv,
) -> None:
    env.resources.create(KEYRINGS, _ring(env, "lonely"))
    status = env.resources.wait_keyring("lonely", "Degraded")
    assert "matches no serving Pod" in status["message"]
    assert status["replicas"]["desired"] == 0
    before = _secret(env, "lonely")
    env.resources.rotate("orphan", "lonely")
    wait_for(
        lambda: "no serving Pod" in env.resources.rotation("orphan").get("message", ""),
        timeout=30,
        what="the rotation to say why it waits",
    )
    assert env.resources.rotation("orphan")["phase"] == "Pending"
    after = _secret(env, "lonely")
    assert after.metadata.resource_version == before.metadata.resource_version
    env.resources.delete(KEYROTATIONS, "orphan")


def _document(keys: list[dict[str, str]]) -> bytes:
    return json.dumps({"version": 1, "phase": "stable", "keys": keys}).encode()


def _key(secret: bytes) -> dict[str, str]:
    text = base64.urlsafe_b64encode(secret).decode().rstrip("=")
    return {"kid": compute_kid(secret), "secret": text, "created": "2026-01-01T00:00:00Z"}


BAD_RINGS = {
    "short": (_document([_key(b"x" * 16)]), "at least 32 bytes"),
    "duplicated": (
        json.dumps(
            {
                "version": 1,
                "phase": "staged",
                "keys": [_key(b"k" * 32), _key(b"k" * 32)],
            }
        ).encode(),
        "same key twice",
    ),
    "malformed": (b'{"version": 1, "keys": [', "not valid JSON"),
}


@pytest.mark.parametrize("case", sorted(BAD_RINGS))
def test_a_secret_that_is_not_a_valid_ring_is_never_overwritten(
    env: OperatorEnv, case: str
) -> None:
    document, reason = BAD_RINGS[case]
    name = f"bad-{case}"
    core = k8s.CoreV1Api(env.resources.api)
    core.create_namespaced_secret(
        env.namespace,
        k8s.V1Secret(
            metadata=k8s.V1ObjectMeta(name=name),
            data={KEYRING_FILE: base64.b64encode(document).decode()},
        ),
    )
    before = _secret(env, name)
    env.resources.create(KEYRINGS, _ring(env, name))
    status = env.resources.wait_keyring(name, "Invalid")
    assert reason in status["message"]
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Ready"]["status"] == "False"
    assert conditions["Degraded"]["reason"] == "Invalid"
    assert "InvalidSecret" in env.resources.event_reasons(name)
    # A rotation of it waits and says why; the Secret is exactly as it was.
    env.resources.rotate(f"{name}-rotation", name)
    wait_for(
        lambda: "not a valid ring" in env.resources.rotation(f"{name}-rotation").get("message", ""),
        timeout=30,
        what="the rotation to name the invalid Secret",
    )
    after = _secret(env, name)
    assert after.metadata.resource_version == before.metadata.resource_version
    assert after.data == before.data
    env.resources.delete(KEYROTATIONS, f"{name}-rotation")


def test_a_rotation_of_a_missing_keyring_waits_and_names_it(env: OperatorEnv) -> None:
    env.resources.rotate("lost", "no-such-ring")
    status = wait_for(
        lambda: (s := env.resources.rotation("lost")).get("message") and s,
        timeout=30,
        what="the rotation's status",
    )
    assert status["phase"] == "Pending"
    assert "KeyRing no-such-ring does not exist" in status["message"]
    env.resources.delete(KEYROTATIONS, "lost")


def test_the_api_server_refuses_an_edited_rotation_spec(env: OperatorEnv) -> None:
    env.resources.rotate("frozen", "no-such-ring", reason="first reason")
    custom = k8s.CustomObjectsApi(env.resources.api)
    for change in ({"reason": "second thoughts"}, {"mode": "Emergency"}, {"keyRing": "other"}):
        with pytest.raises(ApiException) as excinfo:
            custom.patch_namespaced_custom_object(
                GROUP, VERSION, env.namespace, KEYROTATIONS, "frozen", {"spec": change}
            )
        assert excinfo.value.status == 422
        assert "immutable" in excinfo.value.body
    spec = env.resources.get(KEYROTATIONS, "frozen")["spec"]  # type: ignore[index]
    assert spec == {"keyRing": "no-such-ring", "mode": "Normal", "reason": "first reason"}
    env.resources.delete(KEYROTATIONS, "frozen")


@pytest.mark.parametrize(
    ("plural", "body", "field"),
    [
        (KEYROTATIONS, {"keyRing": "r", "mode": "Sometime"}, "spec.mode"),
        (KEYROTATIONS, {"mode": "Normal"}, "spec.keyRing"),
        (
            KEYRINGS,
            {"selector": {"matchLabels": {"a": "b"}}, "tokenTTL": "ten minutes"},
            "tokenTTL",
        ),
        (KEYRINGS, {"selector": {"matchLabels": {"a": "b"}}, "rotateEvery": "-1h"}, "rotateEvery"),
        (KEYRINGS, {"selector": {}}, "selector"),
        (KEYRINGS, {"selector": {"matchLabels": {"a": "b"}}, "fleet": "Bad_Fleet"}, "fleet"),
    ],
)
def test_the_api_server_refuses_an_invalid_spec(
    env: OperatorEnv, plural: str, body: dict[str, Any], field: str
) -> None:
    kind = "KeyRotation" if plural == KEYROTATIONS else "KeyRing"
    obj = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": kind,
        "metadata": {"name": "refused"},
        "spec": body,
    }
    with pytest.raises(ApiException) as excinfo:
        env.resources.create(plural, obj)
    assert excinfo.value.status == 422
    assert field in excinfo.value.body
    assert env.resources.get(plural, "refused") is None


def test_a_ring_key_never_appears_in_status_or_events(env: OperatorEnv) -> None:
    """The Secret's key material stays in the Secret."""
    env.resources.create(KEYRINGS, _ring(env, "quiet"))
    wait_for(lambda: env.resources.keyring("quiet").get("kids"), timeout=60, what="its status")
    ring = KeyRing.from_document(base64.b64decode(_secret(env, "quiet").data[KEYRING_FILE]))
    secret_text = base64.urlsafe_b64encode(ring.secrets[0]).decode().rstrip("=")
    status = json.dumps(env.resources.get(KEYRINGS, "quiet"))
    events = " ".join(f"{e.reason} {e.message}" for e in env.resources.events("quiet"))
    logs = env.operator.tail(10_000)
    for text in (status, events, logs):
        assert secret_text not in text
    assert ring.kids[0] in status and ring.kids[0] in events, "the kid, not the key, is shown"


def test_the_chart_renders_cluster_wide_rbac_and_peering_on_request(
    env: OperatorEnv, helm: Helm
) -> None:
    docs = render_chart(helm, env.namespace, "operator.clusterWide=true", "operator.replicas=2")
    kinds = {d["kind"] for d in docs}
    assert {"ClusterRole", "ClusterRoleBinding", "ClusterKopfPeering"} <= kinds
    assert not {"Role", "RoleBinding", "KopfPeering"} & kinds
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    assert ["clusterkopfpeerings"] in [r["resources"] for r in role["rules"]]
    deployment = next(
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-operator")
    )
    assert "--all-namespaces" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "strategy" not in deployment["spec"], "two replicas roll; peering keeps one active"
    # The API server accepts the rendered Deployment (a server-side dry run).
    dry = k8s.AppsV1Api(env.resources.api).create_namespaced_deployment(
        env.namespace, deployment, dry_run="All"
    )
    assert dry.spec.template.spec.service_account_name == OPERATOR_ACCOUNT
    helm.run("lint", str(CHART))
    # Every rule of the chart's RBAC is commented (the why of each right).
    rbac = (CHART / "templates" / "operator" / "rbac.yaml").read_text().splitlines()
    for i, line in enumerate(rbac):
        if line.strip().startswith("- apiGroups:"):
            assert rbac[i - 1].strip().startswith("#"), f"rule without a comment: {line}"


def test_the_operator_reads_attestations_with_a_read_only_redis_account(
    env: OperatorEnv,
) -> None:
    """Reads are reads: the operator's ACL user may not write, and it needs not.

    The operator runs as an ACL user with exactly ``acl_rules("operator")``,
    its password in a file: nothing secret in its URL, environment or argv, no
    command of it denied (``ACL LOG``), a write and another fleet refused.
    """
    keys = RedisKeys(env.fleet.fleet)
    assert env.operator.redis_password_file is not None
    password = env.operator.redis_password_file.read_text().strip()
    reader = redis.Redis(
        host="127.0.0.1",
        port=env.fleet.redis_port,
        username=READER,
        password=password,
        socket_timeout=5,
    )
    admin = redis.Redis(host="127.0.0.1", port=env.fleet.redis_port, socket_timeout=5)
    try:
        admin.execute_command("ACL", "LOG", "RESET")
        reader.ping()
        assert read_replicas_sync(reader, keys) == {}
        with pytest.raises(NoPermissionError):
            reader.sadd(keys.replicas, "intruder")
        with pytest.raises(NoPermissionError):
            reader.smembers(RedisKeys("other").replicas)
        admin.execute_command("ACL", "LOG", "RESET")
        assert env.operator.redis_url == f"redis://{READER}@127.0.0.1:{env.fleet.redis_port}/0"
        assert password not in " ".join(env.operator.argv())
        # The operator ran its ticks with that account: it read the (empty) registry.
        env.resources.create(KEYRINGS, _ring(env, "read-only"))
        status = env.resources.wait_keyring("read-only", "Degraded")
        assert status["message"] == "the selector matches no serving Pod", "not a Redis error"
        denied = admin.execute_command("ACL", "LOG")
        assert denied == [], f"the operator sent a command outside its rules: {denied}"
    finally:
        reader.close()
        admin.close()


def test_the_operator_refuses_to_start_paused_forever_without_its_peering_object(
    env: OperatorEnv, admin_api: k8s.ApiClient
) -> None:
    with temporary_namespace(admin_api, "no-peering") as namespace:
        result = subprocess.run(
            [sys.executable, "-m", "mcpfleet.cli", "operator", "-n", namespace],
            env={
                **os.environ,
                "KUBECONFIG": str(env.plane.admin_kubeconfig),
                "MCPFLEET_REDIS_URL": env.redis_url,
            },
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert result.returncode == 2, result.stderr
    assert f"no KopfPeering mcpfleet in namespace {namespace}" in result.stderr
    assert "--standalone" in result.stderr
