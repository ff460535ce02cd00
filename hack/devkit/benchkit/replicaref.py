"""The replica as it is against the replica of an earlier commit, side by side.

``make bench-ref REF=<commit>`` prints this after the routers' table (or
``python -m benchkit.replicaref REF``). One run starts plain FastMCP
(:data:`benchkit.roundapp.plain`, JSON mode), this tree's replica of
:func:`benchkit.roundapp.fleet` with its limits off (the flags REF lacks), and
REF's replica of the same app (``server/`` checked out into a detached git
worktree and imported from there, as :mod:`benchkit.refbench` does for the
router), both on one Redis and one key ring. Modern two-round flows go to each
in slices that take turns (:func:`benchkit.roundcost.drive`), and each
server's CPU per asking and per answer round is read from /proc around its own
batches. The figures that count are the ratios within this one run.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from benchkit.refbench import checkout, remove_checkout, short_sha
from benchkit.roundapp import TOOL
from benchkit.roundcost import JSON_MODE, Row, Server, drive, round_fleet, start_plain
from benchkit.table import render
from mcpfleet.dev.fleet import NO_LIMITS, LocalFleet, Proc, http_ok
from mcpfleet.dev.ports import free_port
from mcpfleet.dev.wait import wait_for

PLAIN = "plain FastMCP, JSON mode"
NOW = "replica now, limits off"


def _has_limits(imports: Path) -> bool:
    """Whether REF's server (``imports``) has the limits' flags (on by default there)."""
    return any("--limit-rounds" in p.read_text() for p in imports.rglob("mcpfleet/config/*.py"))


def start_ref_replica(lf: LocalFleet, imports: Path, cli: str, name: str) -> tuple[Proc, str]:
    """REF's replica of the round app beside ``lf``'s, on its Redis and key ring."""
    port = free_port()
    # REF's operator too: the CLI loads the operator's commands as a plugin.
    roots = [str(imports), str(imports.parent / "operator")]
    launcher = (
        f"import sys; sys.path[:0] = {roots!r}; "
        f"from {cli} import main; sys.exit(main(sys.argv[1:]))"
    )
    argv = [sys.executable, "-c", launcher, "serve", "--app", lf.app, "--port", str(port)]
    argv += ["--keys", str(lf.keys_dir), "--redis", lf.redis_url, "--name", name]
    argv += ["--fleet", lf.fleet]  # REF may lack the newer flags (--trusted-hops, limits)
    if _has_limits(imports):
        argv += list(NO_LIMITS)  # limits off, as this tree's replica beside it
    proc = Proc(name, argv, lf.workdir / f"{name}.log")
    proc.start(lf.env())
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if not proc.alive:
            raise RuntimeError(f"{name} exited:\n{proc.tail()}")
        return http_ok(url + "/readyz")

    wait_for(ready, timeout=60, what=f"{name} to be ready")
    return proc, f"{url}/mcp"


def measure(
    sha: str, imports: Path, cli: str, flows: int, slice_flows: int, work: Path
) -> list[Server]:
    lf = round_fleet(work, "replicaref")
    plain: subprocess.Popen[bytes] | None = None
    ref: Proc | None = None
    try:
        plain, plain_url = start_plain(work, json_response=True)
        lf.start()
        member = lf.members["replica-0"]
        ref, ref_url = start_ref_replica(lf, imports, cli, "replica-ref")
        assert member.proc.popen is not None and ref.popen is not None
        servers = [
            Server(PLAIN, plain_url, TOOL, plain.pid),
            Server(NOW, f"{member.url}/mcp", TOOL, member.proc.popen.pid),
            Server(f"replica at {sha}", ref_url, TOOL, ref.popen.pid),
        ]
        drive(servers, flows, slice_flows)
        return servers
    finally:
        if plain is not None:
            plain.terminate()
            plain.wait(10)
        if ref is not None:
            ref.stop()
        lf.stop()


def rows_of(servers: list[Server]) -> list[Row]:
    plain = servers[0]
    rows: list[Row] = []
    for s in servers:
        ratio = ""
        if s is not plain:
            ratio = (
                f"x{s.ask_us / plain.ask_us:.2f} / x{s.answer_us / plain.answer_us:.2f} of plain"
            )
        rows.append(
            (
                f"round CPU ask / answer, {s.name}",
                f"{s.ask_us:.0f} / {s.answer_us:.0f} us",
                ratio,
                f"answered in {s.mode} mode; {s.asks} flows",
            )
        )
    now, ref = servers[1], servers[2]
    rows.append(
        (
            f"replica now against {ref.name.removeprefix('replica at ')}",
            f"{now.ask_us - ref.ask_us:+.0f} / {now.answer_us - ref.answer_us:+.0f} us",
            f"x{now.ask_us / ref.ask_us:.2f} / x{now.answer_us / ref.answer_us:.2f}",
            "asking / answer round, same run",
        )
    )
    if any(s.mode != JSON_MODE for s in servers):
        rows.append(("warning", "a server answered in SSE mode", "", "ratios mix modes"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ref", help="the commit whose replica to compare with")
    parser.add_argument("--flows", type=int, default=2000)
    parser.add_argument("--slice-flows", type=int, default=100)
    args = parser.parse_args()
    sha = short_sha(args.ref)
    work = Path(tempfile.mkdtemp(prefix="mcpfleet-replicaref-"))
    try:
        imports, cli = checkout(sha, work)
        servers = measure(sha, imports, cli, args.flows, args.slice_flows, work)
        print(f"\nreplica now vs replica at {sha}: modern two-round flows, one run\n")
        print(render(rows_of(servers)))
    finally:
        remove_checkout(work)


if __name__ == "__main__":
    main()
