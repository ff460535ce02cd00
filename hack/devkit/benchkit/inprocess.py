"""Modern two-round flows through ASGI apps in this process: no sockets, no uvicorn.

Where :mod:`benchkit.roundcost` measures whole processes over HTTP, this drives
the apps' ASGI callables directly, so what differs between two of them is only
their own code:

* ``plain``: :data:`benchkit.roundapp.plain` as ``http_app(json_response=True)``;
* ``replica``: the replica's whole ASGI app (:func:`mcpfleet.replica.process.build_asgi`)
  of :func:`benchkit.roundapp.fleet`, standalone, limits off;
* ``replica-app``: the same replica's JSON-mode app alone, without the layers in
  front of it (gate, refused credentials, Host/Origin guard, response modes);
* ``replica-user``: the replica as a user gets it (every flag at its default:
  limits per principal on, notifications on), on the Redis ``--redis`` names,
  which the caller starts. Every app's flows come from
  :data:`benchkit.roundcost.USER_PRINCIPALS` client addresses in turn, as in
  ``make bench``;
* ``replica-gate``: the same, but its rounds limited at 2000/s with a burst of
  4000 (the ``limits on`` row of ``make bench``): a lease holds 200 rounds, so a
  round pays the limits gate and nearly never a Redis call. Beside ``replica``
  and ``replica-user`` it splits what the limits cost a round as a user gets
  them into the gate's share and the share of the lease's Redis call.

Two ways to count, both printed per flow (one asking and one answer round):

* CPU (``time.process_time``), every named app in turns, the median of ``--reps``.
  Building the replica turns FastMCP's spans off for the whole process
  (:mod:`mcpfleet.replica.spans`), plain FastMCP's included, so beside the replica
  plain FastMCP runs without its spans here: compare it in instructions;
* instructions, under callgrind (Debian's ``valgrind``): the process turns instrumentation on around
  the measured flows itself (``callgrind_control``), so start-up is not counted::

    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=/tmp/cg.%p \\
      .venv/bin/python -m benchkit.inprocess --grind replica --flows 300

  valgrind prints the instructions (``I refs``); divide by the flows. Under
  valgrind the replica's clock runs some fifty times slower, so its disconnect
  watch (:data:`mcpfleet.replica.respmode.WATCH_AFTER`) is stretched as much.

    PYTHONPATH=hack/devkit .venv/bin/python -m benchkit.inprocess plain replica replica-app
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import json
import os
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from starlette.types import ASGIApp, Message

from benchkit.roundapp import TOOL, plain
from benchkit.roundcost import HEADERS, LIMITS_ARGS, REPLICA_LIMITS, USER_PRINCIPALS, _body

APPS = ("plain", "replica", "replica-app")
#: Apps that need ``--redis``.
REDIS_APPS = ("replica-user", "replica-gate")
#: The ``replica-gate`` app's rounds limit: ``make bench``'s ``limits on`` (a lease of 200 rounds).
_GATE_ARGS = LIMITS_ARGS[REPLICA_LIMITS]
_GATE_FLAGS = dict(zip(_GATE_ARGS[::2], _GATE_ARGS[1::2], strict=True))
GATE_LIMITS: dict[str, Any] = {
    "limit_rounds": float(_GATE_FLAGS["--limit-rounds"]),
    "limit_burst": int(_GATE_FLAGS["--limit-burst"]),
}
ADDRESSES = [f"10.0.{i // 250}.{i % 250 + 1}".encode() for i in range(USER_PRINCIPALS)]
_sent = 0


def build(which: str, stretch: float = 1.0, redis_url: str | None = None) -> ASGIApp:
    """The ASGI app named ``which`` (see the module docstring)."""
    if which == "plain":
        return plain.http_app(path="/mcp", json_response=True)
    from mcpfleet.config import ReplicaConfig
    from mcpfleet.keys.ring import KeyRing
    from mcpfleet.replica import respmode
    from mcpfleet.replica.process import build_asgi
    from mcpfleet.replica.runtime import Replica

    # As a user gets it: every flag at its default, on the caller's Redis. Else
    # standalone, the limits off.
    user = which in REDIS_APPS
    if user and redis_url is None:
        raise SystemExit(f"{which} needs --redis URL (a redis-server of yours)")
    config = ReplicaConfig(
        keys_dir=Path("/nonexistent"),
        app="benchkit.roundapp:fleet",
        trusted_hops=1,
        redis_url=redis_url if user else None,
    )
    if not user:
        config = dataclasses.replace(config, limit_sessions=0, limit_rounds=0, limit_listen=0)
    elif which == "replica-gate":
        config = dataclasses.replace(config, **GATE_LIMITS)
    replica = Replica(config, KeyRing.generate())
    # The watch's delay stretched as the clock is (a Final constant: set from outside).
    setattr(respmode, "WATCH_AFTER", respmode.WATCH_AFTER * stretch)  # noqa: B010
    whole = build_asgi(replica)
    if which in ("replica", *REDIS_APPS):
        return whole
    if which == "replica-app":
        assert replica.json_app is not None
        # The replica's lifespan starts both apps; only the requests skip the front.
        return _Front(whole, replica.json_app)
    raise SystemExit(f"unknown app {which!r}: one of {', '.join(APPS)}")


class _Front:
    """Lifespan messages to the whole replica, requests to its JSON-mode app alone."""

    def __init__(self, whole: ASGIApp, inner: ASGIApp) -> None:
        self.whole, self.inner = whole, inner

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        app = self.whole if scope["type"] == "lifespan" else self.inner
        await app(scope, receive, send)


_HEADERS = [
    (k.encode(), v.encode())
    for k, v in {**HEADERS, "mcp-name": TOOL, "host": "127.0.0.1:8000"}.items()
]


async def call(app: ASGIApp, body: bytes) -> dict[str, Any]:
    """One POST to ``/mcp`` through ``app``, from the next of :data:`ADDRESSES`; its
    JSON-RPC result."""
    global _sent
    address, _sent = ADDRESSES[_sent % len(ADDRESSES)], _sent + 1
    headers = [*_HEADERS, (b"x-forwarded-for", address)]
    headers.append((b"content-length", str(len(body)).encode()))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/mcp",
        "raw_path": b"/mcp",
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 5555),
        "server": ("127.0.0.1", 8000),
        "state": {},
    }
    done = asyncio.Event()
    sent: list[Message] = []
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> Message:
        if pending:
            return pending.pop()
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            done.set()

    await app(scope, receive, send)
    done.set()
    # As a server between two requests: one turn of the loop for the tasks the request
    # left ready (a lease the limits take ahead, mcpfleet.limits).
    await asyncio.sleep(0)
    payload = b"".join(m.get("body", b"") for m in sent[1:])
    if not sent or sent[0]["status"] != 200:
        raise RuntimeError(f"round failed: {payload[:300]!r}")
    result: dict[str, Any] = json.loads(payload)["result"]
    return result


async def lifespan(app: ASGIApp) -> Any:
    """``app``'s lifespan started; the coroutine function that stops it."""
    to_app: asyncio.Queue[Message] = asyncio.Queue()
    from_app: asyncio.Queue[Message] = asyncio.Queue()
    scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
    task: asyncio.Task[None] = asyncio.create_task(
        app(scope, to_app.get, from_app.put)  # type: ignore[arg-type]
    )
    await to_app.put({"type": "lifespan.startup"})
    started = await from_app.get()
    if started["type"] != "lifespan.startup.complete":
        raise RuntimeError(f"the app did not start: {started}")

    async def stop() -> None:
        await to_app.put({"type": "lifespan.shutdown"})
        await from_app.get()
        await task

    return stop


async def flows(app: ASGIApp, n: int, batch: int = 50) -> tuple[float, float]:
    """``n`` flows in batches (asking rounds, then their answers): CPU us per round of each."""
    ask = answer = 0.0
    for _ in range(max(1, n // batch)):
        states = []
        t0 = time.process_time()
        for _ in range(batch):
            states.append((await call(app, _body(TOOL)))["requestState"])
        t1 = time.process_time()
        for state in states:
            text = (await call(app, _body(TOOL, state)))["content"][0]["text"]
            if not str(text).startswith("Purchased"):
                raise RuntimeError(f"unexpected answer {text!r}")
        t2 = time.process_time()
        ask, answer = ask + t1 - t0, answer + t2 - t1
    done = max(1, n // batch) * batch
    return ask / done * 1e6, answer / done * 1e6


async def compare(names: list[str], n: int, reps: int, redis_url: str | None) -> None:
    apps = {name: build(name, redis_url=redis_url) for name in names}
    stops = [await lifespan(app) for app in apps.values()]
    for app in apps.values():
        await flows(app, 100)  # warm every path up
    measured: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for rep in range(reps):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            measured[name].append(await flows(apps[name], n))
    base_ask = statistics.median(a for a, _ in measured[names[0]])
    base_answer = statistics.median(b for _, b in measured[names[0]])
    print(f"CPU per round, ask / answer, median of {reps} x {n} flows, in turns:")
    for name in names:
        ask = statistics.median(a for a, _ in measured[name])
        answer = statistics.median(b for _, b in measured[name])
        print(
            f"  {name:<12} {ask:6.0f} / {answer:6.0f} us"
            f"   x{ask / base_ask:.3f} / x{answer / base_answer:.3f} of {names[0]}"
        )
    for stop in stops:
        await stop()


async def grind(name: str, n: int, redis_url: str | None) -> None:
    app = build(name, stretch=50.0, redis_url=redis_url)
    stop = await lifespan(app)
    await flows(app, 100)
    gc.collect()
    control = ["callgrind_control", "--instr"]
    subprocess.run([*control, "on", str(os.getpid())], check=True, capture_output=True)
    await flows(app, n)
    subprocess.run([*control, "off", str(os.getpid())], check=True, capture_output=True)
    print(f"{name}: {n} flows measured; valgrind's I refs / {n} = instructions a flow")
    await stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    names = (*APPS, *REDIS_APPS)
    parser.add_argument("apps", nargs="*", default=list(APPS), help=f"of {', '.join(names)}")
    parser.add_argument("--redis", help="a Redis URL, for " + ", ".join(REDIS_APPS))
    parser.add_argument("--flows", type=int, default=500)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--grind", action="store_true", help="one app, under callgrind")
    args = parser.parse_args()
    import uvloop

    if args.grind:
        uvloop.run(grind(args.apps[0], args.flows, args.redis))
    else:
        uvloop.run(compare(args.apps, args.flows, args.reps, args.redis))


if __name__ == "__main__":
    main()
