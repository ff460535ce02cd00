"""The handshake-era scale rows of ``make bench``: 1,000 live sessions across 3 replicas.

Each session is opened through the router (``initialize``, then
``notifications/initialized``) and left holding a pending elicitation: a
``tools/call`` of ``confirm_purchase`` whose SSE stream stays open after the
server's ``elicitation/create`` arrived, so every session is as heavy as a
real one waiting for its user (a paused coroutine in its replica, an open
stream through the router). With them all open the bench measures:

* memory per live session: RSS deltas of the replicas and of the router that
  holds the streams, ``INFO memory`` ``used_memory`` delta of Redis, each
  divided by the sessions (baselines taken after a warm-up, before opening);
* Redis commands per request on each routing path, from ``INFO
  commandstats`` deltas: ``initialize``; a sticky request on a router that has
  the session cached; one on a second router that has not (its first request
  for each session); a stateless round. The background (heartbeats, registry
  reads) is measured over an idle window first and subtracted;
* routing latency while they are open, with wrk: a sticky ``ping`` through
  the router vs straight to the owning replica, and a modern round likewise.

At the end every pending elicitation is answered and each tool call must
finish, which proves the sessions were alive (and counts as a check).
"""

from __future__ import annotations

import asyncio
import json
import resource
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import redis

from benchkit.hotpath import DIRECT, ROUTER
from benchkit.loadgen import WrkResult, run_wrk
from benchkit.targets import Figures
from fleetkit.clients.wire import MODERN, MODERN_META
from fleetkit.fleet import ProcessFleet
from mcpfleet.contract import RedisKeys

Row = tuple[str, str, str, str]
HANDSHAKE = "2025-11-25"
BASE_HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}


def raise_fd_limit(need: int) -> int:
    """Raise this process's open-file limit (inherited by the fleet it starts) to the hard one.

    Each held session costs a socket in the bench, two in the router (client
    and upstream) and one in its replica. Returns the soft limit now in force.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def command_calls(client: redis.Redis) -> dict[str, int]:
    """Calls per command from ``INFO commandstats`` (the bench's own INFO left out)."""
    stats = client.info("commandstats")
    return {
        k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info"
    }


def net_commands(
    before: dict[str, int], after: dict[str, int], background: dict[str, float], seconds: float
) -> dict[str, float]:
    """Commands in a window minus the background rate over its length, per command (pure)."""
    names = set(before) | set(after) | set(background)
    out = {}
    for name in names:
        delta = after.get(name, 0) - before.get(name, 0) - background.get(name, 0.0) * seconds
        if abs(delta) >= 0.5:
            out[name] = delta
    return out


@dataclass
class Held:
    session: str
    owner: str
    stream: aiohttp.ClientResponse | None = None
    elicitation_id: object = None


def _sse_messages(text: str) -> list[dict[str, object]]:
    out = []
    for line in text.splitlines():
        if line.startswith("data:") and line[5:].strip():
            out.append(json.loads(line[5:]))
    return out


async def _body_json(resp: aiohttp.ClientResponse) -> list[dict[str, object]]:
    text = await resp.text()
    if resp.headers.get("content-type", "").startswith("text/event-stream"):
        return _sse_messages(text)
    return [json.loads(text)] if text.strip() else []


def _session_headers(session: str) -> dict[str, str]:
    return {**BASE_HEADERS, "mcp-protocol-version": HANDSHAKE, "mcp-session-id": session}


async def initialize(http: aiohttp.ClientSession, url: str) -> Held:
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": HANDSHAKE,
            "capabilities": {"elicitation": {"form": {}}},
            "clientInfo": {"name": "mcpfleet-bench", "version": "1"},
        },
    }
    async with http.post(url, data=json.dumps(body), headers=BASE_HEADERS) as resp:
        assert resp.status == 200, await resp.text()
        await resp.read()
        return Held(resp.headers["mcp-session-id"], resp.headers["x-mcpfleet-replica"])


async def start_elicitation(http: aiohttp.ClientSession, url: str, held: Held) -> None:
    """``notifications/initialized``, then a tool call left waiting on its elicitation."""
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    async with http.post(
        url, data=json.dumps(note), headers=_session_headers(held.session)
    ) as resp:
        assert resp.status == 202, resp.status
    call = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": "confirm_purchase", "arguments": {"item": "tea", "amount_eur": 2}},
    }
    resp = await http.post(url, data=json.dumps(call), headers=_session_headers(held.session))
    assert resp.status == 200, resp.status
    async for line in resp.content:
        if line.startswith(b"data:") and line[5:].strip():  # not a priming event
            msg = json.loads(line[5:])
            if msg.get("method") == "elicitation/create":
                held.stream, held.elicitation_id = resp, msg["id"]
                return
    raise AssertionError("the tool call ended without asking")


#: Seconds one held session may take to be answered, finish and be deleted: the
#: bench's client has no read timeout (its streams are held idle for minutes),
#: so this bounds the end of the run (two runs once waited on one call forever).
FINISH_DEADLINE = 60.0


async def finish_elicitation(http: aiohttp.ClientSession, url: str, held: Held) -> bool:
    """Answer the pending elicitation; True once the tool call returned its result."""
    stage = ["answer"]
    try:
        async with asyncio.timeout(FINISH_DEADLINE):
            return await _finish(http, url, held, stage)
    except TimeoutError:
        raise RuntimeError(
            f"session {held.session}: no end within {FINISH_DEADLINE:g} s at its {stage[0]}"
        ) from None


async def _finish(http: aiohttp.ClientSession, url: str, held: Held, stage: list[str]) -> bool:
    assert held.stream is not None
    answer = {
        "jsonrpc": "2.0",
        "id": held.elicitation_id,
        "result": {"action": "accept", "content": {"value": True}},
    }
    async with http.post(
        url, data=json.dumps(answer), headers=_session_headers(held.session)
    ) as resp:
        await resp.read()
    done = False
    stage[0] = "stream"
    try:
        async for line in held.stream.content:
            if line.startswith(b"data:") and b"Purchased" in line:
                done = True
                break
    finally:
        held.stream.release()
    stage[0] = "DELETE"
    async with http.delete(url, headers=_session_headers(held.session)) as resp:
        await resp.read()
    return done


async def ping(http: aiohttp.ClientSession, url: str, held: Held) -> None:
    body = {"jsonrpc": "2.0", "id": 3, "method": "ping"}
    async with http.post(url, data=json.dumps(body), headers=_session_headers(held.session)) as r:
        assert r.status == 200, (r.status, await r.text())
        await r.read()


async def modern_round(http: aiohttp.ClientSession, url: str) -> None:
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {
            "name": "confirm_purchase",
            "arguments": {"item": "tea", "amount_eur": 2},
            "_meta": MODERN_META,
        },
    }
    headers = {
        **BASE_HEADERS,
        "mcp-protocol-version": MODERN,
        "mcp-method": "tools/call",
        "mcp-name": "confirm_purchase",
    }
    async with http.post(url, data=json.dumps(body), headers=headers) as resp:
        assert resp.status == 200, resp.status
        await resp.read()


async def bounded(n: int, limit: int, make: Callable[[int], Awaitable[object]]) -> list[object]:
    sem = asyncio.Semaphore(limit)

    async def one(i: int) -> object:
        async with sem:
            return await make(i)

    return list(await asyncio.gather(*(one(i) for i in range(n))))


class CommandCounter:
    """Redis commands per request of one phase, background subtracted."""

    def __init__(self, client: redis.Redis, background: dict[str, float]) -> None:
        self.client = client
        self.background = background

    async def count(
        self, requests: int, run: Callable[[], Awaitable[object]]
    ) -> tuple[dict[str, float], int]:
        before = command_calls(self.client)
        t = time.perf_counter()
        await run()
        took = time.perf_counter() - t
        after = command_calls(self.client)
        net = net_commands(before, after, self.background, took)
        return {name: calls / requests for name, calls in net.items()}, requests


def background_rate(client: redis.Redis, seconds: float) -> dict[str, float]:
    before = command_calls(client)
    time.sleep(seconds)
    after = command_calls(client)
    return {k: (after.get(k, 0) - before.get(k, 0)) / seconds for k in after}


def _per_request(breakdown: dict[str, float], n: int) -> tuple[str, str]:
    """The total per request, and the commands behind it (net counts over ``n`` requests)."""
    total = round(sum(breakdown.values()), 2) or 0.0  # never "-0.00"
    detail = ", ".join(
        f"{name.upper()} {v * n:+.0f}"
        for name, v in sorted(breakdown.items(), key=lambda kv: -abs(kv[1]))
    )
    return f"{total:.2f}", f"net: {detail}" if detail else "net: none"


async def measure_sessions(quick: bool, figures: Figures, sessions: int = 1000) -> list[Row]:
    limit = raise_fd_limit(4 * sessions + 1000)
    work = Path(tempfile.mkdtemp(prefix="mcpfleet-bench-sessions-"))
    # Heartbeats every 60 s (not 1 s) keep the background small against the paths'
    # counts; it is measured and subtracted all the same, and no path depends on it.
    lf = ProcessFleet(
        work,
        replicas=3,
        routers=2,
        fleet="sessions",
        replica_args=("--heartbeat", "60", "--heartbeat-ttl", "180"),
    )
    lf.start()
    rows: list[Row] = []
    rclient = redis.Redis(host="127.0.0.1", port=lf.redis_port)
    router_pids = [p.popen.pid for p in lf.router_procs if p.popen]
    replica_pids = {n: m.proc.popen.pid for n, m in lf.members.items() if m.proc.popen}
    r0, r1 = lf.router_url(0), lf.router_url(1)
    # Idle pooled connections are dropped before the router would close them (its
    # keep-alive is 5 s): a request never races a closing connection.
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=2.0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    held: list[Held] = []
    try:
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
            # Warm-up at the concurrency measured below: both routers and every replica
            # have served each path, and the routers' Redis pools have grown to it
            # (a new Redis connection costs HELLO and PING once, then never again).
            warm: list[Held] = await bounded(64, 32, lambda _: initialize(http, r0))  # type: ignore[assignment]
            await bounded(64, 32, lambda i: start_elicitation(http, r0, warm[i]))
            await bounded(64, 32, lambda i: ping(http, r1, warm[i]))
            await bounded(64, 32, lambda i: finish_elicitation(http, r0, warm[i]))
            await bounded(64, 16, lambda _: modern_round(http, r0))
            await asyncio.sleep(1.5)  # heartbeats carry the session counts back down

            background = await asyncio.to_thread(background_rate, rclient, 4.0)
            counter = CommandCounter(rclient, background)
            rss_before = {
                "router": rss_bytes(router_pids[0]),
                "router-1": rss_bytes(router_pids[1]),
                "replicas": sum(rss_bytes(p) for p in replica_pids.values()),
            }
            redis_before = int(rclient.info("memory")["used_memory"])

            async def open_all() -> None:
                held.extend(
                    await bounded(sessions, 32, lambda _: initialize(http, r0))  # type: ignore[arg-type]
                )

            per_init = await counter.count(sessions, open_all)
            t_open = time.perf_counter()
            per_cached = await counter.count(
                2 * sessions,
                lambda: bounded(sessions, 32, lambda i: start_elicitation(http, r0, held[i])),
            )
            opened = time.perf_counter() - t_open
            per_uncached = await counter.count(
                sessions, lambda: bounded(sessions, 16, lambda i: ping(http, r1, held[i]))
            )
            per_cached_r1 = await counter.count(
                sessions, lambda: bounded(sessions, 16, lambda i: ping(http, r1, held[i]))
            )
            per_stateless = await counter.count(
                sessions, lambda: bounded(sessions, 16, lambda _: modern_round(http, r0))
            )
            owners: dict[str, int] = {}
            for h in held:
                owners[h.owner] = owners.get(h.owner, 0) + 1
            pending = sum(1 for h in held if h.stream is not None)
            await asyncio.sleep(1.5)  # a heartbeat or two: attestations carry the counts
            rss_after = {
                "router": rss_bytes(router_pids[0]),
                "router-1": rss_bytes(router_pids[1]),
                "replicas": sum(rss_bytes(p) for p in replica_pids.values()),
            }
            redis_after = int(rclient.info("memory")["used_memory"])
            key_bytes = rclient.memory_usage(RedisKeys(lf.fleet).session(held[0].session))
            per = {k: (rss_after[k] - rss_before[k]) / sessions for k in rss_before}
            per_redis = (redis_after - redis_before) / sessions
            figures.router_bytes_per_session = per["router"]
            figures.redis_bytes_per_session = per_redis
            rows.append(
                (
                    "handshake sessions held open, each with a pending elicitation",
                    f"{pending} of {sessions}",
                    " / ".join(f"{owners.get(n, 0)}" for n in sorted(lf.members)),
                    f"per replica; opened in {opened:.0f} s; open-file limit {limit}",
                )
            )
            rows.append(
                (
                    "memory per live session, replica",
                    f"{per['replicas'] / 1024:.1f} KiB",
                    "",
                    "RSS delta of the 3 replicas / sessions",
                )
            )
            rows.append(
                (
                    "memory per live session, router holding the streams",
                    f"{per['router'] / 1024:.1f} KiB",
                    "",
                    "RSS delta / sessions (2 sockets, a stream, a route each)",
                )
            )
            rows.append(
                (
                    "memory per live session, second router (routes only)",
                    f"{per['router-1'] / 1024:.1f} KiB",
                    "",
                    "RSS delta / sessions: cached owners, no streams",
                )
            )
            rows.append(
                (
                    "memory per live session, Redis",
                    f"{per_redis:.0f} B",
                    "",
                    f"INFO used_memory delta / sessions; MEMORY USAGE of a route: {key_bytes} B",
                )
            )
            bg = sum(background.values())
            for label, (breakdown, n), note in (
                ("initialize", per_init, "the new session's route written"),
                ("sticky, cached", per_cached, "initialized + tools/call, opening router"),
                ("sticky, uncached", per_uncached, "first request for each, second router"),
                ("sticky, cached (second router)", per_cached_r1, "its second request for each"),
                ("stateless (modern round)", per_stateless, "any replica, no lookup"),
            ):
                total, detail = _per_request(breakdown, n)
                rows.append(
                    (
                        f"Redis commands per request, {label}",
                        total,
                        detail,
                        f"{note}; n={n}",
                    )
                )
            rows.append(
                (
                    "Redis background while measuring the paths",
                    f"{bg:.1f} commands/s",
                    "subtracted above",
                    "registry reads, heartbeats (every 60 s here); idle 4 s before",
                )
            )
            lat = await asyncio.to_thread(
                _latency_while_open, lf, r0, held, quick, {"router": router_pids[:1]}
            )
            for name, res in lat.items():
                rows.append(
                    (
                        f"routing latency with {pending} sessions open, {name}",
                        f"p50 {res.p(0.5):.2f} ms / p99 {res.p(0.99):.2f} ms",
                        "",
                        f"wrk 1 connection, n={res.requests}, bad={res.bad + res.socket_errors}",
                    )
                )
            for kind in ("sticky ping", "modern round"):
                d, r = lat[f"{kind}, {DIRECT}"], lat[f"{kind}, {ROUTER}"]
                rows.append(
                    (
                        f"routing latency with sessions open, {kind}: router vs direct",
                        f"{r.p(0.5) - d.p(0.5):+.2f} ms p50",
                        f"p50 x{r.p(0.5) / d.p(0.5):.2f}, p99 x{r.p(0.99) / d.p(0.99):.2f}",
                        "side by side, alternating slices",
                    )
                )
            finished = await bounded(len(held), 32, lambda i: finish_elicitation(http, r0, held[i]))
            rows.append(
                (
                    "pending elicitations answered afterwards, tool calls finished",
                    f"{sum(map(bool, finished))} of {len(held)}",
                    "",
                    "proves every session was alive",
                )
            )
    finally:
        for h in held:
            if h.stream is not None and not h.stream.closed:
                h.stream.close()
        rclient.close()
        lf.stop()
        shutil.rmtree(work, ignore_errors=True)
    return rows


def _latency_while_open(
    lf: ProcessFleet, router: str, held: Sequence[Held], quick: bool, watch: dict[str, list[int]]
) -> dict[str, WrkResult]:
    """Sticky pings (replica-0's sessions) and modern rounds: router vs replica-0, wrk."""
    owner = "replica-0"
    direct = f"{lf.members[owner].url}/mcp"
    ids = Path(tempfile.mkstemp(prefix="mcpfleet-sessions-", suffix=".txt")[1])
    ids.write_text("".join(f"{h.session}\n" for h in held if h.owner == owner))
    out: dict[str, WrkResult] = {}
    runs = {
        f"sticky ping, {DIRECT}": (direct, "sticky"),
        f"sticky ping, {ROUTER}": (router, "sticky"),
        f"modern round, {DIRECT}": (direct, "modern"),
        f"modern round, {ROUTER}": (router, "modern"),
    }
    try:
        for i in range(2 if quick else 4):
            names = list(runs) if i % 2 == 0 else list(reversed(runs))
            for name in names:
                url, mode = runs[name]
                res = run_wrk(
                    url,
                    connections=1,
                    seconds=1 if quick else 2,
                    mode=mode,
                    sessions_file=ids,
                    watch=watch,
                )
                out[name] = out.get(name, WrkResult()) + res
    finally:
        ids.unlink(missing_ok=True)
    return dict(sorted(out.items()))
