"""Shared test configuration: tier markers are applied by folder."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from fleetkit import faulttable

_TIERS = {
    "unit": "unit",
    "packaging": "packaging",
    "fleet": "fleet",
    "controlplane": "controlplane",
    "kind": "kind",
    "conformance": "conformance",
    "node": "node",
    "e2e": "e2e",
    "faults": "faults",
    "rigs": "rigs",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cluster-provider",
        choices=("local", "kind"),
        default=os.environ.get("E2E_PROVIDER", "kind"),
        help="where the e2e tier installs the chart: kind (default; $E2E_PROVIDER, as make"
        " test and make test-e2e take it) or local (this machine's node, root)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        folder = Path(str(item.fspath)).parent.name
        tier = _TIERS.get(folder)
        if tier is not None and not any(m.name == tier for m in item.iter_markers()):
            item.add_marker(getattr(pytest.mark, tier))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """Keep each phase's report on the item, so fixtures can print diagnostics on failure."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


# The fault tier's table (fleetkit.faulttable), printed once for the run: under
# pytest-xdist each worker hands its rows to the controller as it finishes,
# and the controller, which loads this conftest but not tests/faults/conftest.py,
# prints and writes them all.
def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        faulttable.export_rows(workeroutput)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    faulttable.import_rows(getattr(node, "workeroutput", {}))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if hasattr(terminalreporter.config, "workerinput") or not faulttable.TABLE.rows:
        return
    terminalreporter.section("fault tier")
    terminalreporter.write_line(faulttable.TABLE.render())
    faulttable.TABLE.write()
