"""The router as it is against the router of an earlier commit, side by side.

``make bench-ref REF=<commit>`` (or ``python -m benchkit.refbench REF``): one
local fleet of 3 replicas (this tree's code), and two routers in front of the
same replicas: this tree's, and the one ``REF`` ships (its ``server/`` checked
out into a detached git worktree and imported from there). wrk drives modern
rounds straight to a replica and through each router in alternating slices
whose order rotates, so drifting load hits all three alike; each router's CPU
per round comes from /proc over its own slices. The figures that count are
the ratios within this one run.

The old router reads the same registry records (``contract`` did not change
between the commits this is meant for); a REF whose records differ would not
see the replicas, and the bench says so instead of measuring.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
from pathlib import Path

from benchkit.loadgen import WrkResult, cpu_seconds, run_wrk
from benchkit.profilebench import start_extra_router
from mcpfleet.dev.fleet import LocalFleet, Proc

ROOT = Path(__file__).resolve().parents[3]


def short_sha(ref: str) -> str:
    """``ref``'s abbreviated commit id (``git rev-parse --short``)."""
    done = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", ref],
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip()


def remove_checkout(into: Path) -> None:
    """The worktree :func:`checkout` made under ``into`` removed, and ``into`` with it."""
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(into / "tree")],
        capture_output=True,
    )
    shutil.rmtree(into, ignore_errors=True)


def checkout(ref: str, into: Path) -> tuple[Path, str]:
    """``ref``'s tree in a detached worktree: the import root for its code, and its CLI module.

    From 0.2 the tree has a source root (``server/mcpfleet``); before that the
    folders were mapped to ``mcpfleet.server`` by the build, so a symlink tree
    stands in for the mapping.
    """
    tree = into / "tree"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(tree), ref],
        check=True,
        capture_output=True,
    )
    if (tree / "server" / "mcpfleet").is_dir():
        return tree / "server", "mcpfleet.cli"
    imports = into / "imports" / "mcpfleet"
    imports.mkdir(parents=True)
    (imports / "server").symlink_to(tree / "server")
    (imports / "operator").symlink_to(tree / "operator")
    return imports.parent, "mcpfleet.server.cli"


def start_ref_router(lf: LocalFleet, imports: Path, cli: str) -> tuple[Proc, str]:
    # The import root first: mcpfleet then resolves to REF's code, not this tree's.
    launcher = (
        f"import sys; sys.path.insert(0, {str(imports)!r}); "
        f"from {cli} import main; sys.exit(main(sys.argv[1:]))"
    )
    return start_extra_router(lf, launcher, "router-ref")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ref", help="the commit whose router to compare with")
    parser.add_argument("--slices", type=int, default=6)
    parser.add_argument("--slice-seconds", type=float, default=2.0)
    args = parser.parse_args()
    sha = short_sha(args.ref)
    work = Path(tempfile.mkdtemp(prefix="mcpfleet-refbench-"))
    imports, cli = checkout(sha, work)
    lf = LocalFleet(work / "fleet", replicas=3, fleet="refbench", limits=False)
    lf.start()
    ref_proc = None
    try:
        ref_proc, ref_url = start_ref_router(lf, imports, cli)
        now_name, ref_name = "router now", f"router at {sha}"
        urls = {"direct": f"{lf.members['replica-0'].url}/mcp", now_name: lf.url, ref_name: ref_url}
        now_popen, ref_popen = lf.router_procs[0].popen, ref_proc.popen
        assert now_popen is not None and ref_popen is not None
        pids = {now_name: now_popen.pid, ref_name: ref_popen.pid}
        latency = {n: WrkResult() for n in urls}
        rounds = {n: WrkResult() for n in urls}
        cpu = {n: 0.0 for n in pids}
        names = list(urls)
        for name in names:  # warm-up
            run_wrk(urls[name], connections=4, seconds=1)
        for i in range(args.slices):
            order = names[i % len(names) :] + names[: i % len(names)]
            for name in order:
                latency[name] = latency[name] + run_wrk(
                    urls[name], connections=1, seconds=args.slice_seconds
                )
                pid = pids.get(name)
                before = cpu_seconds(pid) if pid else None
                rounds[name] = rounds[name] + run_wrk(
                    urls[name], connections=8, seconds=args.slice_seconds
                )
                after = cpu_seconds(pid) if pid else None
                if pid and before is not None and after is not None:
                    cpu[name] += after - before
        base = latency["direct"]
        print(f"\nrouter now vs router at {sha}: modern rounds through wrk, one run\n")
        print(
            f"{'':<22}{'p50 1 conn':>12}{'p99 1 conn':>12}{'x direct':>10}{'rounds/s 8c':>13}"
            f"{'CPU/round':>12}{'bad':>6}"
        )
        for name in names:
            lat, thr = latency[name], rounds[name]
            ratio = "" if name == "direct" else f"x{lat.p(0.5) / base.p(0.5):.2f}"
            per = f"{cpu[name] / max(1, thr.requests) * 1e6:.0f} us" if name in cpu else ""
            bad = lat.bad + lat.socket_errors + thr.bad + thr.socket_errors
            print(
                f"{name:<22}{lat.p(0.5):>9.2f} ms{lat.p(0.99):>9.2f} ms{ratio:>10}"
                f"{thr.rps:>11.0f}/s{per:>12}{bad:>6}"
            )
    finally:
        if ref_proc is not None:
            ref_proc.stop()
        lf.stop()
        remove_checkout(work)


if __name__ == "__main__":
    main()
