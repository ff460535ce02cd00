"""Fleet-tier fixtures: real redis-server, replica and router processes on 127.0.0.1."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import httpx
import pytest

from fleetkit.failure import explain_on_failure
from fleetkit.fleet import diagnostics, local_fleet
from mcpfleet.dev.fleet import LocalFleet

_ACTIVE: list[LocalFleet] = []


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFleet]:
    """Three replicas behind one router, shared by a module's scenarios."""
    with local_fleet(tmp_path_factory.mktemp("fleet")) as lf, shared(lf):
        yield lf


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    """One HTTP client for a module's scenarios (the MCP tasks tests', test_tasks*.py)."""
    with httpx.Client(timeout=15) as client:
        yield client


@pytest.fixture(autouse=True)
def _print_diagnostics_on_failure(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    explain_on_failure(request, *[lambda lf=lf: diagnostics(lf) for lf in _ACTIVE])


@contextlib.contextmanager
def shared(lf: LocalFleet) -> Iterator[LocalFleet]:
    """For a module-scoped fleet: print its diagnostics after any failing test of the module."""
    _ACTIVE.append(lf)
    try:
        yield lf
    finally:
        _ACTIVE.remove(lf)


@contextlib.contextmanager
def watched(request: pytest.FixtureRequest, lf: LocalFleet) -> Iterator[LocalFleet]:
    """For a test's own fleet: print its diagnostics if the test failed, before teardown."""
    yield lf
    explain_on_failure(request, lambda: diagnostics(lf))
