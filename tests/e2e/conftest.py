"""The end-to-end tier: the chart installed with helm on a real cluster.

The provider (``--cluster-provider``, or ``$E2E_PROVIDER``; default ``kind``,
as in ``make test`` and ``make test-e2e``) says where: ``local`` is this
machine's node (root), one per module; ``kind`` a kind cluster of three nodes
(Docker, or podman as root), one for the whole session: making one costs
minutes. A provider that cannot run here skips the tier with its reason; with
``CI=true`` it fails instead (the CI machines run both).

The modules that take a node away (``TAKES_A_NODE_AWAY = True``) run last, so
the others always see every node; of them, those that bring it back Ready
(``BRINGS_THE_NODE_BACK = True``) run before those that leave it gone.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetkit.cluster.chartfleet import ChartFleet
from fleetkit.cluster.providers import Cluster, cluster, unavailable
from fleetkit.failure import explain_on_failure

HERE = Path(__file__).resolve().parent


def node_order(module: object) -> int:
    """Where a module's tests go: 0 with every node, 1 taking a node away and bringing
    it back, 2 taking it away for good."""
    if not getattr(module, "TAKES_A_NODE_AWAY", False):
        return 0
    return 1 if getattr(module, "BRINGS_THE_NODE_BACK", False) else 2


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """This tier's modules that take a node away go after its others."""
    ours = [i for i, item in enumerate(items) if Path(str(item.fspath)).parent == HERE]
    if not ours or ours[-1] + 1 - ours[0] != len(ours):
        return  # not collected as one block: leave the order alone

    def order(item: pytest.Item) -> int:
        return node_order(getattr(item, "module", None))

    lo, hi = ours[0], ours[-1] + 1
    items[lo:hi] = sorted(items[lo:hi], key=order)  # stable within each group


def _started(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    provider = request.config.getoption("--cluster-provider")
    reason = unavailable(provider)
    if reason:
        message = f"cluster provider {provider} cannot run here: {reason}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and {message}", pytrace=False)
        pytest.skip(message)
    workdir: Path = tmp_path_factory.mktemp(f"e2e-{provider}")
    with cluster(provider, workdir) as started:
        yield started


@pytest.fixture(scope="session")
def _kind_session(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    yield from _started(request, tmp_path_factory)


@pytest.fixture(scope="module")
def e2e_cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    if request.config.getoption("--cluster-provider") == "kind":
        yield request.getfixturevalue("_kind_session")
        return
    yield from _started(request, tmp_path_factory)


@pytest.fixture(autouse=True)
def _diagnostics_on_failure(request: pytest.FixtureRequest) -> Iterator[None]:
    """A failed test prints what its releases' pods and the cluster's nodes say."""
    yield
    fleets = [f for f in request.node.funcargs.values() if isinstance(f, ChartFleet)]
    explainers = [fleet.diagnostics for fleet in fleets]
    if fleets:
        explainers.append(fleets[0].cluster.diagnostics)
    explain_on_failure(request, *explainers)
