"""The conformance suite's ``tasks-*`` scenarios against one replica and through the fleet.

The suite pinned for every other conformance run (``hack/conformance/``,
0.1.16) has no ``tasks-*`` scenario; its pre-releases do. The newest of them is
pinned beside it, for these scenarios only (``hack/conformance/tasks/``,
installed by ``make conformance-tasks-suite`` into ``.cache/conformance-tasks``).
Every ``tasks-*`` server scenario it lists runs twice, each on a fleet of its
own serving :mod:`fleetkit.apps.taskconfapp` on FastMCP's tasks engine:

* **direct**: one replica alone (its own Redis, its own worker), at its own
  endpoint, no router;
* **fleet**: three replicas sharing one queue in one Redis, through the router.

A router in front of the tasks engine must be invisible: each check must end
the same both ways. The outcome of every check is pinned in
``tests/conformance/expected_tasks.json``, with the reason, read from the
engine's and the suite's source, for each that does not pass.

``python -m fleetkit.conformance.tasks`` prints the table and keeps the suite's files
in ``.cache/conformance-tasks/results/<time>/`` (in ``.venv-tasks``:
``PYTHONPATH=hack/devkit .venv-tasks/bin/python -m fleetkit.conformance.tasks``).
The decisions are plain functions; :func:`run_both` starts the processes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from fleetkit.conformance import suite as conformance
from fleetkit.conformance.suite import (
    REPO,
    SEVERITY,
    Outcomes,
    Suite,
    find_suite,
    mark_of,
    read_results,
)
from mcpfleet.dev.fleet import FleetError

PINS = REPO / "hack" / "conformance" / "tasks"
INSTALLER = REPO / "hack" / "conformance" / "install.sh"
CACHE = REPO / ".cache" / "conformance-tasks"
RESULTS = CACHE / "results"
EXPECTED = REPO / "tests" / "conformance" / "expected_tasks.json"
APP = "fleetkit.apps.taskconfapp:app"
PREFIX = "tasks-"

#: The two runs, in table order.
TARGETS = ("direct", "fleet")


def pinned_version() -> str:
    """The pinned pre-release, from ``hack/conformance/tasks/package.json``."""
    deps: dict[str, str] = json.loads((PINS / "package.json").read_text())["dependencies"]
    return deps["@modelcontextprotocol/conformance"]


def suite_name() -> str:
    return f"@modelcontextprotocol/conformance@{pinned_version()}"


def find_tasks_suite(cache: Path = CACHE) -> Suite:
    """The installed pre-release (``SuiteMissing`` says how to install it)."""
    return find_suite(cache)


def install(cache: Path = CACHE) -> Suite:
    """Run the installer for the tasks pin (a matching install is kept)."""
    subprocess.run(["bash", str(INSTALLER), str(cache), str(PINS)], check=True)
    return find_suite(cache)


# --- reading and comparing (pure) ------------------------------------------------------


def tasks_scenarios(all_server: list[str]) -> list[str]:
    """The ``tasks-*`` scenarios among the suite's server scenarios, in its order."""
    return [s for s in all_server if s.startswith(PREFIX)]


def scenario_result(outcomes: Outcomes, scenario: str) -> str:
    """One word per scenario, as the suite reports its checks: the worst status wins.

    ``FAIL`` (any check failed), ``warn``, ``skipped``, ``info``, ``pass``
    (every check passed); ``-`` when the scenario reported no check at all.
    """
    statuses = [v for (s, _), v in outcomes.items() if s == scenario]
    if not statuses:
        return "-"
    worst = min(statuses, key=lambda v: SEVERITY.get(v, 0))
    return {"FAILURE": "FAIL", "WARNING": "warn", "SUCCESS": "pass"}.get(worst, worst.lower())


def counts(outcomes: Outcomes, scenario: str) -> str:
    """``passed/checks`` of a scenario, e.g. ``6/7``."""
    statuses = [v for (s, _), v in outcomes.items() if s == scenario]
    return f"{sum(v == 'SUCCESS' for v in statuses)}/{len(statuses)}"


@dataclass
class TasksReport:
    """The two runs of the ``tasks-*`` scenarios."""

    suite: str
    scenarios: list[str]
    runs: dict[str, Outcomes] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    missing: dict[str, list[str]] = field(default_factory=dict)
    #: Per replica of the fleet run: tasks created through it and tasks it counted
    #: finished (``mcpfleet_tasks_created_total``, ``mcpfleet_tasks_finished_total``:
    #: its worker's ends, and the cancels it recorded).
    spread: dict[str, tuple[int, int]] = field(default_factory=dict)

    def checks(self) -> list[tuple[str, str]]:
        keys = {k for run in self.runs.values() for k in run}
        order = {s: i for i, s in enumerate(self.scenarios)}
        return sorted(keys, key=lambda k: (order.get(k[0], len(order)), k[1]))

    def to_json(self) -> dict[str, object]:
        return {
            "suite": self.suite,
            "scenarios": self.scenarios,
            "seconds": self.seconds,
            "missing": self.missing,
            "spread": self.spread,
            "checks": [
                {
                    "scenario": s,
                    "check": c,
                    **{t: self.runs.get(t, {}).get((s, c)) for t in TARGETS},
                }
                for s, c in self.checks()
            ],
        }


def differences(report: TasksReport) -> list[str]:
    """Checks and scenarios whose result through the fleet is not the direct one."""
    direct, fleet = report.runs.get("direct", {}), report.runs.get("fleet", {})
    problems = [
        f"{s} / {c}: {direct.get((s, c))} directly, {fleet.get((s, c))} through the fleet"
        for s, c in report.checks()
        if direct.get((s, c)) != fleet.get((s, c))
    ]
    for scenario in report.scenarios:
        a, b = scenario_result(direct, scenario), scenario_result(fleet, scenario)
        if a != b:
            problems.append(f"{scenario}: {a} directly, {b} through the fleet")
    return problems


def expected_problems(report: TasksReport, expected: Mapping[str, object]) -> list[str]:
    """Differences between the runs and the expected set kept in the repo.

    ``expected["checks"]`` maps ``"scenario/check"`` to ``{"direct": status,
    "fleet": status, "reason": why}``. A check missing from either side, or a
    status that changed in either direction, is a problem.
    """
    table = expected["checks"]
    assert isinstance(table, dict)
    problems = [
        f"{scenario}: wrote no results via {', '.join(names)}"
        for scenario, names in report.missing.items()
    ]
    seen = {f"{s}/{c}" for s, c in report.checks()}
    problems += [f"{n}: expected but not reported by the suite" for n in sorted(set(table) - seen)]
    for scenario, check in report.checks():
        name = f"{scenario}/{check}"
        want = table.get(name)
        if want is None:
            problems.append(f"{name}: new check, not in {EXPECTED.name}")
            continue
        for target in TARGETS:
            got = report.runs.get(target, {}).get((scenario, check))
            if got != want[target]:
                problems.append(f"{name}: {got} via {target}, expected {want[target]}")
    return problems


def reasons_missing(expected: Mapping[str, object]) -> list[str]:
    """Expected entries that allow something other than SUCCESS without saying why."""
    return conformance.reasons_missing(expected, TARGETS)


def expected_from(report: TasksReport, reasons: Mapping[str, str]) -> dict[str, object]:
    """An expected set recording ``report`` (``--write-expected``), keeping known reasons."""
    return conformance.expected_from(report, reasons, TARGETS)


def load_expected(path: Path = EXPECTED) -> dict[str, object]:
    return conformance.load_expected(path)


def _grid(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def table(report: TasksReport) -> str:
    """Per scenario (result, checks passed), then per check, direct beside fleet."""
    direct, fleet = report.runs.get("direct", {}), report.runs.get("fleet", {})
    rows: list[tuple[str, ...]] = [("scenario", "direct", "fleet", "checks passed")]
    rows += [
        (
            s,
            scenario_result(direct, s),
            scenario_result(fleet, s),
            f"{counts(direct, s)} / {counts(fleet, s)}",
        )
        for s in report.scenarios
    ]
    lines = _grid(rows)
    lines.append("")
    check_rows: list[tuple[str, ...]] = [("scenario", "check", "direct", "fleet")]
    check_rows += [
        (s, c, mark_of(direct.get((s, c))), mark_of(fleet.get((s, c)))) for s, c in report.checks()
    ]
    lines += _grid(check_rows)
    for target in TARGETS:
        run = report.runs.get(target, {})
        ok = sum(v == "SUCCESS" for v in run.values())
        lines.append(
            f"{target}: {ok} of {len(run)} checks pass ({report.seconds.get(target, 0.0):.1f} s)"
        )
    lines.append(f"{len(report.scenarios)} tasks-* scenarios ({report.suite})")
    if report.spread:
        lines.append(
            "fleet run, tasks created / finished, per replica: "
            + ", ".join(f"{n} {c}/{e}" for n, (c, e) in sorted(report.spread.items()))
        )
    return "\n".join(lines)


# --- running (processes) ---------------------------------------------------------------


def run_scenarios(
    suite: Suite, url: str, scenarios: list[str], out_dir: Path, timeout: float = 120
) -> Outcomes:
    """Each scenario against ``url`` (one suite process each); outcomes from its files.

    The suite exits non-zero when a check fails: that is read from the results.
    A scenario that writes no results at all is an error, shown with its output.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    log = []
    for scenario in scenarios:
        proc = subprocess.run(
            [*suite.argv, "server", "--url", url, "--scenario", scenario, "-o", str(out_dir)],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=out_dir,
        )
        log.append(f"=== {scenario} (exit {proc.returncode})\n{proc.stdout}{proc.stderr}")
    (out_dir / "suite-output.txt").write_text("\n".join(log))
    outcomes, _ = read_results(out_dir)
    if not outcomes:
        raise FleetError(f"the suite wrote no results for {url}:\n" + "\n".join(log))
    return outcomes


def task_counts(metrics: str) -> tuple[int, int]:
    """Tasks created through a replica and tasks it counted finished, from its ``/metrics``."""
    created = ended = 0.0
    for line in metrics.splitlines():
        name, _, value = line.rpartition(" ")
        if name.startswith("mcpfleet_tasks_created_total"):
            created += float(value)
        elif name.startswith("mcpfleet_tasks_finished_total"):
            ended += float(value)
    return int(created), int(ended)


def run_both(suite: Suite, root: Path) -> TasksReport:
    """One replica alone, then a fleet of three behind the router: every ``tasks-*`` scenario."""
    from fleetkit.fleet import FleetOptions, local_fleet

    scenarios = tasks_scenarios(suite.scenarios())
    report = TasksReport(suite=suite_name(), scenarios=scenarios)
    if not scenarios:
        raise FleetError(f"{report.suite} lists no {PREFIX}* server scenario")
    for target, replicas in (("direct", 1), ("fleet", 3)):
        options = FleetOptions(replicas=replicas, app=APP, fleet=f"tasksconf-{target}")
        with local_fleet(root / f"{target}-fleet", options) as lf:
            url = f"{next(iter(lf.members.values())).url}/mcp" if target == "direct" else lf.url
            started = time.monotonic()
            report.runs[target] = run_scenarios(suite, url, scenarios, root / target)
            report.seconds[target] = time.monotonic() - started
            if target == "fleet":
                report.spread = {
                    name: task_counts(httpx.get(f"{r.url}/metrics", timeout=10).text)
                    for name, r in lf.members.items()
                }
        _, seen = read_results(root / target)
        for scenario in scenarios:
            if scenario not in seen:
                report.missing.setdefault(scenario, []).append(target)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="fleetkit.conformance.tasks",
        description="Run the conformance suite's tasks-* scenarios against one replica and "
        "through a 3-replica fleet; print the table.",
    )
    parser.add_argument("--results", type=Path, default=RESULTS, help="where the results go")
    parser.add_argument(
        "--write-expected",
        action="store_true",
        help=f"record this run as {EXPECTED.relative_to(REPO)} (keeps the reasons already there)",
    )
    args = parser.parse_args(argv)
    suite = install()
    results = args.results / conformance.stamp()
    with tempfile.TemporaryDirectory(prefix="mcpfleet-tasksconf-") as tmp:
        report = run_both(suite, Path(tmp))
        conformance.keep_results(report, Path(tmp), results, TARGETS)
    print(table(report))
    print(f"results: {results}")
    problems = differences(report)
    if args.write_expected:
        conformance.write_expected(report, EXPECTED, TARGETS)
    else:
        problems += expected_problems(report, load_expected())
    for problem in problems:
        print(f"PROBLEM: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
