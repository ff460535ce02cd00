"""The fault tier: real processes, real signals (SIGKILL, SIGSTOP), side effects counted.

Each test records one row of the tier's table with the ``fault_table`` fixture
(:mod:`fleetkit.faulttable`): the fault, how many attempts, how many double
runs, how many requests were lost, and the worst time a client waited for its
answer. The table is printed at the end of the run and written to
``.cache/faults/table.json`` (the root conftest does both, once for the run,
with or without pytest-xdist workers).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fleetkit.failure import explain_on_failure
from fleetkit.faulttable import TABLE, FaultTable
from fleetkit.fleet import diagnostics
from mcpfleet.dev.fleet import LocalFleet

_ACTIVE: list[LocalFleet] = []


@pytest.fixture(scope="session")
def fault_table() -> FaultTable:
    return TABLE


@pytest.fixture
def watch_fleet() -> Iterator[list[LocalFleet]]:
    """Fleets appended here have their diagnostics printed if the test fails."""
    yield _ACTIVE
    _ACTIVE.clear()


@pytest.fixture(autouse=True)
def _print_diagnostics_on_failure(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    explain_on_failure(request, *[lambda lf=lf: diagnostics(lf) for lf in _ACTIVE])
