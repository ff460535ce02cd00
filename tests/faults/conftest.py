"""The fault tier: real processes, real signals (SIGKILL, SIGSTOP), side effects counted.

Each test records one row of the tier's table with the ``fault_table`` fixture:
the fault, how many attempts, how many double runs (a side effect that ran
twice), how many requests were lost (no answer, or an answer that is not one
of the documented ones), and the worst time a client waited for its answer.
The table is printed at the end of the run and written to
``.cache/faults/table.json`` (``make bench`` may reuse it).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest

from fleetkit.failure import explain_on_failure
from fleetkit.fleet import diagnostics
from mcpfleet.dev.fleet import LocalFleet

ROOT = Path(__file__).resolve().parents[2]
TABLE_FILE = ROOT / ".cache" / "faults" / "table.json"


@dataclass
class FaultRow:
    """One fault's figures, as the tier's table prints them."""

    fault: str
    attempts: int = 0
    double_runs: int = 0
    lost: int = 0
    worst_seconds: float = 0.0
    notes: str = ""

    def answered(self, started: float) -> float:
        """Count one answer that took from ``started`` (time.monotonic) until now."""
        took = time.monotonic() - started
        self.worst_seconds = max(self.worst_seconds, took)
        return took


@dataclass
class FaultTable:
    rows: list[FaultRow] = field(default_factory=list)

    def row(self, fault: str) -> FaultRow:
        row = FaultRow(fault)
        self.rows.append(row)
        return row

    def render(self) -> str:
        head = ("fault", "attempts", "double runs", "lost", "worst answer (s)", "notes")
        lines = [head] + [
            (
                r.fault,
                str(r.attempts),
                str(r.double_runs),
                str(r.lost),
                f"{r.worst_seconds:.2f}",
                r.notes,
            )
            for r in self.rows
        ]
        widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
        return "\n".join(
            "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
            for line in lines
        )


_TABLE = FaultTable()
_ACTIVE: list[LocalFleet] = []


@pytest.fixture(scope="session")
def fault_table() -> FaultTable:
    return _TABLE


@pytest.fixture
def watch_fleet() -> Iterator[list[LocalFleet]]:
    """Fleets appended here have their diagnostics printed if the test fails."""
    yield _ACTIVE
    _ACTIVE.clear()


@pytest.fixture(autouse=True)
def _print_diagnostics_on_failure(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    explain_on_failure(request, *[lambda lf=lf: diagnostics(lf) for lf in _ACTIVE])


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _TABLE.rows:
        return
    terminalreporter.section("fault tier")
    terminalreporter.write_line(_TABLE.render())
    TABLE_FILE.parent.mkdir(parents=True, exist_ok=True)
    TABLE_FILE.write_text(json.dumps([asdict(r) for r in _TABLE.rows], indent=2) + "\n")
