"""The table every part of ``make bench`` prints: rows of measure, value, ratio, note."""

from __future__ import annotations

#: One printed line: the measure, its value, its ratio to what it is judged on, a note.
Row = tuple[str, str, str, str]


def render(rows: list[Row]) -> str:
    head: Row = ("measure", "value", "ratio", "note")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(4)]
    line = "+".join("-" * (w + 2) for w in widths)
    out = [" | ".join(c.ljust(w) for c, w in zip(head, widths, strict=True)), line]
    out += [" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(out)
