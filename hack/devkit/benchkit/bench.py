"""``make bench``: mcpfleet's speed and memory, measured side by side in one run.

Prints one table. Every figure comes from this run on this machine; targets are
ratios (router vs direct, router vs nginx), never absolute times, and nothing
here asserts: a benchmark reports, tests prove behaviour.

    PYTHONPATH=hack/devkit .venv/bin/python -m benchkit.bench [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from benchkit.hotpath import measure_hot_path
from benchkit.loadgen import children
from benchkit.nginx import start_nginx
from benchkit.profilebench import router_cpu_rows
from benchkit.table import Row, render
from benchkit.targets import Figures, target_rows
from fleetkit.clients.wire import MODERN, MODERN_META, initialize_body
from fleetkit.fleet import ProcessFleet
from mcpfleet.dev.fleet import LocalFleet
from mcpfleet.dev.ports import free_port
from mcpfleet.dev.wait import wait_for
from mcpfleet.fleetclient import connect
from mcpfleet.keys.codec import ReloadableCodec
from mcpfleet.keys.ring import KeyRing

HEADERS = {
    "content-type": "application/json",
    "accept": "application/json, text/event-stream",
    "mcp-protocol-version": MODERN,
    "mcp-method": "tools/call",
    "mcp-name": "confirm_purchase",
}
BODY = json.dumps(
    {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {
            "name": "confirm_purchase",
            "arguments": {"item": "tea", "amount_eur": 2},
            "_meta": MODERN_META,
        },
    }
)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def spread(url: str, n: int) -> dict[str, int]:
    """Sequential modern rounds through the router: how many each replica served."""
    counts: dict[str, int] = {}
    async with httpx.AsyncClient(timeout=10) as http:
        for _ in range(n):
            resp = await http.post(url, content=BODY, headers=HEADERS)
            name = resp.headers.get("x-mcpfleet-replica", "?")
            counts[name] = counts.get(name, 0) + 1
    return counts


async def handshake_round_trips(url: str, n: int) -> list[float]:
    """Whole handshake-era flows: connect, one elicitation, result, close."""
    out = []
    for _ in range(n):
        t = time.perf_counter()
        async with connect(url, "handshake") as client:
            await client.call_tool("confirm_purchase", {"item": "tea", "amount_eur": 2})
        out.append(time.perf_counter() - t)
    return out


async def _guard_flows(url: str, concurrency: int, seconds: float) -> tuple[int, float]:
    """Rounds of completed confirm_purchase flows in ``seconds``, and the time taken.

    Every flow is two rounds: the asking round seals ``request_state``, the
    continuation unseals it and answers. Only rounds of completed flows count.
    """
    done = 0
    deadline = time.perf_counter() + seconds

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            first = await http.post(url, content=BODY, headers=HEADERS)
            result = _sse_json(first.text)["result"]
            assert isinstance(result, dict)
            (key,) = result["inputRequests"]
            params = json.loads(BODY)["params"]
            params["requestState"] = result["requestState"]
            params["inputResponses"] = {key: {"action": "accept", "content": {"value": True}}}
            body = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": params}
            second = await http.post(url, content=json.dumps(body), headers=HEADERS)
            answer = _sse_json(second.text)["result"]
            assert isinstance(answer, dict)
            if answer["content"][0]["text"].startswith("Purchased"):
                done += 2

    started = time.perf_counter()
    async with httpx.AsyncClient(timeout=10) as http:
        await asyncio.gather(*(client(http) for _ in range(concurrency)))
    return done, time.perf_counter() - started


async def guard_rounds_paired(
    a: str, b: str, concurrency: int, seconds: float, slices: int = 16
) -> tuple[float, float]:
    """Guard rounds/s of two servers, measured in alternating short slices.

    On a shared machine the load of other processes drifts over seconds; many
    short alternating slices (which one goes first alternates too) expose both
    servers to the same drift, so their ratio means something.
    """
    totals = {a: [0, 0.0], b: [0, 0.0]}
    for i in range(slices):
        for url in (a, b) if i % 2 == 0 else (b, a):
            rounds, took = await _guard_flows(url, concurrency, seconds / slices)
            totals[url][0] += rounds
            totals[url][1] += took
    return totals[a][0] / totals[a][1], totals[b][0] / totals[b][1]


def middleware_cost(n: int) -> tuple[float, float]:
    """In-process tool call p50 (microseconds) with and without the rounds middleware.

    Two copies of one app, called alternately in one event loop, so both see
    the same machine; no network and no codec, only what the middleware adds.
    """
    from fastmcp import Client, FastMCP
    from prometheus_client import CollectorRegistry

    from mcpfleet.replica.middleware import PrometheusMiddleware

    def app(with_metrics: bool) -> FastMCP:
        mcp = FastMCP("bench")

        @mcp.tool
        def ping() -> str:
            return "pong"

        if with_metrics:
            mcp.add_middleware(PrometheusMiddleware(CollectorRegistry()))
        return mcp

    async def run() -> tuple[float, float]:
        timed: dict[bool, list[float]] = {True: [], False: []}
        async with Client(app(True)) as counted, Client(app(False)) as plain:
            clients = {True: counted, False: plain}
            for i in range(n + 50):
                for key in (True, False) if i % 2 else (False, True):
                    t = time.perf_counter()
                    await clients[key].call_tool("ping", {})
                    if i >= 50:  # the first calls warm both up
                        timed[key].append(time.perf_counter() - t)
        return statistics.median(timed[True]) * 1e6, statistics.median(timed[False]) * 1e6

    return asyncio.run(run())


def _sse_json(text: str) -> dict[str, object]:
    """A JSON-RPC answer, sent as plain JSON or as the last event of an SSE stream."""
    data = [ln[5:].strip() for ln in text.splitlines() if ln.startswith("data:")]
    out: dict[str, object] = json.loads(data[-1] if data else text)
    return out


def start_plain_fastmcp(work: Path) -> tuple[subprocess.Popen[bytes], str]:
    """The example app as plain FastMCP: ``http_app()`` under uvicorn, nothing of mcpfleet's."""
    port = free_port()
    code = (
        "import uvicorn\n"
        "from mcpfleet_examples.app import app\n"
        f"uvicorn.run(app.http_app(path='/mcp'), host='127.0.0.1', port={port},"
        " log_level='warning', access_log=False)\n"
    )
    log = (work / "plain.log").open("ab")
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=dict(os.environ),
    )
    log.close()
    url = f"http://127.0.0.1:{port}/mcp"

    def answers() -> bool:
        resp = httpx.post(url, content=BODY, headers=HEADERS, timeout=2)
        return resp.status_code == 200

    wait_for(
        answers,
        timeout=60,
        what="plain FastMCP under uvicorn to answer",
        retry_on=(httpx.HTTPError,),
    )
    return proc, url


def codec_cost(n: int) -> tuple[float, float]:
    """Microseconds per seal+unseal: mcpfleet's reloadable codec vs mcp's own."""
    from mcp.server.request_state import AESGCMRequestStateCodec

    ring = KeyRing.generate().stage().promote()
    payload = b'{"v":1,"s":"' + b"x" * 300 + b'"}'
    ours, theirs = ReloadableCodec(ring), AESGCMRequestStateCodec(ring.secrets)

    def run(codec: ReloadableCodec | AESGCMRequestStateCodec) -> float:
        t = time.perf_counter()
        for _ in range(n):
            codec.unseal(codec.seal(payload))
        return (time.perf_counter() - t) / n * 1e6

    run(ours), run(theirs)  # warm-up
    return run(ours), run(theirs)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def death_to_404(lf: LocalFleet) -> float:
    """Seconds from SIGKILL of a session's owner to the router's 404 for that session."""
    body = json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}})
    async with httpx.AsyncClient(timeout=10) as http:
        init = await http.post(
            lf.url,
            headers={**HEADERS, "mcp-protocol-version": "2025-11-25"},
            content=initialize_body("bench"),
        )
        session = init.headers["mcp-session-id"]
        owner = init.headers["x-mcpfleet-replica"]
        killed = time.perf_counter()
        lf.members[owner].proc.signal(signal.SIGKILL)
        while True:
            resp = await http.post(
                lf.url,
                content=body,
                headers={
                    "content-type": "application/json",
                    "accept": "application/json, text/event-stream",
                    "mcp-session-id": session,
                },
            )
            if resp.status_code == 404:
                return time.perf_counter() - killed


def rotation_convergence(lf: ProcessFleet) -> float:
    """Seconds from writing one ring step until every replica attests it."""
    t = time.perf_counter()
    ring = lf.rotate_step("stage")
    lf.wait_attested(ring.kids, timeout=30)
    return time.perf_counter() - t


def fleet_pids(lf: LocalFleet, nginx_pid: int | None) -> dict[str, list[int]]:
    """The processes whose CPU the bench reports, by role."""
    pids: dict[str, list[int]] = {
        "router": [p.popen.pid for p in lf.router_procs if p.popen],
        "replicas": [m.proc.popen.pid for m in lf.members.values() if m.proc.popen],
    }
    if lf.redis is not None and lf.redis.popen is not None:
        pids["redis"] = [lf.redis.popen.pid]
    if nginx_pid is not None:
        pids["nginx"] = [nginx_pid, *children(nginx_pid)]
    return pids


async def measure(quick: bool, results: Figures, scale_only: bool = False) -> list[Row]:
    secs = 3.0 if quick else 8.0
    rows: list[Row] = []
    work = Path(tempfile.mkdtemp(prefix="mcpfleet-bench-"))
    lf = ProcessFleet(work, replicas=3, fleet="bench")
    lf.start()
    nginx = None
    try:
        direct = f"{lf.members['replica-0'].url}/mcp"
        proxies: dict[str, str] = {"direct to one replica": direct, "mcpfleet router": lf.url}
        nginx = start_nginx(work, [m.url for m in lf.members.values()])
        if nginx is not None:
            proxies["nginx (round robin)"] = f"http://127.0.0.1:{nginx[1]}/mcp"
        watch = fleet_pids(lf, nginx[0].pid if nginx else None)
        hot = await asyncio.to_thread(
            measure_hot_path,
            direct,
            [f"{m.url}/mcp" for m in lf.members.values()],
            lf.url,
            proxies.get("nginx (round robin)"),
            watch,
            slices=2 if quick else 4,
            slice_seconds=1 if quick else 2,
        )
        results.hot = hot
        rows += hot.rows()
        rows += await asyncio.to_thread(router_cpu_rows, lf, quick)
        from benchkit.routercost import router_cost_rows  # the router's targets

        kept: list[Any] = []
        workers = children(nginx[0].pid) if nginx is not None else []
        rows += await asyncio.to_thread(
            router_cost_rows,
            lf,
            proxies.get("nginx (round robin)"),
            quick,
            keep=kept,
            nginx_pid=workers[0] if workers else None,
        )
        results.router = kept[0] if kept else None
        shares = await spread(lf.url, 90)
        rows.append(
            (
                "stateless rounds per replica, 90 sequential, router",
                " / ".join(f"{shares.get(m, 0)}" for m in sorted(lf.members)),
                f"max/min x{max(shares.values()) / max(1, min(shares.values())):.2f}",
                "nothing in flight: ties at random",
            )
        )
        if not scale_only:
            plain, plain_url = start_plain_fastmcp(work)
            try:
                mcpfleet_rps, plain_rps = await guard_rounds_paired(direct, plain_url, 16, 2 * secs)
            finally:
                plain.terminate()
                plain.wait(10)
            rows.append(
                (
                    "guard rounds/s, example app under mcpfleet serve",
                    f"{mcpfleet_rps:.0f}/s",
                    f"x{mcpfleet_rps / plain_rps:.2f} of plain FastMCP",
                    "codec, metrics, registry; target >= x0.90",
                )
            )
            rows.append(
                (
                    "guard rounds/s, same app as plain FastMCP http_app()",
                    f"{plain_rps:.0f}/s",
                    "",
                    "uvicorn, 16 clients, 16 alternating slices",
                )
            )
            counted, bare = await asyncio.to_thread(middleware_cost, 300 if quick else 2000)
            rows.append(
                (
                    "in-process tool call p50, with / without rounds middleware",
                    f"{counted:.0f} / {bare:.0f} us",
                    f"x{counted / bare:.2f}",
                    "alternating calls, one event loop",
                )
            )
            hs_direct = await handshake_round_trips(direct, 20 if quick else 60)
            hs_router = await handshake_round_trips(lf.url, 20 if quick else 60)
            hs_ratio = statistics.median(hs_router) / statistics.median(hs_direct)
            rows.append(
                (
                    "handshake flow (1 elicitation), direct",
                    f"p50 {statistics.median(hs_direct) * 1e3:.1f} ms",
                    "",
                    "",
                )
            )
            rows.append(
                (
                    "handshake flow (1 elicitation), router",
                    f"p50 {statistics.median(hs_router) * 1e3:.1f} ms",
                    f"x{hs_ratio:.2f} of direct",
                    "",
                )
            )
            per_replica = hot.throughput["mcpfleet router"].rps / 3
            rows.append(
                (
                    "modern rounds/s per replica (via router)",
                    f"{per_replica:.0f}/s",
                    "",
                    "3 replicas, 2 cores shared",
                )
            )
            ours, theirs = codec_cost(2000 if quick else 20000)
            rows.append(
                (
                    "seal+unseal, mcpfleet reloadable codec",
                    f"{ours:.1f} us",
                    f"x{ours / theirs:.2f} of mcp's codec",
                    "300-byte state",
                )
            )
            rows.append(
                (
                    "rotation step convergence (3 replicas)",
                    f"{rotation_convergence(lf) * 1e3:.0f} ms",
                    "",
                    "write -> all attest",
                )
            )
            router_pid = lf.router_procs[0].popen.pid if lf.router_procs[0].popen else 0
            replica_pid = lf.members["replica-1"].proc.popen.pid  # type: ignore[union-attr]
            rows.append(
                (
                    "RSS router / replica after load",
                    f"{rss_mib(router_pid):.0f} / {rss_mib(replica_pid):.0f} MiB",
                    f"x{rss_mib(router_pid) / rss_mib(replica_pid):.2f}",
                    "",
                )
            )
            rows.append(
                (
                    "owner death -> first 404",
                    f"{await death_to_404(lf) * 1e3:.0f} ms",
                    "",
                    "target < 2000 ms",
                )
            )
    finally:
        if nginx is not None:
            nginx[0].terminate()
            nginx[0].wait(10)
        lf.stop()
        shutil.rmtree(work, ignore_errors=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer samples (a smoke run)")
    parser.add_argument(
        "--no-node", action="store_true", help="skip the node tier's figures (real kubelet)"
    )
    parser.add_argument(
        "--scale-only",
        action="store_true",
        help="only the load-generator, session, Redis and profile rows (the scale targets)",
    )
    parser.add_argument(
        "--rounds-only",
        action="store_true",
        help="only the replica's CPU per round beside plain FastMCP (benchkit.roundcost)",
    )
    parser.add_argument(
        "--tracing-only",
        action="store_true",
        help="only the replica's and the router's CPU per round with tracing off, on at 100%%"
        " and at 1%% sampling (benchkit.tracecost)",
    )
    parser.add_argument(
        "--listen-only",
        action="store_true",
        help="only the fan-out of notifications to 1,000 listen streams over 3 replicas"
        " (benchkit.listenbench)",
    )
    parser.add_argument(
        "--answers-only",
        action="store_true",
        help="only the router's CPU per round for a 1 MiB answer beside a 1 KiB one"
        " (benchkit.answersize)",
    )
    parser.add_argument(
        "--flood-only",
        action="store_true",
        help="only another principal's latency while one floods 16 threads of rounds, limits"
        " on and off (benchkit.floodbench)",
    )
    args = parser.parse_args()
    # A run stopped from outside (SIGTERM) unwinds as Ctrl-C does: each fleet,
    # Redis, nginx and wrk it started is stopped by its context manager (before,
    # the session fleet's replicas, routers and Redis outlived a stopped run).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    from benchkit.summary import render_summary

    started = time.monotonic()
    if args.rounds_only:
        from benchkit.roundcost import round_cost_rows

        kept: dict[str, Any] = {}
        print(f"mcpfleet bench, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M:%S')}")
        print(render(round_cost_rows(args.quick, keep=kept)))
        print()
        print(render_summary(kept, None))
        print(f"\n{_took(started)}; {_load()}")
        return
    if args.tracing_only:
        from benchkit.tracecost import trace_cost_rows

        print(f"mcpfleet bench, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M:%S')}")
        print(render(trace_cost_rows(args.quick)))
        print(f"\n{_took(started)}; {_load()}")
        return
    if args.listen_only:
        from benchkit.listenbench import listen_rows

        print(f"mcpfleet bench, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M:%S')}")
        print(render(listen_rows(args.quick)))
        print(f"\n{_took(started)}; {_load()}")
        return
    if args.answers_only:
        from benchkit.answersize import answer_size_rows

        print(f"mcpfleet bench, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M:%S')}")
        print(render(answer_size_rows(args.quick)))
        print(f"\n{_took(started)}; {_load()}")
        return
    if args.flood_only:
        from benchkit.floodbench import flood_rows

        print(f"mcpfleet bench, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M:%S')}")
        print(render(flood_rows(args.quick)))
        print(f"\n{_took(started)}; {_load()}")
        return
    results = Figures()
    rows = asyncio.run(measure(args.quick, results, args.scale_only))
    from benchkit.sessionbench import measure_sessions

    rows += asyncio.run(measure_sessions(args.quick, results))
    if not args.scale_only:
        from benchkit.roundcost import round_cost_rows

        rows += round_cost_rows(args.quick, keep=results.rounds)
        from benchkit.tracecost import trace_cost_rows  # tracing off / on 100% / on 1%

        rows += trace_cost_rows(args.quick)
        from benchkit.answersize import answer_size_rows

        rows += answer_size_rows(args.quick)
        from benchkit.listenbench import listen_rows  # notifications to 1,000 listen streams

        rows += listen_rows(args.quick)
        from benchkit.floodbench import flood_rows  # a flooding principal, limits on and off

        rows += flood_rows(args.quick)
    if not args.scale_only:
        from benchkit.oncebench import once_rows

        rows += once_rows(args.quick)
        from benchkit.clusterbench import cluster_rows  # once and sticky on a Redis Cluster

        rows += cluster_rows(args.quick)
    if not args.scale_only:
        from benchkit.taskbench import task_rows  # MCP tasks: in .venv-tasks, or why not

        rows += task_rows(args.quick)
    if not args.scale_only:
        from benchkit.operatorbench import rotation_rows

        rows += rotation_rows(1 if args.quick else 3)
        from fleetkit.failover import failover_rows

        rows += failover_rows(args.quick)
    if not args.no_node and not args.scale_only:
        from benchkit.node_bench import node_rows

        rows += node_rows(args.quick)
    rows += target_rows(results)
    print(f"mcpfleet bench, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M:%S')}")
    print(render(rows))
    summary = render_summary(results.rounds or None, results.router)
    if summary:
        print("\nEvery set-up and target, from this run:\n")
        print(summary)
    print(f"\n{_took(started)}; {_load()}")


def _took(started: float) -> str:
    took = time.monotonic() - started
    return f"bench took {int(took // 60)} min {int(took % 60)} s"


def _load() -> str:
    """The machine's load average (1, 5, 15 min) as the run ends: the machine may be shared."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores"


if __name__ == "__main__":
    main()
