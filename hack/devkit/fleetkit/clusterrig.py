"""A real Redis Cluster for the tests: 3 masters and 3 replicas of redis-server on 127.0.0.1.

:func:`redis_cluster` starts six :class:`~fleetkit.redisrig.RedisServer` nodes
with ``cluster-enabled yes`` (ports and cluster bus ports chosen free, a
failover after 1 s without an answer), and joins them as ``redis-cli --cluster
create --cluster-replicas 1`` would, through the admin user's own client (no
password in a process argument): each master takes a third of the 16384 slots
and its own config epoch, every node meets the first, each replica follows one
master. It returns once every node sees the cluster ``ok`` and every master's
replica is in sync; it stops every node on the way out, whatever happened.

:func:`cluster_fleet` puts a :class:`~fleetkit.redisrig.RedisFleet` on it: the
components connect with ``redis+cluster://<user>@<three seed nodes>`` under
their own ACL users (created on all six nodes: ACL users are per node), with
the cluster's key names' rules.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from redis.cluster import ClusterNode, RedisCluster

from fleetkit.fleet import FleetOptions
from fleetkit.redisrig import ADMIN, NOT_YET, RedisFleet, RedisServer, redis_fleet
from mcpfleet.dev.ports import free_port
from mcpfleet.dev.wait import wait_for

SLOTS = 16384
MASTERS = 3


@dataclass
class RedisClusterRig:
    """Six running nodes: ``masters[i]`` is replicated by ``replicas[i]`` (at start)."""

    masters: list[RedisServer]
    replicas: list[RedisServer]

    @property
    def nodes(self) -> list[RedisServer]:
        return [*self.masters, *self.replicas]

    @property
    def url_hosts(self) -> str:
        """The seed nodes of a ``redis+cluster://`` URL: the three first masters."""
        return ",".join(f"127.0.0.1:{n.port}" for n in self.masters)

    @property
    def url(self) -> str:
        return f"redis+cluster://{self.url_hosts}"

    def admin(self, timeout: float = 2.0) -> Any:
        """A cluster client of the admin user (typed loosely: it stands where a
        ``redis.Redis`` is expected, as the components' cluster clients do)."""
        live = [n for n in self.nodes if n.proc is not None and n.proc.alive]
        return RedisCluster(
            startup_nodes=[ClusterNode("127.0.0.1", n.port) for n in live],
            username=ADMIN,
            password=self.nodes[0].admin_password,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
        )

    def node_of(self, key: str) -> RedisServer:
        """The node that holds ``key``'s slot now (asked of the cluster)."""
        with contextlib.closing(self.admin()) as client:
            node = client.get_node_from_key(key)
            port = int(node.port)
        return next(n for n in self.nodes if n.port == port)

    def node_id(self, server: RedisServer) -> str:
        with contextlib.closing(server.admin()) as admin:
            return str(_text(admin.execute_command("CLUSTER", "MYID")))

    def role(self, server: RedisServer) -> str:
        with contextlib.closing(server.admin()) as admin:
            return str(admin.info("replication").get("role"))

    def logs(self) -> Iterator[tuple[str, str]]:
        for node in self.nodes:
            if node.proc is not None:
                yield node.name, node.proc.tail(15)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def cluster_ok(server: RedisServer) -> bool:
    with contextlib.closing(server.admin()) as admin:
        info = _text(admin.execute_command("CLUSTER", "INFO"))
    fields = dict(line.split(":", 1) for line in str(info).split() if ":" in line)
    return fields.get("cluster_state") == "ok" and fields.get("cluster_known_nodes") == "6"


def _in_sync(master: RedisServer) -> bool:
    with contextlib.closing(master.admin()) as admin:
        info = admin.info("replication")
    return int(info.get("connected_slaves", 0)) >= 1 and "online" in str(info.get("slave0", ""))


def _join(rig: RedisClusterRig) -> None:
    """What ``redis-cli --cluster create --cluster-replicas 1`` does, through the admin user."""
    per = SLOTS // MASTERS
    for i, master in enumerate(rig.masters):
        first, last = i * per, (SLOTS - 1 if i == MASTERS - 1 else (i + 1) * per - 1)
        with contextlib.closing(master.admin()) as admin:
            admin.execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
            admin.execute_command("CLUSTER", "SET-CONFIG-EPOCH", i + 1)
    first_node = rig.masters[0]
    for node in rig.nodes[1:]:
        with contextlib.closing(node.admin()) as admin:
            admin.execute_command(
                "CLUSTER", "MEET", "127.0.0.1", first_node.port, first_node.cluster_bus
            )

    def all_known() -> bool:
        for node in rig.nodes:
            with contextlib.closing(node.admin()) as admin:
                known = str(_text(admin.execute_command("CLUSTER", "NODES"))).strip()
            if len(known.splitlines()) < len(rig.nodes):
                return False
        return True

    wait_for(all_known, timeout=30, what="every node to know the others", retry_on=NOT_YET)
    for master, replica in zip(rig.masters, rig.replicas, strict=True):
        master_id = rig.node_id(master)
        wait_for(
            lambda r=replica, m=master_id: _replicate(r, m),  # type: ignore[misc]
            timeout=30,
            what=f"{replica.name} to follow its master",
            retry_on=(*NOT_YET,),
        )
    for node in rig.nodes:
        wait_for(
            lambda n=node: cluster_ok(n),  # type: ignore[misc]
            timeout=30,
            what=f"{node.name} to see the cluster ok",
            retry_on=NOT_YET,
        )
    for master in rig.masters:
        wait_for(
            lambda m=master: _in_sync(m),  # type: ignore[misc]
            timeout=30,
            what=f"{master.name}'s replica in sync",
            retry_on=NOT_YET,
        )


def _replicate(replica: RedisServer, master_id: str) -> bool:
    with contextlib.closing(replica.admin()) as admin:
        try:
            admin.execute_command("CLUSTER", "REPLICATE", master_id)
        except redis.ResponseError as exc:
            if "Unknown node" in str(exc):
                return False  # the gossip has not reached it yet
            raise
    return True


@contextlib.contextmanager
def redis_cluster(workdir: Path) -> Iterator[RedisClusterRig]:
    """Six nodes joined as a cluster of 3 masters with a replica each; all stopped after."""
    password = secrets.token_hex(16)
    repl = secrets.token_hex(16)

    def node(name: str) -> RedisServer:
        return RedisServer(
            workdir,
            name,
            cluster_bus=free_port(),
            admin_password=password,
            repl_password=repl,
        )

    rig = RedisClusterRig(
        [node(f"master-{i}") for i in range(MASTERS)],
        [node(f"replica-{i}") for i in range(MASTERS)],
    )
    try:
        for each in rig.nodes:
            each.start()
        _join(rig)
        yield rig
    finally:
        rig.stop()


@contextlib.contextmanager
def cluster_fleet(
    workdir: Path, options: FleetOptions, rig: RedisClusterRig
) -> Iterator[RedisFleet]:
    """A fleet on ``rig`` through ``redis+cluster://``, each component as its own user."""
    lf = redis_fleet(workdir / "fleet", rig.nodes, rig.url, rig.admin, options)
    with lf:
        yield lf
