"""Regenerate the values table of charts/mcpfleet/README.md from values.yaml.

    python3 charts/mcpfleet/values-table.py           # rewrites the table in place
    python3 charts/mcpfleet/values-table.py --check   # exit 1 if the README's table is stale

Each value's description is the comment block above it (or above its nearest
documented parent); its default is what values.yaml holds. The chart's tests
run ``--check``: the committed table is exactly what values.yaml makes.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
BEGIN, END = "<!-- values:begin -->", "<!-- values:end -->"


def comments(text: str) -> dict[str, str]:
    """The comment block above each key, by dotted path."""
    out: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    block: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            if not stripped.startswith("# yaml-language-server"):
                block.append(stripped.lstrip("#").strip())
            continue
        m = re.match(r"^(\s*)([A-Za-z0-9_]+):", line)
        if not m:
            if not stripped:
                block = []
            continue
        indent, key = len(m.group(1)), m.group(2)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([k for _, k in stack] + [key])
        stack.append((indent, key))
        if block:
            out[path] = " ".join(block)
        block = []
    return out


def leaves(values: dict, prefix: str = "") -> list[tuple[str, object]]:
    out = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out += leaves(value, path + ".")
        else:
            out.append((path, value))
    return out


def table() -> str:
    text = (HERE / "values.yaml").read_text()
    docs = comments(text)
    rows = ["| value | default | description |", "|---|---|---|"]
    for path, default in leaves(yaml.safe_load(text)):
        parts = path.split(".")
        desc = next(
            (
                docs[".".join(parts[:i])]
                for i in range(len(parts), 0, -1)
                if ".".join(parts[:i]) in docs
            ),
            "",
        )
        shown = json.dumps(default).replace("|", "\\|")
        desc = desc.replace("|", "\\|")
        rows.append(f"| `{path}` | `{shown}` | {desc} |")
    return "\n".join(rows)


def regenerated(text: str) -> str:
    """The README ``text`` with its values table made anew from values.yaml."""
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:start] + "\n" + table() + "\n" + text[end:]


def main(argv: list[str]) -> int:
    readme = HERE / "README.md"
    text = readme.read_text()
    fresh = regenerated(text)
    if argv == ["--check"]:
        if fresh != text:
            print("charts/mcpfleet/README.md: the values table is stale; run values-table.py")
            return 1
        return 0
    if argv:
        print("usage: values-table.py [--check]")
        return 2
    readme.write_text(fresh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
