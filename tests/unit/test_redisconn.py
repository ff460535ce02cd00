"""Redis connection settings: URLs (Sentinel included), secrets from files, TLS files, redaction.

No server here: what a component refuses before it connects, and what it
would connect with. The servers (ACL users, TLS, Sentinel) are in
tests/fleet/test_redis_*.py.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetkit.certs import CertificateAuthority
from mcpfleet import redisconn
from mcpfleet.cli import main
from mcpfleet.contract import REDIS_COMPONENTS, RedisKeys
from mcpfleet.redisconn import (
    FilePassword,
    RedisConfigError,
    RedisFiles,
    RedisURL,
    parse_url,
    redact_url,
    settings,
)

SECRET = "s3cr3t-value"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://127.0.0.1:6379/0", RedisURL("redis", hosts=(("127.0.0.1", 6379),))),
        ("redis://redis", RedisURL("redis", hosts=(("redis", 6379),))),
        (
            "redis://replica@redis:6380/2",
            RedisURL("redis", hosts=(("redis", 6380),), db=2, username="replica"),
        ),
        (
            "rediss://router:pw@[::1]:6390/1",
            RedisURL("rediss", hosts=(("::1", 6390),), db=1, username="router", password="pw"),
        ),
        ("unix:///run/redis.sock?db=3", RedisURL("unix", path="/run/redis.sock", db=3)),
        (
            "redis+sentinel://s1:26379,s2,s3:26380/mymaster",
            RedisURL(
                "redis+sentinel",
                hosts=(("s1", 26379), ("s2", 26379), ("s3", 26380)),
                master="mymaster",
            ),
        ),
        (
            "redis+sentinel://op:p%40ss@s1:1/fleet-master/4",
            RedisURL(
                "redis+sentinel",
                hosts=(("s1", 1),),
                master="fleet-master",
                db=4,
                username="op",
                password="p@ss",
            ),
        ),
        (
            "redis+sentinel://:pw@s1/m",
            RedisURL("redis+sentinel", hosts=(("s1", 26379),), master="m", password="pw"),
        ),
    ],
)
def test_every_accepted_url_form_parses(url: str, expected: RedisURL) -> None:
    assert parse_url(url) == expected


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://127.0.0.1:6379", "starts with redis://"),
        ("127.0.0.1:6379", "starts with redis://"),
        ("redis://127.0.0.1:notaport/0", "bad port"),
        ("redis://127.0.0.1:70000/0", "bad port"),
        ("redis://127.0.0.1/zero", "must be a number"),
        ("redis://:pw@/0", "no host"),
        ("redis://a:1,b:2/0", "several hosts need redis\\+sentinel://"),
        ("redis+sentinel://s1:26379", "names the master"),
        ("redis+sentinel:///mymaster", "no sentinel host"),
        ("redis+sentinel://s1/m/0/extra", "too many path parts"),
        ("unix://relative.sock", "absolute socket path"),
    ],
)
def test_a_bad_url_is_refused_with_a_clear_error(url: str, says: str) -> None:
    with pytest.raises(RedisConfigError, match=says):
        parse_url(url)


def test_no_error_message_repeats_the_password() -> None:
    for url in (
        f"redis://u:{SECRET}@host:bad/0",
        f"redis://u:{SECRET}@host/zero",
        f"redis+sentinel://u:{SECRET}@s1",
        f"http://u:{SECRET}@host",
    ):
        with pytest.raises(RedisConfigError) as info:
            parse_url(url)
        assert SECRET not in str(info.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"redis://u:{SECRET}@h:1/0", "redis://u:***@h:1/0"),
        (f"redis://:{SECRET}@h:1/0", "redis://:***@h:1/0"),
        ("redis://replica@h:1/0", "redis://replica@h:1/0"),
        ("redis://h:1/0", "redis://h:1/0"),
        (f"rediss://u:{SECRET}@h/0", "rediss://u:***@h/0"),
        (f"redis+sentinel://u:{SECRET}@a:1,b:2/m/0", "redis+sentinel://u:***@a:1,b:2/m/0"),
        (f"unix://u:{SECRET}@/run/r.sock", "unix://u:***@/run/r.sock"),
    ],
)
def test_redaction_hides_passwords_and_keeps_the_rest(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_a_password_on_the_command_line_or_in_the_environment_is_refused() -> None:
    for source, where in (("argument", "command line"), ("environment", "environment")):
        with pytest.raises(RedisConfigError) as info:
            settings(f"redis://u:{SECRET}@h/0", source=source)  # type: ignore[arg-type]
        message = str(info.value)
        assert "--redis-password-file" in message and where in message
        assert SECRET not in message
    # Read from a file (or given by library code), it is accepted.
    assert settings(f"redis://u:{SECRET}@h/0", source="file").parsed.password == SECRET
    assert settings(f"redis://u:{SECRET}@h/0").parsed.password == SECRET


def test_a_url_file_may_carry_the_password(tmp_path: Path) -> None:
    url_file = tmp_path / "url"
    url_file.write_text(f"redis://router:{SECRET}@h:6379/0\n")
    s = redisconn.from_options(f"@{url_file}")
    assert s.parsed.username == "router" and s.parsed.password == SECRET
    assert SECRET not in repr(s) and SECRET not in s.redacted


def test_password_file_errors_are_clear(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    with pytest.raises(RedisConfigError, match=f"{missing} does not exist"):
        settings("redis://u@h/0", RedisFiles(password_file=missing))
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(RedisConfigError, match="is empty"):
        settings("redis://u@h/0", RedisFiles(password_file=empty))
    with pytest.raises(RedisConfigError, match="is a directory"):
        settings("redis://u@h/0", RedisFiles(password_file=tmp_path))
    two = tmp_path / "two"
    two.write_text(f"{SECRET}\nmore\n")
    with pytest.raises(RedisConfigError, match="more than one line") as info:
        settings("redis://u@h/0", RedisFiles(password_file=two))
    assert SECRET not in str(info.value)
    good = tmp_path / "good"
    good.write_text(SECRET + "\n")
    with pytest.raises(RedisConfigError, match="give it once"):
        settings(f"redis://u:{SECRET}@h/0", RedisFiles(password_file=good))


def test_an_unreadable_password_file_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    locked = tmp_path / "locked"
    locked.write_text(SECRET)
    locked.chmod(0)
    if os.geteuid() == 0:
        # Root reads any file: let the OS refuse this one read as it would anyone else.
        read_text = Path.read_text

        def refuse(self: Path, *args: object, **kwargs: object) -> str:
            if self == locked:
                raise PermissionError(13, "Permission denied", str(self))
            return read_text(self, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(Path, "read_text", refuse)
    with pytest.raises(RedisConfigError, match=r"not readable \(permission denied\)") as info:
        settings("redis://u@h/0", RedisFiles(password_file=locked))
    assert SECRET not in str(info.value)


def test_the_password_file_is_read_at_every_connection(tmp_path: Path) -> None:
    """A rotated Secret takes effect at the next connection, with no restart."""
    from redis.exceptions import AuthenticationError

    path = tmp_path / "password"
    path.write_text("first\n")
    provider = FilePassword("router", path)
    assert provider.get_credentials() == ("router", "first")
    path.write_text("second\n")
    assert provider.get_credentials() == ("router", "second")
    assert FilePassword(None, path).get_credentials() == ("second",)
    path.unlink()
    # A Redis error, so the components' Redis-down path handles it (no crash).
    with pytest.raises(AuthenticationError, match="does not exist"):
        provider.get_credentials()


def test_tls_files_are_checked_before_connecting(tmp_path: Path) -> None:
    ca = CertificateAuthority("redis-test-ca")
    ca_file = tmp_path / "ca.crt"
    ca_file.write_bytes(ca.cert_pem)
    cert, key = ca.issue_client("router").write(tmp_path, "client")
    s = settings("rediss://h:6380/0", RedisFiles(ca_file=ca_file, cert_file=cert, key_file=key))
    assert s.ssl_kwargs() == {
        "ssl": True,
        "ssl_cert_reqs": "required",
        "ssl_ca_certs": str(ca_file),
        "ssl_certfile": str(cert),
        "ssl_keyfile": str(key),
    }
    garbage = tmp_path / "garbage.crt"
    garbage.write_text("not a certificate\n")
    with pytest.raises(RedisConfigError, match="holds no usable certificate"):
        settings("rediss://h/0", RedisFiles(ca_file=garbage))
    with pytest.raises(RedisConfigError, match="does not exist"):
        settings("rediss://h/0", RedisFiles(ca_file=tmp_path / "nope.crt"))
    with pytest.raises(RedisConfigError, match="go together"):
        settings("rediss://h/0", RedisFiles(ca_file=ca_file, cert_file=cert))
    other_key = CertificateAuthority("other").issue_client("x").write(tmp_path, "other")[1]
    with pytest.raises(RedisConfigError, match="do not load as a pair"):
        settings("rediss://h/0", RedisFiles(cert_file=cert, key_file=other_key))
    with pytest.raises(RedisConfigError, match="use rediss://"):
        settings("redis://h/0", RedisFiles(ca_file=ca_file))


def test_the_acl_rules_name_only_the_fleets_keys() -> None:
    keys = RedisKeys("blue")
    for component in REDIS_COMPONENTS:
        rules = keys.acl_rules(component)
        assert rules[:3] == ["resetkeys", "resetchannels", "-@all"], component
        patterns = [r for r in rules if "~" in r]
        assert patterns and all(r.split("~", 1)[1].startswith("mcpfleet:blue:") for r in patterns)
        assert not any(r.startswith("+@") or r in ("allkeys", "allcommands") for r in rules)
    assert "~mcpfleet:blue:session:*" in keys.acl_rules("router")
    assert not any(r.startswith("~") for r in keys.acl_rules("operator")), "read-only"
    assert "+set" not in keys.acl_rules("operator")
    with pytest.raises(ValueError, match="component"):
        keys.acl_rules("admin")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the command line


@pytest.mark.parametrize("command", ["serve", "router"])
def test_the_command_line_refuses_a_password_in_the_url(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [command, "--redis", f"redis://u:{SECRET}@127.0.0.1:1/0"]
    if command == "serve":
        argv += ["--keys", "/nonexistent"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--redis-password-file" in err and SECRET not in err


def test_the_command_line_names_a_missing_password_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "pw"
    argv = ["router", "--redis", "redis://u@127.0.0.1:1/0", "--redis-password-file", str(missing)]
    assert main(argv) == 2
    assert f"Redis password file {missing} does not exist" in capsys.readouterr().err


def test_the_operator_refuses_a_password_in_its_environment(tmp_path: Path) -> None:
    """Checked before any Kubernetes client is built: no cluster needed."""
    env = {**os.environ, "MCPFLEET_REDIS_URL": f"redis://op:{SECRET}@127.0.0.1:1/0"}
    env["KUBECONFIG"] = str(tmp_path / "no-kubeconfig")
    result = subprocess.run(
        [sys.executable, "-m", "mcpfleet.cli", "operator", "-n", "x"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "visible in the environment" in result.stderr
    assert "--redis-password-file" in result.stderr
    assert SECRET not in result.stderr + result.stdout


def test_the_redis_doc_shows_exactly_the_acl_rules_of_the_contract() -> None:
    """One block of ACL lines for one Redis (or Sentinel), one for a Redis Cluster."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "redis.md").read_text()
    blocks = [b for b in doc.split("```")[1::2] if "user mcpfleet-" in b]
    assert len(blocks) == 2
    for block, cluster in zip(blocks, (False, True), strict=True):
        shown = {}
        for line in (ln for ln in block.splitlines() if ln.startswith("user mcpfleet-")):
            user, on, password, *rules = line.split()[1:]
            assert (on, password) == ("on", "#<sha256")
            assert rules[:3] == ["of", "its", "password>"]
            shown[user.removeprefix("mcpfleet-")] = rules[3:]
        keys = RedisKeys("default", cluster=cluster)
        assert shown == {c: keys.acl_rules(c) for c in REDIS_COMPONENTS}


def test_sentinel_clients_reach_the_sentinels_over_tls_without_the_masters_credentials(
    tmp_path: Path,
) -> None:
    import redis as sync_redis
    import redis.asyncio as aioredis
    import redis.asyncio.sentinel as aiosentinel
    import redis.sentinel

    ca = CertificateAuthority("redis-test-ca")
    ca_file = tmp_path / "ca.crt"
    ca_file.write_bytes(ca.cert_pem)
    password = tmp_path / "password"
    password.write_text(SECRET)
    s = settings(
        "rediss+sentinel://router@s1:26379,s2/mymaster/2",
        RedisFiles(password_file=password, ca_file=ca_file),
    )
    cases = [
        (
            redisconn.async_client(s, timeout=1),
            aiosentinel.SentinelManagedSSLConnection,
            aioredis.SSLConnection,
        ),
        (
            redisconn.sync_client(s, timeout=1),
            redis.sentinel.SentinelManagedSSLConnection,
            sync_redis.SSLConnection,
        ),
    ]
    for client, master_class, sentinel_class in cases:
        pool = client.connection_pool
        assert pool.service_name == "mymaster"
        assert pool.connection_class is master_class
        assert pool.connection_kwargs["db"] == 2
        assert pool.connection_kwargs["ssl_ca_certs"] == str(ca_file)
        provider = pool.connection_kwargs["credential_provider"]
        assert provider.get_credentials() == ("router", SECRET)
        sentinels = pool.sentinel_manager.sentinels
        assert len(sentinels) == 2
        for sentinel in sentinels:
            kwargs = sentinel.connection_pool.connection_kwargs
            assert sentinel.connection_pool.connection_class is sentinel_class
            assert kwargs["ssl_ca_certs"] == str(ca_file)
            assert not any(kwargs.get(k) for k in ("username", "password", "credential_provider"))


async def test_following_the_master_is_a_no_op_without_sentinel() -> None:
    client = redisconn.async_client(settings("redis://127.0.0.1:1/0"), timeout=0.1)
    try:
        assert await redisconn.follow_master(client) is False
    finally:
        await client.aclose()


async def test_a_direct_connection_to_a_master_sentinel_moved_is_closed_before_reuse() -> None:
    """The once ledger's own connections follow the master as the pool's do: once the
    pool takes another server for the master (a failover, :func:`follow_master`), an
    idle connection to the old one is closed before its next command (a demoted
    master may still take writes for seconds, and they would be lost)."""

    class Idle:
        def __init__(self, port: int) -> None:
            self.host, self.port, self.is_connected = "10.0.0.1", port, True

        async def disconnect(self) -> None:
            self.is_connected = False

    client = redisconn.async_client(
        settings("redis+sentinel://10.0.0.9:26379/mymaster/0"), timeout=0.1
    )
    direct = redisconn.DirectCommands(client)
    try:
        pool = client.connection_pool
        pool.master_address = ("10.0.0.1", 6379)
        old, same = Idle(6380), Idle(6379)
        direct._idle += [old, same]
        assert await direct._take() is same and same.is_connected
        assert await direct._take() is old and not old.is_connected
        # A plain client has no master to follow: its connections stay as they are.
        plain = redisconn.DirectCommands(
            redisconn.async_client(settings("redis://127.0.0.1:1/0"), timeout=0.1)
        )
        other = Idle(6380)
        plain._idle.append(other)
        assert await plain._take() is other and other.is_connected
        await plain.client.aclose()
    finally:
        await client.aclose()


def test_a_redis_older_than_7_is_refused_with_the_version_it_needs() -> None:
    from mcpfleet.redisconn import version_error

    assert version_error({"redis_version": "7.0.15"}) is None
    assert version_error({"redis_version": "8.2.1"}) is None
    problem = version_error({"redis_version": "6.2.14"})
    assert problem is not None and "6.2.14" in problem and "7.0" in problem


def test_clients_retry_once_on_a_connection_error_only_and_never_back_off() -> None:
    from redis.backoff import NoBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError

    from mcpfleet.redisconn import async_client, settings

    client = async_client(settings("redis://127.0.0.1:1/0"), timeout=0.5)
    retry = client.connection_pool.connection_kwargs["retry"]
    assert retry.get_retries() == 1
    assert isinstance(retry._backoff, NoBackoff)
    assert retry._supported_errors == (RedisConnectionError,)


async def test_a_late_reply_is_asked_again_within_the_deadline_on_a_plain_redis() -> None:
    """The claim is safe to send twice: a reply later than the socket timeout (a loaded
    machine) is asked again at once, while the deadline lasts, and no longer."""
    import time

    from redis.exceptions import TimeoutError as RedisTimeout

    plain = object()  # no Sentinel pool
    tries: list[float] = []

    async def late_once() -> str:
        tries.append(time.monotonic())
        if len(tries) == 1:
            raise RedisTimeout("Timeout reading from redis")
        return "claimed"

    assert await redisconn.ride_through(plain, late_once, deadline=2.0, failover_wait=8.0) == (
        "claimed"
    )
    assert len(tries) == 2

    async def always_late() -> str:
        tries.append(time.monotonic())
        await asyncio.sleep(0.05)
        raise RedisTimeout("Timeout reading from redis")

    tries.clear()
    started = time.monotonic()
    with pytest.raises((RedisTimeout, TimeoutError)):
        await redisconn.ride_through(plain, always_late, deadline=0.3, failover_wait=8.0)
    took = time.monotonic() - started
    assert len(tries) >= 2 and took < 0.3 + 0.2  # bounded by the deadline, not failover_wait

    async def refused() -> str:
        tries.append(time.monotonic())
        raise ConnectionRefusedError("refused")

    tries.clear()
    with pytest.raises(ConnectionRefusedError):
        await redisconn.ride_through(plain, refused, deadline=2.0, failover_wait=8.0)
    assert len(tries) == 1  # a Redis that is gone fails at once


async def test_a_full_pool_is_not_ridden_through_as_a_failover() -> None:
    """Through Sentinel a connection error may be a failover and is asked again; a full
    pool is this process busy: raised at once, so the caller answers 'busy' at once."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    from mcpfleet.redisconn import pool_full, ride_through

    class Sentinelled:
        connection_pool = type("Pool", (), {"get_master_address": None})()

    calls: list[int] = []

    async def busy() -> None:
        calls.append(1)
        try:
            raise TimeoutError
        except TimeoutError as exc:
            raise RedisConnectionError("No connection available.") from exc

    with pytest.raises(RedisConnectionError) as err:
        await ride_through(Sentinelled(), busy, deadline=1.0, failover_wait=5.0)
    assert pool_full(err.value) and calls == [1]
