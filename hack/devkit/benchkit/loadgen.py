"""The compiled load generator of ``make bench``: Debian's ``wrk`` with ``mcp_round.lua``.

A Python load generator shares the two cores with what it measures and is
slower than the router it drives; ``wrk`` (C, one event loop per thread)
costs a fraction of that. To show it is not the bottleneck, each run samples
CPU time from ``/proc/<pid>/stat`` for wrk itself and any processes named (the
router, the replicas, nginx), over the run's wall time.

The pure helpers (reading wrk's result line, percentiles from a latency
histogram, CPU time from a stat line) are unit-tested in
``tests/unit/test_loadgen.py``; the Lua script's requests are checked against
a real replica in ``tests/fleet/test_bench_wrk.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

SCRIPT = Path(__file__).with_name("mcp_round.lua")
RESULT_PREFIX = "mcpfleet-wrk "
CLK_TCK = os.sysconf("SC_CLK_TCK")


def wrk_binary() -> str | None:
    return shutil.which("wrk")


# --- pure helpers ------------------------------------------------------------------


def stat_cpu_ticks(stat_line: str) -> int:
    """utime + stime (clock ticks) from the text of ``/proc/<pid>/stat``.

    The command name (field 2) is in parentheses and may hold spaces, so the
    fields are counted from the last ``)``.
    """
    rest = stat_line[stat_line.rindex(")") + 2 :].split()
    # rest[0] is field 3 (state); utime and stime are fields 14 and 15.
    return int(rest[11]) + int(rest[12])


def machine_ticks(proc_stat: str) -> tuple[int, int]:
    """(busy, total) clock ticks of all CPUs from the text of ``/proc/stat``."""
    fields = [int(x) for x in proc_stat.splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already inside user/nice
    return total - idle, total


def percentile(histogram: Mapping[int, int], q: float) -> float:
    """The ``q`` quantile (0..1) of a histogram of value -> count: the smallest
    value with at least ``q`` of the counts at or below it."""
    total = sum(histogram.values())
    if total == 0:
        return float("nan")
    need = max(1, q * total)
    running = 0
    for value in sorted(histogram):
        running += histogram[value]
        if running >= need:
            return float(value)
    return float(max(histogram))


def merge(histograms: Iterable[Mapping[int, int]]) -> dict[int, int]:
    out: dict[int, int] = {}
    for h in histograms:
        for value, count in h.items():
            out[value] = out.get(value, 0) + count
    return out


@dataclass
class WrkResult:
    """One wrk run (or several merged): counts, latency histogram (us), CPU seconds."""

    requests: int = 0
    seconds: float = 0.0
    bad: int = 0
    socket_errors: int = 0
    histogram: dict[int, int] = field(default_factory=dict)
    wrk_cpu: float = 0.0
    wall: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)
    machine_busy: float = 0.0

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    def p(self, q: float) -> float:
        """Latency quantile in milliseconds."""
        return percentile(self.histogram, q) / 1000

    @property
    def wrk_share(self) -> float:
        """wrk's CPU while it ran, as a fraction of one core."""
        return self.wrk_cpu / self.wall if self.wall else 0.0

    def cpu_share(self, name: str) -> float:
        return self.cpu.get(name, 0.0) / self.wall if self.wall else 0.0

    def __add__(self, other: WrkResult) -> WrkResult:
        cpu = dict(self.cpu)
        for k, v in other.cpu.items():
            cpu[k] = cpu.get(k, 0.0) + v
        return WrkResult(
            self.requests + other.requests,
            self.seconds + other.seconds,
            self.bad + other.bad,
            self.socket_errors + other.socket_errors,
            merge([self.histogram, other.histogram]),
            self.wrk_cpu + other.wrk_cpu,
            self.wall + other.wall,
            cpu,
            self.machine_busy + other.machine_busy,
        )


def parse_result(stdout: str) -> WrkResult:
    """The result line ``mcp_round.lua`` prints in ``done()``, as a :class:`WrkResult`."""
    for line in stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            doc = json.loads(line[len(RESULT_PREFIX) :])
            break
    else:
        raise ValueError(f"no {RESULT_PREFIX.strip()!r} line in wrk's output:\n{stdout[-2000:]}")
    errors = doc["errors"]
    return WrkResult(
        requests=int(doc["requests"]),
        seconds=int(doc["duration_us"]) / 1e6,
        # Non-2xx statuses are also "bad" (the script checks every response).
        bad=int(doc["bad"]),
        socket_errors=sum(int(errors[k]) for k in ("connect", "read", "write", "timeout")),
        histogram={int(us): int(n) for us, n in doc["histogram"]},
    )


# --- running it --------------------------------------------------------------------


def _read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return None


def cpu_seconds(pid: int) -> float | None:
    text = _read(f"/proc/{pid}/stat")
    return None if text is None else stat_cpu_ticks(text) / CLK_TCK


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (e.g. nginx's worker), from /proc."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            text = _read(f"/proc/{entry}/stat")
            if text and int(text[text.rindex(")") + 2 :].split()[1]) == pid:
                out.append(int(entry))
    return out


class CpuWatch:
    """CPU seconds of named processes between :meth:`start` and :meth:`stop`, from /proc."""

    def __init__(self, pids: Mapping[str, Sequence[int]]) -> None:
        self.pids = pids
        self.before: dict[str, float] = {}
        self.machine_before = (0, 0)
        self.started = 0.0

    def _now(self) -> dict[str, float]:
        return {name: sum(cpu_seconds(p) or 0.0 for p in pids) for name, pids in self.pids.items()}

    def start(self) -> None:
        self.before = self._now()
        self.machine_before = machine_ticks(_read("/proc/stat") or "cpu 0 0 0 0")
        self.started = time.perf_counter()

    def stop(self) -> tuple[dict[str, float], float, float]:
        """(CPU seconds per name, wall seconds, machine busy as a count of cores)."""
        wall = time.perf_counter() - self.started
        after = self._now()
        busy, total = machine_ticks(_read("/proc/stat") or "cpu 0 0 0 0")
        cores = os.cpu_count() or 1
        d_busy, d_total = busy - self.machine_before[0], total - self.machine_before[1]
        machine = cores * d_busy / d_total if d_total else 0.0
        return {n: after[n] - self.before.get(n, 0.0) for n in after}, wall, machine


def run_wrk(
    url: str | Sequence[tuple[str, int]],
    *,
    connections: int = 1,
    seconds: float,
    mode: str = "modern",
    limit: int = 0,
    sessions_file: Path | None = None,
    watch: Mapping[str, Sequence[int]] | None = None,
) -> WrkResult:
    """Run wrk against ``url`` and return its figures, with CPU shares over its run.

    ``url`` may be a list of (url, connections): one wrk per entry, all at once
    (a client spreading its own load over the replicas), merged into one result.
    wrk's own CPU is sampled from /proc every 50 ms while it runs (the last
    sample comes before it exits, so the summary it prints is not counted);
    the processes in ``watch`` over the same samples.
    """
    wrk = wrk_binary()
    if wrk is None:
        raise RuntimeError("wrk not installed (make bench installs it: hack/ensure-debs.sh bench)")
    targets = [(url, connections)] if isinstance(url, str) else list(url)
    env = dict(os.environ, MCPFLEET_WRK_MODE=mode, MCPFLEET_WRK_LIMIT=str(limit))
    if sessions_file is not None:
        env["MCPFLEET_WRK_SESSIONS"] = str(sessions_file)
    procs = []
    watch_all = CpuWatch(dict(watch or {}))
    watch_all.start()
    # wrk's output goes to files, read once it exited: its report (a histogram
    # of every distinct latency) outgrows a pipe's 64 KiB on a quiet machine, and
    # a wrk blocked writing to a pipe nobody reads never exits.
    outputs: list[tuple[IO[str], IO[str]]] = []
    for target, conns in targets:
        assert urlsplit(target).scheme == "http", target
        argv = [wrk, "-t1", f"-c{conns}", f"-d{max(1, round(seconds))}s", "--timeout", "10s"]
        argv += ["-s", str(SCRIPT), target]
        out_file: IO[str] = tempfile.TemporaryFile("w+")  # noqa: SIM115 - closed after wrk exits
        err_file: IO[str] = tempfile.TemporaryFile("w+")  # noqa: SIM115
        outputs.append((out_file, err_file))
        procs.append(subprocess.Popen(argv, stdout=out_file, stderr=err_file, env=env, text=True))
    first = [cpu_seconds(p.pid) or 0.0 for p in procs]
    last = list(first)
    stopped: tuple[dict[str, float], float, float] | None = None
    while any(p.poll() is None for p in procs):
        now = [cpu_seconds(p.pid) for p in procs]
        if all(p.poll() is None for p in procs):
            last = [n if n is not None else old for n, old in zip(now, last, strict=True)]
            stopped = watch_all.stop()
        time.sleep(0.05)
    parts = []
    for p, (out_file, err_file) in zip(procs, outputs, strict=True):
        p.wait()
        with out_file, err_file:
            out_file.seek(0)
            err_file.seek(0)
            out, err = out_file.read(), err_file.read()
        if p.returncode != 0:
            raise RuntimeError(f"wrk failed ({p.returncode}): {err.strip() or out[-2000:]}")
        parts.append(parse_result(out))
    result = sum(parts, WrkResult())
    result.seconds = max(one.seconds for one in parts)  # parallel: counts add, time does not
    result.wrk_cpu = sum(b - a for a, b in zip(first, last, strict=True))
    if stopped is not None:
        result.cpu, result.wall, busy = stopped
        result.machine_busy = busy * result.wall  # core-seconds, so merged runs add up
    return result
