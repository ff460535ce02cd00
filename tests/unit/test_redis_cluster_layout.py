"""Redis Cluster: its URLs, the clients built from them, and the key layout (no server).

The fleet tier (tests/fleet/test_redis_cluster.py) runs the components on a real
cluster; here: what the URL parses to, that the client is a cluster client with
the same credentials and TLS as every other, and that every multi-key operation's
keys share a hash slot while standalone names stay as they always were.
"""

from __future__ import annotations

import asyncio
import fnmatch
from pathlib import Path

import pytest
from redis.crc import key_slot

from mcpfleet import redisconn
from mcpfleet.contract import REDIS_COMPONENTS, RedisKeys
from mcpfleet.redisconn import RedisConfigError, RedisURL, parse_url, redact_url

SECRET = "cluster-secret-7f3a"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "redis+cluster://n0:7000,n1,[::1]:7002",
            RedisURL("redis+cluster", hosts=(("n0", 7000), ("n1", 6379), ("::1", 7002))),
        ),
        (
            "rediss+cluster://router@n0:6380/0",
            RedisURL("rediss+cluster", hosts=(("n0", 6380),), username="router"),
        ),
        (
            "redis+cluster://op:p%40ss@n0",
            RedisURL("redis+cluster", hosts=(("n0", 6379),), username="op", password="p@ss"),
        ),
    ],
)
def test_cluster_urls_parse_to_their_seed_nodes(url: str, expected: RedisURL) -> None:
    parsed = parse_url(url)
    assert parsed == expected
    assert parsed.cluster and not parsed.sentinel
    assert parsed.tls == url.startswith("rediss")


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+cluster://n0/1", "database 0 only"),
        ("redis+cluster://n0/0/x", "database 0 only"),
        ("redis+cluster:///", "no cluster node"),
        ("redis://a:1,b:2/0", "redis\\+cluster://"),
    ],
)
def test_a_bad_cluster_url_is_refused_with_a_clear_error(url: str, says: str) -> None:
    with pytest.raises(RedisConfigError, match=says):
        parse_url(url)


def test_a_cluster_url_is_redacted_and_a_password_in_an_argument_refused() -> None:
    url = f"redis+cluster://u:{SECRET}@a:1,b:2"
    assert redact_url(url) == "redis+cluster://u:***@a:1,b:2"
    with pytest.raises(RedisConfigError) as info:
        redisconn.settings(url, source="argument")
    assert SECRET not in str(info.value)


def test_cluster_clients_carry_the_user_password_file_and_tls_of_every_client(
    tmp_path: Path,
) -> None:
    from redis.asyncio.connection import SSLConnection

    password = tmp_path / "password"
    password.write_text(SECRET)
    ca = tmp_path / "ca.crt"
    from fleetkit.certs import CertificateAuthority

    ca.write_bytes(CertificateAuthority("cluster-test-ca").cert_pem)
    s = redisconn.settings(
        "rediss+cluster://router@n0:7000,n1:7001",
        redisconn.RedisFiles(password_file=password, ca_file=ca),
    )
    client = redisconn.async_client(s, timeout=1, pool_size=7)
    assert redisconn.on_cluster(client)
    nodes = list(client.nodes_manager.startup_nodes.values())
    assert [(n.host, n.port) for n in nodes] == [("n0", 7000), ("n1", 7001)]
    for node in nodes:
        assert node.connection_class is SSLConnection
        assert node.max_connections == 7
        assert node.connection_kwargs["ssl_ca_certs"] == str(ca)
        assert node.connection_kwargs["credential_provider"].get_credentials() == (
            "router",
            SECRET,
        )
    asyncio.run(client.aclose())


def test_an_unreachable_cluster_is_a_redis_connection_error_for_both_clients() -> None:
    """Not redis-py's RedisClusterException, which no Redis-down path would catch."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    s = redisconn.settings("redis+cluster://127.0.0.1:1")
    with pytest.raises(RedisConnectionError, match="Redis Cluster"):
        redisconn.sync_client(s, timeout=0.5)

    async def ask() -> None:
        client = redisconn.async_client(s, timeout=0.5)
        try:
            with pytest.raises(RedisConnectionError, match="Redis Cluster"):
                await client.get("k")
            with pytest.raises(RedisConnectionError):
                await redisconn.mget_by_slot(client, ["a", "b"])
        finally:
            await client.aclose()

    asyncio.run(ask())


def test_the_tasks_queue_gets_the_cluster_url_of_its_library_without_the_password(
    tmp_path: Path,
) -> None:
    password = tmp_path / "password"
    password.write_text(SECRET)
    s = redisconn.settings(
        "redis+cluster://replica@n0:7000,n1:7001", redisconn.RedisFiles(password_file=password)
    )
    url, provider = redisconn.queue_target(s)
    assert url == "redis+cluster://n0:7000"
    assert provider.get_credentials() == ("replica", SECRET)


def test_standalone_and_sentinel_key_names_are_unchanged() -> None:
    keys = RedisKeys("blue")
    assert keys.replicas == "mcpfleet:blue:replicas"
    assert keys.replica("r") == "mcpfleet:blue:replica:r"
    assert keys.session("s") == "mcpfleet:blue:session:s"
    assert keys.session_init("s") == "mcpfleet:blue:session:s:init"
    assert keys.session_lost("s") == "mcpfleet:blue:session:s:lost"
    assert keys.session_moving("s") == "mcpfleet:blue:session:s:moving"
    assert keys.once("f") == "mcpfleet:blue:once:f"
    assert keys.task_seals("k") == "mcpfleet:blue:tasks:sealed:k"
    assert keys.tasks_prefix == keys.tasks


@pytest.mark.parametrize("session", ["abc123", "x}y", "}lead", "{open", "a{b}c"])
def test_on_a_cluster_a_sessions_keys_share_one_slot(session: str) -> None:
    keys = RedisKeys("blue", cluster=True)
    names = [
        keys.session(session),
        keys.session_init(session),
        keys.session_lost(session),
        keys.session_moving(session),
    ]
    assert len({key_slot(n.encode()) for n in names}) == 1, names


def test_on_a_cluster_the_registry_is_one_slot_and_sessions_and_flows_spread() -> None:
    keys = RedisKeys("blue", cluster=True)
    registry = {key_slot(keys.replicas.encode())}
    registry |= {key_slot(keys.replica(f"replica-{i}").encode()) for i in range(50)}
    assert len(registry) == 1
    assert len({key_slot(keys.session(f"s{i}").encode()) for i in range(200)}) > 150
    assert len({key_slot(keys.once(f"f{i}").encode()) for i in range(200)}) > 150
    assert keys.tasks_prefix == "{mcpfleet:blue:tasks}"
    assert keys.task_seals("k") == "{mcpfleet:blue:tasks}:sealed:k"


def _patterns(rules: list[str]) -> list[str]:
    out = []
    for rule in rules:
        rule = rule.strip("()")
        for mark in ("%R~", "~"):
            if rule.startswith(mark):
                out.append(rule.removeprefix(mark))
                break
    return out


def test_on_a_cluster_the_acl_patterns_match_the_tagged_names() -> None:
    keys = RedisKeys("blue", cluster=True)
    replica = _patterns(keys.acl_rules("replica"))
    router = _patterns(keys.acl_rules("router"))
    operator = _patterns(keys.acl_rules("operator"))

    def allowed(patterns: list[str], name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, p) for p in patterns)

    for name in (keys.replicas, keys.replica("r"), keys.session("s"), keys.session_init("s")):
        assert allowed(replica, name) and allowed(router, name), name
    assert allowed(replica, keys.once("f"))
    assert allowed(replica, f"{keys.tasks_prefix}:stream")
    assert allowed(operator, keys.task_seals("k")) and allowed(operator, keys.replica("r"))
    assert not allowed(router, keys.once("f"))


def test_cluster_rules_add_the_slot_map_and_redirections_only_on_a_cluster() -> None:
    extra = ["+cluster|slots", "+command", "+asking"]
    for component in REDIS_COMPONENTS:
        plain = RedisKeys("blue").acl_rules(component)
        tagged = RedisKeys("blue", cluster=True).acl_rules(component)
        assert not set(extra) & set(plain)
        assert set(extra) <= set(tagged)
