"""deploy/kind/up.sh as the README tells a newcomer to run it, on the tier's kind cluster.

The script runs unchanged (``KIND_CLUSTER`` names the tier's cluster, so no
second cluster is made): it finds the cluster through ``make kind-up``, prints
the ``export KUBECONFIG=...`` line first, installs the chart and passes its
``helm test``, whose Pod the chart deletes once it succeeded. Its counterpart,
``deploy/kind/down.sh``, is how the tier deletes the cluster at the end
(:func:`fleetkit.cluster.providers.kind_cluster`), checked there to exit 0 and leave the
machine as it found it.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

from fleetkit.cluster.controlplane import tools_bin_dir
from fleetkit.cluster.providers import UP_SCRIPT, Cluster

NAMESPACE = "kind-up-sh"
RELEASE = "upsh"


@pytest.fixture
def kind_only(e2e_cluster: Cluster) -> Iterator[Cluster]:
    if e2e_cluster.provider != "kind":
        pytest.skip("deploy/kind/up.sh makes a kind cluster: the kind provider runs it")
    yield e2e_cluster
    subprocess.run(
        [str(tools_bin_dir() / "helm"), "uninstall", RELEASE, "--namespace", NAMESPACE, "--wait"],
        env={**os.environ, "KUBECONFIG": str(e2e_cluster.kubeconfig)},
        capture_output=True,
        timeout=300,
        check=False,
    )
    subprocess.run(
        [str(tools_bin_dir() / "kubectl"), "delete", "namespace", NAMESPACE, "--wait=false"],
        env={**os.environ, "KUBECONFIG": str(e2e_cluster.kubeconfig)},
        capture_output=True,
        timeout=120,
        check=False,
    )


@pytest.mark.timeout(900)
def test_up_sh_prints_the_kubeconfig_first_installs_the_chart_and_passes_helm_test(
    kind_only: Cluster,
) -> None:
    env = {
        **os.environ,
        "KIND_CLUSTER": kind_only.kind_name,
        "NAMESPACE": NAMESPACE,
        "RELEASE": RELEASE,
        "HELM": str(tools_bin_dir() / "helm"),
    }
    done = subprocess.run(
        ["bash", str(UP_SCRIPT)], env=env, capture_output=True, text=True, timeout=880, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"export KUBECONFIG={kind_only.kubeconfig}", done.stdout
    assert f"mcpfleet is up on kind cluster {kind_only.kind_name}." in done.stdout
    assert "kubectl -n kind-up-sh port-forward service/upsh-mcpfleet-router 8000:80" in done.stdout
    # helm test ran and succeeded (its Pod is gone, by the chart's hook delete policy).
    assert "kind-up: helm test upsh" in done.stderr
    assert "Phase:          Succeeded" in done.stdout, done.stdout
