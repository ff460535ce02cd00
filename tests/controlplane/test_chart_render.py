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
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetkit.cluster import chartkit
from fleetkit.cluster.controlplane import require_tools
from fleetkit.cluster.helm import Helm, HelmError
from mcpfleet.contract import RedisKeys

pytestmark = pytest.mark.timeout(300)

SCENARIOS = {p.name.removesuffix("-values.yaml"): p for p in chartkit.CI_VALUES}
SCENARIOS |= {"example-" + p.stem.removeprefix("values-"): p for p in chartkit.EXAMPLE_VALUES}
if chartkit.OWN_APP_VALUES.exists():
    SCENARIOS["own-app"] = chartkit.OWN_APP_VALUES
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
    assert {"example-production", "example-external-sentinel", "own-app"} <= set(SCENARIOS)


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


def _extra(scenario: str) -> set[tuple[str, str]]:
    """(kind, name) of the scenario's extraObjects: the user's objects, not the chart's."""
    values = yaml.safe_load(SCENARIOS[scenario].read_text()) or {}
    out = set()
    for obj in values.get("extraObjects", []):
        if isinstance(obj, str):  # a template: its kind and (literal) name by their lines
            kind = re.search(r"^kind: *(\S+)", obj, re.M)
            name = re.search(r"^  name: *(\S+)", obj, re.M)
            assert kind and name, obj
            out.add((kind.group(1), name.group(1)))
        else:
            out.add((obj["kind"], obj["metadata"]["name"]))
    return out


def _containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*spec.get("initContainers", []), *spec["containers"]]


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
        ("server.tasks.concurrency=0", "/server/tasks/concurrency': minimum"),
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


@pytest.mark.parametrize(
    ("values", "router_flag", "server_flag"),
    [
        ((), False, None),
        (("--set", "router.rehomeSessions=true"), True, "--drain-handover"),
        (
            ("--set", "router.rehomeSessions=true,server.sessionRehome=false"),
            True,
            "--no-session-rehome",
        ),
    ],
    ids=["default-off", "on", "on-app-opted-out"],
)
def test_session_rehoming_is_off_by_default_and_its_values_set_both_components_flags(
    helm: Helm, values: tuple[str, ...], router_flag: bool, server_flag: str | None
) -> None:
    docs = chartkit.objects(chartkit.render(helm, *values))
    router = _by(docs, "Deployment", "-router")["spec"]["template"]["spec"]["containers"][0]
    server = _by(docs, "Deployment", "-server")["spec"]["template"]["spec"]["containers"][0]
    assert ("--rehome-sessions" in router["args"]) is router_flag
    flags = {"--drain-handover", "--no-session-rehome"} & set(server["args"])
    assert flags == ({server_flag} if server_flag else set())


def test_the_task_values_reach_the_replicas_flags_with_the_replicas_own_defaults(
    helm: Helm,
) -> None:
    from mcpfleet.config import ReplicaConfig

    def flags(*args: str) -> dict[str, float]:
        docs = chartkit.objects(chartkit.render(helm, *args))
        (container,) = _by(docs, "Deployment", "-server")["spec"]["template"]["spec"]["containers"]
        tasks = [a for a in container["args"] if a.startswith("--tasks-")]
        pairs = (a.split("=", 1) for a in tasks if "=" in a)
        return {k: float(v) for k, v in pairs} | {a: 1.0 for a in tasks if "=" not in a}

    defaults = ReplicaConfig(keys_dir=Path("."))
    assert flags() == {
        "--tasks-redelivery": defaults.tasks_redelivery,
        "--tasks-concurrency": defaults.tasks_concurrency,
        "--tasks-deadline": defaults.tasks_deadline,
    }
    assert defaults.tasks_encrypt is False
    tuned = (
        "server.tasks.redelivery=12,server.tasks.concurrency=4,server.tasks.deadline=3,"
        "server.tasks.encrypt=true"
    )
    assert flags("--set", tuned) == {
        "--tasks-redelivery": 12,
        "--tasks-concurrency": 4,
        "--tasks-deadline": 3,
        "--tasks-encrypt": 1,
    }


def test_the_sse_values_reach_the_replicas_flags_with_the_replicas_own_defaults(
    helm: Helm,
) -> None:
    from mcpfleet.config import ReplicaConfig

    def flags(*args: str) -> dict[str, float]:
        docs = chartkit.objects(chartkit.render(helm, *args))
        (container,) = _by(docs, "Deployment", "-server")["spec"]["template"]["spec"]["containers"]
        pairs = (a.split("=", 1) for a in container["args"] if a.startswith("--sse-"))
        return {k: float(v) for k, v in pairs}

    defaults = ReplicaConfig(keys_dir=Path("."))
    assert flags() == {"--sse-events": defaults.sse_events, "--sse-ttl": defaults.sse_ttl}
    assert flags("--set", "server.sseEvents=0,server.sseTtl=30") == {
        "--sse-events": 0,
        "--sse-ttl": 30,
    }
    with pytest.raises(HelmError, match="sseEvents"):
        chartkit.render(helm, "--set", "server.sseEvents=-1")


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
    maps = _dashboard_maps(docs)
    assert len(maps) == len(sources)
    assert all(m["metadata"]["labels"]["grafana_dashboard"] == "1" for m in maps)
    assert sorted(k for m in maps for k in m["data"]) == [p.name for p in sources]
    docs = chartkit.objects(
        chartkit.render(
            helm, "--set", "monitoring.dashboards.label=dash,monitoring.dashboards.labelValue=yes"
        )
    )
    maps = _dashboard_maps(docs)
    assert all(m["metadata"]["labels"]["dash"] == "yes" for m in maps)
    off = chartkit.objects(chartkit.render(helm, "--set", "monitoring.dashboards.enabled=false"))
    assert _dashboard_maps(off) == []


def _dashboard_maps(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ConfigMaps of a render but the replicas' limits file."""
    return [
        d
        for d in docs
        if d["kind"] == "ConfigMap" and not d["metadata"]["name"].endswith("-limits")
    ]


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


def test_the_chart_readme_values_table_is_what_values_yaml_makes() -> None:
    """Regenerated and compared (``values-table.py --check``), as the dashboards are."""
    script = chartkit.CHART / "values-table.py"
    done = subprocess.run(
        [sys.executable, str(script), "--check"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


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


# --------------------------------------------------------------------------- helpers


def _render(helm: Helm, values: dict[str, Any], tmp_path: Path, *args: str, **kw: Any) -> str:
    path = tmp_path / f"values-{len(list(tmp_path.glob('values-*')))}.yaml"
    path.write_text(yaml.safe_dump(values))
    return chartkit.render(helm, "-f", str(path), *args, **kw)


def _container(spec: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in _containers(spec) if c["name"] == name]
    return found


# --------------------------------------------------------------------------- Redis under GitOps


EXISTING = {"redis": {"auth": {"existingSecret": "mcp-redis-users"}}}


def test_with_an_existing_secret_two_renders_are_the_same_and_hold_no_password(
    helm: Helm, tmp_path: Path
) -> None:
    """Argo CD and Flux render without lookup: generated passwords would change on
    every sync while Redis keeps the ACL it loaded (WRONGPASS for the whole fleet)."""
    first = _render(helm, EXISTING, tmp_path)
    assert first == _render(helm, EXISTING, tmp_path)
    docs = chartkit.objects(first)
    assert not [d for d in docs if d["kind"] == "Secret"], "the chart makes no password"
    rules = _by(docs, "ConfigMap", "-redis-acl")["data"]
    keys = RedisKeys(_by(docs, "KeyRing")["spec"]["fleet"])
    assert {user: r.split() for user, r in rules.items()} == {
        c: keys.acl_rules(c) for c in ("replica", "router", "operator")
    }
    for suffix, user in [("-server", "replica"), ("-router", "router"), ("-operator", "operator")]:
        spec = _by(docs, "Deployment", suffix)["spec"]["template"]["spec"]
        (volume,) = [v for v in spec["volumes"] if v["name"] == "redis-password"]
        assert volume["secret"]["secretName"] == "mcp-redis-users"
        assert volume["secret"]["items"] == [{"key": user, "path": "password"}]
    redis = _by(docs, "Deployment", "-redis")["spec"]["template"]["spec"]
    (passwords,) = [v for v in redis["volumes"] if v["name"] == "passwords"]
    assert passwords["secret"]["secretName"] == "mcp-redis-users"
    # Without it, each render generates new passwords: what GitOps tools would apply.
    plain = [_by(chartkit.objects(chartkit.render(helm)), "Secret", "-redis-auth") for _ in "ab"]
    assert plain[0]["data"]["router"] != plain[1]["data"]["router"]


def _acl_script(
    helm: Helm, tmp_path: Path, passwords: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """The Redis Pod's init container, run here on files laid out as its volumes are."""
    docs = chartkit.objects(_render(helm, EXISTING, tmp_path))
    spec = _by(docs, "Deployment", "-redis")["spec"]["template"]["spec"]
    init = _container(spec, "acl")
    assert init["command"] == ["/bin/sh", "-eu", "-c"]
    root = tmp_path / "pod"
    for sub in ("redis-acl", "redis-rules", "redis-passwords"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for user, rules in _by(docs, "ConfigMap", "-redis-acl")["data"].items():
        (root / "redis-rules" / user).write_text(rules)
    for user, password in passwords.items():
        (root / "redis-passwords" / user).write_text(password)
    script = init["args"][0].replace("/etc/mcpfleet/", f"{root}/")
    return subprocess.run(
        ["/bin/sh", "-eu", "-c", script], capture_output=True, text=True, timeout=30, check=False
    )


def test_the_redis_init_container_makes_an_acl_redis_loads_with_hashed_passwords(
    helm: Helm, tmp_path: Path
) -> None:
    import secrets as pysecrets

    import redis as redislib

    from fleetkit.cluster.controlplane import free_port, wait_for

    passwords = {
        "replica": pysecrets.token_urlsafe(24) + "\n",  # kubectl create secret --from-file
        "router": pysecrets.token_urlsafe(24),
        "operator": "with spaces and $ signs\r\n",
    }
    done = _acl_script(helm, tmp_path, passwords)
    assert done.returncode == 0, done.stderr
    acl = (tmp_path / "pod" / "redis-acl" / "users.acl").read_text()
    for password in passwords.values():
        assert password.strip() not in acl, "the file holds hashes, never a password"
    port = free_port()
    proc = subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--aclfile",
            str(tmp_path / "pod" / "redis-acl" / "users.acl"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        fleet = _by(chartkit.objects(_render(helm, EXISTING, tmp_path)), "KeyRing")["spec"]["fleet"]

        def client(user: str, password: str) -> redislib.Redis:
            return redislib.Redis(port=port, username=user, password=password, socket_timeout=5)

        def up() -> bool:
            return bool(client("router", passwords["router"]).ping())

        wait_for(
            up, timeout=30, what="redis-server with the ACL", retry_on=(redislib.ConnectionError,)
        )
        replica = client("replica", passwords["replica"].removesuffix("\n"))
        replica.set(f"mcpfleet:{fleet}:replica:r0", "x")
        operator = client("operator", "with spaces and $ signs")
        assert operator.mget([f"mcpfleet:{fleet}:replica:r0"]) == [b"x"]
        with pytest.raises(redislib.exceptions.NoPermissionError):
            client("router", passwords["router"]).set(f"mcpfleet:{fleet}:replica:r0", "y")
        with pytest.raises(redislib.exceptions.AuthenticationError):
            client("router", "wrong").ping()
        with pytest.raises(redislib.exceptions.AuthenticationError):
            redislib.Redis(port=port, socket_timeout=5).execute_command("AUTH", "default", "")
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize(
    ("password", "message"),
    [("", "the password of router is empty"), ("one\ntwo\n", "router has more than one line")],
    ids=["empty", "two-lines"],
)
def test_a_bad_password_in_the_existing_secret_stops_redis_naming_the_user(
    helm: Helm, tmp_path: Path, password: str, message: str
) -> None:
    done = _acl_script(
        helm, tmp_path, {"replica": "r" * 20, "router": password, "operator": "o" * 20}
    )
    assert done.returncode == 1
    assert "Secret mcp-redis-users: " in done.stderr and message in done.stderr
    assert "one" not in done.stderr.replace("one line", "").replace("none", "")
    assert not (tmp_path / "pod" / "redis-acl" / "users.acl").exists()


# --------------------------------------------------------------------------- external Redis


@pytest.mark.parametrize(
    ("url", "ports"),
    [
        ("redis://redis.example.internal/0", [6379]),
        ("rediss://u@redis.example.internal:6380/0", [6380]),
        ("redis+sentinel://s0:26379,s1:26380,s2/mymaster/0", [26379, 26380, 6379]),
        ("rediss+sentinel://u@s0,s1/mymaster", [26379, 6379]),
        ("redis+cluster://n0:7000,n1:7001,n2", [7000, 7001, 6379]),
        ("rediss+cluster://u@n0.cache.example,n1.cache.example", [6379]),
        ("unix:///run/redis/redis.sock", []),
    ],
)
def test_the_network_policies_open_the_external_redis_ports(
    helm: Helm, schemas: Path, tmp_path: Path, url: str, ports: list[int]
) -> None:
    values = {
        "redis": {"enabled": False, "external": {"url": url}},
        "networkPolicy": {"enabled": True},
    }
    manifest = _render(helm, values, tmp_path)
    assert chartkit.kubeconform(manifest, schemas) == []
    docs = chartkit.objects(manifest)
    for suffix in ("-server", "-router", "-operator"):
        egress = _by(docs, "NetworkPolicy", suffix)["spec"]["egress"]
        opened = [p["port"] for rule in egress if "to" not in rule for p in rule["ports"]]
        assert opened == ports, (suffix, egress)
        assert 0 not in opened
    explicit = _render(
        helm,
        {**values, "redis": {"enabled": False, "external": {"url": url, "ports": [7000, 7001]}}},
        tmp_path,
    )
    egress = _by(chartkit.objects(explicit), "NetworkPolicy", "-server")["spec"]["egress"]
    assert [p["port"] for r in egress if "to" not in r for p in r["ports"]] == [7000, 7001]


def test_each_component_logs_in_to_an_external_redis_as_its_own_user(
    rendered: dict[tuple[str, bool], list[dict[str, Any]]],
) -> None:
    docs = rendered["example-external-sentinel", False]
    values = yaml.safe_load(SCENARIOS["example-external-sentinel"].read_text())
    users = values["redis"]["external"]["users"]
    for suffix, component in [
        ("-server", "replica"),
        ("-router", "router"),
        ("-operator", "operator"),
    ]:
        spec = _by(docs, "Deployment", suffix)["spec"]["template"]["spec"]
        args = spec["containers"][0]["args"]
        url = next(a for a in args if a.startswith("--redis="))
        assert url == (
            f"--redis=redis+sentinel://{users[component]['username']}@sentinel-0.redis.svc:26379,"
            "sentinel-1.redis.svc:26379,sentinel-2.redis.svc:26379/mymaster/0"
        )
        (volume,) = [v for v in spec["volumes"] if v["name"] == "redis-password"]
        assert volume["secret"]["secretName"] == users[component]["passwordSecret"]["name"]
        assert volume["secret"]["items"] == [{"key": "password", "path": "password"}]
    egress = _by(docs, "NetworkPolicy", "-router")["spec"]["egress"]
    assert [p["port"] for r in egress if "to" not in r for p in r["ports"]] == [26379, 6379]


def test_every_component_gets_a_redis_cluster_url_as_given(helm: Helm, tmp_path: Path) -> None:
    url = "rediss+cluster://n0.cache.example:6379,n1.cache.example:6379"
    values = {"redis": {"enabled": False, "external": {"url": url}}}
    docs = chartkit.objects(_render(helm, values, tmp_path))
    for suffix in ("-server", "-router", "-operator"):
        args = _by(docs, "Deployment", suffix)["spec"]["template"]["spec"]["containers"][0]["args"]
        assert f"--redis={url}" in args, (suffix, args)


# --------------------------------------------------------------------------- two releases


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


# --------------------------------------------------------------------------- the router's shutdown


def test_the_router_shuts_down_like_a_replica_drains(helm: Helm, tmp_path: Path) -> None:
    from mcpfleet.cli import build_parser

    values = {
        "router": {
            "preStopSeconds": 4,
            "drainLinger": 3,
            "gracefulTimeout": 25,
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0},
            },
            "readinessProbe": {"periodSeconds": 3, "failureThreshold": 2},
            "livenessProbe": {"periodSeconds": 7, "timeoutSeconds": 2, "failureThreshold": 4},
            "podLabels": {"team": "mcp"},
            "priorityClassName": "fleet-critical",
        }
    }
    docs = chartkit.objects(_render(helm, values, tmp_path))
    router = _by(docs, "Deployment", "-router")
    spec = router["spec"]["template"]["spec"]
    container = _container(spec, "router")
    assert container["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "4"]
    assert spec["terminationGracePeriodSeconds"] == 4 + 3 + 25 + 5
    assert spec["priorityClassName"] == "fleet-critical"
    assert router["spec"]["strategy"] == values["router"]["strategy"]
    assert router["spec"]["template"]["metadata"]["labels"]["team"] == "mcp"
    ready, live = container["readinessProbe"], container["livenessProbe"]
    assert (ready["periodSeconds"], ready["failureThreshold"]) == (3, 2)
    assert (live["periodSeconds"], live["timeoutSeconds"], live["failureThreshold"]) == (7, 2, 4)
    # The rendered arguments are ones `mcpfleet router` takes, with the timeout.
    args = build_parser().parse_args(container["args"])
    assert args.graceful_timeout == 25 and args.drain_linger == 3
    default = _by(chartkit.objects(chartkit.render(helm)), "Deployment", "-router")
    default_spec = default["spec"]["template"]["spec"]
    assert default_spec["terminationGracePeriodSeconds"] == 2 + 2 + 10 + 5
    default_args = _container(default_spec, "router")["args"]
    assert "--graceful-timeout=10" in default_args and "--drain-linger=2" in default_args


def test_the_routers_scale_with_an_hpa_and_then_have_no_replica_count(
    helm: Helm, tmp_path: Path
) -> None:
    values = {"router": {"autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 5}}}
    docs = chartkit.objects(_render(helm, values, tmp_path))
    router = _by(docs, "Deployment", "-router")
    assert "replicas" not in router["spec"]
    hpa = _by(docs, "HorizontalPodAutoscaler", "-router")
    assert hpa["spec"]["scaleTargetRef"]["name"] == router["metadata"]["name"]
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 5)
    assert "replicas" in _by(docs, "Deployment", "-server")["spec"]
    with pytest.raises(HelmError) as refused:
        chartkit.render(
            helm,
            "--set",
            "router.autoscaling.enabled=true,router.autoscaling.minReplicas=12",
        )
    assert "router.autoscaling.minReplicas must not exceed" in str(refused.value)


# --------------------------------------------------------------------------- your own app


def test_the_replicas_run_your_own_image_and_app_with_its_config(
    rendered: dict[tuple[str, bool], list[dict[str, Any]]],
) -> None:
    docs = rendered["own-app", False]
    values = yaml.safe_load(SCENARIOS["own-app"].read_text())
    own = values["server"]
    spec = _by(docs, "Deployment", "-server")["spec"]["template"]["spec"]
    server = _container(spec, "server")
    assert server["image"].startswith(own["image"]["repository"] + ":")
    assert f"--app={own['app']}" in server["args"]
    env = {e["name"] for e in server["env"]}
    assert {e["name"] for e in own["extraEnv"]} <= env and "POD_NAME" in env
    assert server["envFrom"] == own["envFrom"]
    for mount in own["extraVolumeMounts"]:
        assert mount in server["volumeMounts"]
    for volume in own["extraVolumes"]:
        assert volume in spec["volumes"]
    assert [c["name"] for c in spec["initContainers"]] == [c["name"] for c in own["initContainers"]]
    assert [c["name"] for c in spec["containers"]] == [
        "server",
        *(c["name"] for c in own["extraContainers"]),
    ]
    # The router, the operator and the helm test keep the mcpfleet image.
    mcpfleet = _container(_by(docs, "Deployment", "-router")["spec"]["template"]["spec"], "router")
    assert not mcpfleet["image"].startswith(own["image"]["repository"] + ":")
    account = _by(docs, "ServiceAccount", "-server")
    assert spec["serviceAccountName"] == account["metadata"]["name"]
    assert spec["automountServiceAccountToken"] is False
    assert account["automountServiceAccountToken"] is False
    extra = {(k, n) for k, n in _extra("own-app")}
    assert extra and extra <= {(d["kind"], d["metadata"]["name"]) for d in docs}


def test_server_image_fields_fall_back_to_image_one_by_one(helm: Helm, tmp_path: Path) -> None:
    def server(values: dict[str, Any]) -> dict[str, Any]:
        docs = chartkit.objects(_render(helm, values, tmp_path))
        spec = _by(docs, "Deployment", "-server")["spec"]["template"]["spec"]
        return _container(spec, "server")

    base = {"image": {"repository": "reg.example/mcpfleet", "tag": "9.9", "pullPolicy": "Always"}}
    assert server(base)["image"] == "reg.example/mcpfleet:9.9"
    mine = server({**base, "server": {"image": {"repository": "reg.example/myapp"}}})
    assert mine["image"] == "reg.example/myapp:9.9" and mine["imagePullPolicy"] == "Always"
    digest = "sha256:" + "b" * 64
    pinned = server(
        {
            **base,
            "server": {
                "image": {
                    "repository": "reg.example/myapp",
                    "tag": "1",
                    "digest": digest,
                    "pullPolicy": "Never",
                }
            },
        }
    )
    assert (
        pinned["image"] == f"reg.example/myapp:1@{digest}" and pinned["imagePullPolicy"] == "Never"
    )


def test_extra_objects_are_rendered_maps_as_is_strings_through_tpl(
    helm: Helm, tmp_path: Path
) -> None:
    values = {
        "extraObjects": [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "plain"},
                "data": {"a": "1"},
            },
            "apiVersion: v1\nkind: ConfigMap\n"
            "metadata:\n  name: '{{ .Release.Name }}-templated'\n"
            "data:\n  ns: '{{ .Release.Namespace }}'\n",
        ]
    }
    docs = chartkit.objects(_render(helm, values, tmp_path, release="shop", namespace="tools"))
    assert _by(docs, "ConfigMap", "plain")["data"] == {"a": "1"}
    assert _by(docs, "ConfigMap", "shop-templated")["data"] == {"ns": "tools"}


def test_component_service_accounts_are_made_only_when_asked(helm: Helm, tmp_path: Path) -> None:
    plain = chartkit.objects(chartkit.render(helm))
    assert {d["metadata"]["name"] for d in plain if d["kind"] == "ServiceAccount"} == {
        "mcpfleet-operator",
        "mcpfleet-uninstall",
    }
    for name, spec in _pod_specs(plain):
        if name.endswith(("-server", "-router")):
            assert spec["serviceAccountName"] == "default"
    values = {
        "server": {"serviceAccount": {"create": True, "annotations": {"iam.example/role": "app"}}},
        "router": {"serviceAccount": {"create": False, "name": "shared"}},
    }
    docs = chartkit.objects(_render(helm, values, tmp_path))
    account = _by(docs, "ServiceAccount", "-server")
    assert account["metadata"]["annotations"] == {"iam.example/role": "app"}
    server = _by(docs, "Deployment", "-server")["spec"]["template"]["spec"]
    router = _by(docs, "Deployment", "-router")["spec"]["template"]["spec"]
    assert server["serviceAccountName"] == "mcpfleet-server"
    assert router["serviceAccountName"] == "shared"


# --------------------------------------------------------------------------- monitoring knobs


def test_service_monitor_knobs_and_the_runbook_base(helm: Helm, tmp_path: Path) -> None:
    relabel = [{"sourceLabels": ["__name__"], "regex": "python_gc_.*", "action": "drop"}]
    values = {
        "monitoring": {
            "serviceMonitor": {
                "scrapeTimeout": "7s",
                "relabelings": [{"targetLabel": "team", "replacement": "mcp"}],
                "metricRelabelings": relabel,
                "labels": {"release": "kps"},
            },
            "prometheusRule": {"runbookBaseURL": "https://runbooks.example/mcpfleet.md"},
        }
    }
    docs = chartkit.objects(
        _render(helm, values, tmp_path, "--api-versions", chartkit.MONITORING_API)
    )
    monitors = [d for d in docs if d["kind"] == "ServiceMonitor"]
    assert len(monitors) == 3
    for monitor in monitors:
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["scrapeTimeout"] == "7s"
        assert endpoint["relabelings"] == [{"targetLabel": "team", "replacement": "mcp"}]
        assert endpoint["metricRelabelings"] == relabel
        assert monitor["metadata"]["labels"]["release"] == "kps"
    rules = [r for g in _by(docs, "PrometheusRule")["spec"]["groups"] for r in g["rules"]]
    assert rules and all(
        r["annotations"]["runbook_url"]
        == "https://runbooks.example/mcpfleet.md#" + r["alert"].lower()
        for r in rules
    )
    default = chartkit.objects(chartkit.render(helm, "--api-versions", chartkit.MONITORING_API))
    url = _by(default, "PrometheusRule")["spec"]["groups"][0]["rules"][0]["annotations"]
    assert re.match(
        r"https://github\.com/mcpfleet/mcpfleet/blob/v\d+\.\d+\.\d+/", url["runbook_url"]
    )
    chart = yaml.safe_load((chartkit.CHART / "Chart.yaml").read_text())
    assert f"/blob/v{chart['version']}/" in url["runbook_url"], "the tag of this chart's version"


def test_the_releases_key_is_too_old_at_one_and_a_half_rotation_periods(
    helm: Helm, tmp_path: Path
) -> None:
    """The rendered rule, unit-tested by promtool: at rotateEvery 720h the release's key
    fires past 1080h; another KeyRing's key of the same age stays quiet (90 days)."""
    import shutil

    values = {"keyRing": {"rotateEvery": "720h"}}
    docs = chartkit.objects(
        _render(helm, values, tmp_path, "--api-versions", chartkit.MONITORING_API, namespace="shop")
    )
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": _by(docs, "PrometheusRule")["spec"]["groups"]}))
    age = 1080 * 3600 - 600
    series = "mcpfleet_operator_key_age_seconds"
    runbook = "https://github.com/mcpfleet/mcpfleet/blob/v0.1.0/deploy/monitoring/RUNBOOK.md"
    (tmp_path / "test.yaml").write_text(
        f"""
rule_files: [rules.yaml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: '{series}{{namespace="shop",keyring="mcpfleet-keys"}}'
        values: '{age}+60x60'
      - series: '{series}{{namespace="shop",keyring="other"}}'
        values: '{age}+60x60'
    alert_rule_test:
      - eval_time: 5m
        alertname: McpfleetKeyTooOld
        exp_alerts: []
      - eval_time: 50m
        alertname: McpfleetKeyTooOld
        exp_alerts:
          - exp_labels: {{severity: warning, namespace: shop, keyring: mcpfleet-keys}}
            exp_annotations:
              summary: "A key ring's sealing key is older than its rotation schedule allows."
              description: >-
                The sealing key of key ring mcpfleet-keys in namespace shop is
                45d 0h 40m 0s old: scheduled rotations are not completing.
              runbook_url: "{runbook}#mcpfleetkeytooold"
"""
    )
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed: bash hack/ensure-debs.sh")
    out = subprocess.run(
        [promtool, "test", "rules", "test.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_numbers_and_booleans_given_with_set_render_as_strings_in_labels_and_annotations(
    helm: Helm, schemas: Path
) -> None:
    """``--set server.podAnnotations.revision=2`` gives helm the number 2, which the API
    refuses in an annotation or a label: the chart renders every such value as a string."""
    settings = [
        "server.podAnnotations.revision=2",
        "server.podLabels.tier=1",
        "router.podAnnotations.ratio=0.5",
        "router.podLabels.canary=true",
        "router.service.annotations.weight=10",
        "operator.podAnnotations.generation=7",
        "redis.podAnnotations.backup=false",
        "server.serviceAccount.create=true",
        "server.serviceAccount.annotations.id=12345",
        "commonLabels.cost=42",
    ]
    manifest = chartkit.render(
        helm,
        *(a for s in settings for a in ("--set", s)),
        "--api-versions",
        chartkit.MONITORING_API,
    )
    assert chartkit.kubeconform(manifest, schemas) == []
    seen = set()
    for doc in chartkit.objects(manifest):
        metas = [doc.get("metadata", {})]
        template = doc.get("spec", {}).get("template", {})
        if isinstance(template, dict) and "metadata" in template:
            metas.append(template["metadata"])
        for meta in metas:
            for field in ("labels", "annotations"):
                for key, value in (meta.get(field) or {}).items():
                    assert isinstance(value, str), f"{doc['kind']} {field} {key}: {value!r}"
                    seen.add((key, value))
    for pair in [("revision", "2"), ("tier", "1"), ("ratio", "0.5"), ("canary", "true"),
                 ("weight", "10"), ("generation", "7"), ("backup", "false"), ("id", "12345"),
                 ("cost", "42")]:  # fmt: skip
        assert pair in seen, pair
    # A map where a value belongs is refused by the schema, naming the field.
    with pytest.raises(HelmError, match="podAnnotations"):
        chartkit.render(helm, "--set", "server.podAnnotations.team.name=x")


# --------------------------------------------------------------------------- traces


def _otel_env(docs: list[dict[str, Any]], component: str) -> dict[str, str]:
    deployment = _by(docs, "Deployment", f"-{component}")
    (container,) = [
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == component
    ]
    return {
        e["name"]: e.get("value", "")
        for e in container.get("env", [])
        if "OTEL" in e["name"] or e["name"] == "MCPFLEET_TRACES_IDENTITY"
    }


def test_tracing_values_set_the_opentelemetry_environment_of_routers_and_replicas(
    helm: Helm,
) -> None:
    off = chartkit.objects(chartkit.render(helm))
    assert _otel_env(off, "server") == {} and _otel_env(off, "router") == {}
    on = chartkit.objects(
        chartkit.render(
            helm,
            "--set",
            "tracing.otlpEndpoint=http://collector:4318",
            "--set-json",
            "tracing.sampleRatio=0.01",
            "--set",
            "tracing.resourceAttributes.deployment\\.environment=prod",
        )
    )
    for component, service in (("server", "mcpfleet-replica"), ("router", "mcpfleet-router")):
        env = _otel_env(on, component)
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://collector:4318"
        assert env["OTEL_TRACES_SAMPLER"] == "parentbased_traceidratio"
        assert env["OTEL_TRACES_SAMPLER_ARG"] == "0.01"
        assert env["OTEL_SERVICE_NAME"] == service
        attrs = dict(a.split("=", 1) for a in env["OTEL_RESOURCE_ATTRIBUTES"].split(","))
        assert attrs["service.instance.id"] == "$(OTEL_POD_NAME)"
        assert attrs["deployment.environment"] == "prod"
        assert env["MCPFLEET_TRACES_IDENTITY"] == "keep"


def test_tracing_identity_digest_reaches_routers_and_replicas_and_nothing_else_is_taken(
    helm: Helm,
) -> None:
    endpoint = "tracing.otlpEndpoint=http://collector:4318"
    on = chartkit.objects(
        chartkit.render(helm, "--set", endpoint, "--set", "tracing.identity=digest")
    )
    for component in ("server", "router"):
        assert _otel_env(on, component)["MCPFLEET_TRACES_IDENTITY"] == "digest"
    with pytest.raises(HelmError, match="identity"):
        chartkit.render(helm, "--set", endpoint, "--set", "tracing.identity=hash")


@pytest.mark.parametrize(
    ("endpoint", "port"),
    [("http://collector.obs:4318", 4318), ("https://otlp.example.com", 443), ("http://otel", 80)],
)
def test_with_tracing_on_the_network_policies_open_the_otlp_endpoints_port(
    helm: Helm, schemas: Path, tmp_path: Path, endpoint: str, port: int
) -> None:
    values: dict[str, Any] = {
        "networkPolicy": {"enabled": True},
        "tracing": {"otlpEndpoint": endpoint},
    }

    def tracing_rules(manifest: str, suffix: str) -> list[dict[str, Any]]:
        egress = _by(chartkit.objects(manifest), "NetworkPolicy", suffix)["spec"]["egress"]
        return [r for r in egress if r.get("ports") == [{"protocol": "TCP", "port": port}]]

    manifest = _render(helm, values, tmp_path)
    assert chartkit.kubeconform(manifest, schemas) == []
    for suffix in ("-server", "-router"):
        assert [r.get("to") for r in tracing_rules(manifest, suffix)] == [None]
    assert tracing_rules(manifest, "-operator") == []
    peer = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "obs"}}}
    scoped = _render(
        helm, {**values, "networkPolicy": {"enabled": True, "tracingTo": [peer]}}, tmp_path
    )
    for suffix in ("-server", "-router"):
        (rule,) = tracing_rules(scoped, suffix)
        assert rule["to"] == [peer]
    off = _render(helm, {"networkPolicy": {"enabled": True}}, tmp_path)
    assert tracing_rules(off, "-server") == []
