"""``mcpfleet dev``: a whole fleet on 127.0.0.1 (Redis, replicas, a router) until Ctrl-C."""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NoReturn

from mcpfleet.commands import UsageError, port
from mcpfleet.config import DEFAULT_APP, ReplicaConfig

COMMANDS = ("dev",)


def add_parsers(sub: Any) -> None:
    d = sub.add_parser("dev", help="run a whole fleet on 127.0.0.1 until Ctrl-C")
    d.add_argument("--replicas", type=int, default=3, help="replica processes")
    d.add_argument("--port", type=port, default=8000, help="the router's port")
    d.add_argument("--app", default=DEFAULT_APP, help="the FastMCP server, as module:attribute")
    d.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="where keys, logs and Redis data go (default: a new temporary directory)",
    )


def run(args: argparse.Namespace) -> int:
    from mcpfleet.dev.fleet import FleetError, LocalFleet, start_monitoring
    from mcpfleet.dev.supervisor import Supervisor
    from mcpfleet.dev.wait import WaitTimeout

    replicas, app, listen = args.replicas, args.app, args.port
    if replicas < 1:
        raise UsageError("--replicas must be at least 1")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="mcpfleet-dev-"))
    if shutil.which("redis-server") is None:
        return _embedded(work, app, listen)
    fleet = LocalFleet(
        work,
        replicas=replicas,
        port=listen,
        app=app,
        fleet="dev",
        replica_args=("--drain-timeout", "5"),
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


def _embedded(work: Path, app: str, listen: int) -> int:
    """Without redis-server: one replica in this process, no Redis, no router."""
    print(
        "redis-server not found (install: apt-get install redis-server).\n"
        "Falling back to embedded mode: ONE replica, no Redis, no router.",
        file=sys.stderr,
    )
    from mcpfleet.keys.files import write_ring
    from mcpfleet.keys.ring import KeyRing
    from mcpfleet.replica.runtime import run_replica

    write_ring(work / "keys", KeyRing.generate())
    print(f"mcpfleet (embedded) serving {app} at http://127.0.0.1:{listen}/mcp", flush=True)
    run_replica(ReplicaConfig(keys_dir=work / "keys", app=app, port=listen, name="replica-0"))
    return 0


def _did_not_start(fleet: Any, exc: Exception) -> NoReturn:
    """The fleet failed to start: it stops, each process's log tail goes to stderr."""
    fleet.stop()
    for name, tail in fleet.logs():
        print(f"--- {name} ---\n{tail}", file=sys.stderr)
    raise UsageError(f"the fleet did not start: {exc}") from None
