"""The router's CPU per request, where it goes (py-spy), and one improvement, before/after.

Two routers run in front of the same replicas at once: the router as it is,
and the same code with the improvement switched off (``WHOLE_BODY_LIMIT`` set
below any body before it starts: every response goes through the stream pump,
as before the change). wrk drives modern rounds through each in alternating
slices; each router's CPU comes from /proc over its own slices, divided by the
requests wrk completed through it. So both figures come from one run on the
same machine state, and their ratio is what counts.

py-spy (``record --format raw``, non-blocking) samples each router during one
more run; the collapsed stacks go to ``.cache/bench/`` and the top frames into
the table (see :mod:`benchkit.profile_summary`).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchkit.loadgen import WrkResult, run_wrk
from benchkit.profile_summary import Profile, read_collapsed
from mcpfleet.dev.fleet import LocalFleet, Proc
from mcpfleet.dev.ports import free_port
from mcpfleet.dev.wait import wait_for

Row = tuple[str, str, str, str]
OUT = Path(__file__).resolve().parents[3] / ".cache" / "bench"
NOW, BEFORE = "router now", "router before (pump for every body)"

_BEFORE_LAUNCHER = (
    "import sys\n"
    "import mcpfleet.router.upstream as upstream\n"
    "upstream.WHOLE_BODY_LIMIT = -1  # every body through the pump, as before the change\n"
    "from mcpfleet.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def start_extra_router(lf: LocalFleet, launcher: str, name: str) -> tuple[Proc, str]:
    """One more router in front of ``lf``'s replicas, started by ``python -c launcher``
    (which ends by calling mcpfleet's CLI); its process and URL once it sees them all."""
    port = free_port()
    argv = [sys.executable, "-c", launcher, "router", "--port", str(port)]
    argv += ["--redis", lf.redis_url, "--fleet", lf.fleet]
    proc = Proc(name, argv, lf.workdir / f"{name}.log")
    proc.start(lf.env())
    wait_for(
        lf._router_sees(port, lf.replicas),
        timeout=60,
        what=f"{name} to see the replicas",
        retry_on=(OSError, ValueError, KeyError),
    )
    return proc, f"http://127.0.0.1:{port}/mcp"


def start_before_router(lf: LocalFleet) -> tuple[Proc, str]:
    return start_extra_router(lf, _BEFORE_LAUNCHER, "router-before")


def py_spy() -> str | None:
    here = Path(sys.executable).with_name("py-spy")
    return str(here) if here.exists() else shutil.which("py-spy")


def profile(pid: int, url: str, seconds: int, out: Path) -> Profile | str:
    """py-spy samples ``pid`` while wrk drives ``url``; the profile, or why there is none."""
    spy = py_spy()
    if spy is None:
        return "py-spy not installed (pip install -e '.[test]')"
    argv = [spy, "record", "--pid", str(pid), "--format", "raw", "--rate", "250"]
    argv += ["--duration", str(seconds), "--nonblocking", "--output", str(out)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)  # attached
    run_wrk(url, connections=8, seconds=seconds)
    _, err = proc.communicate(timeout=60)
    if proc.returncode != 0 or not out.exists():
        return f"py-spy failed: {err.strip()[-200:]}"
    return read_collapsed(out.read_text().splitlines())


def write_summary(prof: Profile, path: Path, title: str) -> None:
    lines = [f"# {title}: {prof.samples} samples (py-spy, non-blocking, 250 Hz)", "", "## self"]
    lines += [f"{share * 100:5.1f}%  {name}" for name, share in prof.top_self(30)]
    lines += ["", "## inclusive"]
    lines += [f"{share * 100:5.1f}%  {name}" for name, share in prof.top_inclusive(60)]
    path.write_text("\n".join(lines) + "\n")


def router_cpu_rows(lf: LocalFleet, quick: bool) -> list[Row]:
    rows: list[Row] = []
    now_pid = lf.router_procs[0].popen.pid if lf.router_procs[0].popen else 0
    before, before_url = start_before_router(lf)
    try:
        assert before.popen is not None
        pids = {NOW: now_pid, BEFORE: before.popen.pid}
        urls = {NOW: lf.url, BEFORE: before_url}
        for url in urls.values():
            run_wrk(url, connections=4, seconds=1)  # warm-up
        got = {NOW: WrkResult(), BEFORE: WrkResult()}
        for i in range(2 if quick else 6):
            for name in (NOW, BEFORE) if i % 2 == 0 else (BEFORE, NOW):
                got[name] = got[name] + run_wrk(
                    urls[name],
                    connections=8,
                    seconds=2 if quick else 3,
                    watch={"router": [pids[name]]},
                )
        per_req = {n: r.cpu.get("router", 0.0) / max(1, r.requests) * 1e6 for n, r in got.items()}
        for name in (BEFORE, NOW):
            res = got[name]
            rows.append(
                (
                    f"router CPU per modern round, {name}",
                    f"{per_req[name]:.0f} us",
                    "" if name == BEFORE else f"x{per_req[NOW] / per_req[BEFORE]:.2f} of before",
                    f"over {res.requests} rounds (wrk, 8 connections), "
                    f"{res.rps:.0f}/s, p50 {res.p(0.5):.1f} ms, bad={res.bad + res.socket_errors}",
                )
            )
        OUT.mkdir(parents=True, exist_ok=True)
        seconds = 4 if quick else 8
        relay_share: dict[str, float] = {}
        for name, tag in ((BEFORE, "before"), (NOW, "now")):
            raw = OUT / f"router-profile-{tag}.txt"
            prof = profile(pids[name], urls[name], seconds, raw)
            if isinstance(prof, str):
                rows.append((f"router profile, {name}", "skipped", "", prof))
                continue
            summary = OUT / f"router-profile-{tag}-summary.txt"
            write_summary(prof, summary, name)
            relay_share[name] = relay_path_share(prof)
            top = ", ".join(f"{_short(f)} {s * 100:.0f}%" for f, s in prof.top_self(4))
            outer = ("Router.__call__", "Router._http", "Router._route", "run_router")
            mine = ", ".join(
                f"{_short(f)} {s * 100:.0f}%"
                for f, s in [
                    (f, s)
                    for f, s in prof.top_inclusive(30, within="server/mcpfleet/router/")
                    if not f.startswith(outer)
                ][:5]
            )
            rows.append(
                (
                    f"router profile, {name}: top self frames",
                    top,
                    "",
                    f"{prof.samples} samples; {summary.relative_to(OUT.parents[1])}",
                )
            )
            rows.append((f"router profile, {name}: router code, inclusive", mine, "", ""))
        if len(relay_share) == 2:
            rows.append(
                (
                    "router samples relaying the answer, before / now",
                    f"{relay_share[BEFORE] * 100:.1f}% / {relay_share[NOW] * 100:.1f}%",
                    f"x{relay_share[NOW] / relay_share[BEFORE]:.2f}",
                    "Upstream.relay + the pump's tasks (they run outside it)",
                )
            )
    finally:
        before.stop()
    return rows


def relay_path_share(prof: Profile) -> float:
    """Share of samples relaying answers: in ``Upstream.relay``, or in the pump's tasks
    (a task's stack starts at the event loop, so it is not inside ``relay``)."""
    hits = 0
    for name in ("Upstream.relay", "_pump.<locals>.copy", "_pump.<locals>.client_gone"):
        hits += sum(c for f, c in prof.inclusive.items() if f.startswith(name + " ("))
    return hits / prof.samples if prof.samples else 0.0


def _short(frame: str) -> str:
    """``Router._pump (server/mcpfleet/router/proxy.py)`` -> ``Router._pump``."""
    func, _, where = frame.partition(" (")
    where = where.rstrip(")")
    if where.startswith("server/"):
        return func
    return f"{func} [{where.split('/')[0]}]"
