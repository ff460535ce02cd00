"""Regenerate the flag tables of docs/flags.md from mcpfleet.config.SETTINGS.

    .venv/bin/python docs/flags-table.py           # rewrites the tables in place (make flags-docs)
    .venv/bin/python docs/flags-table.py --check   # exit 1 if a table of the page is stale

One table per process (``mcpfleet serve``, ``mcpfleet router``), a row per flag
in ``--help``'s order: the flag, its default, the environment variable the
process falls back to, the chart value that sets it, and its help line. The
unit tests run ``--check``: the committed page is exactly what the tables make.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from mcpfleet.config import SETTINGS, Flags, RedisFlags, Setting

PAGE = Path(__file__).resolve().parent / "flags.md"
HEADER = "| flag (`mcpfleet {command}`) | default | environment | chart value | what |"
#: The Redis flags' row: they are declared once for every process (docs/redis.md).
REDIS_ROW = (
    "| `--redis URL`, `--redis-password-file FILE`, `--redis-ca-file FILE`,"
    " `--redis-cert-file FILE`, `--redis-key-file FILE` | {required} |  | `redis.*` |"
    " {url_help}: the URL and the files of [redis.md](redis.md) |"
)


def shown(setting: Setting, default: Any) -> str:
    """A default as the table shows it: a number as written, a word in code, nothing as blank."""
    if setting.required:
        return "(required)"
    if setting.kind in ("switch", "off-switch"):  # given, the flag turns its field over
        return "off" if bool(default) == (setting.kind == "off-switch") else "on"
    if default is None or default in ("", [], ()):
        return ""
    if isinstance(default, float):
        return f"{default:g}"
    if isinstance(default, int):
        return str(default)
    return f"`{default}`"


def what(setting: Setting, default: Any) -> str:
    """The help line, less the default it names (the table has a column for it)."""
    text = setting.help_line(default)
    for tail in (
        f" (default {default})",
        f" (default {default:g})" if isinstance(default, float) else "",
    ):
        if tail and text.endswith(tail):
            text = text.removesuffix(tail)
    return text.replace("|", "\\|")


def chart(setting: Setting) -> str:
    """The chart value, and why its default is not the flag's where it is not."""
    if not setting.chart:
        return ""
    differs = f" (not the default: {setting.chart_differs})" if setting.chart_differs else ""
    return f"`{setting.chart}`{differs}"


def row(setting: Setting, flags: Flags) -> str:
    default = setting.default_in(flags.config)
    cells = [
        f"`{setting.flag}`" + (" (repeatable)" if setting.kind == "repeat" else ""),
        shown(setting, default),
        f"`{setting.env}`" if setting.env else "",
        chart(setting),
        what(setting, default),
    ]
    return "| " + " | ".join(cells) + " |"


def table(command: str, flags: Flags) -> str:
    lines = [HEADER.format(command=command), "|---|---|---|---|---|"]
    for item in flags.rows:
        if isinstance(item, RedisFlags):
            required = "(required)" if item.required else ""
            lines.append(REDIS_ROW.format(required=required, url_help=item.url_help))
        else:
            lines.append(row(item, flags))
    return "\n".join(lines)


def markers(command: str) -> tuple[str, str]:
    return f"<!-- flags:{command}:begin -->", f"<!-- flags:{command}:end -->"


def render(page: str) -> str:
    """``page`` with each process's table between its markers made again."""
    for command, flags in SETTINGS.items():
        begin, end = markers(command)
        head, found, rest = page.partition(begin)
        if not found or end not in rest:
            raise SystemExit(f"{PAGE.name}: no {begin} ... {end}")
        page = f"{head}{begin}\n{table(command, flags)}\n{end}{rest.split(end, 1)[1]}"
    return page


def main(argv: list[str]) -> int:
    current = PAGE.read_text()
    made = render(current)
    if "--check" in argv:
        if made != current:
            print(f"{PAGE} is stale: run make flags-docs", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(made)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
