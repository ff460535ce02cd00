"""The ``Fleet`` interface the multi-replica scenarios are written against, and its backends.

A scenario gets a :class:`Fleet` and never asks how it runs: local processes
here (:func:`local_fleet`), a real API server feeding the key ring through a
Secret (the control-plane backend), or a kind cluster. On failure the
scenario prints :func:`diagnostics`: log tails, the replica registry and the
routing table as Redis holds them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

import redis

import mcpfleet
from fleetkit.clients.jwtkit import TokenIssuer
from mcpfleet.config import DEFAULT_APP
from mcpfleet.contract import Attestation, RedisKeys
from mcpfleet.dev.fleet import LocalFleet
from mcpfleet.dev.ports import free_port
from mcpfleet.dev.wait import wait_for
from mcpfleet.keys.files import read_ring, write_ring
from mcpfleet.keys.ring import KeyRing

#: The import root of fleetkit and benchkit (hack/devkit/).
DEVKIT_DIR = Path(__file__).resolve().parents[1]
#: The source root of the ``mcpfleet`` these tests import: the processes they start
#: import the same one (a worktree's, not whatever an editable install points at).
SERVER_ROOT = Path(mcpfleet.__file__).resolve().parents[1]

F = TypeVar("F", bound=LocalFleet)


class Fleet(Protocol):
    """What a multi-replica scenario may do to a fleet."""

    @property
    def url(self) -> str:
        """The MCP endpoint clients use (a router)."""
        ...

    def router_url(self, index: int) -> str: ...

    def replica_names(self) -> list[str]: ...

    def kill(self, name: str) -> None:
        """Kill a replica without a chance to drain."""
        ...

    def drain(self, name: str) -> None:
        """Ask a replica to drain and exit (SIGTERM, or a pod deletion)."""
        ...

    def rotate_step(self, step: str) -> KeyRing:
        """Apply stage/promote/retire/abort to the fleet's key ring where it lives."""
        ...

    def wait_attested(self, kids: tuple[str, ...], timeout: float = 30.0) -> None: ...

    def attestations(self) -> dict[str, Attestation]: ...

    def ring(self) -> KeyRing: ...


@dataclass
class ProcessFleet(LocalFleet):
    """The :class:`LocalFleet` of ``mcpfleet dev`` with what a scenario does to it
    (the :class:`Fleet` interface): the product's class runs a fleet, this one tests it.
    Its replicas run without limits per principal (every test client is one
    principal, 127.0.0.1); a test of the limits sets ``limits=True`` or its flags."""

    limits: bool = False

    def router_url(self, index: int) -> str:
        return f"http://127.0.0.1:{self.router_ports[index]}/mcp"

    def kill(self, name: str) -> None:
        """SIGKILL a replica: no drain, no goodbye."""
        proc = self.members[name].proc
        proc.signal(signal.SIGKILL)
        proc.wait(10)

    def drain(self, name: str) -> None:
        """SIGTERM a replica: it drains and exits by itself."""
        self.members[name].proc.signal(signal.SIGTERM)

    def stop_redis(self) -> None:
        """Stop the fleet's redis-server; :meth:`start_redis` starts it again, empty."""
        if self.redis is not None:
            self.redis.stop()

    def ring(self) -> KeyRing:
        """The key ring the replicas read, as it is on disk now."""
        return read_ring(self.keys_dir)

    def replica_names(self) -> list[str]:
        """Replicas whose process is running."""
        return [m.name for m in self.members.values() if m.proc.alive]

    def rotate_step(self, step: str) -> KeyRing:
        """Apply one of stage/promote/retire/abort to the shared ring directory."""
        ring: KeyRing = getattr(self.ring(), step)()
        write_ring(self.keys_dir, ring)
        return ring

    def wait_attested(self, kids: tuple[str, ...], timeout: float = 30.0) -> None:
        """Until every live serving replica attests exactly ``kids`` (in order)."""

        def converged() -> bool:
            live = [m for m in self.members.values() if m.proc.alive]
            att = self.attestations()
            return all(m.name in att and att[m.name].kids == kids for m in live)

        wait_for(
            converged,
            timeout=timeout,
            what=f"every replica to attest kids {list(kids)}",
            retry_on=(OSError, redis.RedisError),
        )


def require_redis() -> str:
    """The redis-server binary; in CI a missing one fails the run rather than skipping it."""
    import pytest

    found = shutil.which("redis-server")
    if found:
        return found
    if os.environ.get("CI") == "true":
        pytest.fail("redis-server is not installed (.ci/run installs it with apt-get)")
    pytest.skip("redis-server is not installed: apt-get install redis-server (or make deps)")


@dataclass(frozen=True)
class FleetOptions:
    """What every backend's fleet is made of, whichever backend runs it.

    ``app`` may also name a test app in ``hack/devkit/fleetkit``: hack/devkit/ is on
    the replicas' ``PYTHONPATH``, and so is the source root of the ``mcpfleet`` the
    caller imported. ``env`` adds to every process's environment (its ``PYTHONPATH``
    goes after those two). ``port``: the first router's (default: free).
    """

    replicas: int = 3
    routers: int = 1
    replica_args: Sequence[str] = ()
    router_args: Sequence[str] = ()
    fleet: str = "test"
    app: str = DEFAULT_APP
    env: Mapping[str, str] = field(default_factory=dict)
    port: int = 0

    def __post_init__(self) -> None:
        # Tuples, whatever sequence a caller passed: the options stay what they were.
        object.__setattr__(self, "replica_args", tuple(self.replica_args))
        object.__setattr__(self, "router_args", tuple(self.router_args))
        object.__setattr__(self, "env", dict(self.env))

    def fleet_fields(self) -> dict[str, Any]:
        """The :class:`LocalFleet` fields these options set, for any backend's constructor."""
        # The tests' own import path goes last (made absolute: the processes run in
        # their work directory), so the processes run the code the tests import.
        inherited = [
            os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p
        ]
        roots = (str(DEVKIT_DIR), str(SERVER_ROOT), self.env.get("PYTHONPATH"), *inherited)
        path = os.pathsep.join(p for p in roots if p)
        return {
            "replicas": self.replicas,
            "routers": self.routers,
            "fleet": self.fleet,
            "app": self.app,
            "replica_args": tuple(self.replica_args),
            "router_args": tuple(self.router_args),
            "port": self.port,
            "extra_env": {**self.env, "PYTHONPATH": path},
        }


@contextlib.contextmanager
def local_fleet(workdir: Path, options: FleetOptions | None = None) -> Iterator[ProcessFleet]:
    """A fleet of local processes; torn down (and its ports freed) on exit."""
    require_redis()
    lf = ProcessFleet(workdir, **(options or FleetOptions()).fleet_fields())
    with running(lf, diagnostics):
        yield lf


#: deploy/own-app: an app of one's own with FastMCP's JWT auth (``ownapp.server:mcp``).
OWN_APP = Path(__file__).resolve().parents[3] / "deploy" / "own-app"


@contextlib.contextmanager
def own_app_fleet(
    workdir: Path,
    issuer: TokenIssuer,
    *,
    replica_args: Sequence[str] = (),
    router_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> Iterator[ProcessFleet]:
    """Two replicas of deploy/own-app, verifying ``issuer``'s tokens, behind one router;
    ``env`` is added to the app's own environment."""
    key = issuer.write_public_key(workdir / "jwt-public.pem")
    port = free_port()
    options = FleetOptions(
        replicas=2,
        app="ownapp.server:mcp",
        env={
            **issuer.app_env(key, f"http://127.0.0.1:{port}"),
            "PYTHONPATH": str(OWN_APP),
            **(env or {}),
        },
        port=port,
        replica_args=tuple(replica_args),
        router_args=tuple(router_args),
    )
    with local_fleet(workdir, options) as lf:
        yield lf


@contextlib.contextmanager
def running(fleet: F, diagnose: Callable[[F], str]) -> Iterator[F]:
    """Start ``fleet``; on a failed start print ``diagnose(fleet)``; always stop it."""
    try:
        fleet.start()
    except BaseException:
        print(diagnose(fleet))
        fleet.stop()
        raise
    try:
        yield fleet
    finally:
        fleet.stop()


def diagnostics(fleet: LocalFleet) -> str:
    """What a person needs when a fleet scenario fails."""
    out = [f"=== fleet {fleet.fleet} (router {fleet.router_ports}, redis {fleet.redis_port}) ==="]
    try:
        import redis

        # A fleet on a Redis with ACL users (fleetkit.redisrig) says how to reach it as admin.
        admin = getattr(fleet, "redis_admin", None)
        client = (
            admin()
            if admin is not None
            else redis.Redis(host="127.0.0.1", port=fleet.redis_port, socket_timeout=1)
        )
        keys = getattr(fleet, "keys", None) or RedisKeys(fleet.fleet)
        names = sorted(k.decode() for k in client.scan_iter(f"{keys.prefix}:*", count=1000))
        out.append(f"--- redis keys ({len(names)}) ---")
        for name in names[:200]:
            kind = cast(bytes, client.type(name)).decode()
            value = cast(bytes, client.get(name)).decode() if kind == "string" else kind
            out.append(f"{name} = {value}")
        client.close()
    except Exception as exc:
        out.append(f"(redis not readable: {type(exc).__name__}: {exc})")
    for name, tail in fleet.logs():
        out.append(f"--- {name} log (tail) ---\n{tail}")
    return "\n".join(out)
