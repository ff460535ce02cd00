"""What the chart promises of every object it renders, in every scenario (the real helm).

The property tests read the rendered objects of every scenario: no subPath on the
key volume, the restricted security context, the standard labels, an HPA or a
replica count but never both, PDBs, the KeyRing's selector, the operator's peering,
NetworkPolicies, images, the uninstall hook, and two releases side by side.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from fleetkit.cluster import chartkit
from fleetkit.cluster.helm import Helm

from .chartrender import SCENARIOS, _by, _containers, _extra, _pod_specs

pytestmark = pytest.mark.timeout(300)


COMPONENTS = {"server", "router", "operator", "redis"}


STANDARD_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/component",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/version",
    "helm.sh/chart",
)


WORKLOADS = ("Deployment",)


def _all(
    rendered: dict[tuple[str, bool], list[dict[str, Any]]],
) -> Iterator[tuple[str, dict[str, Any]]]:
    for (name, _), docs in rendered.items():
        for doc in docs:
            yield name, doc


def test_the_key_ring_is_a_read_only_secret_volume_never_a_subpath_never_env(
    rendered: dict[tuple[str, bool], list[dict[str, Any]]],
) -> None:
    for (scenario, _), docs in rendered.items():
        server = _by(docs, "Deployment", "-server")["spec"]["template"]["spec"]
        keyring = _by(docs, "KeyRing")
        (keys,) = [v for v in server["volumes"] if v["name"] == "keys"]
        assert keys["secret"]["secretName"] == keyring["spec"]["secretName"], scenario
        assert "items" not in keys["secret"], "every key of the Secret, as the kubelet swaps it"
        (container,) = [c for c in server["containers"] if c["name"] == "server"]
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == "keys"]
        assert mount["readOnly"] is True and "subPath" not in mount and "subPathExpr" not in mount
        assert f"--keys={mount['mountPath']}" in container["args"]
        for _, spec in _pod_specs(docs):
            for c in _containers(spec):
                for env in c.get("env", []):
                    assert "secretKeyRef" not in env.get("valueFrom", {}), (scenario, env)
                # envFrom only as asked (server.envFrom), and never from a Secret.
                for source in c.get("envFrom", []):
                    assert set(source) == {"configMapRef"}, (scenario, source)


def test_every_pod_runs_restricted(rendered: dict[tuple[str, bool], list[dict[str, Any]]]) -> None:
    count = 0
    for (scenario, _), docs in rendered.items():
        for name, spec in _pod_specs(docs):
            pod = spec["securityContext"]
            assert pod["runAsNonRoot"] is True, (scenario, name)
            assert pod["seccompProfile"] == {"type": "RuntimeDefault"}, (scenario, name)
            for c in _containers(spec):
                sc = c["securityContext"]
                assert sc["allowPrivilegeEscalation"] is False, (scenario, name)
                assert sc["readOnlyRootFilesystem"] is True, (scenario, name)
                assert sc["capabilities"] == {"drop": ["ALL"]}, (scenario, name)
                assert "resources" in c and c["resources"].get("requests"), (scenario, name)
                count += 1
    assert count >= 4 * len(rendered)  # replicas, router, operator, test (+ redis)


def test_every_object_carries_the_standard_labels_and_its_component(
    rendered: dict[tuple[str, bool], list[dict[str, Any]]],
) -> None:
    for scenario, doc in _all(rendered):
        if (doc["kind"], doc["metadata"]["name"]) in _extra(scenario):
            continue
        labels = doc["metadata"]["labels"]
        for label in STANDARD_LABELS:
            assert label in labels, (scenario, doc["kind"], doc["metadata"]["name"], label)
        hook = doc["metadata"].get("annotations", {}).get("helm.sh/hook")
        allowed = COMPONENTS | ({"test"} if hook == "test" else set())
        assert labels["app.kubernetes.io/component"] in allowed, (scenario, doc["metadata"])
        assert len(doc["metadata"]["name"]) <= 63
    docs = rendered["default", False]
    for component, suffix in [("server", "-server"), ("router", "-router"), ("redis", "-redis")]:
        deployment = _by(docs, "Deployment", suffix)
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert pod_labels["app.kubernetes.io/component"] == component
        assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    service = _by(docs, "Service", "-router")
    assert service["metadata"]["labels"]["app.kubernetes.io/component"] == "router"
    assert service["spec"]["type"] == "ClusterIP"


def test_names_fit_in_63_characters_with_a_long_release_name(helm: Helm) -> None:
    long = "a-release-name-that-is-far-longer-than-anyone-would-choose-really"[:53]
    docs = chartkit.objects(chartkit.render(helm, release=long))
    assert all(len(d["metadata"]["name"]) <= 63 for d in docs)


def test_replicas_are_an_hpa_or_a_count_never_both(
    rendered: dict[tuple[str, bool], list[dict[str, Any]]],
) -> None:
    seen = set()
    for (scenario, _), docs in rendered.items():
        server = _by(docs, "Deployment", "-server")
        hpas = [
            d
            for d in docs
            if d["kind"] == "HorizontalPodAutoscaler"
            and d["spec"]["scaleTargetRef"]["name"].endswith("-server")
        ]
        assert bool(hpas) != ("replicas" in server["spec"]), scenario
        seen.add(bool(hpas))
        for hpa in hpas:
            assert hpa["spec"]["scaleTargetRef"]["name"] == server["metadata"]["name"]
    assert seen == {True, False}
    (hpa,) = [d for d in rendered["autoscaling", False] if d["kind"] == "HorizontalPodAutoscaler"]
    values = yaml.safe_load(SCENARIOS["autoscaling"].read_text())
    assert hpa["spec"]["behavior"] == values["server"]["autoscaling"]["behavior"]


def test_replicas_and_routers_have_pdbs_selecting_their_pods(
    rendered: dict[tuple[str, bool], list[dict[str, Any]]],
) -> None:
    for (scenario, _), docs in rendered.items():
        for suffix in ("-server", "-router"):
            pdb = _by(docs, "PodDisruptionBudget", suffix)
            pods = _by(docs, "Deployment", suffix)["spec"]["template"]["metadata"]["labels"]
            assert pdb["spec"]["selector"]["matchLabels"].items() <= pods.items(), scenario


def test_the_keyring_selects_exactly_the_replica_pods(
    rendered: dict[tuple[str, bool], list[dict[str, Any]]],
) -> None:
    for (scenario, _), docs in rendered.items():
        keyring = _by(docs, "KeyRing")
        selector = keyring["spec"]["selector"]["matchLabels"]
        for deployment in (d for d in docs if d["kind"] == "Deployment"):
            labels = deployment["spec"]["template"]["metadata"]["labels"]
            matches = selector.items() <= labels.items()
            assert matches == deployment["metadata"]["name"].endswith("-server"), scenario
        server = _by(docs, "Deployment", "-server")["spec"]["template"]["spec"]
        args = server["containers"][0]["args"]
        assert f"--fleet={keyring['spec']['fleet']}" in args
        ttl = next(a for a in args if a.startswith("--state-ttl="))
        assert keyring["spec"]["tokenTTL"] == ttl.split("=")[1] + "s"
    keyring = _by(rendered["hardened", False], "KeyRing")
    assert keyring["spec"]["rotateEvery"] == "720h"


def test_one_operator_recreates_two_share_a_peering(
    rendered: dict[tuple[str, bool], list[dict[str, Any]]],
) -> None:
    one = _by(rendered["default", False], "Deployment", "-operator")
    assert one["spec"]["replicas"] == 1 and one["spec"]["strategy"]["type"] == "Recreate"
    two = _by(rendered["hardened", False], "Deployment", "-operator")
    assert two["spec"]["replicas"] == 2 and "strategy" not in two["spec"]
    args = two["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--peering=mcpfleet" in args
    probe = two["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]
    assert probe["httpGet"]["path"] == "/healthz"


def test_every_rbac_rule_has_a_comment() -> None:
    text = (chartkit.CHART / "templates" / "operator" / "rbac.yaml").read_text()
    lines = text.splitlines()
    rules = [i for i, line in enumerate(lines) if line.strip().startswith("- apiGroups:")]
    assert rules
    for i in rules:
        assert lines[i - 1].strip().startswith("#"), lines[i]


def test_network_policies_let_only_the_router_reach_the_replicas(
    rendered: dict[tuple[str, bool], list[dict[str, Any]]],
) -> None:
    docs = rendered["hardened", False]
    policy = _by(docs, "NetworkPolicy", "-server")
    (rule,) = policy["spec"]["ingress"]
    peers = rule["from"]
    assert peers[0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "router"
    redis = _by(docs, "NetworkPolicy", "-redis")
    components = {
        p["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
        for p in redis["spec"]["ingress"][0]["from"]
    }
    assert components == {"server", "router", "operator"}
    assert not [d for d in rendered["default", False] if d["kind"] == "NetworkPolicy"]


def test_images_are_overridable(helm: Helm) -> None:
    docs = chartkit.objects(
        chartkit.render(
            helm,
            "--set",
            "image.repository=reg.example/mcp,image.tag=1.2.3,image.pullPolicy=Always,"
            "redis.image.repository=reg.example/redis,redis.image.digest=sha256:" + "a" * 64,
            "--set",
            "imagePullSecrets[0]=pull",
        )
    )
    for name, spec in _pod_specs(docs):
        (container,) = spec["containers"]
        if name.endswith("-redis"):
            assert container["image"] == "reg.example/redis@sha256:" + "a" * 64
        else:
            assert container["image"] == "reg.example/mcp:1.2.3"
            assert container["imagePullPolicy"] == "Always"
        assert spec["imagePullSecrets"] == [{"name": "pull"}]


@pytest.mark.parametrize("keep", [True, False], ids=["keep", "delete"])
def test_the_uninstall_hook_deletes_the_key_secret_only_when_told(helm: Helm, keep: bool) -> None:
    docs = chartkit.objects(
        chartkit.render(helm, "--set", f"keyRing.keepSecret={str(keep).lower()}")
    )
    role = next(
        d for d in docs if d["kind"] == "Role" and d["metadata"]["name"].endswith("-uninstall")
    )
    secret_rules = [r for r in role["rules"] if "secrets" in r.get("resources", [])]
    job = next(
        d for d in docs if d["kind"] == "Job" and d["metadata"]["name"].endswith("-uninstall")
    )
    script = job["spec"]["template"]["spec"]["containers"][0]["args"][0]
    compile(script, "uninstall-hook", "exec")  # the rendered script is valid Python
    if keep:
        assert secret_rules == []
        assert "delete_namespaced_secret" not in script
    else:
        # Only the release's key Secret, by name, and only deleting it.
        assert secret_rules == [
            {
                "apiGroups": [""],
                "resources": ["secrets"],
                "resourceNames": ["mcpfleet-keys"],
                "verbs": ["delete"],
            }
        ]
        assert "delete_namespaced_secret" in script and '"mcpfleet-keys"' in script


def test_two_releases_in_one_namespace_share_no_object(helm: Helm) -> None:
    names: dict[str, set[tuple[str, str]]] = {}
    for release in ("shop", "billing"):
        docs = chartkit.objects(chartkit.render(helm, release=release, namespace="tools"))
        names[release] = {(d["kind"], d["metadata"]["name"]) for d in docs}
        (peering,) = [d for d in docs if d["kind"] == "KopfPeering"]
        assert peering["metadata"]["name"] == f"{release}-mcpfleet"
        args = _by(docs, "Deployment", "-operator")["spec"]["template"]["spec"]["containers"][0]
        assert f"--peering={release}-mcpfleet" in args["args"]
    assert not names["shop"] & names["billing"], names["shop"] & names["billing"]
