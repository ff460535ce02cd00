"""``mcpfleet dev``: a whole fleet on 127.0.0.1 (Redis, replicas, a router) until Ctrl-C.

The replicas' limits per principal are ``mcpfleet serve``'s own flags, declared
once in :data:`mcpfleet.config.LIMIT_SETTINGS` and added by
:mod:`mcpfleet.commands.limitflags`: ``dev`` takes every flag that module adds
and hands the ones given on its command line to each replica as they were
given, so a limit flag declared there reaches ``dev`` with no change here.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NoReturn

from mcpfleet.commands import UsageError, limitflags, port
from mcpfleet.config import DEFAULT_APP, ReplicaConfig

COMMANDS = ("dev",)


class _Declared(argparse.ArgumentParser):
    """A parser that keeps the actions of the flags declared on it."""

    def __init__(self) -> None:
        super().__init__(add_help=False)
        self.declared: list[argparse.Action] = []

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        self.declared.append(action)
        return action


def limit_flags() -> list[argparse.Action]:
    """The replicas' limit flags, as :func:`limitflags.add_flags` declares them for serve."""
    declared = _Declared()
    limitflags.add_flags(declared, ReplicaConfig)
    return declared.declared


def limit_args(args: argparse.Namespace) -> list[str]:
    """The limit flags given to ``dev``, as arguments of each replica's ``serve``.

    Only flags given on the command line pass (their ``dev`` default is None):
    a replica keeps its own default for the rest, and the fleet's own
    ``--trusted-hops 1`` (the router) stays unless ``--trusted-hops`` is given.
    """
    out: list[str] = []
    for action in limit_flags():
        value = getattr(args, action.dest, None)
        if value is None:
            continue
        flag = action.option_strings[-1]
        if action.nargs == 0:  # a switch: given, it is on
            out.append(flag)
        elif isinstance(value, list):
            out += [f"{flag}={item}" for item in value]
        else:
            out.append(f"{flag}={value}")
    return out


def limit_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The limit flags given to ``dev``, as ReplicaConfig fields (the embedded replica)."""
    out: dict[str, Any] = {}
    for action in limit_flags():
        value = getattr(args, action.dest, None)
        if value is not None:
            out[action.dest] = tuple(value) if isinstance(value, list) else value
    return out


def add_parsers(sub: Any) -> None:
    d = sub.add_parser(
        "dev",
        help="run a whole fleet on 127.0.0.1 until Ctrl-C",
        description="A whole fleet on 127.0.0.1 until Ctrl-C. The limit flags are"
        " `mcpfleet serve`'s: each one given here is passed to every replica (a replica"
        " keeps its default for the others). The router is one trusted hop already:"
        " --trusted-hops counts it too.",
    )
    d.add_argument("--replicas", type=int, default=3, help="replica processes")
    d.add_argument("--port", type=port, default=8000, help="the router's port")
    d.add_argument("--app", default=DEFAULT_APP, help="the FastMCP server, as module:attribute")
    d.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="where keys, logs and Redis data go (default: a new temporary directory)",
    )
    limitflags.add_flags(d, ReplicaConfig)
    # None: not given, so the replicas keep their own defaults (limit_args).
    d.set_defaults(**{action.dest: None for action in limit_flags()})


def run(args: argparse.Namespace) -> int:
    from mcpfleet.dev.fleet import FleetError, LocalFleet, start_monitoring
    from mcpfleet.dev.supervisor import Supervisor
    from mcpfleet.dev.wait import WaitTimeout

    replicas, app, listen = args.replicas, args.app, args.port
    if replicas < 1:
        raise UsageError("--replicas must be at least 1")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="mcpfleet-dev-"))
    if shutil.which("redis-server") is None:
        return _embedded(work, app, listen, limit_fields(args))
    fleet = LocalFleet(
        work,
        replicas=replicas,
        port=listen,
        app=app,
        fleet="dev",
        replica_args=("--drain-timeout", "5", *limit_args(args)),
    )
    stop = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        fleet.start()
    except (FleetError, WaitTimeout) as exc:
        _did_not_start(fleet, exc)
    print(f"mcpfleet dev: {replicas} replica(s) behind the router at {fleet.url}")
    print(f"  redis {fleet.redis_url}, key ring {fleet.keys_dir}, logs in {work}")
    prometheus = start_monitoring(fleet, work / "prometheus")
    print(
        f"  try: mcpfleet demo --url {fleet.url} --era modern   (Ctrl-C stops the fleet)",
        flush=True,
    )
    supervisor = Supervisor(fleet, say=lambda line: print(f"mcpfleet dev: {line}", flush=True))
    try:
        while not stop:
            supervisor.tick(time.monotonic())
            time.sleep(0.25)
    finally:
        print("stopping the fleet", flush=True)
        if prometheus is not None:
            prometheus.stop()
        fleet.stop()
    return 0


def _embedded(work: Path, app: str, listen: int, limits: dict[str, Any]) -> int:
    """Without redis-server: one replica in this process, no Redis, no router."""
    print(
        "redis-server not found (install: apt-get install redis-server).\n"
        "Falling back to embedded mode: ONE replica, no Redis, no router.",
        file=sys.stderr,
    )
    from mcpfleet.keys.files import write_ring
    from mcpfleet.keys.ring import KeyRing
    from mcpfleet.replica.process import run_replica

    write_ring(work / "keys", KeyRing.generate())
    print(f"mcpfleet (embedded) serving {app} at http://127.0.0.1:{listen}/mcp", flush=True)
    config = ReplicaConfig(keys_dir=work / "keys", app=app, port=listen, name="replica-0", **limits)
    run_replica(config)
    return 0


def _did_not_start(fleet: Any, exc: Exception) -> NoReturn:
    """The fleet failed to start: it stops, each process's log tail goes to stderr."""
    fleet.stop()
    for name, tail in fleet.logs():
        print(f"--- {name} ---\n{tail}", file=sys.stderr)
    raise UsageError(f"the fleet did not start: {exc}") from None
