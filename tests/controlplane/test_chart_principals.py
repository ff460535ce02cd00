"""Who an unauthenticated user counts as, as the chart renders it (the real helm).

The replicas read a client's address ``--trusted-hops`` entries left of their
peer in ``X-Forwarded-For``. The router is one hop; the Ingress the chart makes
(``router.ingress``) is another, so with it on and ``trustedProxyHops`` unset the
chart counts it: otherwise every unauthenticated user behind the Ingress would
be the ingress controller's address, one principal. NOTES.txt says which
principal they count as.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from fleetkit.cluster import chartkit
from fleetkit.cluster.helm import Helm, HelmError

pytestmark = pytest.mark.timeout(120)

INGRESS = "router.ingress.enabled=true"


def _trusted_hops(helm: Helm, *args: str) -> int:
    docs: list[dict[str, Any]] = chartkit.objects(chartkit.render(helm, *args))
    (server,) = [
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-server")
    ]
    (container,) = server["spec"]["template"]["spec"]["containers"]
    (flag,) = [a for a in container["args"] if a.startswith("--trusted-hops=")]
    return int(flag.split("=", 1)[1])


@pytest.fixture(scope="module")
def notes_chart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The chart again, with NOTES.txt also rendered into a ConfigMap (`helm template`
    leaves NOTES.txt out, and `helm install --dry-run` needs a cluster): the same
    template text, through `tpl` with the release's context."""
    chart = tmp_path_factory.mktemp("notes") / "mcpfleet"
    shutil.copytree(chartkit.CHART, chart)
    shutil.copy(chart / "templates" / "NOTES.txt", chart / "notes.tmpl")
    (chart / "templates" / "notes-rendered.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes-rendered\n"
        'data:\n  notes: {{ tpl (.Files.Get "notes.tmpl") . | quote }}\n'
    )
    return chart


def _notes(helm: Helm, chart: Path, *args: str) -> str:
    out = helm.run(
        "template",
        "mcpfleet",
        str(chart),
        "-n",
        "mcpfleet",
        "--show-only",
        "templates/notes-rendered.yaml",
        *args,
    ).stdout
    (doc,) = chartkit.objects(out)
    notes: str = doc["data"]["notes"]
    return notes


def test_the_router_is_the_one_trusted_hop_without_an_ingress(helm: Helm) -> None:
    assert _trusted_hops(helm) == 1


def test_with_the_ingress_on_its_hop_is_counted(helm: Helm) -> None:
    assert _trusted_hops(helm, "--set", INGRESS) == 2


@pytest.mark.parametrize("given", [0, 1, 3])
def test_an_explicit_trusted_proxy_hops_wins_with_or_without_the_ingress(
    helm: Helm, given: int
) -> None:
    value = f"server.limits.trustedProxyHops={given}"
    assert _trusted_hops(helm, "--set", value) == 1 + given
    assert _trusted_hops(helm, "--set", f"{value},{INGRESS}") == 1 + given


def test_every_ingress_scenario_counts_the_ingress_hop(helm: Helm) -> None:
    scenarios = [
        p
        for p in (*chartkit.CI_VALUES, *chartkit.EXAMPLE_VALUES)
        if "ingress:\n    enabled: true" in p.read_text()
    ]
    assert scenarios, "no values file with the Ingress on"
    for path in scenarios:
        assert _trusted_hops(helm, "-f", str(path)) == 2, path.name


def test_a_negative_trusted_proxy_hops_is_refused(helm: Helm) -> None:
    with pytest.raises(HelmError, match="trustedProxyHops"):
        chartkit.render(helm, "--set", "server.limits.trustedProxyHops=-1")


def test_the_notes_name_the_principal_of_unauthenticated_users(
    helm: Helm, notes_chart: Path
) -> None:
    plain = _notes(helm, notes_chart)
    assert "the address of the router's peer" in plain
    assert "WARNING" not in plain

    behind = _notes(helm, notes_chart, "--set", INGRESS)
    assert "each client's own address, as the outermost trusted proxy" in behind
    assert "trustedProxyHops=1, counted for the Ingress" in behind

    uncounted = _notes(helm, notes_chart, "--set", f"{INGRESS},server.limits.trustedProxyHops=0")
    assert "every\n  unauthenticated user behind it is ONE principal" in uncounted

    shared = _notes(helm, notes_chart, "--set", "server.limits.anonymousPrincipal=shared")
    assert "every unauthenticated user is ONE principal" in shared
