"""The operator's API parsing, the CRDs' shape, the Secret's ring parsing, the metric names."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from mcpfleet.contract import KEYRING_FILE
from mcpfleet.keys.ring import KeyRing
from mcpfleet_operator.api import (
    KEYRING_REF_LABEL,
    KeyRingSpec,
    RotationSpec,
    SpecError,
    parse_duration,
    rotation_manifest,
    selector_string,
)
from mcpfleet_operator.metrics import OperatorMetrics
from mcpfleet_operator.secretring import ring_of

pytestmark = pytest.mark.unit

CRDS = Path(__file__).resolve().parents[2] / "charts" / "mcpfleet" / "crds"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("10m", 600), ("4s", 4), ("1h30m", 5400), ("250ms", 0.25), ("1.5s", 1.5)],
)
def test_durations_read_like_go(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "10", "-5s", "5 s", "1d", "m"])
def test_bad_durations_are_refused_with_the_value(text: str) -> None:
    with pytest.raises(SpecError, match="is not a duration"):
        parse_duration(text)


def test_keyring_spec_defaults() -> None:
    spec = KeyRingSpec.parse("ring", {"selector": {"matchLabels": {"app": "x"}}})
    assert spec.secret_name == "ring" and spec.fleet == "default"
    assert spec.token_ttl == 600 and spec.rotate_every is None
    assert spec.selector == "app=x"


def test_selector_expressions_become_a_label_selector_string() -> None:
    sel = selector_string(
        {
            "matchLabels": {"b": "2", "a": "1"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["x", "y"]},
                {"key": "gone", "operator": "DoesNotExist"},
            ],
        }
    )
    assert sel == "a=1,b=2,tier in (x,y),!gone"


def test_an_empty_selector_is_refused_rather_than_matching_every_pod() -> None:
    with pytest.raises(SpecError, match="matches every Pod"):
        KeyRingSpec.parse("ring", {"selector": {}})


def test_zero_ttl_and_bad_fleet_are_refused() -> None:
    sel = {"matchLabels": {"a": "b"}}
    with pytest.raises(SpecError, match="tokenTTL"):
        KeyRingSpec.parse("r", {"selector": sel, "tokenTTL": "0s"})
    with pytest.raises(SpecError, match="fleet"):
        KeyRingSpec.parse("r", {"selector": sel, "fleet": "Not_A_Label"})


def test_rotation_spec_modes() -> None:
    assert RotationSpec.parse({"keyRing": "r"}).mode == "Normal"
    assert RotationSpec.parse({"keyRing": "r", "mode": "Emergency"}).emergency
    with pytest.raises(SpecError, match="Normal or Emergency"):
        RotationSpec.parse({"keyRing": "r", "mode": "Fast"})
    with pytest.raises(SpecError, match="keyRing"):
        RotationSpec.parse({})


def _crd(name: str) -> dict[str, Any]:
    docs = [d for f in CRDS.glob("*.yaml") for d in yaml.safe_load_all(f.read_text()) if d]
    return next(d for d in docs if d["metadata"]["name"] == name)


def test_the_keyrotation_spec_is_immutable_by_a_cel_rule() -> None:
    version = _crd("keyrotations.mcpfleet.dev")["spec"]["versions"][0]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert {"rule": "self == oldSelf"}.items() <= spec["x-kubernetes-validations"][0].items()
    assert spec["properties"]["mode"]["enum"] == ["Normal", "Emergency"]
    phases = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["phase"]
    assert phases["enum"] == [
        "Pending",
        "Staging",
        "Promoting",
        "Waiting",
        "Retiring",
        "Complete",
        "Failed",
        "Aborted",
    ]
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns == ["KeyRing", "Phase", "New Kid", "Converged", "Age"]


def test_the_keyring_crd_names_and_columns() -> None:
    crd = _crd("keyrings.mcpfleet.dev")
    assert crd["spec"]["names"]["shortNames"] == ["kr"]
    assert _crd("keyrotations.mcpfleet.dev")["spec"]["names"]["shortNames"] == ["krot"]
    version = crd["spec"]["versions"][0]
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Kid",
        "Phase",
        "Converged",
        "Age",
    ]
    assert version["subresources"] == {"status": {}}


def _secret(data: dict[str, str] | None) -> k8s.V1Secret:
    return k8s.V1Secret(metadata=k8s.V1ObjectMeta(name="s", resource_version="1"), data=data)


def test_a_secret_that_is_not_a_ring_is_reported_never_raised() -> None:
    assert "has no keyring.json" in ring_of(_secret(None)).error
    assert "not base64" in ring_of(_secret({KEYRING_FILE: "!!"})).error
    short = base64.b64encode(
        b'{"version":1,"phase":"stable","keys":[{"kid":"x","secret":"AAAA"}]}'
    ).decode()
    assert "at least 32 bytes" in ring_of(_secret({KEYRING_FILE: short})).error
    good = KeyRing.generate()
    parsed = ring_of(_secret({KEYRING_FILE: base64.b64encode(good.to_document()).decode()}))
    assert parsed.ring is not None and parsed.ring.kids == good.kids and parsed.error == ""


def test_the_metric_names_are_the_contract() -> None:
    m = OperatorMetrics()
    m.set_phase("ns", "ring", "Staging")
    m.set_replicas("ns", "ring", 3, 2)
    m.rotations.labels("ns", "ring", "complete").inc()
    m.phase_duration.labels("staging").observe(0.5)
    m.key_age.labels("ns", "ring").set(1)
    m.stalls.labels("ns", "ring").inc()
    m.stalled.labels("ns", "ring").set(1)
    names = {s.name for metric in m.registry.collect() for s in metric.samples}
    assert {
        "mcpfleet_operator_rotations_total",
        "mcpfleet_operator_phase_duration_seconds_bucket",
        "mcpfleet_operator_rotation_phase",
        "mcpfleet_operator_key_age_seconds",
        "mcpfleet_operator_replicas",
        "mcpfleet_operator_stalls_total",
        "mcpfleet_operator_stalled",
    } <= names
    value = m.registry.get_sample_value
    assert (
        value(
            "mcpfleet_operator_rotation_phase",
            {"namespace": "ns", "keyring": "ring", "phase": "staging"},
        )
        == 1
    )
    assert (
        value(
            "mcpfleet_operator_rotation_phase",
            {"namespace": "ns", "keyring": "ring", "phase": "idle"},
        )
        == 0
    )
    assert (
        value(
            "mcpfleet_operator_replicas",
            {"namespace": "ns", "keyring": "ring", "state": "converged"},
        )
        == 2
    )


def test_each_rotation_step_exports_the_abandoned_tasks_counter_at_zero_first() -> None:
    # Prometheus's increase() sees no increase in a series born at its first value:
    # McpfleetKeyRotationAbandonedTasks needs the counter at 0 before the retire step.
    m = OperatorMetrics()
    value = m.registry.get_sample_value
    labels = {"namespace": "ns", "keyring": "ring"}
    assert value("mcpfleet_operator_tasks_abandoned_total", labels) is None
    m.set_old_key_tasks("ns", "ring", 0)
    assert value("mcpfleet_operator_tasks_abandoned_total", labels) == 0
    m.set_old_key_tasks("ns", "ring", 7)
    assert value("mcpfleet_operator_old_key_tasks", labels) == 7
    assert value("mcpfleet_operator_tasks_abandoned_total", labels) == 0
    m.forget_keyring("ns", "ring")
    assert value("mcpfleet_operator_old_key_tasks", labels) is None
    assert value("mcpfleet_operator_tasks_abandoned_total", labels) == 0, "counters are kept"


def test_rotate_wait_prints_phase_convergence_lagging_and_stalls() -> None:
    from mcpfleet_operator.cli import progress_line

    assert progress_line({}) == "Pending"
    line = progress_line(
        {
            "phase": "Staging",
            "convergence": "2/3",
            "newKid": "abcd0123",
            "lagging": ["replica-1"],
            "stalled": True,
            "message": "waiting",
        }
    )
    assert line == "Staging converged 2/3 new kid abcd0123 lagging: replica-1 STALLED - waiting"


def test_rotate_status_prints_the_ring_and_its_history(capsys: pytest.CaptureFixture[str]) -> None:
    from mcpfleet_operator.cli import print_status

    keyring = {
        "metadata": {"name": "keys", "namespace": "ns"},
        "status": {
            "phase": "Ready",
            "kids": ["bbbb0002"],
            "ringPhase": "stable",
            "replicas": {"desired": 3, "converged": 3, "lagging": []},
        },
    }
    history = [
        {
            "metadata": {"name": "keys-1", "creationTimestamp": "2026-11-30T08:00:00Z"},
            "spec": {"keyRing": "keys", "mode": "Emergency", "reason": "leak"},
            "status": {
                "phase": "Complete",
                "oldKid": "aaaa0001",
                "newKid": "bbbb0002",
                "phaseTimestamps": {"Complete": "2026-11-30T08:00:05.000Z"},
            },
        }
    ]
    print_status(keyring, history)
    out = capsys.readouterr().out
    assert "keyring ns/keys: Ready" in out
    assert "kids: bbbb0002 (first seals; ring stable)" in out
    assert "replicas: 3/3 converged" in out
    assert "keys-1: Complete aaaa0001 -> bbbb0002 (Emergency)" in out
    assert "ended 2026-11-30T08:00:05.000Z - leak" in out


class _FakeCore:
    """Enough of CoreV1Api for secretring: a Secret store with resourceVersion checks."""

    def __init__(self, secret: k8s.V1Secret) -> None:
        self.secret = secret
        self.writes: list[str] = []

    def read_namespaced_secret(self, name: str, namespace: str) -> k8s.V1Secret:
        return k8s.V1Secret(
            metadata=k8s.V1ObjectMeta(
                name=name,
                namespace=namespace,
                resource_version=self.secret.metadata.resource_version,
                annotations=dict(self.secret.metadata.annotations or {}),
            ),
            data=dict(self.secret.data or {}),
        )

    def replace_namespaced_secret(
        self, name: str, namespace: str, body: k8s.V1Secret
    ) -> k8s.V1Secret:
        from kubernetes.client.exceptions import ApiException

        if body.metadata.resource_version != self.secret.metadata.resource_version:
            raise ApiException(status=409, reason="Conflict")
        self.writes.append(body.metadata.resource_version)
        version = str(int(body.metadata.resource_version) + 1)
        body.metadata.resource_version = version
        self.secret = body
        return self.read_namespaced_secret(name, namespace)


def test_every_secret_write_carries_the_version_it_read_and_a_stale_one_is_refused() -> None:
    from mcpfleet_operator import secretring

    ring = KeyRing.generate()
    store = _FakeCore(
        k8s.V1Secret(
            metadata=k8s.V1ObjectMeta(name="s", namespace="ns", resource_version="7"),
            data={KEYRING_FILE: base64.b64encode(ring.to_document()).decode()},
        )
    )
    core: Any = store
    stale = secretring.read(core, "ns", "s")
    current = secretring.read(core, "ns", "s")
    assert current is not None
    staged = secretring.write_step(core, current, "stage", owner=("rot", "uid-1")).ring
    assert store.writes == ["7"] and staged is not None and staged.kids[0] == ring.kids[0]
    now = secretring.read(core, "ns", "s")
    assert now is not None and now.owner == ("rot", "uid-1") and now.view().phase == "staged"
    assert stale is not None and stale.ring is not None
    with pytest.raises(secretring.SecretConflict):
        secretring.replace(core, stale, stale.ring.stage())
    assert store.writes == ["7"], "the stale write changed nothing"
    with pytest.raises(ValueError, match="unknown rotation step"):
        secretring.write_step(core, current, "explode")


def test_the_keyrotation_manifest_is_labelled_and_named_one_way() -> None:
    named = rotation_manifest("keys", name="keys-1", mode="Emergency", reason="leak")
    assert named == {
        "apiVersion": "mcpfleet.dev/v1alpha1",
        "kind": "KeyRotation",
        "metadata": {"name": "keys-1", "labels": {KEYRING_REF_LABEL: "keys"}},
        "spec": {"keyRing": "keys", "mode": "Emergency", "reason": "leak"},
    }
    generated = rotation_manifest("keys", generate_name="keys-")
    assert generated["metadata"]["generateName"] == "keys-" and "name" not in generated["metadata"]
    assert "reason" not in generated["spec"] and generated["spec"]["mode"] == "Normal"
    with pytest.raises(ValueError, match="exactly one"):
        rotation_manifest("keys")
    with pytest.raises(ValueError, match="exactly one"):
        rotation_manifest("keys", name="a", generate_name="b")


def test_a_step_write_refuses_a_secret_without_a_ring() -> None:
    from mcpfleet.keys.ring import KeyRingError
    from mcpfleet_operator import secretring

    empty = secretring.ring_of(k8s.V1Secret(metadata=k8s.V1ObjectMeta(name="s"), data={}))
    with pytest.raises(KeyRingError, match=r"no keyring\.json"):
        secretring.write_step(object(), empty, "stage")  # type: ignore[arg-type]


def test_a_rotation_that_ends_is_counted_by_result_and_its_keyring_goes_idle() -> None:
    m = OperatorMetrics()
    m.set_phase("ns", "ring", "Waiting")
    m.rotation_ended("ns", "ring", "failed")
    value = m.registry.get_sample_value
    labels = {"namespace": "ns", "keyring": "ring"}
    assert value("mcpfleet_operator_rotations_total", {**labels, "result": "failed"}) == 1
    assert value("mcpfleet_operator_rotation_phase", {**labels, "phase": "idle"}) == 1
    assert value("mcpfleet_operator_rotation_phase", {**labels, "phase": "waiting"}) == 0


def test_a_keyrings_first_phase_exports_its_rotation_counters_at_zero() -> None:
    # McpfleetKeyRotationFailed is increase(...{result="failed"}[1h]) > 0: a series
    # born at 1 by the first failure shows no increase, so the alert would miss it.
    m = OperatorMetrics()
    value = m.registry.get_sample_value
    labels = {"namespace": "ns", "keyring": "ring", "result": "failed"}
    assert value("mcpfleet_operator_rotations_total", labels) is None
    m.set_phase("ns", "ring", "Staging")
    for result in ("complete", "failed", "aborted"):
        assert value("mcpfleet_operator_rotations_total", {**labels, "result": result}) == 0
    m.rotation_ended("ns", "ring", "failed")
    assert value("mcpfleet_operator_rotations_total", labels) == 1
