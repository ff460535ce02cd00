"""rediss://: a fleet on a redis-server that speaks only TLS and wants client certificates.

The test makes a CA, the server's certificate (127.0.0.1) and a client
certificate; every component connects with ``--redis-ca-file``,
``--redis-cert-file`` and ``--redis-key-file`` under its own ACL user. A CA
that did not sign the server's certificate is refused with an error that
says so and names the flag.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetkit import scenarios
from fleetkit.certs import CertificateAuthority
from fleetkit.fleet import FleetOptions
from fleetkit.redisrig import RedisFleet, RedisServer, TLSFiles, acl_log, redis_fleet
from mcpfleet import redisconn
from mcpfleet.contract import RedisKeys
from mcpfleet.dev.fleet import Proc, mcpfleet_argv
from mcpfleet.dev.ports import free_port
from mcpfleet.dev.wait import wait_for
from mcpfleet.once import Confirmed, Record, RedisLedger, new_flow_id
from mcpfleet.registry import connect, read_replicas_sync

from .conftest import shared


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TLSFiles:
    return TLSFiles(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def server(tls: TLSFiles, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    srv = RedisServer(tmp_path_factory.mktemp("tls-redis"), tls=tls).start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def fleet(
    server: RedisServer, tls: TLSFiles, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RedisFleet]:
    lf = redis_fleet(
        tmp_path_factory.mktemp("tls-fleet"),
        [server],
        f"rediss://127.0.0.1:{server.port}/0",
        server.admin,
        FleetOptions(fleet="tls", replicas=2),
        client_args=tls.client_args(),
    )
    acl_log(server, reset=True)
    with lf, shared(lf):
        yield lf


async def test_both_eras_run_over_tls_with_client_certificates(
    fleet: RedisFleet, server: RedisServer
) -> None:
    await scenarios.modern_rounds_spread(fleet)
    await scenarios.handshake_session_sticks(fleet)
    with contextlib.closing(server.admin()) as admin:
        users = {c["user"] for c in admin.client_list()}
    assert {fleet.users["replica"][0], fleet.users["router"][0]} <= users
    assert acl_log(server) == []


def test_the_operators_client_reads_attestations_over_tls(fleet: RedisFleet, tls: TLSFiles) -> None:
    """The blocking client the operator's handlers use, with its own user, over TLS."""
    user, password_file = fleet.users["operator"]
    base = fleet.base_url.partition("://")[2]
    s = redisconn.settings(
        f"rediss://{user}@{base}",
        redisconn.RedisFiles(password_file, tls.ca_file, tls.client_cert, tls.client_key),
    )
    client = redisconn.sync_client(s, timeout=2)
    try:
        assert set(read_replicas_sync(client, RedisKeys("tls"))) == {"replica-0", "replica-1"}
    finally:
        client.close()


def _router(fleet: RedisFleet, workdir: Path, name: str, *tls_args: str) -> Proc:
    user, password_file = fleet.users["router"]
    base = fleet.base_url.partition("://")[2]
    proc = Proc(
        name,
        mcpfleet_argv(
            "router",
            "--port",
            str(free_port()),
            "--fleet",
            "tls",
            "--redis",
            f"rediss://{user}@{base}",
            "--redis-password-file",
            str(password_file),
            *tls_args,
        ),
        workdir / f"{name}.log",
    )
    proc.start(fleet.env())
    return proc


def test_a_wrong_ca_is_refused_with_a_clear_error(
    fleet: RedisFleet, tls: TLSFiles, tmp_path: Path
) -> None:
    other = tmp_path / "other-ca.crt"
    other.write_bytes(CertificateAuthority("not-the-redis-ca").cert_pem)
    proc = _router(
        fleet,
        tmp_path,
        "router-wrong-ca",
        "--redis-ca-file",
        str(other),
        "--redis-cert-file",
        str(tls.client_cert),
        "--redis-key-file",
        str(tls.client_key),
    )
    try:
        wait_for(
            lambda: "TLS certificate verify failed" in proc.tail(),
            timeout=30,
            what="the router to say the certificate did not verify",
        )
        log = proc.tail()
        assert "is --redis-ca-file the CA that signed the Redis server's certificate?" in log
        assert proc.alive, "degraded, not crashed: Redis may be fixed without a restart"
    finally:
        proc.stop()


def test_a_client_without_a_certificate_is_refused_by_the_server(
    fleet: RedisFleet, tls: TLSFiles, tmp_path: Path
) -> None:
    proc = _router(fleet, tmp_path, "router-no-cert", "--redis-ca-file", str(tls.ca_file))
    try:
        wait_for(
            lambda: "give --redis-cert-file and --redis-key-file" in proc.tail(),
            timeout=30,
            what="the router to say a client certificate is wanted",
        )
        assert proc.alive
    finally:
        proc.stop()


async def test_the_once_ledgers_direct_commands_over_tls_under_the_replica_user(
    fleet: RedisFleet, server: RedisServer, tls: TLSFiles
) -> None:
    """The claim, its confirmation, the store and a release go through
    :class:`~mcpfleet.redisconn.DirectCommands` on connections the client's pool
    makes: TLS with the client certificate, the replica's ACL user and exactly its
    rules. Nothing is denied."""
    user, password_file = fleet.users["replica"]
    base = fleet.base_url.partition("://")[2]
    s = redisconn.settings(
        f"rediss://{user}@{base}",
        redisconn.RedisFiles(password_file, tls.ca_file, tls.client_cert, tls.client_key),
    )
    pooled = connect(s.url, s.files)
    direct = redisconn.DirectCommands(pooled)
    ledger = RedisLedger(direct, RedisKeys("tls"), memory_limit=0)
    acl_log(server, reset=True)
    try:
        mine, flow = Record("running", "replica-0", claim="t"), new_flow_id()
        assert await ledger.claim(flow, mine, 5) is None
        assert await ledger.confirm(flow, mine, 60, time.monotonic()) is Confirmed.YES
        done = Record("done", "replica-0", result={"raw": "charged"})
        await ledger.store(flow, done, 60)
        assert await ledger.get(flow) == done
        other = new_flow_id()
        assert await ledger.claim(other, mine, 5) is None
        assert await ledger.release(other, mine) is True
        assert await ledger.alive("replica-0", "") is True
    finally:
        await direct.aclose()
        await pooled.aclose()
    assert acl_log(server) == []
