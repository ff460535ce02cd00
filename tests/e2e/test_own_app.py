"""Your own FastMCP app in the fleet, for real: built, loaded, installed, tested.

The app is the example of ``deploy/own-app`` (package ``ownapp``, FastMCP's
JWT auth; the issuer's public key from a Secret the Pods mount). The tests
run the commands docs/apps.md's "Run your own app on Kubernetes" shows, in its
order: the image built on the mcpfleet image, ``make node-load``, the
Secret, ``helm install`` with ``deploy/own-app/values.yaml`` and the
cluster's values only, ``helm test``; then both eras through the router
Service with tokens minted here, and nothing without one. A second release
(the example app, its Redis passwords from a Secret: the GitOps way) then
runs beside it in the same namespace, and each is uninstalled alone.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import subprocess
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml
from kubernetes import client as k8s

from fleetkit import scenarios
from fleetkit.clients import jwtkit
from fleetkit.cluster.chartfleet import GROUP, VERSION, ChartFleet
from fleetkit.cluster.chartkit import CHART, OWN_APP_VALUES
from fleetkit.cluster.controlplane import repo_root, tools_bin_dir, wait_for
from fleetkit.cluster.providers import Cluster
from mcpfleet.fleetclient import Era, Trace, connect
from mcpfleet.selftest import selftest

pytestmark = pytest.mark.timeout(900)

NAMESPACE = "shop"
IMAGE = "localhost/ownapp:1"
ROOT = repo_root()
SETTINGS = yaml.safe_load(OWN_APP_VALUES.read_text())
#: The issuer and audience the app's ConfigMap (extraObjects) names.
_CONFIG = yaml.safe_load(SETTINGS["extraObjects"][0].replace("{{", "").replace("}}", ""))["data"]
ISSUER, AUDIENCE = _CONFIG["OWNAPP_JWT_ISSUER"], _CONFIG["OWNAPP_JWT_AUDIENCE"]


def _run(*args: str, timeout: float = 900) -> str:
    """A command as docs/apps.md shows it, from the repository's root."""
    done = subprocess.run(
        list(args), cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"{' '.join(args)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def issuer() -> jwtkit.TokenIssuer:
    return jwtkit.TokenIssuer(issuer=ISSUER, audience=AUDIENCE)


@pytest.fixture(scope="module")
def shop(e2e_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChartFleet]:
    fleet = ChartFleet(e2e_cluster, NAMESPACE, tmp_path_factory.mktemp("shop"), release="shop")
    yield fleet
    with contextlib.suppress(Exception):
        fleet.uninstall()


def _bearer(token: str) -> Any:
    async def hook(request: Any) -> None:
        request.headers["authorization"] = f"Bearer {token}"

    return hook


# ---------------------------------------------------------------------- docs/apps.md's steps


def test_the_app_image_builds_on_the_mcpfleet_image_and_the_node_takes_it(
    e2e_cluster: Cluster,
) -> None:
    built = _run("bash", "deploy/own-app/build.sh", IMAGE)
    assert built.splitlines()[-1] == IMAGE
    if e2e_cluster.provider == "kind":
        cluster = os.environ.get("MCPFLEET_KIND_CLUSTER", "mcpfleet-e2e")
        load = ["kind-load", f"IMAGE={IMAGE}", f"KIND_CLUSTER={cluster}"]
    else:
        load = ["node-load", f"IMAGE={IMAGE}"]
    loaded = _run("make", "--no-print-directory", *load)
    assert loaded.splitlines()[-1] == f"loaded: {IMAGE}"


def test_install_the_app_with_its_public_key_from_a_secret(
    shop: ChartFleet, issuer: jwtkit.TokenIssuer
) -> None:
    public = issuer.write_public_key(shop.workdir / "issuer-public.pem")
    kubectl = str(tools_bin_dir() / "kubectl")
    kubeconfig = f"--kubeconfig={shop.cluster.kubeconfig}"
    _run(kubectl, kubeconfig, "create", "namespace", NAMESPACE)
    _run(
        kubectl, kubeconfig, "-n", NAMESPACE, "create", "secret", "generic", "ownapp-jwt",
        f"--from-file=public.pem={public}",
    )  # fmt: skip
    shop.helm.run(
        "install", "shop", str(CHART), "-n", NAMESPACE,
        "-f", str(shop.values_file()), "-f", str(OWN_APP_VALUES),
        "--wait", "--timeout", "600s",
        timeout=660,
    )  # fmt: skip
    pods = shop.pods("server")
    assert len(pods) == 3
    for pod in pods:
        server = next(c for c in pod.spec.containers if c.name == "server")
        assert server.image.startswith("localhost/ownapp:")
        assert "--app=ownapp.server:mcp" in server.args
        assert [c.name for c in pod.spec.containers] == ["server", "jwt-key-sync"]
        assert [c.name for c in pod.spec.init_containers] == ["jwt-key"]
        assert pod.spec.service_account_name == "shop-mcpfleet-server"
        statuses = {s.name: s for s in pod.status.container_statuses}
        assert all(s.ready and s.restart_count == 0 for s in statuses.values()), statuses
    # The router, the operator and Redis still run the mcpfleet images.
    for component in ("router", "operator"):
        for pod in shop.pods(component):
            assert pod.spec.containers[0].image.startswith("localhost/mcpfleet:")
    shop.wait_serving(3, timeout=120)


def test_helm_test_proves_the_auth_app_refuses_strangers_and_names_its_metadata(
    shop: ChartFleet,
) -> None:
    out = shop.test()
    assert re.search(r"TEST SUITE:\s+shop-mcpfleet-selftest", out), out
    assert re.search(r"Phase:\s+Succeeded", out), out


async def test_the_selftest_from_here_sees_the_401_and_the_metadata(shop: ChartFleet) -> None:
    lines: list[str] = []
    assert await selftest(shop.url, lines.append) == 0, lines
    assert [line.split(":")[0] for line in lines] == ["modern", "handshake"]
    assert all("ok, auth required: 401 with a Bearer challenge" in line for line in lines), lines


# --------------------------------------------------------------------------- both eras, with tokens


def test_no_token_or_a_wrong_one_is_refused_with_401(
    shop: ChartFleet, issuer: jwtkit.TokenIssuer
) -> None:
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    elsewhere = jwtkit.TokenIssuer(issuer=ISSUER, audience="someone-else", keys=issuer.keys)
    stranger = jwtkit.TokenIssuer(issuer=ISSUER, audience=AUDIENCE)  # its own key pair
    headers = {"accept": "application/json, text/event-stream"}
    cases = {
        "none": {},
        "garbage": {"authorization": "Bearer not-a-token"},
        "other audience": {"authorization": f"Bearer {elsewhere.token('alice')}"},
        "expired": {"authorization": f"Bearer {issuer.token('alice', expires_in=-60)}"},
        "another key": {"authorization": f"Bearer {stranger.token('alice')}"},
    }
    for case, extra in cases.items():
        refused = httpx.post(shop.url, json=ping, headers={**headers, **extra}, timeout=10)
        assert refused.status_code == 401, (case, refused.status_code, refused.text)
        assert refused.headers["www-authenticate"].lower().startswith("bearer"), case


@pytest.mark.parametrize("era", ["modern", "handshake"])
async def test_both_eras_answer_through_the_router_with_a_token(
    shop: ChartFleet, issuer: jwtkit.TokenIssuer, era: Era
) -> None:
    trace = Trace()
    token = issuer.token(f"alice-{era}")
    async with connect(shop.url, era, trace, request_hook=_bearer(token)) as client:
        assert {t.name for t in await client.list_tools()} == {"whoami", "place_order"}
        who = await client.call_tool("whoami", {})
        # The user confirms (the client's answerer says yes): one question, then the order.
        order = await client.call_tool("place_order", {"item": "tea", "quantity": 2})
    assert str(who.data) == f"signed in as alice-{era}"
    assert str(order.data) == f"Ordered 2 x tea for alice-{era}.", order.data
    assert all(r.status < 400 for r in trace.rounds), [r.status for r in trace.rounds]
    replicas = trace.replicas()
    assert replicas <= set(shop.replica_names())
    if era == "handshake":
        assert len(replicas) == 1, "one session, one replica"


# ------------------------------------------------------------- a second release beside it


@pytest.fixture(scope="module")
def second(e2e_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChartFleet]:
    values: dict[str, Any] = {
        "server": {"replicas": 2},
        "router": {"replicas": 1},
        "redis": {"auth": {"existingSecret": "mcp-redis-users"}},
    }
    values["router"] |= e2e_cluster.router_values(1)  # its own fixed ClusterIP
    fleet = ChartFleet(
        e2e_cluster,
        NAMESPACE,
        tmp_path_factory.mktemp("second"),
        release="mcpfleet",
        values=values,
        redis_users_secret="mcp-redis-users",
    )
    yield fleet
    with contextlib.suppress(Exception):
        fleet.uninstall()


def test_a_second_release_runs_beside_it_with_its_own_peering_and_redis_users(
    shop: ChartFleet, second: ChartFleet
) -> None:
    import secrets as pysecrets

    # Its Redis passwords from a Secret made first, as a GitOps repository would.
    second.core.create_namespaced_secret(
        NAMESPACE,
        k8s.V1Secret(
            metadata=k8s.V1ObjectMeta(name="mcp-redis-users"),
            string_data={u: pysecrets.token_hex(24) for u in ("replica", "router", "operator")},
        ),
    )
    second.install()
    second.wait_serving(2, timeout=120)
    peerings = second.custom.list_namespaced_custom_object(
        "kopf.dev", "v1", NAMESPACE, "kopfpeerings"
    )["items"]
    assert {p["metadata"]["name"] for p in peerings} == {"shop-mcpfleet", "mcpfleet"}
    for fleet in (shop, second):

        def ready(fleet: ChartFleet = fleet) -> bool:
            status = fleet.custom.get_namespaced_custom_object(
                GROUP, VERSION, NAMESPACE, "keyrings", fleet.keyring
            ).get("status", {})
            return status.get("phase") == "Ready"

        wait_for(ready, timeout=120, what=f"KeyRing {fleet.keyring} Ready")
    # Each fleet's replicas attest only in their own Redis and answer only their router.
    assert set(second.attestations()) == set(second.replica_names())
    assert set(shop.attestations()) == set(shop.replica_names())
    assert not set(second.replica_names()) & set(shop.replica_names())
    out = second.test()
    assert re.search(r"TEST SUITE:\s+mcpfleet-selftest", out) and "Succeeded" in out, out
    # No password was generated for it: the only Redis Secret is the one made above.
    secrets = {s.metadata.name for s in second.core.list_namespaced_secret(NAMESPACE).items}
    assert "mcpfleet-redis-auth" not in secrets and "shop-mcpfleet-redis-auth" in secrets
    acl = second.core.read_namespaced_config_map("mcpfleet-redis-acl", NAMESPACE).data
    assert set(acl) == {"replica", "router", "operator"}


async def test_the_example_app_beside_it_answers_both_eras(second: ChartFleet) -> None:
    await scenarios.modern_rounds_spread(second)
    await scenarios.handshake_session_sticks(second)


async def test_uninstalling_one_release_leaves_the_other_serving(
    shop: ChartFleet, second: ChartFleet, issuer: jwtkit.TokenIssuer
) -> None:
    second.uninstall()

    def gone() -> bool:
        return not second.pods("server") and not second.pods("operator")

    wait_for(gone, timeout=180, interval=1, what="the second release's pods gone")
    peerings = shop.custom.list_namespaced_custom_object(
        "kopf.dev", "v1", NAMESPACE, "kopfpeerings"
    )["items"]
    assert {p["metadata"]["name"] for p in peerings} == {"shop-mcpfleet"}
    async with connect(shop.url, "modern", request_hook=_bearer(issuer.token("bob"))) as c:
        assert str((await c.call_tool("whoami", {})).data) == "signed in as bob"
    shop.wait_serving(3, timeout=60)
    secret = shop.core.read_namespaced_secret("ownapp-jwt", NAMESPACE)
    assert base64.b64decode(secret.data["public.pem"]).decode() == issuer.public_pem
