"""The end-to-end tier: the chart installed with helm on a real cluster.

The provider (``--cluster-provider``, or ``$MCPFLEET_E2E_PROVIDER``; default
``local``) says where: ``local`` is this machine's node (root), ``kind`` a
kind cluster (Docker). A provider that cannot run here skips the tier with
its reason; with ``CI=true`` the ``local`` provider fails instead (the CI
machines run it as root), while ``kind`` still skips where no Docker engine
answers (GitHub Actions runs it, see .github/workflows/).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from fleetkit.providers import Cluster, cluster, unavailable


@pytest.fixture(scope="module")
def e2e_cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    provider = request.config.getoption("--cluster-provider")
    reason = unavailable(provider)
    if reason:
        message = f"cluster provider {provider} cannot run here: {reason}"
        if provider == "local" and os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and {message}", pytrace=False)
        pytest.skip(message)
    with cluster(provider, tmp_path_factory.mktemp(f"e2e-{provider}")) as started:
        yield started
