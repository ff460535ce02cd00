"""``make bench``'s replica rows: CPU per modern round, mcpfleet beside plain FastMCP.

One run starts, side by side on this machine:

* plain FastMCP (:data:`benchkit.roundapp.plain`, nothing of mcpfleet's) under
  uvicorn, twice: JSON response mode and SSE mode (FastMCP's default);
* ``mcpfleet serve`` replicas of :func:`benchkit.roundapp.fleet` with their
  Redis (as ``make bench`` starts replicas), whose ``confirm`` is the same tool
  through :func:`mcpfleet.ask_then` and ``confirm_once`` the same with
  ``once=True``.

It then drives two-round modern (2026-07-28) flows against each, one client,
in short slices that take turns (the order rotates every slice, so drifting
load on a shared machine hits every server alike). A slice is a batch of
asking rounds, then the answer rounds of the same flows, so each server's CPU
(every thread's, nanoseconds, from ``/proc/<pid>/task/*/schedstat``) is read
around batches of one kind of round: CPU per asking round and per answer round
separately. Latency is each round's wall time at the client (p50/p99).

Each server runs in :data:`PROCESSES` processes started alike, and its slices go
to each in turn: a Python process's CPU per round differs from its twin's by a
few % for its whole life (its hash seed, its memory layout), so a figure of one
process moved the ratios by about as much as the targets' margins. Slices are
short (10 flows) because the machine's speed moves within seconds, for every
server alike: a turn of every server must be shorter than that.

The targets, printed with PASS/FAIL and the ratios they are on:

* the replica's CPU per asking round and per answer round <= 1.00x plain
  FastMCP's in the same response mode (the mode the replica answered in), both
  with the limits off and as a user gets it (:data:`REPLICA_DEFAULTS`: every
  flag at its default, the limits, notifications and tracing as they are);
* ``once=True`` adds <= 100 us CPU and <= 0.3 ms p50 to the answer round.

Nothing here asserts: a benchmark reports, tests prove behaviour.

    PYTHONPATH=hack/devkit .venv/bin/python -m benchkit.roundcost [--quick]
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from benchkit.oncefloor import floor_rows
from benchkit.roundapp import ARGS, ONCE_TOOL, TOOL
from benchkit.table import part_main
from fleetkit.clients.wire import MODERN, MODERN_META, response_body
from fleetkit.fleet import DEVKIT_DIR
from mcpfleet.dev.fleet import LocalFleet
from mcpfleet.dev.ports import free_port
from mcpfleet.dev.wait import wait_for

Row = tuple[str, str, str, str]

#: Processes each server runs in, started alike, its slices going to each in turn:
#: a Python process's own luck (its hash seed, its memory layout) moves its CPU per
#: round by a few % for its whole life, which no number of slices in it averages out.
PROCESSES = 3
#: The targets: CPU per round within this factor of plain FastMCP's (same mode).
CPU_RATIO_TARGET = 1.00
#: What ``once=True`` may add to the answer round: CPU (us) and p50 latency (ms).
ONCE_CPU_TARGET_US = 100.0
ONCE_P50_TARGET_MS = 0.3

PLAIN_JSON, PLAIN_SSE = "plain FastMCP, JSON mode", "plain FastMCP, SSE mode"
REPLICA, REPLICA_ONCE = "mcpfleet replica", "mcpfleet replica, once=True"
#: The same replica with limits per principal on, every round allowed (mcpfleet.limits):
#: rates far above the client's, taken from Redis a lease of 200 rounds at a time, and
#: a rate whose lease is one round (a Redis call per round: the worst case).
#: The replica as ``mcpfleet serve`` starts with no flag of these: limits per principal
#: at their defaults (50 rounds/s, burst 100), notifications and the handshake event
#: store on, tracing off (no ``OTEL_*``), its rounds from :data:`USER_PRINCIPALS`
#: client addresses, each well under its rate, as many users' rounds are.
REPLICA_DEFAULTS = "mcpfleet replica, as a user gets it"
USER_PRINCIPALS = 64
REPLICA_LIMITS = "mcpfleet replica, limits on"
REPLICA_LIMITS_EACH = "mcpfleet replica, limits on, Redis per round"
LIMITS_ARGS = {
    REPLICA_LIMITS: ("--limit-rounds", "2000", "--limit-burst", "4000"),
    REPLICA_LIMITS_EACH: ("--limit-rounds", "5000", "--limit-burst", "2"),
}
#: What the limit check may add to an allowed round: CPU (us) and p50 latency (ms).
LIMITS_CPU_TARGET_US = 50.0
LIMITS_P50_TARGET_MS = 0.1
JSON_MODE, SSE_MODE = "JSON", "SSE"


def cpu_ns(pid: int) -> int:
    """CPU time of every live thread of ``pid`` so far, in nanoseconds."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that just exited
    return total


@dataclass
class Server:
    """One server under test: where it listens, which tool, and what was measured."""

    name: str
    url: str
    tool: str
    pid: int
    ask_ns: int = 0
    answer_ns: int = 0
    asks: int = 0
    answers: int = 0
    ask_ms: list[float] = field(default_factory=list)
    answer_ms: list[float] = field(default_factory=list)
    #: The response mode the server answered these rounds in (:func:`response_mode`).
    mode: str = "?"
    #: The client addresses its flows come from, one flow each in turn: each round
    #: names its flow's in ``X-Forwarded-For``, which the replica's limits read as
    #: the principal (``--trusted-hops 1``). Every server gets the header.
    addresses: tuple[str, ...] = ("10.0.0.1",)
    flows: int = 0
    #: Where else the same server runs (url, pid): a process each, started alike. The
    #: slices go to each in turn (:meth:`instances`), so one process's luck (its hash
    #: seed, its memory layout: a few % either way) weighs a share of the figure.
    more: tuple[tuple[str, int], ...] = ()

    def instances(self) -> list[tuple[str, int]]:
        return [(self.url, self.pid), *self.more]

    def take_turn(self) -> None:
        """The next slice goes to the next process of this server."""
        if self.more:
            every = self.instances()
            self.url, self.pid = every[1]
            self.more = (*every[2:], every[0])

    def next_address(self) -> str:
        address = self.addresses[self.flows % len(self.addresses)]
        self.flows += 1
        return address

    @property
    def ask_us(self) -> float:
        return self.ask_ns / max(1, self.asks) / 1e3

    @property
    def answer_us(self) -> float:
        return self.answer_ns / max(1, self.answers) / 1e3

    def rounds_per_core(self) -> float:
        return 2e6 / (self.ask_us + self.answer_us)


HEADERS = {
    "content-type": "application/json",
    "accept": "application/json, text/event-stream",
    "mcp-protocol-version": MODERN,
    "mcp-method": "tools/call",
}


def _body(tool: str, state: str | None = None) -> bytes:
    params: dict[str, Any] = {"name": tool, "arguments": ARGS, "_meta": MODERN_META}
    if state is not None:
        params["requestState"] = state
        params["inputResponses"] = {"ok": {"action": "accept", "content": {"value": True}}}
    return json.dumps(
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
    ).encode()


def _round(
    http: httpx.Client, s: Server, state: str | None, address: str | None = None
) -> tuple[float, dict[str, Any]]:
    headers = {**HEADERS, "mcp-name": s.tool, "x-forwarded-for": address or s.addresses[0]}
    started = time.perf_counter()
    resp = http.post(s.url, content=_body(s.tool, state), headers=headers)
    took = (time.perf_counter() - started) * 1e3
    result = response_body(resp).get("result")
    if resp.status_code != 200 or not isinstance(result, dict):
        raise RuntimeError(f"{s.name}: round failed: {resp.status_code} {resp.text[:300]}")
    return took, result


def response_mode(http: httpx.Client, s: Server) -> str:
    """The mode ``s`` answers such a round in, seen from the wire.

    A silent round looks the same either way (mcp's SSE mode answers one that
    emitted nothing as ``application/json`` too), but only JSON mode serves a
    client that accepts JSON alone: SSE mode refuses it with 406.
    """
    headers = {**HEADERS, "mcp-name": s.tool, "accept": "application/json"}
    resp = http.post(s.url, content=_body(s.tool), headers=headers)
    return SSE_MODE if resp.status_code == 406 else JSON_MODE


def _batch(http: httpx.Client, s: Server, flows: int, timed: bool = True) -> None:
    """``flows`` asking rounds, then their answer rounds, each batch's CPU read around it."""
    states: list[tuple[str, str]] = []
    before = cpu_ns(s.pid)
    for _ in range(flows):
        address = s.next_address()
        took, result = _round(http, s, None, address)
        states.append((str(result["requestState"]), address))
        if timed:
            s.ask_ms.append(took)
    between = cpu_ns(s.pid)
    for state, address in states:
        took, result = _round(http, s, state, address)
        text = str(result["content"][0]["text"])
        if not text.startswith("Purchased"):
            raise RuntimeError(f"{s.name}: unexpected answer {text!r}")
        if timed:
            s.answer_ms.append(took)
    after = cpu_ns(s.pid)
    if timed:
        s.ask_ns += between - before
        s.answer_ns += after - between
        s.asks += flows
        s.answers += flows


def _pythonpath() -> str:
    """The devkit first, then the caller's ``PYTHONPATH``: what every server here imports."""
    return os.pathsep.join(p for p in (str(DEVKIT_DIR), os.environ.get("PYTHONPATH")) if p)


def start_plain(work: Path, json_response: bool) -> tuple[subprocess.Popen[bytes], str]:
    """:data:`benchkit.roundapp.plain` under uvicorn, in the given response mode."""
    port = free_port()
    code = (
        "import uvicorn\n"
        "from benchkit.roundapp import plain\n"
        f"app = plain.http_app(path='/mcp', json_response={json_response})\n"
        f"uvicorn.run(app, host='127.0.0.1', port={port}, log_level='warning',"
        " access_log=False)\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = _pythonpath()
    log = (work / f"plain-{'json' if json_response else 'sse'}.log").open("ab")
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    log.close()
    url = f"http://127.0.0.1:{port}/mcp"

    def answers() -> bool:
        body = _body(TOOL)
        resp = httpx.post(url, content=body, headers={**HEADERS, "mcp-name": TOOL}, timeout=2)
        return resp.status_code == 200

    wait_for(answers, timeout=60, what="plain FastMCP to answer", retry_on=(httpx.HTTPError,))
    return proc, url


def _server(name: str, tool: str, at: list[tuple[str, int]]) -> Server:
    """A server that runs in the processes ``at`` (url, pid), taking turns."""
    (url, pid), *more = at
    return Server(name, url, tool, pid, more=tuple(more))


def _at(lf: LocalFleet, names: list[str]) -> list[tuple[str, int]]:
    """The MCP endpoint and pid of each of ``lf``'s replicas ``names``."""
    found = []
    for name in names:
        member = lf.members[name]
        assert member.proc.popen is not None
        found.append((f"{member.url}/mcp", member.proc.popen.pid))
    return found


def _added(lf: LocalFleet, names: list[str]) -> list[tuple[str, int]]:
    """Replicas ``names`` added to ``lf`` with its current arguments, started together."""
    for name in names:
        lf.add_replica(name, wait=False)
    for name in names:
        lf.wait_replica(name)
    return _at(lf, names)


def round_fleet(work: Path, fleet: str, replicas: int = 1) -> LocalFleet:
    """Redis and ``replicas`` replicas of :func:`benchkit.roundapp.fleet` with their
    limits off (not started): what each server of the rounds runs beside."""
    return LocalFleet(
        work / "fleet",
        replicas=replicas,
        routers=0,
        fleet=fleet,
        app="benchkit.roundapp:fleet",
        # The caller's PYTHONPATH kept behind the devkit's, as plain FastMCP's is.
        extra_env={"PYTHONPATH": _pythonpath()},
        limits=False,
    )


def drive(servers: list[Server], flows: int, slice_flows: int) -> None:
    """Every server warmed up and its response mode read, then ``flows`` flows each in
    slices of ``slice_flows`` whose order rotates, so drifting load hits all alike."""
    with httpx.Client(timeout=10) as http:
        for s in servers:  # warm every path up: imports, caches, connections
            for _ in s.instances():
                _batch(http, s, 50, timed=False)
                s.mode = response_mode(http, s)
                s.take_turn()
        for i in range(max(1, flows // slice_flows)):
            shift = i % len(servers)
            for s in servers[shift:] + servers[:shift]:
                _batch(http, s, slice_flows)
                s.take_turn()


def measure(
    flows: int, slice_flows: int, work: Path, floor: list[Row] | None = None
) -> dict[str, Server]:
    """Every server started, warmed up and driven; what was measured, by server name.

    With ``floor``, the once floor's rows (:mod:`benchkit.oncefloor`, against the
    replica's Redis, after the rounds) are appended to it.
    """
    procs: list[subprocess.Popen[bytes]] = []
    lf = round_fleet(work, "rounds", replicas=PROCESSES)
    try:
        plains: dict[bool, list[tuple[str, int]]] = {True: [], False: []}
        for json_response in (True, False):
            for _ in range(PROCESSES):
                proc, url = start_plain(work, json_response)
                procs.append(proc)
                plains[json_response].append((url, proc.pid))
        lf.start()
        fleet = _at(lf, [f"replica-{i}" for i in range(PROCESSES)])
        servers = [
            _server(PLAIN_JSON, TOOL, plains[True]),
            _server(PLAIN_SSE, TOOL, plains[False]),
            _server(REPLICA, TOOL, fleet),
            _server(REPLICA_ONCE, ONCE_TOOL, fleet),
        ]
        for i, (name, args) in enumerate(LIMITS_ARGS.items()):
            lf.replica_args = args  # after the fleet's NO_LIMITS: these win
            names = [f"replica-limits-{i}-{k}" for k in range(PROCESSES)]
            servers.append(_server(name, TOOL, _added(lf, names)))
        lf.replica_args, lf.limits = (), True  # every flag at its default
        names = [f"replica-defaults-{k}" for k in range(PROCESSES)]
        servers.append(_server(REPLICA_DEFAULTS, TOOL, _added(lf, names)))
        for n, s in enumerate(servers):
            # One principal per server (the limited replicas share the fleet's
            # buckets: each its own), USER_PRINCIPALS for the user's replica.
            count = USER_PRINCIPALS if s.name == REPLICA_DEFAULTS else 1
            s.addresses = tuple(f"10.{n}.{j // 256}.{j % 256}" for j in range(count))
        drive(servers, flows, slice_flows)
        if floor is not None:
            floor += floor_rows(lf.redis_port, quick=flows < 1000)
        return {s.name: s for s in servers}
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)
        lf.stop()


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def rows_of(servers: dict[str, Server], flows: int) -> list[Row]:
    rows: list[Row] = []
    plain = {JSON_MODE: servers[PLAIN_JSON], SSE_MODE: servers[PLAIN_SSE]}
    for s in servers.values():
        same = plain.get(s.mode)
        ratio = ""
        if same is not None and s.name not in (PLAIN_JSON, PLAIN_SSE):
            ratio = (
                f"x{s.ask_us / same.ask_us:.2f} / x{s.answer_us / same.answer_us:.2f}"
                f" of plain {s.mode}"
            )
        rows.append(
            (
                f"round CPU ask / answer, {s.name}",
                f"{s.ask_us:.0f} / {s.answer_us:.0f} us",
                ratio,
                f"answered in {s.mode} mode; {s.rounds_per_core():.0f} rounds/s per core",
            )
        )
        rows.append(
            (
                f"round latency ask / answer, {s.name}",
                f"p50 {statistics.median(s.ask_ms):.2f} / {statistics.median(s.answer_ms):.2f} ms",
                f"p99 {_p(s.ask_ms, 0.99):.2f} / {_p(s.answer_ms, 0.99):.2f} ms",
                f"{s.asks} flows, 1 client, interleaved slices",
            )
        )
    rep, once = servers[REPLICA], servers[REPLICA_ONCE]
    for who, s in (("replica", rep), ("replica as a user gets it", servers[REPLICA_DEFAULTS])):
        base = plain.get(s.mode, servers[PLAIN_SSE])
        for kind, ours, theirs in (
            ("asking", s.ask_us, base.ask_us),
            ("answer", s.answer_us, base.answer_us),
        ):
            times = ours / theirs
            rows.append(
                (
                    f"target: {who} CPU per {kind} round <= x{CPU_RATIO_TARGET:.2f} plain FastMCP",
                    f"x{times:.2f} ({ours:.0f} vs {theirs:.0f} us, {s.mode} mode)",
                    _verdict(times <= CPU_RATIO_TARGET),
                    "same tool, same response mode, same run",
                )
            )
    rows += limits_rows(servers)
    added_cpu = once.answer_us - rep.answer_us
    rows.append(
        (
            f"target: once=True adds <= {ONCE_CPU_TARGET_US:.0f} us CPU to the answer round",
            f"{added_cpu:+.0f} us ({once.answer_us:.0f} vs {rep.answer_us:.0f})",
            _verdict(added_cpu <= ONCE_CPU_TARGET_US),
            "one claim-and-confirm in Redis; the result's store after the answer",
        )
    )
    added_p50 = statistics.median(once.answer_ms) - statistics.median(rep.answer_ms)
    rows.append(
        (
            f"target: once=True adds <= {ONCE_P50_TARGET_MS} ms p50 to the answer round",
            f"{added_p50:+.2f} ms",
            _verdict(added_p50 <= ONCE_P50_TARGET_MS),
            f"{flows} flows each",
        )
    )
    return rows


def limits_rows(servers: dict[str, Server]) -> list[Row]:
    """The limit check's cost per allowed round, beside the same replica with limits off."""
    rep = servers[REPLICA]
    rows: list[Row] = []
    for name in LIMITS_ARGS:
        on = servers[name]
        cpu = ((on.ask_us - rep.ask_us) + (on.answer_us - rep.answer_us)) / 2
        p50 = statistics.median(on.ask_ms + on.answer_ms) - statistics.median(
            rep.ask_ms + rep.answer_ms
        )
        rows.append(
            (
                f"target: {name.removeprefix('mcpfleet replica, ')} adds <= "
                f"{LIMITS_CPU_TARGET_US:.0f} us CPU and <= {LIMITS_P50_TARGET_MS} ms p50 a round",
                f"{cpu:+.0f} us, {p50:+.2f} ms",
                _verdict(cpu <= LIMITS_CPU_TARGET_US and p50 <= LIMITS_P50_TARGET_MS),
                "every round allowed; same tool, same run, interleaved slices",
            )
        )
    return rows


def round_cost_rows(quick: bool, keep: dict[str, Server] | None = None) -> list[Row]:
    """The rows :mod:`benchkit.bench` prints (``--rounds-only`` prints only these);
    the servers measured go into ``keep`` too (for :mod:`benchkit.summary`)."""
    flows, slice_flows = (400, 10) if quick else (2000, 10)
    work = Path(tempfile.mkdtemp(prefix="mcpfleet-bench-rounds-"))
    try:
        floor: list[Row] = []
        servers = measure(flows, slice_flows, work, floor)
        if keep is not None:
            keep.update(servers)
        return rows_of(servers, flows) + floor
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    part_main("round cost", __doc__, round_cost_rows, "fewer flows (a smoke run)")


if __name__ == "__main__":
    main()
