"""The fault tier's table: rows recorded in pytest-xdist workers reach the controller's table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fleetkit.faulttable import FaultTable, export_rows, import_rows


def worker_output(*faults: str) -> dict[str, Any]:
    """What a worker hands the controller after recording one row per fault."""
    table = FaultTable()
    for i, fault in enumerate(faults):
        row = table.row(fault)
        row.attempts, row.worst_seconds = i + 1, 0.5 * (i + 1)
    output: dict[str, Any] = {}
    export_rows(output, table)
    return output


def test_the_controller_prints_every_workers_rows(tmp_path: Path) -> None:
    controller = FaultTable()
    import_rows(worker_output("router SIGKILL", "Redis stall 3 s"), controller)
    import_rows(worker_output("Redis full"), controller)
    import_rows({}, controller)  # a worker that ran no fault test
    assert [r.fault for r in controller.rows] == ["router SIGKILL", "Redis stall 3 s", "Redis full"]
    lines = controller.render().splitlines()
    assert lines[0].split()[:2] == ["fault", "attempts"]
    assert lines[2].startswith("Redis stall 3 s") and "1.00" in lines[2]
    controller.write(tmp_path / "table.json")
    written = json.loads((tmp_path / "table.json").read_text())
    assert [(r["fault"], r["attempts"]) for r in written] == [
        ("router SIGKILL", 1),
        ("Redis stall 3 s", 2),
        ("Redis full", 1),
    ]
