"""Every component under its own Redis ACL user, with exactly the contract's rules.

One redis-server with the default user off; the replicas, the router (and,
in tests/controlplane, the operator) each connect as the user
``RedisKeys(fleet).acl_rules(component)`` describes, the password from a
file. The shared scenarios run through it (both eras, a rotation, a drain);
``ACL LOG`` then shows nothing denied, while a command outside each rule set
is refused. A second fleet on the same Redis sees only its own prefix.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from redis.exceptions import NoPermissionError

from fleetkit import scenarios
from fleetkit.clients.wire import initialize_body
from fleetkit.fleet import FleetOptions
from fleetkit.redisrig import RedisFleet, RedisServer, acl_log, redis_fleet
from mcpfleet import redisconn
from mcpfleet.contract import REDIS_COMPONENTS, SESSION_HEADER, RedisKeys
from mcpfleet.dev.wait import wait_for
from mcpfleet.registry import connect, read_replicas, read_replicas_sync

from .conftest import shared

STATE_TTL = 4.0
#: Short, so a route's expiry is refreshed (PEXPIRE) within the test.
SESSION_TTL = 8.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    srv = RedisServer(tmp_path_factory.mktemp("acl-redis")).start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def blue(server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisFleet]:
    lf = redis_fleet(
        tmp_path_factory.mktemp("blue"),
        [server],
        f"redis://127.0.0.1:{server.port}/0",
        server.admin,
        FleetOptions(
            fleet="blue",
            replica_args=(
                *("--state-ttl", str(STATE_TTL), "--session-idle", str(SESSION_TTL)),
                # Limits on, far above what the scenarios send: their scripts run
                # under the replica's user too (a place per session, a rate per round).
                *("--limit-sessions", "1000", "--limit-rounds", "100000"),
                *("--limit-burst", "100000"),
            ),
            router_args=("--session-ttl", str(SESSION_TTL)),
        ),
    )
    acl_log(server, reset=True)
    with lf, shared(lf):
        yield lf


def user_client(lf: RedisFleet, server: RedisServer, component: str) -> redis.Redis:
    user, password_file = lf.users[component]
    return redis.Redis(
        host="127.0.0.1",
        port=server.port,
        username=user,
        password=password_file.read_text().strip(),
        socket_timeout=2,
    )


async def test_modern_rounds_spread_with_every_component_under_its_acl_user(
    blue: RedisFleet,
) -> None:
    await scenarios.modern_rounds_spread(blue)


async def test_handshake_sessions_stick_with_every_component_under_its_acl_user(
    blue: RedisFleet,
) -> None:
    await scenarios.handshake_session_sticks(blue)
    await scenarios.concurrent_handshake_sessions(blue, 9)


def test_a_session_route_is_refreshed_under_the_router_user(
    blue: RedisFleet, server: RedisServer
) -> None:
    """A request on a cached session past a quarter of the TTL refreshes the route (PEXPIRE)."""
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
    with httpx.Client(timeout=10) as http:
        resp = http.post(blue.url, content=initialize_body("acl-test"), headers=headers)
        assert resp.status_code == 200, resp.text
        session = resp.headers[SESSION_HEADER]
        key = RedisKeys("blue").session(session)
        with contextlib.closing(server.admin()) as admin:
            assert admin.get(key) is not None, "the router wrote the route as its user"
            time.sleep(SESSION_TTL / 4 + 0.5)  # the refresh is due only after a quarter TTL
            before = admin.pttl(key)
            ping = '{"jsonrpc":"2.0","id":2,"method":"ping"}'
            answer = http.post(blue.url, content=ping, headers={**headers, SESSION_HEADER: session})
            assert answer.status_code == 200, answer.text
            wait_for(
                lambda: admin.pttl(key) > before, timeout=5, what="the route's TTL to be refreshed"
            )


async def test_a_rotation_under_load_with_every_component_under_its_acl_user(
    blue: RedisFleet,
) -> None:
    await scenarios.rotation_under_load(blue, STATE_TTL)


def test_a_drained_replica_withdraws_its_record_under_the_replica_user(
    blue: RedisFleet, server: RedisServer
) -> None:
    blue.drain("replica-2")
    keys = RedisKeys("blue")
    with contextlib.closing(server.admin()) as admin:
        wait_for(
            lambda: (
                admin.get(keys.replica("replica-2")) is None
                and b"replica-2" not in admin.smembers(keys.replicas)
            ),
            timeout=30,
            what="replica-2 to withdraw its record and its name",
        )


async def test_the_router_and_operator_clients_connect_over_a_unix_socket(
    blue: RedisFleet, server: RedisServer
) -> None:
    """unix:// with a user and its password file, for the asyncio and the blocking client."""
    keys = RedisKeys("blue")
    user, password_file = blue.users["router"]
    files = redisconn.RedisFiles(password_file=password_file)
    router = connect(f"unix://{user}@{server.socket}?db=0", files)
    try:
        assert "replica-0" in await read_replicas(router, keys)
    finally:
        await router.aclose()
    user, password_file = blue.users["operator"]
    s = redisconn.settings(
        f"unix://{user}@{server.socket}", redisconn.RedisFiles(password_file=password_file)
    )
    operator = redisconn.sync_client(s, timeout=2)
    try:
        assert "replica-0" in read_replicas_sync(operator, keys)
    finally:
        operator.close()


def test_nothing_in_normal_operation_was_denied(blue: RedisFleet, server: RedisServer) -> None:
    """Every scenario above ran as the components' users: ACL LOG stays empty."""
    with contextlib.closing(server.admin()) as admin:
        clients = admin.client_list()
    users = {c["user"] for c in clients}
    assert {blue.users["replica"][0], blue.users["router"][0]} <= users, users
    assert "default" not in users
    assert acl_log(server) == [], "a component sent a command outside its rules"


def _router_degraded(lf: RedisFleet) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{lf.router_ports[0]}/readyz", timeout=1) as r:
        return bool(json.loads(r.read())["degraded"])


def _open_session(url: str) -> tuple[str, str]:
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
    resp = httpx.post(url, content=initialize_body("acl-test"), headers=headers, timeout=10)
    assert resp.status_code == 200, resp.text
    return resp.headers[SESSION_HEADER], resp.headers["x-mcpfleet-replica"]


def _ping(url: str, session: str) -> httpx.Response:
    headers = {
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        SESSION_HEADER: session,
    }
    return httpx.post(url, content='{"jsonrpc":"2.0","id":3,"method":"ping"}', headers=headers)


def test_the_redis_password_rotates_without_a_restart(
    blue: RedisFleet, server: RedisServer
) -> None:
    """Add the new password, swap the file, drop connections, remove the old one: no denial."""
    user, password_file = blue.users["router"]
    old = password_file.read_text().strip()
    new = secrets.token_hex(16)
    acl_log(server, reset=True)
    with contextlib.closing(server.admin()) as admin:
        admin.execute_command("ACL", "SETUSER", user, f">{new}")
        password_file.write_text(new + "\n")
        admin.execute_command("CLIENT", "KILL", "USER", user)
        admin.execute_command("ACL", "SETUSER", user, f"<{old}")
        wait_for(
            lambda: any(c["user"] == user for c in admin.client_list()),
            timeout=10,
            what="the router to reconnect with the new password",
        )
        session, owner = _open_session(blue.url)
        # Written under the new password: the route is in Redis.
        assert admin.get(RedisKeys("blue").session(session)) == owner.encode()
    assert not _router_degraded(blue)
    assert acl_log(server) == []


def test_a_vanished_password_file_degrades_the_router_and_loses_nothing(
    blue: RedisFleet, server: RedisServer
) -> None:
    """The file gone (a broken Secret): the router says so, routes from its cache, recovers."""
    user, password_file = blue.users["router"]
    session, owner = _open_session(blue.url)
    saved = password_file.read_text()
    password_file.unlink()
    try:
        with contextlib.closing(server.admin()) as admin:
            admin.execute_command("CLIENT", "KILL", "USER", user)
        wait_for(lambda: _router_degraded(blue), timeout=10, what="the router to report degraded")
        log = blue.router_procs[0].tail(200)
        assert f"Redis password file {password_file} does not exist" in log
        assert saved.strip() not in log
        # Known sessions route from the cache, modern rounds need no Redis.
        answer = _ping(blue.url, session)
        assert answer.status_code == 200 and answer.headers["x-mcpfleet-replica"] == owner
    finally:
        password_file.write_text(saved)
    wait_for(lambda: not _router_degraded(blue), timeout=10, what="the router to leave degraded")
    assert _ping(blue.url, session).status_code == 200


def test_no_password_is_in_a_log_or_a_process_argument(blue: RedisFleet) -> None:
    passwords = [path.read_text().strip() for _, path in blue.users.values()]
    logs = [p.read_text(errors="replace") for p in blue.workdir.glob("*.log")]
    procs = [m.proc for m in blue.members.values()] + blue.router_procs
    argvs = [
        Path(f"/proc/{proc.popen.pid}/cmdline").read_bytes().decode(errors="replace")
        for proc in procs
        if proc.alive and proc.popen is not None
    ]
    assert len(logs) >= 4 and len(argvs) >= 3
    for password in passwords:
        assert not any(password in text for text in logs + argvs)
    assert all("--redis-password-file" in argv for argv in argvs)


@pytest.mark.parametrize("component", REDIS_COMPONENTS)
def test_a_command_outside_the_rules_is_refused(
    blue: RedisFleet, server: RedisServer, component: str
) -> None:
    keys = RedisKeys("blue")
    outside = {
        "replica": [
            # Its own sessions' routes it may write back (SET NX), never extend or list.
            ("PEXPIRE", keys.session("s"), "1000"),
            ("GET", RedisKeys("other").once("s")),
            ("SCRIPT", "FLUSH"),
            ("KEYS", "*"),
            ("FLUSHALL",),
            ("CONFIG", "GET", "requirepass"),
            ("SET", "mcpfleet:other:replica:x", "{}"),
        ],
        "router": [
            ("SET", keys.replica("replica-0"), "{}"),
            ("SADD", keys.replicas, "intruder"),
            ("DEL", keys.replica("replica-0")),
            ("FLUSHDB",),
            ("GET", RedisKeys("other").session("s")),
            ("ACL", "LIST"),
        ],
        "operator": [
            ("SADD", keys.replicas, "intruder"),
            ("SET", keys.replica("x"), "{}"),
            ("GET", keys.session("s")),
            ("DEL", keys.replicas),
            ("SMEMBERS", RedisKeys("other").replicas),
        ],
    }[component]
    acl_log(server, reset=True)
    with contextlib.closing(user_client(blue, server, component)) as client:
        client.ping()
        for command in outside:
            with pytest.raises(NoPermissionError):
                client.execute_command(*command)
    assert len(acl_log(server, reset=True)) >= len(outside) - 1, "ACL LOG records denials"


def test_two_fleets_on_one_redis_see_only_their_own_prefix(
    blue: RedisFleet, server: RedisServer, tmp_path: Path
) -> None:
    green = redis_fleet(
        tmp_path / "green",
        [server],
        f"redis://127.0.0.1:{server.port}/0",
        server.admin,
        FleetOptions(fleet="green", replicas=1),
    )
    acl_log(server, reset=True)
    with green:
        text, replicas, _ = scenarios_handshake(green)
        assert text.startswith("Planned 'green'")
        assert replicas == {"replica-0"}
        assert set(green.attestations()) == {"replica-0"}
        assert "replica-0" in blue.attestations() and "replica-1" in blue.attestations()
        assert acl_log(server) == [], "two fleets side by side need nothing outside the rules"
        for mine, theirs in ((green, blue), (blue, green)):
            other = RedisKeys(theirs.fleet)
            for component in REDIS_COMPONENTS:
                with contextlib.closing(user_client(mine, server, component)) as client:
                    for command in (("SMEMBERS", other.replicas), ("GET", other.replica("x"))):
                        with pytest.raises(NoPermissionError):
                            client.execute_command(*command)
        acl_log(server, reset=True)


def scenarios_handshake(lf: RedisFleet) -> tuple[str, set[str], int]:
    import asyncio

    return asyncio.run(scenarios.handshake_session(lf.url, "green"))
