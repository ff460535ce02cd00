"""A Redis Cluster's master SIGKILLed, and slots migrated, under traffic.

The rig is :func:`fleetkit.clusterrig.redis_cluster` (3 masters, 3 replicas,
``cluster-node-timeout`` 1 s); two replicas of the once test app and two
routers connect with ``redis+cluster://`` under their own ACL users.

* The master holding the registry's slot is SIGKILLed while users run
  once-flows (``charge``: each run of ``finish`` writes a line) through both
  routers and ping handshake sessions: its replica is promoted; every answer
  comes within the once claim's failover wait plus a deadline, a final round
  is charged or refused as retryable (fail closed), and no order is charged
  twice.
* Replication held back on a master, sessions opened, the master killed: the
  promoted replica lacks their routes, which the router's cache and the
  replicas write back once their slot map shows the new master.
* The slots of the registry and of open sessions are migrated key by key to
  another master (``CLUSTER SETSLOT ... MIGRATING/IMPORTING``, ``MIGRATE``)
  while the same traffic runs, and a router that never saw the sessions looks
  them up in the middle of it (ASK and MOVED redirections): every ping reaches
  its session's owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from redis.crc import key_slot

from fleetkit.apps.onceapp import EFFECTS_ENV
from fleetkit.clients.wire import initialize_body
from fleetkit.clusterrig import RedisClusterRig, cluster_fleet, redis_cluster
from fleetkit.faulttable import FaultTable
from fleetkit.fleet import FleetOptions
from fleetkit.redisrig import ADMIN, RedisFleet, RedisServer
from mcpfleet.contract import SESSION_HEADER
from mcpfleet.dev.wait import wait_for
from mcpfleet.redisconn import DEFAULT_DEADLINE, DEFAULT_FAILOVER_WAIT

from .oncewire import ask, charged, count, final, retryable

HEADERS = {
    "content-type": "application/json",
    "accept": "application/json, text/event-stream",
    "mcp-protocol-version": "2025-11-25",
}
#: The longest a final round may wait: its claim rides through the failover
#: (``--redis-failover-wait``) and the confirmation has its deadline.
BOUND = DEFAULT_FAILOVER_WAIT + 2 * DEFAULT_DEADLINE


@dataclass
class Load:
    """Once-flows and session pings through both routers until stopped, all counted."""

    effects: Path
    urls: list[str]
    sessions: dict[str, str]
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    finals: list[tuple[str, float, str]] = field(default_factory=list)
    pings: list[tuple[int, bool, float]] = field(default_factory=list)
    n: int = 0
    #: JSON-RPC ids for the pings: a session's requests in flight never share one
    #: (a reused id orphans the first request's answer stream in the SDK).
    ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    async def flows(self, url: str, user: int) -> None:
        while not self.stop.is_set():
            self.n += 1
            order = f"u{user}-{self.n}"
            state = await asyncio.to_thread(ask, url, order)
            start = time.monotonic()
            answer = await asyncio.to_thread(final, url, order, state)
            took = time.monotonic() - start
            verdict = "charged" if charged(answer, order) else "retry" if retryable(answer) else ""
            self.finals.append((order, took, verdict or answer.body[:200]))

    async def ping(self, http: httpx.AsyncClient, url: str) -> None:
        while not self.stop.is_set():
            for session, owner in self.sessions.items():
                start = time.monotonic()
                status, replica = await ping(http, url, session, next(self.ids))
                self.pings.append((status, replica == owner, time.monotonic() - start))

    def double_runs(self) -> int:
        return sum(max(0, count(self.effects, order) - 1) for order, _, _ in self.finals)

    def wrong(self) -> list[str]:
        """Answers that are neither a charge nor a retryable refusal, or a charge not run."""
        out = [f"{o}: {v}" for o, _, v in self.finals if v not in ("charged", "retry")]
        out += [f"{o}: charged, ran {count(self.effects, o)}" for o, _, v in self.finals
                if v == "charged" and count(self.effects, o) != 1]  # fmt: skip
        out += [f"ping {p}" for p in self.pings if p[:2] != (200, True)]
        return out

    def worst(self) -> float:
        return max([t for _, t, _ in self.finals] + [p[2] for p in self.pings])


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[RedisClusterRig, RedisFleet, Path]]:
    effects = tmp_path / "effects.log"
    options = FleetOptions(
        fleet="clusterfaults",
        app="fleetkit.apps.onceapp:app",
        replicas=2,
        routers=2,
        env={EFFECTS_ENV: str(effects)},
    )
    with redis_cluster(tmp_path / "cluster") as rig, cluster_fleet(tmp_path, options, rig) as lf:
        yield rig, lf, effects


async def ping(http: httpx.AsyncClient, url: str, session: str, request_id: int) -> tuple[int, str]:
    """A session's ``ping`` through ``url``: the status and the answering replica, or
    ``(0, "")`` past :data:`BOUND` (an SSE answer's keep-alives defeat httpx's read
    timeout, so the bound is the test's own)."""
    body = f'{{"jsonrpc":"2.0","id":{request_id},"method":"ping"}}'
    try:
        async with asyncio.timeout(BOUND):
            resp = await http.post(url, content=body, headers={**HEADERS, SESSION_HEADER: session})
    except TimeoutError:
        return 0, ""
    return resp.status_code, resp.headers.get("x-mcpfleet-replica", "")


async def _open(url: str, http: httpx.AsyncClient, count_: int) -> dict[str, str]:
    owners = {}
    for _ in range(count_):
        resp = await http.post(url, content=initialize_body("cluster"), headers=HEADERS)
        assert resp.status_code == 200, resp.text
        owners[resp.headers[SESSION_HEADER]] = resp.headers["x-mcpfleet-replica"]
    return owners


async def _until(check: object, what: str, timeout: float) -> None:
    limit = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < limit, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def _run(load: Load, http: httpx.AsyncClient, fault: object) -> None:
    tasks = [asyncio.create_task(load.flows(url, i)) for i, url in enumerate(load.urls * 2)]
    tasks.append(asyncio.create_task(load.ping(http, load.urls[0])))
    try:
        await _until(lambda: len(load.finals) >= 8, "once-flows before the fault", 60)
        await fault()  # type: ignore[operator]
        after = len(load.finals)
        await _until(lambda: len(load.finals) >= after + 12, "once-flows after the fault", 60)
    finally:
        load.stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)


@pytest.mark.timeout(180)
async def test_a_master_killed_under_once_flows_runs_nothing_twice_and_answers_in_bound(
    setup: tuple[RedisClusterRig, RedisFleet, Path], fault_table: FaultTable
) -> None:
    rig, lf, effects = setup
    victim = rig.node_of(lf.keys.replicas)  # the registry's master: the hardest one to lose
    heir = rig.replicas[rig.masters.index(victim)]
    promoted: list[float] = []
    async with httpx.AsyncClient(timeout=30) as http:
        load = Load(effects, [lf.router_url(0), lf.router_url(1)], await _open(lf.url, http, 6))

        async def kill() -> None:
            killed = time.monotonic()
            await asyncio.to_thread(victim.kill)
            await _until(lambda: _role(rig, heir) == "master", "the replica's promotion", 30)
            promoted.append(time.monotonic() - killed)

        await _run(load, http, kill)
    row = fault_table.row("Redis Cluster master SIGKILL (once-flows, sessions)")
    row.attempts = len(load.finals) + len(load.pings)
    row.double_runs = load.double_runs()
    row.lost = len(load.wrong())
    row.worst_seconds = load.worst()
    retried = sum(1 for _, _, v in load.finals if v == "retry")
    row.notes = f"promoted after {promoted[0]:.2f}s; {retried} final round(s) refused retryable"
    print(f"cluster failover: {row.notes}; worst answer {row.worst_seconds:.2f}s")
    assert row.double_runs == 0
    assert load.wrong() == []
    assert row.worst_seconds <= BOUND, f"an answer took {row.worst_seconds:.2f}s"


@pytest.mark.timeout(180)
async def test_slots_migrated_under_traffic_keep_every_session_and_flow(
    setup: tuple[RedisClusterRig, RedisFleet, Path], fault_table: FaultTable
) -> None:
    rig, lf, effects = setup
    keys = lf.keys
    async with httpx.AsyncClient(timeout=30) as http:
        owners = await _open(lf.router_url(0), http, 6)
        load = Load(effects, [lf.router_url(0), lf.router_url(1)], owners)
        moved: list[str] = [keys.replicas, *(keys.session(s) for s in owners)]
        cold: list[tuple[int, bool]] = []
        targets: dict[str, RedisServer] = {}

        async def migrate() -> None:
            for key in moved:
                targets[key] = await asyncio.to_thread(_migrate_slot, rig, key)
                if key == keys.replicas:
                    continue
                # Router 1 never saw these sessions: its lookups follow the redirections.
                session = key.rsplit("{", 1)[1].rstrip("}")
                status, replica = await ping(http, lf.router_url(1), session, next(load.ids))
                cold.append((status, replica == owners[session]))

        await _run(load, http, migrate)
    row = fault_table.row("Redis Cluster slots migrated (registry, sessions)")
    row.attempts = len(load.finals) + len(load.pings) + len(cold)
    row.double_runs = load.double_runs()
    row.lost = len(load.wrong()) + sum(1 for c in cold if c != (200, True))
    row.worst_seconds = load.worst()
    row.notes = f"{len(moved)} slots moved key by key"
    print(f"slot migration: worst answer {row.worst_seconds:.2f}s, cold lookups {cold}")
    assert row.double_runs == 0
    assert load.wrong() == []
    assert cold == [(200, True)] * len(owners)
    for key in moved:
        assert rig.node_of(key) is targets[key]
        assert key_slot(key.encode()) in _slots_of(targets[key])
    wait_for(lambda: len(lf.attestations()) == 2, timeout=10, what="both replicas attested")


@pytest.mark.timeout(180)
async def test_routes_a_failover_lost_are_written_back_and_served_by_a_router_that_never_saw_them(
    setup: tuple[RedisClusterRig, RedisFleet, Path], fault_table: FaultTable
) -> None:
    """Replication held back on one master, sessions opened, the master killed: the
    promoted replica lacks their routes; router 0 (its cache) and the replicas write
    them back when their slot map shows the new master, so router 1 routes them."""
    rig, lf, _ = setup
    keys = lf.keys
    victim = next(m for m in rig.masters if m is not rig.node_of(keys.replicas))
    heir = rig.replicas[rig.masters.index(victim)]
    victim.hold_replication()
    wait_for(lambda: not _linked(heir), timeout=15, what="the replica to lose its link")
    async with httpx.AsyncClient(timeout=30) as http:
        owners: dict[str, str] = {}
        while len(owners) < 4:
            for session, owner in (await _open(lf.router_url(0), http, 4)).items():
                if rig.node_of(keys.session(session)) is victim:
                    owners[session] = owner
        unreplicated = sum(1 for s in owners if _on_replica(heir, keys.session(s)) is None)
        killed = time.monotonic()
        await asyncio.to_thread(victim.kill)
        await _until(lambda: _role(rig, heir) == "master", "the replica's promotion", 30)
        promoted = time.monotonic() - killed

        def written_back() -> bool:
            with contextlib.closing(heir.admin()) as admin:
                return all(admin.get(keys.session(s)) is not None for s in owners)

        wait_for(written_back, timeout=15, what="the routes written back", retry_on=(Exception,))
        back = time.monotonic() - killed
        answers = []
        for n, (session, owner) in enumerate(owners.items()):
            status, replica = await ping(http, lf.router_url(1), session, n)
            answers.append((status, replica == owner))
    row = fault_table.row("Redis Cluster master SIGKILL with routes unreplicated")
    row.attempts = len(answers)
    row.lost = sum(1 for a in answers if a != (200, True))
    row.worst_seconds = back
    row.notes = f"{unreplicated} routes unreplicated; promoted {promoted:.2f}s, back {back:.2f}s"
    print(f"write-back after a cluster failover: {row.notes}; answers {answers}")
    assert unreplicated == len(owners)
    assert answers == [(200, True)] * len(owners)


def _linked(replica: RedisServer) -> bool:
    with contextlib.closing(replica.admin()) as admin:
        return admin.info("replication").get("master_link_status") == "up"


def _on_replica(replica: RedisServer, key: str) -> object:
    """``key`` as a cluster replica holds it (READONLY: a replica answers reads)."""
    with contextlib.closing(replica.admin()) as admin, admin.pipeline(transaction=False) as pipe:
        pipe.execute_command("READONLY")
        pipe.get(key)
        return pipe.execute()[1]


def _role(rig: RedisClusterRig, node: RedisServer) -> str:
    try:
        return rig.role(node)
    except Exception:
        return "down"


def _slots_of(node: RedisServer) -> set[int]:
    with contextlib.closing(node.admin()) as admin:
        shards = admin.execute_command("CLUSTER", "SLOTS")
    out: set[int] = set()
    for first, last, master, *_ in shards:
        if int(master[1]) == node.port:
            out |= set(range(int(first), int(last) + 1))
    return out


def _migrate_slot(rig: RedisClusterRig, key: str) -> RedisServer:
    """Move ``key``'s slot to the next master, one key at a time, as ``redis-cli
    --cluster reshard`` does: IMPORTING on the target, MIGRATING on the source,
    MIGRATE of each key, then the slot's new owner told to every master."""
    slot = key_slot(key.encode())
    source = rig.node_of(key)
    masters = [m for m in rig.masters if _role(rig, m) == "master"]
    target = masters[(masters.index(source) + 1) % len(masters)]
    source_id, target_id = rig.node_id(source), rig.node_id(target)
    with contextlib.closing(source.admin()) as src, contextlib.closing(target.admin()) as dst:
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        while True:
            batch = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1)
            if not batch:
                break
            src.execute_command(
                "MIGRATE", "127.0.0.1", target.port, "", 0, 5000,
                "AUTH2", ADMIN, source.admin_password, "KEYS", *batch,
            )  # fmt: skip
        for node in (dst, src):
            node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
    for other in masters:
        if other not in (source, target):
            with contextlib.closing(other.admin()) as admin:
                admin.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
    return target
