"""``make bench``'s answer-size rows: the router's CPU per round for a 1 MiB answer
beside a 1 KiB one.

One replica of ``fleetkit.apps.streamapp`` (whose ``blob`` tool answers as many
characters of text as asked) behind one router. One client sends modern
(2026-07-28) ``tools/call`` rounds of ``blob`` through the router, in slices
that take turns between the two sizes (the order rotates every slice, so
drifting load on a shared machine hits both alike); the router's CPU (every
thread's, nanoseconds, ``/proc/<pid>/task/*/schedstat``) is read around each
slice and divided by its rounds. A 1 KiB answer is read whole and relayed in
one write; a 1 MiB one is relayed chunk by chunk (``WHOLE_BODY_LIMIT``).

Nothing here asserts: a benchmark reports, tests prove behaviour.

    PYTHONPATH=hack/devkit .venv/bin/python -m benchkit.answersize [--quick]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from benchkit.roundcost import cpu_ns
from fleetkit.apps.blobtext import blob_text
from fleetkit.clients.wire import MODERN, MODERN_META
from fleetkit.fleet import FleetOptions, local_fleet

Row = tuple[str, str, str, str]
KIB = 1024
#: Answer sizes (characters of text) and rounds of each per slice.
SIZES = {1 * KIB: 200, 1024 * KIB: 20}


def _label(size: int) -> str:
    return f"{size // KIB} KiB" if size < 1024 * KIB else f"{size // (1024 * KIB)} MiB"


def measure(url: str, router_pid: int, slices: int) -> dict[int, tuple[int, int, list[float], int]]:
    """Per size: (router CPU ns, rounds, each round's wall seconds, rounds not 200)."""
    headers = {
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": MODERN,
        "mcp-method": "tools/call",
        "mcp-name": "blob",
    }
    got: dict[int, tuple[int, int, list[float], int]] = {s: (0, 0, [], 0) for s in SIZES}
    with httpx.Client(timeout=60) as http:

        def call(size: int) -> tuple[float, httpx.Response]:
            params = {"name": "blob", "arguments": {"size": size}, "_meta": MODERN_META}
            body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params})
            started = time.perf_counter()
            resp = http.post(url, content=body, headers=headers)
            return time.perf_counter() - started, resp

        for size in SIZES:  # warm-up, and each answer checked once
            for _ in range(5):
                _, resp = call(size)
            if resp.status_code == 200:
                assert resp.json()["result"]["content"][0]["text"] == blob_text(size)
        order = list(SIZES)
        for i in range(slices):
            for size in order[i % 2 :] + order[: i % 2]:
                rounds = SIZES[size]
                before = cpu_ns(router_pid)
                calls = [call(size) for _ in range(rounds)]
                spent = cpu_ns(router_pid) - before
                ns, n, w, bad = got[size]
                bad += sum(1 for _, r in calls if r.status_code != 200)
                got[size] = (ns + spent, n + rounds, w + [t for t, _ in calls], bad)
    return got


def answer_size_rows(quick: bool) -> list[Row]:
    work = Path(tempfile.mkdtemp(prefix="mcpfleet-answers-"))
    options = FleetOptions(replicas=1, app="fleetkit.apps.streamapp:app", fleet="answers")
    try:
        with local_fleet(work, options) as lf:
            popen = lf.router_procs[0].popen
            assert popen is not None
            got = measure(lf.url, popen.pid, 2 if quick else 6)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    per_round = {s: ns / max(1, n) / 1000 for s, (ns, n, _, _) in got.items()}
    small, large = sorted(SIZES)
    rows: list[Row] = []
    for size in (small, large):
        _, n, walls, bad = got[size]
        ratio = "" if size == small else f"x{per_round[large] / per_round[small]:.1f} of 1 KiB"
        rows.append(
            (
                f"router CPU per modern round, {_label(size)} answer",
                f"{per_round[size]:.0f} us",
                ratio,
                f"over {n} rounds, one client, p50 {statistics.median(walls) * 1000:.1f} ms"
                + (f", {bad} not 200" if bad else ""),
            )
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer slices (a smoke run)")
    args = parser.parse_args()
    for row in answer_size_rows(args.quick):
        print(" | ".join(row))


if __name__ == "__main__":
    main()
