"""Fixtures of the control-plane tier: one real etcd + kube-apiserver per session.

The building blocks live in :mod:`fleetkit.cluster.controlplane` so that any other
tier's conftest can build the same fixtures.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from fleetkit.cluster import chartkit
from fleetkit.cluster.controlplane import (
    ControlPlane,
    require_tools,
    session_control_plane,
    temporary_namespace,
)
from fleetkit.cluster.helm import Helm

from .chartrender import SCENARIOS

_reports = pytest.StashKey[dict[str, pytest.TestReport]]()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    item.stash.setdefault(_reports, {})[report.when] = report
    return report


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """etcd + kube-apiserver (+ kube-controller-manager when built), started once."""
    yield from session_control_plane(tmp_path_factory.mktemp("controlplane"))


@pytest.fixture(autouse=True)
def _control_plane_logs_on_failure(request: pytest.FixtureRequest) -> Iterator[None]:
    """When a test that used the control plane fails, show its components' log tails."""
    yield
    reports = request.node.stash.get(_reports, {})
    # funcargs holds the plane only if it started (a failed start printed its logs).
    plane = getattr(request.node, "funcargs", {}).get("control_plane")
    if isinstance(plane, ControlPlane) and any(r.failed for r in reports.values()):
        print("\n===== control plane logs =====")
        plane.print_logs()


@pytest.fixture(scope="session")
def admin_api(control_plane: ControlPlane) -> k8s.ApiClient:
    """An API client acting as a member of system:masters."""
    return control_plane.api_client()


@pytest.fixture
def namespace(admin_api: k8s.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace for one test, named after it, deleted afterwards."""
    with temporary_namespace(admin_api, request.node.name.removeprefix("test_")) as name:
        yield name


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    """The built helm, with no cluster (``helm template``, ``helm lint``)."""
    bin_dir = require_tools(("helm",))
    return Helm(bin_dir / "helm", tmp_path_factory.mktemp("helm"))


@pytest.fixture(scope="session")
def cluster_helm(control_plane: ControlPlane) -> Helm:
    """The built helm talking to the session's API server as admin."""
    return control_plane.helm()


# The chart-render tests' (test_chart_render_*.py): made once for all their modules.


@pytest.fixture(scope="session")
def schemas() -> Path:
    require_tools(("kubeconform",))
    return chartkit.kubeconform_schemas()


@pytest.fixture(scope="session")
def rendered(helm: Helm) -> dict[tuple[str, bool], list[dict[str, Any]]]:
    """Every scenario's objects, with (True) and without (False) monitoring.coreos.com/v1."""
    out = {}
    for name, path in SCENARIOS.items():
        for monitoring in (False, True):
            extra = ["--api-versions", chartkit.MONITORING_API] if monitoring else []
            out[name, monitoring] = chartkit.objects(chartkit.render(helm, "-f", str(path), *extra))
    return out
