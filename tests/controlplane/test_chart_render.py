"""The chart, rendered by the real helm: lint, kubeconform, and properties of every object.

Every ``charts/mcpfleet/ci/*-values.yaml`` scenario is rendered twice (with and
without the Prometheus Operator's API) and validated by kubeconform against
strict schemas made from the pinned Kubernetes OpenAPI document and the pinned
prometheus-operator CRDs. The property tests read the rendered objects: what
the chart promises (no subPath on the key volume, the restricted security
context, the standard labels, an HPA or a replica count but never both, PDBs)
holds in every scenario.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetkit import chartkit
from fleetkit.controlplane import require_tools
from fleetkit.helm import Helm, HelmError
from mcpfleet.server.contract import RedisKeys

pytestmark = pytest.mark.timeout(300)

SCENARIOS = {p.name.removesuffix("-values.yaml"): p for p in chartkit.CI_VALUES}
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


def test_there_are_ci_scenarios() -> None:
    assert {"default", "autoscaling", "external-redis", "redis-auth", "hardened"} <= set(SCENARIOS)


@pytest.fixture(scope="module")
def schemas() -> Path:
    require_tools(("kubeconform",))
    return chartkit.kubeconform_schemas()


@pytest.fixture(scope="module")
def rendered(helm: Helm) -> dict[tuple[str, bool], list[dict[str, Any]]]:
    """Every scenario's objects, with (True) and without (False) monitoring.coreos.com/v1."""
    out = {}
    for name, path in SCENARIOS.items():
        for monitoring in (False, True):
            extra = ["--api-versions", chartkit.MONITORING_API] if monitoring else []
            out[name, monitoring] = chartkit.objects(chartkit.render(helm, "-f", str(path), *extra))
    return out


def _all(
    rendered: dict[tuple[str, bool], list[dict[str, Any]]],
) -> Iterator[tuple[str, dict[str, Any]]]:
    for (name, _), docs in rendered.items():
        for doc in docs:
            yield name, doc


def _pod_specs(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for doc in docs:
        if doc["kind"] == "Deployment":
            yield doc["metadata"]["name"], doc["spec"]["template"]["spec"]
        elif doc["kind"] == "Pod":
            yield doc["metadata"]["name"], doc["spec"]


def _by(docs: list[dict[str, Any]], kind: str, suffix: str = "") -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(suffix)]
    return found


# --------------------------------------------------------------------------- lint, schemas


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_helm_lint_passes(helm: Helm, scenario: str) -> None:
    out = helm.run("lint", str(chartkit.CHART), "--strict", "-f", str(SCENARIOS[scenario])).stdout
    assert "0 chart(s) failed" in out


@pytest.mark.parametrize("monitoring", [False, True], ids=["plain", "prometheus-operator"])
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_scenario_is_valid_against_the_kubernetes_and_crd_schemas(
    helm: Helm, schemas: Path, scenario: str, monitoring: bool
) -> None:
    extra = ["--api-versions", chartkit.MONITORING_API] if monitoring else []
    # The chart's own CRDs are checked by the API server (the control-plane tier
    # applies them); here, every templated object.
    manifest = chartkit.render(helm, "-f", str(SCENARIOS[scenario]), *extra)
    assert chartkit.kubeconform(manifest, schemas) == []


def test_kubeconform_refuses_a_misspelt_field(helm: Helm, schemas: Path) -> None:
    """The schemas are strict: the validation above can fail."""
    manifest = chartkit.render(helm).replace("readOnlyRootFilesystem", "readOnlyRootFilesytem", 1)
    problems = chartkit.kubeconform(manifest, schemas)
    assert len(problems) == 1 and "readOnlyRootFilesytem" in problems[0]


def test_kubeconform_refuses_a_bad_service_monitor(helm: Helm, schemas: Path) -> None:
    manifest = chartkit.render(helm, "--api-versions", chartkit.MONITORING_API)
    manifest = manifest.replace("honorLabels: true", "honorLabels: maybe")
    assert any("ServiceMonitor" in p for p in chartkit.kubeconform(manifest, schemas))


# --------------------------------------------------------------------------- values refused


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("operator.replicas=3", "/operator/replicas': value must be one of 1, 2"),
        ("redis.enabled=false", "/redis/external/url': minLength"),
        (
            "redis.enabled=false,redis.external.url=redis://u:secret@h:6379/0",
            "/redis/external/url': 'redis://u:secret@h:6379/0' does not match",
        ),
        ("fleet=Not_A_Label", "/fleet'"),
        ("server.replicas=0", "/server/replicas': minimum"),
        ("image.pullPolicy=Sometimes", "/image/pullPolicy': value must be one of"),
        ("serverr.replicas=2", "additional properties 'serverr' not allowed"),
        ("image.digest=latest", "/image/digest'"),
        ("keyRing.rotateEvery=monthly", "/keyRing/rotateEvery'"),
        (
            "server.autoscaling.enabled=true,server.autoscaling.minReplicas=5,"
            "server.autoscaling.maxReplicas=3",
            "minReplicas must not exceed server.autoscaling.maxReplicas",
        ),
    ],
)
def test_bad_values_are_refused_with_a_clear_message(
    helm: Helm, setting: str, message: str
) -> None:
    with pytest.raises(HelmError) as refused:
        chartkit.render(helm, "--set", setting)
    assert message in str(refused.value)


# --------------------------------------------------------------------------- properties


def test_the_key_ring_is_a_read_only_secret_volume_never_a_subpath_never_env(
    rendered: dict[tuple[str, bool], list[dict[str, Any]]],
) -> None:
    for (scenario, _), docs in rendered.items():
        server = _by(docs, "Deployment", "-server")["spec"]["template"]["spec"]
        keyring = _by(docs, "KeyRing")
        (keys,) = [v for v in server["volumes"] if v["name"] == "keys"]
        assert keys["secret"]["secretName"] == keyring["spec"]["secretName"], scenario
        assert "items" not in keys["secret"], "every key of the Secret, as the kubelet swaps it"
        (container,) = server["containers"]
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == "keys"]
        assert mount["readOnly"] is True and "subPath" not in mount and "subPathExpr" not in mount
        assert f"--keys={mount['mountPath']}" in container["args"]
        for _, spec in _pod_specs(docs):
            for c in spec["containers"]:
                for env in c.get("env", []):
                    assert "secretKeyRef" not in env.get("valueFrom", {}), (scenario, env)
                assert not c.get("envFrom"), scenario


def test_every_pod_runs_restricted(rendered: dict[tuple[str, bool], list[dict[str, Any]]]) -> None:
    count = 0
    for (scenario, _), docs in rendered.items():
        for name, spec in _pod_specs(docs):
            pod = spec["securityContext"]
            assert pod["runAsNonRoot"] is True, (scenario, name)
            assert pod["seccompProfile"] == {"type": "RuntimeDefault"}, (scenario, name)
            for c in spec["containers"]:
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
        hpas = [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]
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


def test_the_grace_period_covers_the_prestop_pause_and_the_drain_deadline(helm: Helm) -> None:
    docs = chartkit.objects(
        chartkit.render(
            helm,
            "--set",
            "server.drain.timeout=45,server.drain.linger=3,server.drain.preStopSeconds=2",
        )
    )
    spec = _by(docs, "Deployment", "-server")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert "--drain-timeout=45" in container["args"] and "--drain-linger=3" in container["args"]
    assert container["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "2"]
    assert spec["terminationGracePeriodSeconds"] == 2 + 45 + 3 + 5
    env = {
        e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        for e in container["env"]
    }
    assert env["POD_NAME"] == "metadata.name" and env["POD_IP"] == "status.podIP"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"


def test_the_router_answers_only_its_own_service_names(helm: Helm) -> None:
    docs = chartkit.objects(chartkit.render(helm, release="shop", namespace="tools"))
    args = _by(docs, "Deployment", "-router")["spec"]["template"]["spec"]["containers"][0]["args"]
    hosts = {a.split("=", 1)[1] for a in args if a.startswith("--allowed-host=")}
    assert {"shop-mcpfleet-router", "shop-mcpfleet-router.tools.svc:*"} <= hosts
    assert "shop-mcpfleet-router.tools.svc.cluster.local" in hosts
    assert not any(h in ("*", "") for h in hosts)


def test_monitoring_objects_only_where_the_api_exists(
    rendered: dict[tuple[str, bool], list[dict[str, Any]]],
) -> None:
    plain = {d["kind"] for d in rendered["default", False]}
    assert not plain & {"ServiceMonitor", "PrometheusRule"}
    docs = rendered["default", True]
    monitors = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ServiceMonitor"}
    assert {n.rsplit("-", 1)[1] for n in monitors} == {"server", "router", "operator"}
    for name, monitor in monitors.items():
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint.get("honorLabels", False) == name.endswith("-operator")
    rule = _by(docs, "PrometheusRule")
    source = yaml.safe_load((chartkit.CHART / "rules" / "mcpfleet.rules.yaml").read_text())
    assert rule["spec"]["groups"] == source["groups"]


def test_dashboards_are_configmaps_with_a_configurable_sidecar_label(helm: Helm) -> None:
    sources = sorted((chartkit.CHART / "dashboards").glob("*.json"))
    docs = chartkit.objects(chartkit.render(helm))
    maps = [d for d in docs if d["kind"] == "ConfigMap"]
    assert len(maps) == len(sources)
    assert all(m["metadata"]["labels"]["grafana_dashboard"] == "1" for m in maps)
    assert sorted(k for m in maps for k in m["data"]) == [p.name for p in sources]
    docs = chartkit.objects(
        chartkit.render(
            helm, "--set", "monitoring.dashboards.label=dash,monitoring.dashboards.labelValue=yes"
        )
    )
    maps = [d for d in docs if d["kind"] == "ConfigMap"]
    assert all(m["metadata"]["labels"]["dash"] == "yes" for m in maps)
    off = chartkit.objects(chartkit.render(helm, "--set", "monitoring.dashboards.enabled=false"))
    assert [d for d in off if d["kind"] == "ConfigMap"] == []


def test_with_redis_auth_each_component_mounts_only_its_own_password(
    rendered: dict[tuple[str, bool], list[dict[str, Any]]],
) -> None:
    docs = rendered["redis-auth", False]
    secret = _by(docs, "Secret", "-redis-auth")
    assert set(secret["data"]) == {"replica", "router", "operator", "users.acl"}
    import base64

    acl = base64.b64decode(secret["data"]["users.acl"]).decode().splitlines()
    assert acl[0] == "user default off"
    # Each user has exactly the rules the server's contract names for its component.
    keys = RedisKeys(_by(docs, "KeyRing")["spec"]["fleet"])
    for line, component in zip(acl[1:], ("replica", "router", "operator"), strict=True):
        user, on, password, *rules = line.split()[1:]
        assert (user, on) == (component, "on") and password.startswith(">")
        assert (
            len(password) > 30
            and password[1:] == base64.b64decode(secret["data"][component]).decode()
        )
        assert rules == keys.acl_rules(component)
    for suffix, user in [("-server", "replica"), ("-router", "router"), ("-operator", "operator")]:
        spec = _by(docs, "Deployment", suffix)["spec"]["template"]["spec"]
        (volume,) = [v for v in spec["volumes"] if v["name"] == "redis-password"]
        assert volume["secret"]["items"] == [{"key": user, "path": "password"}]
        args = spec["containers"][0]["args"]
        assert "--redis-password-file=/etc/mcpfleet/redis/password" in args
        url = next(a for a in args if a.startswith("--redis="))
        assert re.match(rf"--redis=redis://{user}@[^:@]+:6379/0$", url), url
    redis = _by(docs, "Deployment", "-redis")["spec"]["template"]["spec"]
    assert any(v.get("persistentVolumeClaim") for v in redis["volumes"])


def test_external_redis_passwords_and_tls_are_files(
    rendered: dict[tuple[str, bool], list[dict[str, Any]]],
) -> None:
    docs = rendered["external-redis", False]
    assert not [d for d in docs if d["metadata"]["name"].endswith("-redis")]
    for suffix in ("-server", "-router", "-operator"):
        args = _by(docs, "Deployment", suffix)["spec"]["template"]["spec"]["containers"][0]["args"]
        assert "--redis=rediss://mcpfleet@redis.example.internal:6380/0" in args
        assert "--redis-password-file=/etc/mcpfleet/redis/password" in args
        assert "--redis-ca-file=/etc/mcpfleet/redis-tls/ca.crt" in args
        assert "--redis-cert-file=/etc/mcpfleet/redis-tls-client/tls.crt" in args


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


def test_the_chart_readme_lists_every_value() -> None:
    values = yaml.safe_load((chartkit.CHART / "values.yaml").read_text())
    readme = (chartkit.CHART / "README.md").read_text()
    listed = set(re.findall(r"^\| `([^`]+)` \|", readme, flags=re.M))
    assert listed == set(chartkit.value_paths(values))


def test_an_upgrade_that_changes_the_replicas_does_not_restart_redis(helm: Helm) -> None:
    """Redis' pod template is the same whatever else changes (its ACL checksum holds
    no generated password): restarting it would drop every session's route."""

    def redis_template(*settings: str) -> dict[str, Any]:
        docs = chartkit.objects(chartkit.render(helm, *settings))
        return _by(docs, "Deployment", "-redis")["spec"]["template"]

    assert redis_template() == redis_template("--set", "server.stateTTL=5,server.replicas=4")


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
