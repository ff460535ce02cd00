"""The table every part of ``make bench`` prints: rows of measure, value, ratio, note."""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

#: One printed line: the measure, its value, its ratio to what it is judged on, a note.
Row = tuple[str, str, str, str]


def render(rows: list[Row]) -> str:
    head: Row = ("measure", "value", "ratio", "note")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(4)]
    line = "+".join("-" * (w + 2) for w in widths)
    out = [" | ".join(c.ljust(w) for c, w in zip(head, widths, strict=True)), line]
    out += [" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(out)


def part_main(title: str, doc: str | None, rows: Callable[[bool], list[Row]], quick: str) -> None:
    """The command line of a part of ``make bench`` run alone (``python -m benchkit.<part>``):
    ``--quick`` (what it cuts: ``quick``), a heading with the cores and the time, its table."""
    parser = argparse.ArgumentParser(description=doc)
    parser.add_argument("--quick", action="store_true", help=quick)
    args = parser.parse_args()
    print(f"mcpfleet {title}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M:%S')}")
    print(render(rows(args.quick)))
