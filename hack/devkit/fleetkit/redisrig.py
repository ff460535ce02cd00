"""Redis as users run it, for the tests: ACL users, TLS, Sentinel, with real processes.

:class:`RedisServer` is one redis-server on 127.0.0.1, configured from a file
(0600) so that no password is ever in a process argument: the default user
off, an admin user for the test itself, optionally TLS (certificates from
:mod:`fleetkit.certs`) or a replica of another server. :class:`Sentinels`
watches a master with one or more redis-sentinel processes.

:func:`component_user` creates the ACL user a component runs as, with exactly
``RedisKeys(fleet).acl_rules(component)``, and its password file.
:class:`RedisFleet` is a :class:`~fleetkit.fleet.ProcessFleet` whose replicas and routers
connect to such a Redis under their own users (URL with the user name,
``--redis-password-file``, TLS files), and whose own reads (attestations,
readiness) go through the admin user.
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
import signal
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
import redis

from fleetkit.certs import CertificateAuthority
from fleetkit.fleet import FleetOptions, ProcessFleet
from mcpfleet.contract import REDIS_COMPONENTS, Attestation, RedisComponent, RedisKeys
from mcpfleet.dev.fleet import FleetError, Proc
from mcpfleet.dev.ports import free_port
from mcpfleet.dev.wait import wait_for
from mcpfleet.redisconn import parse_url
from mcpfleet.registry import read_replicas_sync

#: What a server or sentinel not yet (or no longer) answering raises: "not yet".
NOT_YET = (redis.RedisError, OSError)

ADMIN = "mcpfleet-test-admin"
REPLICATION = "mcpfleet-test-replication"
MASTER = "mcpfleet"


def require(binary: str) -> str:
    """A Debian-packaged binary the test starts; in CI a missing one fails the run."""
    import os

    found = shutil.which(binary)
    if found:
        return found
    if os.environ.get("CI") == "true":
        pytest.fail(f"{binary} is not installed (make deps installs it)")
    pytest.skip(f"{binary} is not installed: apt-get install {binary} (or make deps)")


def secret_file(path: Path, value: str) -> Path:
    """Write a secret as a Secret volume would hold it: a 0600 file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.write_text(value + "\n")
    return path


@dataclass
class TLSFiles:
    """A CA, the server's certificate (127.0.0.1) and a client certificate, as files."""

    directory: Path
    ca: CertificateAuthority = field(default_factory=lambda: CertificateAuthority("redis-ca"))

    def __post_init__(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.ca_file = self.directory / "ca.crt"
        self.ca_file.write_bytes(self.ca.cert_pem)
        serving = self.ca.issue_serving("redis")
        self.server_cert, self.server_key = serving.write(self.directory, "server")
        self.client_cert, self.client_key = self.ca.issue_client("mcpfleet").write(
            self.directory, "client"
        )

    def client_args(self) -> list[str]:
        return [
            "--redis-ca-file",
            str(self.ca_file),
            "--redis-cert-file",
            str(self.client_cert),
            "--redis-key-file",
            str(self.client_key),
        ]

    def client_kwargs(self) -> dict[str, Any]:
        return {
            "ssl": True,
            "ssl_ca_certs": str(self.ca_file),
            "ssl_certfile": str(self.client_cert),
            "ssl_keyfile": str(self.client_key),
        }


@dataclass
class RedisServer:
    """One redis-server on 127.0.0.1: default user off, an admin user, TLS if asked."""

    workdir: Path
    name: str = "redis"
    tls: TLSFiles | None = None
    #: With TLS, clients must present a certificate the CA signed.
    tls_auth_clients: bool = True
    replica_of: RedisServer | None = None
    port: int = 0
    #: A node of a Redis Cluster (:mod:`fleetkit.clusterrig`): its cluster bus port.
    cluster_bus: int = 0
    admin_password: str = field(default_factory=lambda: secrets.token_hex(16), repr=False)
    repl_password: str = field(default_factory=lambda: secrets.token_hex(16), repr=False)
    proc: Proc | None = None

    @property
    def dir(self) -> Path:
        return self.workdir / self.name

    @property
    def socket(self) -> Path:
        return self.dir / "redis.sock"

    def config(self) -> str:
        lines = [
            "bind 127.0.0.1",
            "protected-mode yes",
            'save ""',
            "appendonly no",
            f"dir {self.dir}",
            f"unixsocket {self.socket}",
            "unixsocketperm 700",
            "user default off",
            f"user {ADMIN} on >{self.admin_password} ~* &* +@all",
            # What a replica authenticates as to its master: only replication.
            f"user {REPLICATION} on >{self.repl_password} +psync +replconf +ping",
            # Sentinel tests want a quick failover; harmless elsewhere.
            "repl-diskless-sync yes",
            "repl-diskless-sync-delay 0",
        ]
        if self.tls is not None:
            lines += [
                "port 0",
                f"tls-port {self.port}",
                f"tls-cert-file {self.tls.server_cert}",
                f"tls-key-file {self.tls.server_key}",
                f"tls-ca-cert-file {self.tls.ca_file}",
                f"tls-auth-clients {'yes' if self.tls_auth_clients else 'no'}",
            ]
        else:
            lines.append(f"port {self.port}")
        if self.cluster_bus:
            lines += [
                "cluster-enabled yes",
                f"cluster-config-file {self.dir / 'nodes.conf'}",
                f"cluster-port {self.cluster_bus}",
                # A master unanswered this long is failed over to its replica.
                "cluster-node-timeout 1000",
                "cluster-replica-validity-factor 0",
                # What it authenticates as, should it become a replica.
                f"masteruser {REPLICATION}",
                f"masterauth {self.repl_password}",
            ]
        if self.replica_of is not None:
            lines += [
                f"replicaof 127.0.0.1 {self.replica_of.port}",
                f"masteruser {REPLICATION}",
                f"masterauth {self.replica_of.repl_password}",
            ]
        return "\n".join(lines) + "\n"

    def start(self, timeout: float = 30.0) -> RedisServer:
        binary = require("redis-server")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        conf = secret_file(self.dir / "redis.conf", self.config())
        self.proc = Proc(self.name, [binary, str(conf)], self.dir / "redis.log")
        self.proc.start({})
        try:
            wait_for(
                self.ping, timeout=timeout, what=f"{self.name} to answer PING", retry_on=NOT_YET
            )
        except BaseException:
            self.stop()  # a failed start leaves no process behind
            raise
        return self

    def ping(self) -> bool:
        if self.proc is None or not self.proc.alive:
            raise FleetError(f"{self.name} exited:\n{self.proc.tail() if self.proc else ''}")
        with contextlib.closing(self.admin()) as client:
            return bool(client.ping())

    def admin(self, timeout: float = 2.0) -> redis.Redis:
        kwargs = self.tls.client_kwargs() if self.tls else {}
        return redis.Redis(
            host="127.0.0.1",
            port=self.port,
            username=ADMIN,
            password=self.admin_password,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            **kwargs,
        )

    def hold_replication(self) -> None:
        """On a master: cut its replicas off and keep them off (their user disabled).

        The master goes on acknowledging writes; the replicas stay up, serving
        reads, a little behind: the state a failover then promotes.
        """
        with contextlib.closing(self.admin()) as admin:
            admin.execute_command("ACL", "SETUSER", REPLICATION, "off")
            admin.execute_command("CLIENT", "KILL", "USER", REPLICATION)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()


def component_user(
    server: RedisServer | Sequence[RedisServer],
    fleet: str,
    component: RedisComponent,
    workdir: Path,
    *,
    cluster: bool = False,
) -> tuple[str, Path]:
    """Create ``component``'s ACL user for ``fleet`` on ``server`` (each of them); return the
    user name and its password file. The rules are exactly the contract's (for a Redis
    Cluster's key names, if ``cluster``)."""
    user = f"mcpfleet-{fleet}-{component}"
    password = secrets.token_hex(16)
    servers = [server] if isinstance(server, RedisServer) else list(server)
    for each in servers:
        with contextlib.closing(each.admin()) as admin:
            admin.execute_command(
                "ACL",
                "SETUSER",
                user,
                "reset",
                "on",
                f">{password}",
                *RedisKeys(fleet, cluster=cluster).acl_rules(component),
            )
    return user, secret_file(workdir / "secrets" / f"{user}.password", password)


def acl_log(server: RedisServer, reset: bool = False) -> list[dict[str, Any]]:
    """The denials ``ACL LOG`` recorded (then cleared, if ``reset``)."""
    with contextlib.closing(server.admin()) as admin:
        entries = admin.execute_command("ACL", "LOG")
        if reset:
            admin.execute_command("ACL", "LOG", "RESET")
    out = []
    for entry in entries:
        if isinstance(entry, dict):
            out.append({_text(k): _text(v) for k, v in entry.items()})
        else:  # RESP2: a flat list of field, value
            it = iter(entry)
            out.append({_text(k): _text(v) for k, v in zip(it, it, strict=False)})
    return out


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


@dataclass
class RedisFleet(ProcessFleet):
    """A :class:`ProcessFleet` on a Redis the test runs, every component under its own user.

    ``base_url`` is the URL without a user (``redis://127.0.0.1:P/0``,
    ``rediss://...``, ``redis+sentinel://...``); each component's user goes in
    front of the host. The fleet neither starts nor stops that Redis.
    """

    base_url: str = ""
    admin_client: Callable[[], redis.Redis] | None = None
    client_args: Sequence[str] = ()
    users: dict[str, tuple[str, Path]] = field(default_factory=dict)

    def component_args(self, component: RedisComponent) -> list[str]:
        user, password_file = self.users[component]
        scheme, _, rest = self.base_url.partition("://")
        return [
            "--redis",
            f"{scheme}://{user}@{rest}",
            "--redis-password-file",
            str(password_file),
            *self.client_args,
        ]

    def start_redis(self, timeout: float = 30.0) -> None:
        """The Redis is the test's: only check it answers."""
        wait_for(self._redis_ping, timeout=timeout, what="the test's Redis", retry_on=NOT_YET)

    def _redis_ping(self) -> bool:
        with contextlib.closing(self.redis_admin()) as client:
            return bool(client.ping())

    def redis_admin(self) -> redis.Redis:
        """A client of the test's admin user (a name no other backend's fleet uses)."""
        assert self.admin_client is not None
        return self.admin_client()

    def admin(self) -> redis.Redis:
        """:meth:`redis_admin`."""
        return self.redis_admin()

    def attestations(self) -> dict[str, Attestation]:
        with contextlib.closing(self.redis_admin()) as client:
            return read_replicas_sync(client, self.keys)

    @property
    def keys(self) -> RedisKeys:
        """The fleet's key names (hash-tagged when ``base_url`` is a cluster's)."""
        return RedisKeys(self.fleet, cluster=parse_url(self.base_url).cluster)


def redis_fleet(
    workdir: Path,
    servers: Sequence[RedisServer],
    base_url: str,
    admin_client: Callable[[], redis.Redis],
    options: FleetOptions,
    *,
    client_args: Sequence[str] = (),
    kind: type[RedisFleet] = RedisFleet,
    **fields: Any,
) -> RedisFleet:
    """A :class:`RedisFleet` whose users exist on every one of ``servers``.

    ``kind``: a subclass of :class:`RedisFleet` to build instead (another
    backend's fleet on such a Redis), given ``fields`` besides.
    """
    cluster = parse_url(base_url).cluster
    users: dict[str, tuple[str, Path]] = {
        c: component_user(servers, options.fleet, c, workdir, cluster=cluster)
        for c in REDIS_COMPONENTS
    }
    lf = kind(
        workdir,
        **options.fleet_fields(),
        base_url=base_url,
        admin_client=admin_client,
        client_args=tuple(client_args),
        users=users,
        **fields,
    )
    lf.replica_args = (*lf.component_args("replica"), *options.replica_args)
    lf.router_args = (*lf.component_args("router"), *options.router_args)
    return lf


# --------------------------------------------------------------------------- Sentinel


@dataclass
class Sentinels:
    """``count`` redis-sentinel processes watching ``master`` under the name :data:`MASTER`."""

    workdir: Path
    master: RedisServer
    count: int = 3
    quorum: int = 2
    down_after_ms: int = 1000
    failover_timeout_ms: int = 4000
    ports: list[int] = field(default_factory=list)
    procs: list[Proc] = field(default_factory=list)

    def start(self, timeout: float = 30.0) -> Sentinels:
        binary = require("redis-sentinel")
        for i in range(self.count):
            # Distinct ports: a port free a moment ago may be handed out again
            # before the sentinel just started has bound it (seen: two sentinels
            # given one port, the second aborting while the first answered for it).
            port = free_port()
            while port in self.ports:
                port = free_port()
            directory = self.workdir / f"sentinel-{i}"
            directory.mkdir(parents=True, exist_ok=True)
            conf = secret_file(
                directory / "sentinel.conf",
                "\n".join(
                    [
                        f"port {port}",
                        "bind 127.0.0.1",
                        f"dir {directory}",
                        f"sentinel monitor {MASTER} 127.0.0.1 {self.master.port} {self.quorum}",
                        f"sentinel down-after-milliseconds {MASTER} {self.down_after_ms}",
                        f"sentinel failover-timeout {MASTER} {self.failover_timeout_ms}",
                        f"sentinel parallel-syncs {MASTER} 1",
                        f"sentinel auth-user {MASTER} {ADMIN}",
                        f"sentinel auth-pass {MASTER} {self.master.admin_password}",
                    ]
                ),
            )
            proc = Proc(f"sentinel-{i}", [binary, str(conf)], directory / "sentinel.log")
            proc.start({})
            self.ports.append(port)
            self.procs.append(proc)
        try:
            for port in self.ports:
                wait_for(
                    self._sees_master(port),
                    timeout=timeout,
                    what=f"sentinel :{port} to see the master",
                    retry_on=NOT_YET,
                )
            for proc in self.procs:
                if not proc.alive:
                    raise FleetError(f"{proc.name} exited at its start: see {proc.log}")
        except BaseException:
            self.stop()  # a failed start leaves no process behind
            raise
        return self

    def _sees_master(self, port: int) -> Callable[[], bool]:
        def check() -> bool:
            with contextlib.closing(redis.Redis(port=port, socket_timeout=1)) as s:
                return s.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER) is not None

        return check

    def master_port(self) -> int:
        """The master's port as the sentinels (the first that answers) name it now."""
        for port in self.ports:
            try:
                with contextlib.closing(redis.Redis(port=port, socket_timeout=1)) as s:
                    addr = s.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER)
                    return int(addr[1])
            except (redis.RedisError, OSError):
                continue
        raise FleetError("no sentinel answers")

    def wait_replicas_known(self, count: int, timeout: float = 30.0) -> None:
        """Until every sentinel knows ``count`` replicas of the master (and its peers)."""

        def known() -> bool:
            for port in self.ports:
                with contextlib.closing(redis.Redis(port=port, socket_timeout=1)) as s:
                    info = cast(dict[str, Any], s.sentinel_master(MASTER))
                    if int(info["num-slaves"]) < count:
                        return False
                    if int(info["num-other-sentinels"]) < self.count - 1:
                        return False
            return True

        wait_for(
            known,
            timeout=timeout,
            what=f"the sentinels to know {count} replica(s) and each other",
            retry_on=NOT_YET,
        )

    @property
    def url_hosts(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def stop(self) -> None:
        for proc in self.procs:
            proc.stop()

    def logs(self) -> Iterator[tuple[str, str]]:
        for proc in self.procs:
            yield proc.name, proc.tail(20)
