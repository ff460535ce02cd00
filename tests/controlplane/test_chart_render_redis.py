"""Redis as the chart renders it (the real helm): each component's own ACL user and
password file, Redis under GitOps (an existing Secret, the init container that makes
the ACL file, run here against a real redis-server), and an external Redis (its URL,
TLS, and the ports the NetworkPolicies open).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetkit.cluster import chartkit
from fleetkit.cluster.helm import Helm
from mcpfleet.contract import RedisKeys

from .chartrender import SCENARIOS, _by, _container, _render

pytestmark = pytest.mark.timeout(300)


def test_with_redis_auth_each_component_mounts_only_its_own_password(
    rendered: dict[tuple[str, bool], list[dict[str, Any]]],
) -> None:
    docs = rendered["redis-auth", False]
    secret = _by(docs, "Secret", "-redis-auth")
    assert set(secret["data"]) == {"replica", "router", "operator", "users.acl"}
    import base64

    acl = base64.b64decode(secret["data"]["users.acl"]).decode().splitlines()
    assert acl[0] == "user default off"
    # Each user has exactly the rules the server's contract names for its component.
    keys = RedisKeys(_by(docs, "KeyRing")["spec"]["fleet"])
    for line, component in zip(acl[1:], ("replica", "router", "operator"), strict=True):
        user, on, password, *rules = line.split()[1:]
        assert (user, on) == (component, "on") and password.startswith(">")
        assert (
            len(password) > 30
            and password[1:] == base64.b64decode(secret["data"][component]).decode()
        )
        assert rules == keys.acl_rules(component)
    for suffix, user in [("-server", "replica"), ("-router", "router"), ("-operator", "operator")]:
        spec = _by(docs, "Deployment", suffix)["spec"]["template"]["spec"]
        (volume,) = [v for v in spec["volumes"] if v["name"] == "redis-password"]
        assert volume["secret"]["items"] == [{"key": user, "path": "password"}]
        args = spec["containers"][0]["args"]
        assert "--redis-password-file=/etc/mcpfleet/redis/password" in args
        url = next(a for a in args if a.startswith("--redis="))
        assert re.match(rf"--redis=redis://{user}@[^:@]+:6379/0$", url), url
    redis = _by(docs, "Deployment", "-redis")["spec"]["template"]["spec"]
    assert any(v.get("persistentVolumeClaim") for v in redis["volumes"])


def test_external_redis_passwords_and_tls_are_files(
    rendered: dict[tuple[str, bool], list[dict[str, Any]]],
) -> None:
    docs = rendered["external-redis", False]
    assert not [d for d in docs if d["metadata"]["name"].endswith("-redis")]
    for suffix in ("-server", "-router", "-operator"):
        args = _by(docs, "Deployment", suffix)["spec"]["template"]["spec"]["containers"][0]["args"]
        assert "--redis=rediss://mcpfleet@redis.example.internal:6380/0" in args
        assert "--redis-password-file=/etc/mcpfleet/redis/password" in args
        assert "--redis-ca-file=/etc/mcpfleet/redis-tls/ca.crt" in args
        assert "--redis-cert-file=/etc/mcpfleet/redis-tls-client/tls.crt" in args


def test_an_upgrade_that_changes_the_replicas_does_not_restart_redis(helm: Helm) -> None:
    """Redis' pod template is the same whatever else changes (its ACL checksum holds
    no generated password): restarting it would drop every session's route."""

    def redis_template(*settings: str) -> dict[str, Any]:
        docs = chartkit.objects(chartkit.render(helm, *settings))
        return _by(docs, "Deployment", "-redis")["spec"]["template"]

    assert redis_template() == redis_template("--set", "server.stateTTL=5,server.replicas=4")


# --------------------------------------------------------------------------- Redis under GitOps


EXISTING = {"redis": {"auth": {"existingSecret": "mcp-redis-users"}}}


def test_with_an_existing_secret_two_renders_are_the_same_and_hold_no_password(
    helm: Helm, tmp_path: Path
) -> None:
    """Argo CD and Flux render without lookup: generated passwords would change on
    every sync while Redis keeps the ACL it loaded (WRONGPASS for the whole fleet)."""
    first = _render(helm, EXISTING, tmp_path)
    assert first == _render(helm, EXISTING, tmp_path)
    docs = chartkit.objects(first)
    assert not [d for d in docs if d["kind"] == "Secret"], "the chart makes no password"
    rules = _by(docs, "ConfigMap", "-redis-acl")["data"]
    keys = RedisKeys(_by(docs, "KeyRing")["spec"]["fleet"])
    assert {user: r.split() for user, r in rules.items()} == {
        c: keys.acl_rules(c) for c in ("replica", "router", "operator")
    }
    for suffix, user in [("-server", "replica"), ("-router", "router"), ("-operator", "operator")]:
        spec = _by(docs, "Deployment", suffix)["spec"]["template"]["spec"]
        (volume,) = [v for v in spec["volumes"] if v["name"] == "redis-password"]
        assert volume["secret"]["secretName"] == "mcp-redis-users"
        assert volume["secret"]["items"] == [{"key": user, "path": "password"}]
    redis = _by(docs, "Deployment", "-redis")["spec"]["template"]["spec"]
    (passwords,) = [v for v in redis["volumes"] if v["name"] == "passwords"]
    assert passwords["secret"]["secretName"] == "mcp-redis-users"
    # Without it, each render generates new passwords: what GitOps tools would apply.
    plain = [_by(chartkit.objects(chartkit.render(helm)), "Secret", "-redis-auth") for _ in "ab"]
    assert plain[0]["data"]["router"] != plain[1]["data"]["router"]


def _acl_script(
    helm: Helm, tmp_path: Path, passwords: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """The Redis Pod's init container, run here on files laid out as its volumes are."""
    docs = chartkit.objects(_render(helm, EXISTING, tmp_path))
    spec = _by(docs, "Deployment", "-redis")["spec"]["template"]["spec"]
    init = _container(spec, "acl")
    assert init["command"] == ["/bin/sh", "-eu", "-c"]
    root = tmp_path / "pod"
    for sub in ("redis-acl", "redis-rules", "redis-passwords"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for user, rules in _by(docs, "ConfigMap", "-redis-acl")["data"].items():
        (root / "redis-rules" / user).write_text(rules)
    for user, password in passwords.items():
        (root / "redis-passwords" / user).write_text(password)
    script = init["args"][0].replace("/etc/mcpfleet/", f"{root}/")
    return subprocess.run(
        ["/bin/sh", "-eu", "-c", script], capture_output=True, text=True, timeout=30, check=False
    )


def test_the_redis_init_container_makes_an_acl_redis_loads_with_hashed_passwords(
    helm: Helm, tmp_path: Path
) -> None:
    import secrets as pysecrets

    import redis as redislib

    from fleetkit.cluster.controlplane import free_port, wait_for

    passwords = {
        "replica": pysecrets.token_urlsafe(24) + "\n",  # kubectl create secret --from-file
        "router": pysecrets.token_urlsafe(24),
        "operator": "with spaces and $ signs\r\n",
    }
    done = _acl_script(helm, tmp_path, passwords)
    assert done.returncode == 0, done.stderr
    acl = (tmp_path / "pod" / "redis-acl" / "users.acl").read_text()
    for password in passwords.values():
        assert password.strip() not in acl, "the file holds hashes, never a password"
    port = free_port()
    proc = subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--aclfile",
            str(tmp_path / "pod" / "redis-acl" / "users.acl"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        fleet = _by(chartkit.objects(_render(helm, EXISTING, tmp_path)), "KeyRing")["spec"]["fleet"]

        def client(user: str, password: str) -> redislib.Redis:
            return redislib.Redis(port=port, username=user, password=password, socket_timeout=5)

        def up() -> bool:
            return bool(client("router", passwords["router"]).ping())

        wait_for(
            up, timeout=30, what="redis-server with the ACL", retry_on=(redislib.ConnectionError,)
        )
        replica = client("replica", passwords["replica"].removesuffix("\n"))
        replica.set(f"mcpfleet:{fleet}:replica:r0", "x")
        operator = client("operator", "with spaces and $ signs")
        assert operator.mget([f"mcpfleet:{fleet}:replica:r0"]) == [b"x"]
        with pytest.raises(redislib.exceptions.NoPermissionError):
            client("router", passwords["router"]).set(f"mcpfleet:{fleet}:replica:r0", "y")
        with pytest.raises(redislib.exceptions.AuthenticationError):
            client("router", "wrong").ping()
        with pytest.raises(redislib.exceptions.AuthenticationError):
            redislib.Redis(port=port, socket_timeout=5).execute_command("AUTH", "default", "")
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize(
    ("password", "message"),
    [("", "the password of router is empty"), ("one\ntwo\n", "router has more than one line")],
    ids=["empty", "two-lines"],
)
def test_a_bad_password_in_the_existing_secret_stops_redis_naming_the_user(
    helm: Helm, tmp_path: Path, password: str, message: str
) -> None:
    done = _acl_script(
        helm, tmp_path, {"replica": "r" * 20, "router": password, "operator": "o" * 20}
    )
    assert done.returncode == 1
    assert "Secret mcp-redis-users: " in done.stderr and message in done.stderr
    assert "one" not in done.stderr.replace("one line", "").replace("none", "")
    assert not (tmp_path / "pod" / "redis-acl" / "users.acl").exists()


# --------------------------------------------------------------------------- external Redis


@pytest.mark.parametrize(
    ("url", "ports"),
    [
        ("redis://redis.example.internal/0", [6379]),
        ("rediss://u@redis.example.internal:6380/0", [6380]),
        ("redis+sentinel://s0:26379,s1:26380,s2/mymaster/0", [26379, 26380, 6379]),
        ("rediss+sentinel://u@s0,s1/mymaster", [26379, 6379]),
        ("redis+cluster://n0:7000,n1:7001,n2", [7000, 7001, 6379]),
        ("rediss+cluster://u@n0.cache.example,n1.cache.example", [6379]),
        ("unix:///run/redis/redis.sock", []),
    ],
)
def test_the_network_policies_open_the_external_redis_ports(
    helm: Helm, schemas: Path, tmp_path: Path, url: str, ports: list[int]
) -> None:
    values = {
        "redis": {"enabled": False, "external": {"url": url}},
        "networkPolicy": {"enabled": True},
    }
    manifest = _render(helm, values, tmp_path)
    assert chartkit.kubeconform(manifest, schemas) == []
    docs = chartkit.objects(manifest)
    for suffix in ("-server", "-router", "-operator"):
        egress = _by(docs, "NetworkPolicy", suffix)["spec"]["egress"]
        opened = [p["port"] for rule in egress if "to" not in rule for p in rule["ports"]]
        assert opened == ports, (suffix, egress)
        assert 0 not in opened
    explicit = _render(
        helm,
        {**values, "redis": {"enabled": False, "external": {"url": url, "ports": [7000, 7001]}}},
        tmp_path,
    )
    egress = _by(chartkit.objects(explicit), "NetworkPolicy", "-server")["spec"]["egress"]
    assert [p["port"] for r in egress if "to" not in r for p in r["ports"]] == [7000, 7001]


def test_each_component_logs_in_to_an_external_redis_as_its_own_user(
    rendered: dict[tuple[str, bool], list[dict[str, Any]]],
) -> None:
    docs = rendered["example-external-sentinel", False]
    values = yaml.safe_load(SCENARIOS["example-external-sentinel"].read_text())
    users = values["redis"]["external"]["users"]
    for suffix, component in [
        ("-server", "replica"),
        ("-router", "router"),
        ("-operator", "operator"),
    ]:
        spec = _by(docs, "Deployment", suffix)["spec"]["template"]["spec"]
        args = spec["containers"][0]["args"]
        url = next(a for a in args if a.startswith("--redis="))
        assert url == (
            f"--redis=redis+sentinel://{users[component]['username']}@sentinel-0.redis.svc:26379,"
            "sentinel-1.redis.svc:26379,sentinel-2.redis.svc:26379/mymaster/0"
        )
        (volume,) = [v for v in spec["volumes"] if v["name"] == "redis-password"]
        assert volume["secret"]["secretName"] == users[component]["passwordSecret"]["name"]
        assert volume["secret"]["items"] == [{"key": "password", "path": "password"}]
    egress = _by(docs, "NetworkPolicy", "-router")["spec"]["egress"]
    assert [p["port"] for r in egress if "to" not in r for p in r["ports"]] == [26379, 6379]


def test_every_component_gets_a_redis_cluster_url_as_given(helm: Helm, tmp_path: Path) -> None:
    url = "rediss+cluster://n0.cache.example:6379,n1.cache.example:6379"
    values = {"redis": {"enabled": False, "external": {"url": url}}}
    docs = chartkit.objects(_render(helm, values, tmp_path))
    for suffix in ("-server", "-router", "-operator"):
        args = _by(docs, "Deployment", suffix)["spec"]["template"]["spec"]["containers"][0]["args"]
        assert f"--redis={url}" in args, (suffix, args)
