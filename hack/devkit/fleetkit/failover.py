"""A Sentinel failover under load, written once for the test and for ``make bench``.

The setup (:func:`sentinel_fleet`): a master, one replica, N redis-sentinel processes
(quorum N//2+1), and a fleet of two replicas behind two routers, every
component under its own ACL user (created on both servers: ACL users are not
replicated), all connecting through ``redis+sentinel://``.

The scenario (:func:`failover_under_load`): modern bookings and handshake
meeting plans run without pause through both routers; replication is held
back (the replica's replication user is cut off: both stay up); sessions are
opened through router 0 (the master acknowledges their
routes, the replica never gets them); the master is SIGKILLed. Sentinel
promotes the replica, which lacks those routes. Router 0 still has them in
its cache and writes them back once Redis answers again; router 1, which
never saw them, must then route them to their owners (without the
write-back it would answer 404 and end live sessions). Counted: rounds and
sessions that failed, and how long each part took to recover.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis

from fleetkit.clients.traffic import Traffic
from fleetkit.clients.wire import initialize_body
from fleetkit.fleet import FleetOptions
from fleetkit.redisrig import (
    MASTER,
    NOT_YET,
    RedisFleet,
    RedisServer,
    Sentinels,
    acl_log,
    redis_fleet,
)
from mcpfleet import redisconn
from mcpfleet.contract import SESSION_HEADER, RedisKeys
from mcpfleet.dev.wait import WaitTimeout, wait_for
from mcpfleet.registry import read_replicas_sync

FLEET = "failover"
HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}


@dataclass
class SentinelFleet:
    master: RedisServer
    replica: RedisServer
    sentinels: Sentinels
    fleet: RedisFleet

    def current_master(self) -> RedisServer:
        port = self.sentinels.master_port()
        return self.replica if port == self.replica.port else self.master

    def operator_client(self) -> redis.Redis:
        """The blocking client the operator builds, as the operator's user, via Sentinel."""
        user, password_file = self.fleet.users["operator"]
        s = redisconn.settings(
            f"redis+sentinel://{user}@{self.sentinels.url_hosts}/{MASTER}/0",
            redisconn.RedisFiles(password_file=password_file),
        )
        return redisconn.sync_client(s, timeout=1)

    def logs(self) -> str:
        out = [f"--- {name} ---\n{tail}" for name, tail in self.sentinels.logs()]
        for srv in (self.master, self.replica):
            if srv.proc is not None:
                out.append(f"--- {srv.name} ---\n{srv.proc.tail(15)}")
        out += [f"--- {name} ---\n{tail}" for name, tail in self.fleet.logs()]
        return "\n".join(out)


@contextlib.contextmanager
def sentinel_redis(
    workdir: Path, sentinels: int = 3
) -> Iterator[tuple[RedisServer, RedisServer, Sentinels]]:
    """A master, its replica (linked) and ``sentinels`` sentinels that know both."""
    master = RedisServer(workdir, "master").start()
    # One admin password for both: the sentinels talk to either with it.
    replica = RedisServer(
        workdir, "replica", replica_of=master, admin_password=master.admin_password
    )
    group = Sentinels(workdir, master, count=sentinels, quorum=sentinels // 2 + 1)
    try:
        replica.start()
        wait_for(
            lambda: link_up(replica),
            timeout=30,
            what="the replica's link to the master",
            retry_on=NOT_YET,
        )
        group.start()
        group.wait_replicas_known(1)
        yield master, replica, group
    finally:
        group.stop()
        replica.stop()
        master.stop()


@contextlib.contextmanager
def sentinel_fleet(
    workdir: Path, sentinels: int = 3, options: FleetOptions | None = None
) -> Iterator[SentinelFleet]:
    """The Sentinel set-up with a fleet on it (default: 2 replicas, 2 routers of the
    example app, fleet :data:`FLEET`)."""
    with sentinel_redis(workdir, sentinels) as (master, replica, group):
        servers = {master.port: master, replica.port: replica}
        lf = redis_fleet(
            workdir / "fleet",
            [master, replica],
            f"redis+sentinel://{group.url_hosts}/{MASTER}/0",
            lambda: servers[group.master_port()].admin(),
            options or FleetOptions(fleet=FLEET, replicas=2, routers=2),
        )
        with lf:
            yield SentinelFleet(master, replica, group, lf)


def link_up(replica: RedisServer) -> bool:
    """Whether ``replica``'s replication link to its master is up."""
    with contextlib.closing(replica.admin()) as admin:
        return admin.info("replication").get("master_link_status") == "up"


@dataclass
class FailoverReport:
    #: Modern bookings and handshake meeting plans completed and failed during the run.
    modern_ok: int = 0
    modern_failed: int = 0
    handshake_ok: int = 0
    handshake_failed: int = 0
    failures: list[str] = field(default_factory=list)
    #: Seconds from the SIGKILL until: Sentinel names the new master; every router
    #: routes from Redis again (not degraded); every replica is attested on it; the
    #: operator's client reads the registry from it.
    promoted: float = 0.0
    routers_back: float = 0.0
    replicas_back: float = 0.0
    operator_back: float = 0.0
    #: Routes the old master acknowledged and the replica never got; how many of
    #: those the other router then routed to their owner.
    unreplicated: int = 0
    kept: int = 0
    #: Denials in ACL LOG on the new master (nothing outside the rules, even now).
    denied: int = 0


async def failover_under_load(setup: SentinelFleet, sessions: int = 5) -> FailoverReport:
    lf = setup.fleet
    report = FailoverReport()
    load = Traffic()
    urls = [lf.router_url(0), lf.router_url(1)]
    for n, url in enumerate(urls):
        # Without once=True: a once-flow's final round fails closed
        # (retryable) in the seconds no master answers, by design.
        load.modern(url, "plan_meeting", {"topic": f"M{n}"}, "Planned", timeout=15)
        load.handshake(url, f"h{n}", one_replica=True)
    keys = RedisKeys(FLEET)
    operator = setup.operator_client()
    try:
        await _until(
            "load to run", lambda: load.done("modern") >= 10 and load.done("handshake") >= 4
        )
        assert set(read_replicas_sync(operator, keys)) == {"replica-0", "replica-1"}
        acl_log(setup.master, reset=True)
        acl_log(setup.replica, reset=True)

        # Hold replication back, then open sessions through router 0 only.
        setup.master.hold_replication()
        await _until("the replica to lose its link", lambda: not link_up(setup.replica), 10)
        async with httpx.AsyncClient(timeout=10) as http:
            opened: dict[str, str] = {}
            for _ in range(sessions):
                resp = await http.post(
                    urls[0], content=initialize_body("failover"), headers=HEADERS
                )
                assert resp.status_code == 200, resp.text
                opened[resp.headers[SESSION_HEADER]] = resp.headers["x-mcpfleet-replica"]
            with (
                contextlib.closing(setup.master.admin()) as on_master,
                contextlib.closing(setup.replica.admin()) as on_replica,
            ):
                for session in opened:
                    assert on_master.get(keys.session(session)) is not None
                    if on_replica.get(keys.session(session)) is None:
                        report.unreplicated += 1

            killed = time.monotonic()
            setup.master.kill()
            await _until(
                "Sentinel to promote the replica",
                lambda: setup.sentinels.master_port() == setup.replica.port,
                30,
            )
            report.promoted = time.monotonic() - killed
            await _until("every router to leave degraded", lambda: _routers_back(lf), 30)
            report.routers_back = time.monotonic() - killed
            await _until(
                "every replica to be attested on the new master",
                lambda: set(_attested(setup.replica, keys)) == {"replica-0", "replica-1"},
                30,
            )
            report.replicas_back = time.monotonic() - killed
            await _until(
                "the operator's client to read the new master",
                lambda: set(read_replicas_sync(operator, keys)) == {"replica-0", "replica-1"},
                30,
            )
            report.operator_back = time.monotonic() - killed

            # The routes lost with the old master: router 1 never saw these sessions.
            for session, owner in opened.items():
                ping = '{"jsonrpc":"2.0","id":9,"method":"ping"}'
                resp = await http.post(
                    urls[1], content=ping, headers={**HEADERS, SESSION_HEADER: session}
                )
                if resp.status_code == 200 and resp.headers.get("x-mcpfleet-replica") == owner:
                    report.kept += 1
                else:
                    report.failures.append(f"session via router 1: {resp.status_code} {resp.text}")
        done = load.done()
        await _until("load to run on the new master", lambda: load.done() >= done + 10)
    finally:
        await load.stop()
        operator.close()
    report.modern_ok, report.handshake_ok = load.done("modern"), load.done("handshake")
    report.modern_failed, report.handshake_failed = load.failed["modern"], load.failed["handshake"]
    report.failures[:0] = [f[:300] for f in load.failures]
    report.denied = len(acl_log(setup.replica))
    return report


async def _until(what: str, check: Callable[[], object], timeout: float = 60) -> None:
    """Wait for ``check()`` off the event loop thread, so the load keeps running."""
    await asyncio.to_thread(
        wait_for,
        check,
        timeout=timeout,
        what=what,
        retry_on=NOT_YET,
    )


def _routers_back(lf: RedisFleet) -> bool:
    for port in lf.router_ports:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as resp:
            status = json.loads(resp.read())
        if status["degraded"] or status["serving"] < 2:
            return False
    return True


def _attested(server: RedisServer, keys: RedisKeys) -> dict[str, object]:
    with contextlib.closing(server.admin()) as admin:
        return dict(read_replicas_sync(admin, keys))


# --------------------------------------------------------------------------- make bench


def failover_rows(quick: bool = False) -> list[tuple[str, str, str, str]]:
    """Rows for ``make bench``: a failover's recovery times and failures, median of runs."""
    import shutil
    import statistics
    import tempfile

    missing = [b for b in ("redis-server", "redis-sentinel") if shutil.which(b) is None]
    if missing:
        return [("Sentinel failover", "skipped", "", f"not installed: {', '.join(missing)}")]
    reports: list[FailoverReport] = []
    for _ in range(1 if quick else 3):
        work = Path(tempfile.mkdtemp(prefix="mcpfleet-failover-"))
        try:
            with sentinel_fleet(work) as setup:
                reports.append(asyncio.run(failover_under_load(setup)))
        finally:
            shutil.rmtree(work, ignore_errors=True)
    med = {
        name: statistics.median(getattr(r, name) for r in reports)
        for name in ("promoted", "routers_back", "replicas_back", "operator_back")
    }
    note = "master SIGKILLed; 3 sentinels, quorum 2, down-after 1 s"
    rows = [
        ("failover: Sentinel promoted the replica", f"{med['promoted']:.2f} s", "", note),
        ("failover: routers route from Redis again", f"{med['routers_back']:.2f} s", "", ""),
        ("failover: every replica attested again", f"{med['replicas_back']:.2f} s", "", ""),
        ("failover: operator reads the registry", f"{med['operator_back']:.2f} s", "", ""),
    ]
    modern = sum(r.modern_ok + r.modern_failed for r in reports)
    handshake = sum(r.handshake_ok + r.handshake_failed for r in reports)
    failed_modern = sum(r.modern_failed for r in reports)
    failed_handshake = sum(r.handshake_failed for r in reports)
    kept = sum(r.kept for r in reports)
    lost = sum(r.unreplicated for r in reports)
    rows += [
        (
            "failover: failed during the run",
            f"{failed_modern}/{modern} modern, {failed_handshake}/{handshake} handshake",
            "",
            f"{len(reports)} run(s), load on 2 routers throughout",
        ),
        (
            "failover: unreplicated routes kept",
            f"{kept}/{lost}",
            "",
            "written back by the router that cached them",
        ),
    ]
    return rows


if __name__ == "__main__":
    import sys

    rows = failover_rows("--quick" in sys.argv)
    for row in rows:
        print(" | ".join(row))


async def graceful_failover(setup: SentinelFleet, sessions: int = 3) -> tuple[int, int]:
    """``SENTINEL FAILOVER`` (an upgrade, say) with replication held back.

    The old master stays up and is demoted; Sentinel drops its clients, which
    reconnect to the new master at once, often without a single failed
    command: no outage for a router to notice. The routes the old master
    acknowledged are lost all the same, unless written back. Returns
    (unreplicated, present on the new master a few seconds later).
    """
    lf = setup.fleet
    keys = RedisKeys(FLEET)
    urls = [lf.router_url(0), lf.router_url(1)]
    setup.master.hold_replication()
    await _until("the replica to lose its link", lambda: not link_up(setup.replica), 10)
    unreplicated = kept = 0
    async with httpx.AsyncClient(timeout=10) as http:
        opened: dict[str, str] = {}
        for _ in range(sessions):
            resp = await http.post(urls[0], content=initialize_body("graceful"), headers=HEADERS)
            assert resp.status_code == 200, resp.text
            opened[resp.headers[SESSION_HEADER]] = resp.headers["x-mcpfleet-replica"]
        with contextlib.closing(setup.replica.admin()) as on_replica:
            unreplicated = sum(on_replica.get(keys.session(s)) is None for s in opened)
        port = setup.sentinels.ports[0]
        with contextlib.closing(redis.Redis(port=port, socket_timeout=2)) as sentinel:
            sentinel.execute_command("SENTINEL", "FAILOVER", MASTER)
        await _until(
            "Sentinel to promote the replica",
            lambda: setup.sentinels.master_port() == setup.replica.port,
            30,
        )
        await _until(
            "every replica to be attested on the new master",
            lambda: set(_attested(setup.replica, keys)) == {"replica-0", "replica-1"},
            30,
        )

        # Every router's connections moved to the new master (the old one dropped them).
        # The routes must be there, whatever router (or a new one) is asked next.
        def present() -> int:
            with contextlib.closing(setup.replica.admin()) as on_new:
                return sum(on_new.get(keys.session(s)) is not None for s in opened)

        with contextlib.suppress(WaitTimeout):
            await asyncio.to_thread(
                wait_for, lambda: present() == len(opened), timeout=5, what="routes written back"
            )
        kept = present()
    return unreplicated, kept
