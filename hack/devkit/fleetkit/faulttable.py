"""The fault tier's table: one row per fault, printed at the end of a run.

Each test of ``tests/faults`` records one row with the ``fault_table`` fixture:
the fault, how many attempts, how many double runs (a side effect that ran
twice), how many requests were lost (no answer, or an answer that is not one
of the documented ones), and the worst time a client waited for its answer.
The root conftest prints the table once, at the end of the run, and writes it
to ``.cache/faults/table.json``. When the run is spread over pytest-xdist
workers (``make test`` runs the tier on two), each worker holds the rows of
the tests it ran and hands them to the controller when it finishes
(:func:`export_rows`, :func:`import_rows`): the controller prints them all.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
TABLE_FILE = ROOT / ".cache" / "faults" / "table.json"

#: The key of a worker's rows in what it hands the controller (``workeroutput``).
WORKER_KEY = "fault_rows"


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

    def write(self, path: Path = TABLE_FILE) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps([asdict(r) for r in self.rows], indent=2) + "\n")


#: The run's table: in a worker, the rows of the tests it ran; in the
#: controller (or a run without workers), every row.
TABLE = FaultTable()


def export_rows(workeroutput: dict[str, Any], table: FaultTable = TABLE) -> None:
    """In a worker, at the end of its session: hand its rows to the controller."""
    workeroutput[WORKER_KEY] = [asdict(r) for r in table.rows]


def import_rows(workeroutput: dict[str, Any], table: FaultTable = TABLE) -> None:
    """In the controller, as a worker finishes: add the rows it handed over."""
    table.rows.extend(FaultRow(**row) for row in workeroutput.get(WORKER_KEY, []))
