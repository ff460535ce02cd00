"""The cost curve's per-path figures (:mod:`benchkit.scale`): Redis commands per round of
the paths that need a fleet of their own, and what one Redis master sustains.

* **once-flows**: one ``mcpfleet serve`` replica of :func:`benchkit.roundapp.fleet`
  (as :mod:`benchkit.roundcost` starts it), its ``confirm`` and ``confirm_once``
  driven as two-round modern flows, commands counted around the asking rounds
  and around the answer rounds;
* **listen streams**: one replica of ``fleetkit.apps.listenapp``, ``subscriptions/listen``
  streams opened (each acknowledged), then ``retool`` calls whose
  ``tools/list_changed`` every stream must receive: commands per stream opened
  and per event published;
* **the handshake event store on and off**: one replica with the default
  ``--sse-events`` and one with ``--sse-events 0``, each sent ``initialize``
  and then ``ping`` on the sessions it opened, straight (no router: its ``SET``
  per ``initialize`` and its lookups are the curve's own rows): what each
  handshake request costs Redis with resumable streams and without;
* **one master's commands/s**: ``redis-benchmark`` (Debian's redis-tools) against
  the bench's redis-server, GET and SET, 50 clients, no pipelining.

Every count is an ``INFO commandstats`` delta less the background rate measured
over an idle window just before. Limits per principal are off (NO_LIMITS), as in
the rest of the curve, but for **limits on**: one replica at the default limits,
each request from a principal of its own (``X-Forwarded-For`` through the one
trusted hop): commands per modern round and per ``initialize``, then per held
session per second (each replica renews its sessions' places, one script call
per principal, every 10 s).
"""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import redis

from benchkit.roundapp import ARGS, ONCE_TOOL, TOOL
from benchkit.scalecurve import NOISE_PER_UNIT, PathCost, per_unit
from benchkit.sessionbench import background_rate, command_calls
from fleetkit.clients.listen import listening
from fleetkit.clients.wire import accept, initialize_body, modern_call
from fleetkit.fleet import DEVKIT_DIR
from mcpfleet.dev.fleet import LocalFleet

#: Seconds of the idle window each background rate is measured over.
IDLE_WINDOW = 3.0
HANDSHAKE = {
    "content-type": "application/json",
    "accept": "application/json, text/event-stream",
    "mcp-protocol-version": "2025-11-25",
}
INITIALIZED = '{"jsonrpc": "2.0", "method": "notifications/initialized"}'
#: Seconds a listen stream may take to show its acknowledgement or an event.
EVENT_DEADLINE = 10.0


def counted(
    rclient: redis.Redis, background: dict[str, float], units: int, run: Callable[[], Any]
) -> dict[str, float]:
    """Commands per unit of ``run()`` (synchronous), net of the background."""
    before = command_calls(rclient)
    started = time.perf_counter()
    run()
    took = time.perf_counter() - started
    return per_unit(before, command_calls(rclient), background, took, units)


@contextmanager
def _one_replica(
    work: Path,
    fleet: str,
    app: str | None = None,
    *,
    limits: bool = False,
    args: tuple[str, ...] = (),
) -> Iterator[tuple[redis.Redis, str]]:
    """A fleet of one replica (no router) serving ``app`` (the default app when None),
    started with ``args`` besides the fleet's own: a client of its Redis and the
    replica's MCP URL, both stopped on the way out."""
    extra: dict[str, Any] = {} if app is None else {"app": app}
    lf = LocalFleet(
        work / fleet,
        replicas=1,
        routers=0,
        fleet=fleet,
        extra_env={"PYTHONPATH": str(DEVKIT_DIR)},
        limits=limits,
        replica_args=args,
        **extra,
    )
    lf.start()
    rclient = redis.Redis(host="127.0.0.1", port=lf.redis_port)
    try:
        yield rclient, f"{lf.members['replica-0'].url}/mcp"
    finally:
        rclient.close()
        lf.stop()


def once_paths(work: Path, flows: int) -> list[PathCost]:
    """Commands per asking and per answer round, of a plain guard flow and a once-flow."""
    out: list[PathCost] = []
    fleet = _one_replica(work, "scaleonce", "benchkit.roundapp:fleet")
    with fleet as (rclient, url), httpx.Client(timeout=10) as http:
        for tool in (TOOL, ONCE_TOOL):
            _flows(http, url, tool, 20)  # warm-up: imports, pools, scripts loaded
        background = background_rate(rclient, IDLE_WINDOW)
        for tool, label in ((TOOL, "modern guard flow"), (ONCE_TOOL, "once-flow")):
            out += _flow_costs(rclient, background, http, url, tool, label, flows)
    return out


def _flow_costs(
    rclient: redis.Redis,
    background: dict[str, float],
    http: httpx.Client,
    url: str,
    tool: str,
    label: str,
    flows: int,
) -> list[PathCost]:
    """The asking rounds of ``flows`` flows, then their answer rounds, each counted."""
    states: list[str] = []
    asks = counted(rclient, background, flows, lambda: states.extend(_asks(http, url, tool, flows)))
    answers = counted(rclient, background, flows, lambda: _answers(http, url, tool, states))
    return [
        PathCost(f"{label}, asking round", asks, flows, "replica direct"),
        PathCost(f"{label}, answer round", answers, flows, "replica direct"),
    ]


def _asks(http: httpx.Client, url: str, tool: str, n: int) -> list[str]:
    states = []
    for _ in range(n):
        answer = modern_call(url, tool, ARGS, client=http)
        if answer.status != 200 or "requestState" not in answer.result:
            raise RuntimeError(f"{tool}: asking round failed: {answer.status} {answer.body}")
        states.append(str(answer.result["requestState"]))
    return states


def _answers(http: httpx.Client, url: str, tool: str, states: list[str]) -> None:
    for state in states:
        answer = modern_call(
            url, tool, ARGS, request_state=state, input_responses={"ok": accept(True)}, client=http
        )
        text = str((answer.result.get("content") or [{}])[0].get("text", ""))
        if not text.startswith("Purchased"):
            raise RuntimeError(f"{tool}: unexpected answer {answer.status} {answer.body}")


def _flows(http: httpx.Client, url: str, tool: str, n: int) -> None:
    _answers(http, url, tool, _asks(http, url, tool, n))


def listen_paths(work: Path, streams: int, events: int) -> list[PathCost]:
    """Commands per listen stream opened and per event published to every stream."""
    with _one_replica(work, "scalelisten", "fleetkit.apps.listenapp:app") as (rclient, url):
        return asyncio.run(_listen(rclient, url, streams, events))


async def _listen(rclient: redis.Redis, url: str, streams: int, events: int) -> list[PathCost]:
    timeout = httpx.Timeout(10, read=None)
    async with httpx.AsyncClient(timeout=timeout) as http, AsyncExitStack() as stack:
        # Warm-up: one stream and one event (the replica's bus subscription made).
        warm = await stack.enter_async_context(listening(http, url, 1, toolsListChanged=True))
        await warm.next_event(EVENT_DEADLINE)
        await asyncio.to_thread(_retool, url, "warm")
        await warm.next_event(EVENT_DEADLINE)
        background = await asyncio.to_thread(background_rate, rclient, IDLE_WINDOW)
        before, started = command_calls(rclient), time.perf_counter()
        opened = []
        for i in range(streams):
            listener = await stack.enter_async_context(
                listening(http, url, 100 + i, toolsListChanged=True)
            )
            ack = await listener.next_event(EVENT_DEADLINE)
            if ack.method != "notifications/subscriptions/acknowledged":
                raise RuntimeError(f"listen stream {i}: {ack.message}")
            opened.append(listener)
        per_stream = per_unit(
            before, command_calls(rclient), background, time.perf_counter() - started, streams
        )
        before, started = command_calls(rclient), time.perf_counter()
        for e in range(events):
            await asyncio.to_thread(_retool, url, f"t{e}")
            for listener in opened:
                frame = await listener.next_event(EVENT_DEADLINE)
                if frame.method != "notifications/tools/list_changed":
                    raise RuntimeError(f"listen stream: unexpected {frame.message}")
        per_event = per_unit(
            before, command_calls(rclient), background, time.perf_counter() - started, events
        )
    return [
        PathCost("listen stream opened", per_stream, streams, "subscriptions/listen, acknowledged"),
        PathCost(
            "event to every listen stream",
            per_event,
            events,
            f"a tool call that announces tools/list_changed; each of {streams} streams got it",
        ),
    ]


def _retool(url: str, name: str) -> None:
    answer = modern_call(url, "retool", {"name": name})
    if answer.status != 200 or answer.error is not None:
        raise RuntimeError(f"retool: {answer.status} {answer.body}")


def redis_capacity(port: int, requests: int) -> tuple[float, str] | None:
    """The lower of GET's and SET's requests/s by ``redis-benchmark`` (50 clients, no
    pipelining) against the Redis on ``port``, and how it was measured; None without
    redis-benchmark."""
    binary = shutil.which("redis-benchmark")
    if binary is None:
        return None
    argv = [binary, "-h", "127.0.0.1", "-p", str(port), "-q", "-t", "get,set"]
    argv += ["-n", str(requests), "-c", "50"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True).stdout
    rates = parse_benchmark(out)
    if not rates:
        raise RuntimeError(f"redis-benchmark said nothing readable: {out[-500:]}")
    rate = min(rates.values())
    detail = ", ".join(f"{k} {v:,.0f}/s" for k, v in sorted(rates.items()))
    return rate, f"redis-benchmark -t get,set -n {requests} -c 50: {detail}"


_RATE = re.compile(r"^(\w+): ([\d.]+) requests per second", re.MULTILINE)


def parse_benchmark(out: str) -> dict[str, float]:
    """``{"GET": 81234.5, ...}`` from ``redis-benchmark -q`` output (its progress lines,
    ending in carriage returns, left out)."""
    last = "\n".join(line.rsplit("\r", 1)[-1] for line in out.splitlines())
    return {m.group(1): float(m.group(2)) for m in _RATE.finditer(last)}


#: Seconds of the idle window over which held sessions' renewals are counted: two
#: renewals of each place (every 10 s, a third of its 30 s lease).
RENEWAL_WINDOW = 20.0
EXAMPLE_ARGS = {"item": "tea", "amount_eur": 2}


def store_paths(work: Path, sessions: int) -> list[PathCost]:
    """Commands per ``initialize`` and per session request (``ping``), replica direct,
    with the handshake event store (the default) and with ``--sse-events 0``, and the
    Redis memory each leaves behind (``used_memory`` delta: the store's keys live
    ``--sse-ttl``)."""
    out: list[PathCost] = []
    for label, name, args in (
        ("event store on", "scalestoreon", ()),
        ("--sse-events 0", "scalestoreoff", ("--sse-events", "0")),
    ):
        (inits, init_bytes), (pings, ping_bytes) = _store_costs(work, name, args, sessions)
        note = "replica direct; Redis memory +{:.0f} B each"
        out += [
            PathCost(f"initialize, {label}", inits, sessions, note.format(init_bytes)),
            PathCost(f"session request, {label}", pings, sessions, note.format(ping_bytes)),
        ]
    return out


def _store_costs(
    work: Path, name: str, args: tuple[str, ...], sessions: int
) -> tuple[tuple[dict[str, float], float], tuple[dict[str, float], float]]:
    """(commands, Redis bytes) per ``initialize`` and per ``ping`` of ``sessions``."""
    with _one_replica(work, name, args=args) as (rclient, url), httpx.Client(timeout=10) as http:
        _open_sessions(http, url, 10)  # warm-up: imports, pools, scripts loaded
        background = background_rate(rclient, IDLE_WINDOW)
        opened: list[str] = []

        def open_all() -> None:
            opened.extend(_open_sessions(http, url, sessions))

        used = _used_memory(rclient)
        inits = counted(rclient, background, sessions, open_all)
        init_bytes = (_used_memory(rclient) - used) / sessions
        used = _used_memory(rclient)
        pings = counted(rclient, background, sessions, lambda: _ping_each(http, url, opened))
        ping_bytes = (_used_memory(rclient) - used) / sessions
    return (inits, init_bytes), (pings, ping_bytes)


def _used_memory(rclient: redis.Redis) -> int:
    return int(rclient.info("memory")["used_memory"])


def _open_sessions(http: httpx.Client, url: str, n: int) -> list[str]:
    opened = []
    for _ in range(n):
        resp = http.post(url, content=initialize_body("bench-scale"), headers=HANDSHAKE)
        if resp.status_code != 200:
            raise RuntimeError(f"initialize: {resp.status_code} {resp.text[:200]}")
        session = resp.headers["mcp-session-id"]
        done = http.post(url, content=INITIALIZED, headers={**HANDSHAKE, "mcp-session-id": session})
        if done.status_code != 202:
            raise RuntimeError(f"initialized: {done.status_code}")
        opened.append(session)
    return opened


def _ping_each(http: httpx.Client, url: str, sessions: list[str]) -> None:
    for n, session in enumerate(sessions):
        body = f'{{"jsonrpc": "2.0", "id": {n + 1}, "method": "ping"}}'
        resp = http.post(url, content=body, headers={**HANDSHAKE, "mcp-session-id": session})
        if resp.status_code != 200 or '"result":{}' not in resp.text:
            raise RuntimeError(f"ping: {resp.status_code} {resp.text[:200]}")


def principal(i: int) -> str:
    """The ``i``-th stand-in client address (``X-Forwarded-For``: the replica trusts one hop)."""
    return f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}"


def limits_paths(work: Path, principals: int) -> list[PathCost]:
    """With limits per principal on at their defaults, every request from its own principal:
    commands per modern round and per ``initialize``, and per held session per second."""
    with _one_replica(work, "scalelimits", limits=True) as (rclient, url):
        with httpx.Client(timeout=10) as http:
            background = background_rate(rclient, IDLE_WINDOW)
            rounds = counted(
                rclient, background, principals, lambda: _rounds_each(http, url, principals)
            )
            inits = counted(
                rclient, background, principals, lambda: _sessions_each(http, url, principals)
            )
            time.sleep(1.0)  # past the places' first renewal's start
            held = background_rate(rclient, RENEWAL_WINDOW)
        renewals = {k: (v - background.get(k, 0.0)) / principals for k, v in held.items()}
        note = f"{principals} principals, one request each; defaults"
        return [
            PathCost("modern round, limits on", rounds, principals, note),
            PathCost("initialize, limits on", inits, principals, note),
            PathCost(
                "held session, limits on (per session per second)",
                {k: v for k, v in renewals.items() if abs(v) >= NOISE_PER_UNIT / 10},
                principals,
                f"{principals} sessions of as many principals, idle {RENEWAL_WINDOW:g} s",
                ceiling_unit="sessions held",
            ),
        ]


def _rounds_each(http: httpx.Client, url: str, n: int) -> None:
    for i in range(n):
        headers = {"x-forwarded-for": principal(i)}
        answer = modern_call(url, "confirm_purchase", EXAMPLE_ARGS, client=http, headers=headers)
        if answer.status != 200 or "requestState" not in answer.result:
            raise RuntimeError(f"round with limits on: {answer.status} {answer.body}")


def _sessions_each(http: httpx.Client, url: str, n: int) -> None:
    for i in range(n):
        headers = {**HANDSHAKE, "x-forwarded-for": principal(i)}
        resp = http.post(url, content=initialize_body("bench-scale"), headers=headers)
        if resp.status_code != 200:
            raise RuntimeError(f"initialize with limits on: {resp.status_code} {resp.text[:200]}")
        note = {**headers, "mcp-session-id": resp.headers["mcp-session-id"]}
        done = http.post(url, content=INITIALIZED, headers=note)
        if done.status_code != 202:
            raise RuntimeError(f"initialized with limits on: {done.status_code}")
