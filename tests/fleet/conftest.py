"""Fleet-tier fixtures: real redis-server, replica and router processes on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fleetkit.fleet import diagnostics, local_fleet
from mcpfleet.server.devfleet import LocalFleet

_ACTIVE: list[LocalFleet] = []


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFleet]:
    """Three replicas behind one router, shared by a module's scenarios."""
    with local_fleet(tmp_path_factory.mktemp("fleet")) as lf:
        _ACTIVE.append(lf)
        yield lf
        _ACTIVE.remove(lf)


@pytest.fixture(autouse=True)
def _print_diagnostics_on_failure(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        for lf in _ACTIVE:
            print(diagnostics(lf))


def track(lf: LocalFleet) -> LocalFleet:
    """Register a test's own fleet for failure diagnostics."""
    _ACTIVE.append(lf)
    return lf


def untrack(lf: LocalFleet) -> None:
    if lf in _ACTIVE:
        _ACTIVE.remove(lf)
