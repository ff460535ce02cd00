"""A whole fleet on 127.0.0.1 as child processes: redis-server, replicas, routers.

What ``mcpfleet dev`` runs, and what the fleet-tier tests drive (through the
``Fleet`` interface in ``hack/devkit/fleetkit``). Every component is the real one,
started as ``mcpfleet serve`` / ``mcpfleet router`` processes; the key ring
lives in one local directory laid out like a Secret volume, shared by the
replicas, and is rotated with the same steps the operator performs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from mcpfleet import redisconn
from mcpfleet.config import DEFAULT_APP
from mcpfleet.contract import Attestation, RedisKeys
from mcpfleet.dev.localprom import (
    REPLICA_JOB,
    ROUTER_JOB,
    RULES_FILE,
    LocalPrometheus,
    PrometheusError,
    Target,
    find_prometheus,
    graph_url,
)
from mcpfleet.dev.ports import free_port
from mcpfleet.dev.wait import WaitTimeout, wait_for
from mcpfleet.keys.files import write_ring
from mcpfleet.keys.ring import KeyRing
from mcpfleet.registry import read_replicas_sync


class FleetError(RuntimeError):
    """A component did not start or a condition was not reached in time."""


def http_ok(url: str, timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@dataclass
class Proc:
    name: str
    argv: list[str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None

    def start(self, env: dict[str, str]) -> None:
        fh = self.log.open("ab")
        self.popen = subprocess.Popen(
            self.argv,
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=env,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        fh.close()

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive:
            assert self.popen is not None
            self.popen.send_signal(sig)

    def wait(self, timeout: float) -> int | None:
        if self.popen is None:
            return None
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout: float = 10.0) -> None:
        if not self.alive:
            return
        self.signal(signal.SIGTERM)
        if self.wait(timeout) is None:
            self.signal(signal.SIGKILL)
            self.wait(5)

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def mcpfleet_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "mcpfleet.cli", *args]


@dataclass
class ReplicaProcess:
    name: str
    port: int
    proc: Proc

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


#: The flags that turn every limit per principal off (mcpfleet.limits): for a
#: fleet whose one client stands for many users (a benchmark, a test).
NO_LIMITS: tuple[str, ...] = ("--limit-sessions", "0", "--limit-rounds", "0", "--limit-listen", "0")


@dataclass
class LocalFleet:
    """Redis, ``replicas`` replica processes and ``routers`` routers on 127.0.0.1."""

    workdir: Path
    replicas: int = 3
    routers: int = 1
    port: int = 0
    app: str = DEFAULT_APP
    fleet: str = "dev"
    replica_args: Sequence[str] = ()
    router_args: Sequence[str] = ()
    #: The replicas' limits per principal: their defaults, or off (NO_LIMITS).
    limits: bool = True
    redis_server: str | None = field(default_factory=lambda: shutil.which("redis-server"))
    redis_port: int = 0
    members: dict[str, ReplicaProcess] = field(default_factory=dict)
    router_procs: list[Proc] = field(default_factory=list)
    router_ports: list[int] = field(default_factory=list)
    redis: Proc | None = None
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def keys_dir(self) -> Path:
        return self.workdir / "keys"

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    @property
    def url(self) -> str:
        """The MCP endpoint of the first router."""
        return f"http://127.0.0.1:{self.router_ports[0]}/mcp"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        env.update(self.extra_env)
        return env

    # --- lifecycle ---------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.redis_server is None:
            raise FleetError("redis-server not found: install it (apt-get install redis-server)")
        self.prepare_keys()
        self.start_redis(timeout)
        for i in range(self.replicas):
            self.add_replica(f"replica-{i}", wait=False)
        for name in list(self.members):
            self.wait_replica(name, timeout)
        self.start_routers(timeout)

    def start_routers(self, timeout: float) -> None:
        """Start ``routers`` routers; return once each sees every replica serving."""
        for i in range(self.routers):
            port = self.port if (i == 0 and self.port) else free_port()
            proc = Proc(
                f"router-{i}",
                mcpfleet_argv(
                    "router",
                    "--port",
                    str(port),
                    "--redis",
                    self.redis_url,
                    "--fleet",
                    self.fleet,
                    *self.router_args,
                ),
                self.workdir / f"router-{i}.log",
            )
            proc.start(self.env())
            self.router_procs.append(proc)
            self.router_ports.append(port)
        for i, port in enumerate(self.router_ports):
            wait_for(
                self._router_sees(port, self.replicas),
                timeout=timeout,
                what=f"router-{i} to see {self.replicas} serving replica(s)",
                retry_on=(OSError, ValueError, KeyError),
            )

    #: Where redis-server listens. Protected mode (loopback clients only) is on
    #: when that is loopback alone; a backend whose clients come from elsewhere
    #: (the node's pods, from its bridge) adds that address, and listening on
    #: loopback and it alone is then the protection.
    redis_bind: ClassVar[tuple[str, ...]] = ("127.0.0.1",)

    def start_redis(self, timeout: float = 30.0) -> None:
        """Start redis-server (again, on the same port, empty, after it stopped)."""
        assert self.redis_server is not None
        if not self.redis_port:
            self.redis_port = free_port()
        self.redis = Proc(
            "redis",
            [
                self.redis_server,
                "--port",
                str(self.redis_port),
                "--bind",
                *self.redis_bind,
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
                "--protected-mode",
                "yes" if self.redis_bind == ("127.0.0.1",) else "no",
            ],
            self.workdir / "redis.log",
        )
        self.redis.start(self.env())
        wait_for(
            self._redis_ping,
            timeout=timeout,
            what="redis-server to answer PING",
            retry_on=(OSError,),
        )

    def _redis_ping(self) -> bool:
        with socket.create_connection(("127.0.0.1", self.redis_port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")

    def _router_sees(self, port: int, count: int) -> Callable[[], bool]:
        return lambda: self._router_serving(port) >= count

    def _router_serving(self, port: int) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as resp:
                return int(json.loads(resp.read())["serving"])
        except urllib.error.HTTPError as exc:
            return int(json.loads(exc.read())["serving"])

    # --- hooks a backend may override (the control-plane backend feeds each
    # replica's key directory from a real Secret) ---------------------------------

    def prepare_keys(self) -> None:
        """Create the fleet's key ring before any replica starts."""
        if not (self.keys_dir / "..data").exists():
            write_ring(self.keys_dir, KeyRing.generate())

    def replica_keys_dir(self, name: str) -> Path:
        """The key ring directory replica ``name`` reads (here: one, shared)."""
        return self.keys_dir

    def add_replica(self, name: str, *, wait: bool = True, timeout: float = 60.0) -> ReplicaProcess:
        port = free_port()
        proc = Proc(
            name,
            mcpfleet_argv(
                "serve",
                "--app",
                self.app,
                "--port",
                str(port),
                "--keys",
                str(self.replica_keys_dir(name)),
                "--redis",
                self.redis_url,
                "--name",
                name,
                "--fleet",
                self.fleet,
                # Every request reaches a replica through the fleet's router.
                "--trusted-hops",
                "1",
                *(() if self.limits else NO_LIMITS),
                *self.replica_args,
            ),
            self.workdir / f"{name}.log",
        )
        proc.start(self.env())
        member = ReplicaProcess(name, port, proc)
        self.members[name] = member
        if wait:
            self.wait_replica(name, timeout)
        return member

    def wait_replica(self, name: str, timeout: float = 60.0) -> None:
        member = self.members[name]

        def ready() -> bool:
            if not member.proc.alive:
                raise FleetError(f"{name} exited:\n{member.proc.tail()}")
            return http_ok(member.url + "/readyz") and name in self.attestations()

        import redis

        try:
            wait_for(
                ready,
                timeout=timeout,
                what=f"{name} to be ready and registered",
                retry_on=(OSError, redis.RedisError),
            )
        except (FleetError, WaitTimeout) as exc:
            raise FleetError(f"{exc}\n--- {name} log ---\n{member.proc.tail()}") from None

    def stop(self) -> None:
        for proc in self.router_procs:
            proc.signal(signal.SIGINT)
        for member in self.members.values():
            member.proc.signal(signal.SIGINT)
        for proc in [*self.router_procs, *(m.proc for m in self.members.values())]:
            if proc.wait(10) is None:
                proc.stop(1)
        if self.redis is not None:
            self.redis.stop()

    def __enter__(self) -> LocalFleet:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- what it reports ----------------------------------------------------------------

    def attestations(self) -> dict[str, Attestation]:
        settings = redisconn.settings(self.redis_url)
        client = redisconn.sync_client(settings, timeout=2)
        try:
            return read_replicas_sync(client, RedisKeys(self.fleet, settings.parsed.cluster))
        finally:
            client.close()

    def metrics_targets(self) -> list[Target]:
        """Every process with a ``/metrics``: the replicas and the routers."""
        out = [Target(f"127.0.0.1:{m.port}", REPLICA_JOB, m.name) for m in self.members.values()]
        out += [
            Target(f"127.0.0.1:{port}", ROUTER_JOB, proc.name)
            for port, proc in zip(self.router_ports, self.router_procs, strict=True)
        ]
        return out

    def logs(self) -> Iterator[tuple[str, str]]:
        if self.redis is not None:
            yield "redis", self.redis.tail(10)
        for member in self.members.values():
            yield member.name, member.proc.tail()
        for proc in self.router_procs:
            yield proc.name, proc.tail()


def start_monitoring(
    fleet: LocalFleet, workdir: Path, out: Callable[[str], None] = print, interval: float = 5.0
) -> LocalPrometheus | None:
    """Debian's Prometheus scraping every process of ``fleet`` with the alert rules loaded.

    Without a ``prometheus`` binary (or when it fails to start) this says so and
    returns None: the fleet runs on without monitoring.
    """
    if find_prometheus() is None:
        out("  prometheus not found (apt-get install prometheus): running without monitoring")
        return None
    rules = [RULES_FILE] if RULES_FILE.exists() else []
    prom = LocalPrometheus(workdir, namespace=fleet.fleet, interval=interval, rules=rules)
    try:
        prom.start(fleet.metrics_targets())
    except PrometheusError as exc:
        prom.stop()
        out(f"  prometheus did not start, running without monitoring: {exc}")
        return None
    loaded = "alert rules loaded" if rules else "alert rules not found (not a source checkout)"
    out(f"  prometheus {prom.url} scraping {len(fleet.metrics_targets())} processes, {loaded}")
    out(f"  asking vs final rounds: {graph_url(prom.url)}")
    return prom
