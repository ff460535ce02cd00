"""The docs agree with the code and with each other.

- A default a page states for a flag (in a table with a ``default`` column, or as
  "`--flag` (default X)" in its prose) is the flag's declared default: for
  ``serve`` and ``router``, their tables' (mcpfleet.config.SETTINGS, defaults from
  the config dataclasses); for the other subcommands, their parsers'.
- A figure stated on several pages has one source, and every other page states the
  source's value: the conformance count (``tests/conformance/expected.json``), the
  Redis bytes of a session's route (docs/sizing.md's ``make bench-scale`` row), the
  warm and cold CI times (docs/testing.md).
- docs/sizing.md's ceilings are its own arithmetic, and every design entry of
  docs/performance.md names the command that measures it.

Every page of docs/ is read, those owned elsewhere included.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from mcpfleet import cli
from mcpfleet.config import SETTINGS

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))
README = ROOT / "README.md"

FENCE = re.compile(r"^```.*?^```\s*$", re.MULTILINE | re.DOTALL)
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]+")
COMMAND = re.compile(r"mcpfleet (serve|router|dev|operator|rotate|keys|demo)\b")
#: A number with its unit, as the pages write defaults: ``2 s``, ``16 KiB``, ``0.8``, ``80%``.
NUMBER = re.compile(r"(\d[\d,]*(?:\.\d+)?)\s*(KiB|MiB|ms|min|s|%)?(?![\w.])")
UNITS = {"": 1.0, "s": 1.0, "ms": 0.001, "min": 60.0, "KiB": 1024.0, "MiB": 1024.0**2, "%": 0.01}


def _flag_defaults() -> dict[str, dict[str, object]]:
    """Every subcommand's flags and their defaults: {flag: {command: default}}.

    ``serve``'s and ``router``'s come from their tables (mcpfleet.config.SETTINGS,
    the one source); the other subcommands' (and the Redis flags') from the parsers.
    """
    parser = cli.build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    out: dict[str, dict[str, object]] = {}
    for command, subparser in sub.choices.items():
        for action in subparser._actions:
            for flag in action.option_strings:
                out.setdefault(flag, {})[command] = action.default
    for command, flags in SETTINGS.items():
        for flag, default in flags.defaults().items():
            out[flag][command] = default
    return out


DEFAULTS = _flag_defaults()


def _numbers(text: str) -> list[float]:
    return [float(n.replace(",", "")) * UNITS[unit] for n, unit in NUMBER.findall(text)]


def _default_of(flag: str, command: str | None, where: str) -> float:
    """The code's default of ``flag`` (of ``command``, or the one all commands agree on)."""
    by_command = DEFAULTS.get(flag)
    assert by_command, f"{where}: {flag} is no flag of any mcpfleet command"
    if command is not None and command in by_command:
        values = {by_command[command]}
    else:
        # dev's limit flags have no default of their own (None: the replicas' applies).
        values = {v for v in by_command.values() if v is not None}
    assert len(values) == 1, f"{where}: {flag}'s default differs by command; name the command"
    (value,) = values
    assert isinstance(value, int | float), f"{where}: {flag} has no numeric default ({value!r})"
    return float(value)


def _table_claims(page: Path) -> list[tuple[str, str | None, str, str]]:
    """(flag, command, stated default, where) of every flag row of a table with a
    ``default`` column."""
    claims = []
    text = FENCE.sub("", page.read_text())
    header: list[str] | None = None
    for n, line in enumerate(text.splitlines(), 1):
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = [c.lower() for c in cells]
            continue
        if "default" not in header or set("".join(cells)) <= set("-: "):
            continue
        stated = cells[header.index("default")]
        others = [c for i, c in enumerate(cells) if i != header.index("default")]
        flagged = [c for c in others if FLAG.search(c) and not c.startswith("(")]
        if not flagged or not _numbers(stated):
            continue
        if stated.startswith("`"):
            continue  # a word or an address (`auto`, `127.0.0.1`), no number
        flags = FLAG.findall(flagged[0])
        command = COMMAND.search(flagged[0]) or COMMAND.search(" ".join(header))
        where = f"{page.name}:{n}"
        numbers = _numbers(stated)
        if len(flags) > 1:
            assert len(numbers) == len(flags), f"{where}: {len(flags)} flags, {stated!r}"
            claims += [
                (f, command and command.group(1), str(v), where)
                for f, v in zip(flags, numbers, strict=True)
            ]
        else:
            claims.append((flags[0], command and command.group(1), str(numbers[0]), where))
    return claims


PROSE = re.compile(
    r"`(?:mcpfleet (\w+) )?(--[a-z][a-z0-9-]+)[^`]*`[^`.;|]{0,40}?\(default \**([^)*;]+)"
)


def _prose_claims(page: Path) -> list[tuple[str, str | None, str, str]]:
    text = FENCE.sub("", page.read_text())
    claims = []
    for m in PROSE.finditer(text):
        numbers = _numbers(m.group(3))
        if numbers:
            line = text.count("\n", 0, m.start()) + 1
            claims.append((m.group(2), m.group(1), str(numbers[0]), f"{page.name}:{line}"))
    return claims


CLAIMS = [c for page in [*PAGES, README] for c in _table_claims(page) + _prose_claims(page)]


def test_the_docs_state_flag_defaults_to_check() -> None:
    """The readers find the tables and the prose (a reader that finds nothing passes)."""
    flags = {flag for flag, *_ in CLAIMS}
    assert {"--redis-deadline", "--max-header-bytes", "--limit-rounds", "--tasks-deadline"} <= flags


@pytest.mark.parametrize(("flag", "command", "stated", "where"), CLAIMS, ids=lambda v: str(v))
def test_every_default_a_page_states_is_the_codes(
    flag: str, command: str | None, stated: str, where: str
) -> None:
    assert float(stated) == pytest.approx(_default_of(flag, command, where)), (
        f"{where}: the page says {flag} defaults to {stated}"
    )


def test_a_wrong_default_in_a_table_is_seen(tmp_path: Path) -> None:
    page = tmp_path / "wrong.md"
    page.write_text("| flag | default |\n|---|---|\n| `--max-header-bytes` | 8 KiB |\n")
    ((flag, command, stated, where),) = _table_claims(page)
    assert float(stated) != _default_of(flag, command, where)


# --------------------------------------------------------------------------- one source per figure


def _passed(expected: Path) -> tuple[int, int]:
    checks = json.loads(expected.read_text())["checks"]
    return sum(v["fleet"] == "SUCCESS" for v in checks.values()), len(checks)


def test_the_conformance_page_states_expected_jsons_outcomes() -> None:
    expected = json.loads((ROOT / "tests" / "conformance" / "expected.json").read_text())
    checks = expected["checks"]
    marks = {"SUCCESS": "pass", "FAILURE": "FAIL", "WARNING": "warn", "INFO": "info"}
    page = (DOCS / "conformance.md").read_text()
    rows = {
        f"{m.group(1)}/{m.group(2)}": (m.group(3), m.group(4), m.group(5))
        for m in re.finditer(r"^(\S+) +(\S+) +(pass|FAIL|warn|info) +(\S+) +(\S+)$", page, re.M)
    }
    # The rotation column equals the fleet's (the tier fails otherwise).
    assert rows == {
        key: (marks[v["direct"]], marks[v["fleet"]], marks[v["fleet"]]) for key, v in checks.items()
    }
    for target in ("direct", "fleet"):
        passed = sum(v[target] == "SUCCESS" for v in checks.values())
        assert f"{target}: {passed} of {len(checks)} checks pass" in page


def test_every_count_of_conformance_checks_is_one_of_the_expected_sets() -> None:
    """Each "N of M checks pass" on any page is the suite's or the tasks suite's count."""
    sources = {
        _passed(ROOT / "tests" / "conformance" / "expected.json"),
        _passed(ROOT / "tests" / "conformance" / "expected_tasks.json"),
    }
    seen = 0
    for page in [README, *PAGES]:
        for a, b in re.findall(r"\b(\d+) of (\d+) checks pass", page.read_text()):
            seen += 1
            assert (int(a), int(b)) in sources, f"{page.name}: {a} of {b} checks pass"
    assert seen >= 4


def _route_bytes() -> int:
    """The source: docs/sizing.md's `make bench-scale` row, at its largest step."""
    sizing = (DOCS / "sizing.md").read_text()
    (row,) = re.findall(r"^\| Redis memory per route \| ([\d /]+) B", sizing, re.M)
    return int(row.split("/")[-1])


def test_every_page_states_the_redis_bytes_of_a_session_as_sizing_measures_them() -> None:
    source = _route_bytes()
    stated = {
        "performance.md": r"a session's route: (\d+) B|30\.7 KiB / (\d+) B",
        "faults.md": r"(\d+) B per live session",
        "sizing.md": r"Redis (\d+) B for its route|\(x (\d+) B\)",
    }
    for name, pattern in stated.items():
        text = (DOCS / name).read_text()
        found = [int(v) for m in re.finditer(pattern, text) for v in m.groups() if v]
        assert found, f"{name} no longer states the Redis bytes of a session where this reads"
        assert set(found) == {source}, f"{name} states {found} B; sizing.md measured {source} B"
    for page in [README, *PAGES]:
        for m in re.finditer(r"about \d+ bytes per (?:live )?session", page.read_text()):
            pytest.fail(f"{page.name}: {m.group(0)!r}; sizing.md measured {source} B")


def _ci_times() -> tuple[str, str]:
    """The source: docs/testing.md's whole run, warm and cold."""
    testing = (DOCS / "testing.md").read_text()
    (warm,) = re.findall(
        r"`CI=true bash \.ci/run` passes in \*\*((?:about )?\d+ min(?: \d+ s)?)\*\*", testing
    )
    (cold,) = re.findall(r"a cold run is then about (\d+-\d+)\s+minutes", testing)
    return warm, cold


def test_the_readme_states_the_ci_times_testing_md_measured() -> None:
    warm, cold = _ci_times()
    readme = " ".join(README.read_text().split())
    assert f"a cold run takes about {cold} minutes" in readme
    assert f"one from a fresh clone with warm caches {warm}" in readme
    for page in [README, *PAGES]:
        text = " ".join(page.read_text().split())
        for m in re.finditer(r"warm caches ((?:about )?\d+[^.,;]*)", text):
            assert m.group(1).startswith(warm), f"{page.name}: {m.group(0)}"


# --------------------------------------------------------------------------- arithmetic, commands


def test_sizings_ceilings_are_its_masters_rate_over_each_rows_count() -> None:
    sizing = (DOCS / "sizing.md").read_text()
    (master,) = re.findall(r"One master sustained ([\d,]+) commands/s", sizing)
    rate = int(master.replace(",", ""))
    rows = re.findall(r"^\| [^|]*\((\d+) each[^|]*\| ([\d,]+)[/ ]", sizing, re.M)
    assert len(rows) >= 4, "the ceiling table's rows are no longer where this reads"
    for each, ceiling in rows:
        assert int(ceiling.replace(",", "")) == round(rate / int(each)), (each, ceiling)
    for a, b, result in re.findall(r"arithmetic: ([\d,]+) / (\d+)\) \| ([\d,]+)", sizing):
        assert int(result.replace(",", "")) == round(int(a.replace(",", "")) / int(b))


COMMAND_IN_ENTRY = re.compile(r"`(?:make\s|PYTHONPATH=|\.venv/bin/|strace\s|perf\s)[^`]*`")


def test_every_design_entry_of_performance_md_names_its_command() -> None:
    page = (DOCS / "performance.md").read_text()
    section = page.split("## Design choices, and what they measured", 1)[1]
    section = section.split("\n## ", 1)[0]
    entries = re.findall(r"^- (.+?)(?=^- |^#|\Z)", section, re.M | re.S)
    assert len(entries) >= 10
    missing = [
        e.split("\n", 1)[0][:60]
        for e in entries
        if not COMMAND_IN_ENTRY.search(e) and "not in the tree" not in " ".join(e.lower().split())
    ]
    assert not missing, f"design entries without the command that measures them: {missing}"
