"""How every mcpfleet component connects to Redis: URLs, secrets from files, TLS, Sentinel.

The replica, the router and the operator accept the same things and build
their clients here, nowhere else:

* a URL: ``redis://``, ``rediss://`` (TLS), ``unix://`` or
  ``redis+sentinel://[[user]:password@]host:port[,host:port...]/<master>[/<db>]``
  (``rediss+sentinel://`` for Sentinel with TLS); a user name may be in it
  (``redis://replica@redis:6379/0``: an ACL user);
* the password from a file (``--redis-password-file``), re-read at every new
  connection, so a rotated Secret needs no restart;
* TLS files: the CA that signed the server's certificate, and optionally a
  client certificate and its key.

Secrets never travel in process arguments or environment variables: a URL
given on the command line (or in ``$MCPFLEET_REDIS_URL``) that carries a
password is refused, with a pointer to the password file flag. A URL read
from a file (``--redis @FILE``) may carry one. Only :func:`redact_url`
output is ever logged; file contents never are.

For Sentinel, the credentials in the URL (or the password file) are the
master's; the sentinels are asked without credentials, over TLS when the
URL is ``rediss+sentinel://``. redis-py's Sentinel pools ask the sentinels for the
master at every new connection and drop connections to a demoted one, which
is all following a failover takes: the components' usual Redis-down path
(retry, degrade, write back) covers the seconds in between, and a step that
must not fail during a failover (a once-flow's claim) waits for the new
master with :func:`ride_through`.

Fail fast, bounded: every client is built with at most :data:`RETRIES` retry,
on a connection error only, with no backoff (redis-py's default retries ten
times with a growing backoff, which turned a 0.5 s socket timeout into 10-18 s
waits); a timeout is never retried (the command may have run). A request's
path also puts a deadline around each Redis step (:func:`within`), so the
wait is bounded whatever the client does inside it.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar
from urllib.parse import unquote

if TYPE_CHECKING:  # redis itself is imported when a client is built: config stays light
    import redis
    import redis.asyncio as aioredis

log = logging.getLogger("mcpfleet.redis")

#: Every scheme a Redis URL may have.
SCHEMES = ("redis", "rediss", "unix", "redis+sentinel", "rediss+sentinel")
DEFAULT_PORT = 6379
DEFAULT_SENTINEL_PORT = 26379
#: The flag a password belongs in, named by every refusal.
PASSWORD_FILE_FLAG = "--redis-password-file"
#: Retries of one command, on a connection error only (a stale pooled connection,
#: a master that just moved), at once: never on a timeout, never with a backoff.
RETRIES = 1
#: The default deadline of one Redis step on a request's path (seconds): a
#: socket timeout (0.5 s) and a retry fit in it several times over. 1 s was
#: measured too short on a loaded 2-core kind cluster during a replica roll (a
#: new replica's first claim read for over 0.5 s); 2 s is still a bounded,
#: fast answer when Redis is gone.
DEFAULT_DEADLINE = 2.0
#: The default time a step that must ride through a Sentinel failover waits for
#: the new master: the chart's Sentinel settings (down-after 1 s, failover
#: within a few seconds; failover-timeout 5 s) plus a margin.
DEFAULT_FAILOVER_WAIT = 8.0
#: The oldest Redis the components work with: ``SET ... NX GET`` (the once
#: ledger's claim) and ``PEXPIRE ... GT`` came with 7.0.
MIN_VERSION = (7, 0)

T = TypeVar("T")

Source = Literal["argument", "environment", "file", "library"]


class RedisConfigError(ValueError):
    """A Redis URL or file the user must fix; the message is one clear line, never a secret."""


# --------------------------------------------------------------------------- URLs


@dataclass(frozen=True)
class RedisURL:
    """A parsed Redis URL. ``password`` is kept out of ``repr``."""

    scheme: str
    hosts: tuple[tuple[str, int], ...] = ()
    path: str = ""
    master: str = ""
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    @property
    def tls(self) -> bool:
        return self.scheme.startswith("rediss")

    @property
    def sentinel(self) -> bool:
        return self.scheme.endswith("+sentinel")


def redact_url(url: str) -> str:
    """A Redis URL for logs: any password replaced by ``***``, the user name kept."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, tail = rest.partition("/")
    if "@" not in authority:
        return url
    creds, _, hosts = authority.rpartition("@")
    user, colon, _ = creds.partition(":")
    if not colon:
        return url  # a user name alone ("redis://replica@host"): nothing secret
    shown = f"{user}:***" if user else ":***"
    return f"{scheme}://{shown}@{hosts}{slash}{tail}"


def _split_creds(creds: str) -> tuple[str | None, str | None]:
    """``user:pw``, ``:pw``, ``user:`` or ``user`` (a user name alone: the password comes
    from a file)."""
    if not creds:
        return None, None
    user, colon, password = creds.partition(":")
    return (unquote(user) or None), (unquote(password) if colon and password else None)


def _host_port(text: str, default: int, url: str) -> tuple[str, int]:
    if text.startswith("["):  # [::1]:6379
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    else:
        host, _, port_text = text.rpartition(":") if ":" in text else (text, "", "")
    if not host:
        raise RedisConfigError(f"no host in Redis URL {redact_url(url)}")
    try:
        port = int(port_text) if port_text else default
    except ValueError:
        raise RedisConfigError(f"bad port {port_text!r} in Redis URL {redact_url(url)}") from None
    if not 0 < port < 65536:
        raise RedisConfigError(f"bad port {port} in Redis URL {redact_url(url)}")
    return host, port


def _db(text: str, url: str) -> int:
    if not text:
        return 0
    if not text.isdigit():
        raise RedisConfigError(f"the database in {redact_url(url)} must be a number, got {text!r}")
    return int(text)


def parse_url(url: str) -> RedisURL:
    """Parse any URL a component accepts; raise :class:`RedisConfigError` if it is not one."""
    url = url.strip()
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in SCHEMES:
        raise RedisConfigError(
            "a Redis URL starts with redis://, rediss://, unix:// or redis+sentinel://, "
            f"got {redact_url(url)!r}"
        )
    scheme = scheme.lower()
    rest, _, query = rest.partition("?")
    if scheme == "unix":
        creds, _, path = rest.rpartition("@") if "@" in rest else ("", "", rest)
        user, password = _split_creds(creds)
        if not path.startswith("/"):
            raise RedisConfigError(
                f"a unix:// URL names an absolute socket path, got {redact_url(url)!r}"
            )
        db = 0
        for item in filter(None, query.split("&")):
            name, _, value = item.partition("=")
            if name == "db":
                db = _db(value, url)
        return RedisURL(scheme, path=path, db=db, username=user, password=password)
    authority, _, path = rest.partition("/")
    creds, _, hosts_text = authority.rpartition("@")
    user, password = _split_creds(creds)
    if creds and ":" not in creds:
        # redis-py would read a lone word before "@" as a password; here it is a user
        # name (the ACL user), so the rule is the same with or without a password file.
        user, password = unquote(creds), None
    parts = [p for p in path.split("/") if p]
    if scheme.endswith("+sentinel"):
        if not hosts_text:
            raise RedisConfigError(f"no sentinel host in {redact_url(url)}")
        hosts = tuple(_host_port(h, DEFAULT_SENTINEL_PORT, url) for h in hosts_text.split(",") if h)
        if not parts:
            raise RedisConfigError(
                f"a redis+sentinel:// URL names the master after the hosts "
                f"(redis+sentinel://host:26379/mymaster[/db]), got {redact_url(url)!r}"
            )
        if len(parts) > 2:
            raise RedisConfigError(f"too many path parts in {redact_url(url)}")
        return RedisURL(
            scheme,
            hosts=hosts,
            master=unquote(parts[0]),
            db=_db(parts[1] if len(parts) > 1 else "", url),
            username=user,
            password=password,
        )
    if "," in hosts_text:
        raise RedisConfigError(f"several hosts need redis+sentinel://, got {redact_url(url)!r}")
    if len(parts) > 1:
        raise RedisConfigError(f"too many path parts in {redact_url(url)}")
    host = _host_port(hosts_text, DEFAULT_PORT, url)
    return RedisURL(
        scheme,
        hosts=(host,),
        db=_db(parts[0] if parts else "", url),
        username=user,
        password=password,
    )


# --------------------------------------------------------------------------- files


def read_secret_file(path: Path, what: str) -> str:
    """A secret's text (one trailing newline dropped); a clear error, never the content."""
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RedisConfigError(f"{what} {path} does not exist") from None
    except PermissionError:
        raise RedisConfigError(f"{what} {path} is not readable (permission denied)") from None
    except IsADirectoryError:
        raise RedisConfigError(f"{what} {path} is a directory, not a file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RedisConfigError(f"{what} {path} cannot be read: {type(exc).__name__}") from None
    value = raw[:-1] if raw.endswith("\n") else raw
    value = value[:-1] if value.endswith("\r") else value
    if not value.strip():
        raise RedisConfigError(f"{what} {path} is empty")
    if "\n" in value:
        raise RedisConfigError(f"{what} {path} has more than one line")
    return value


class FilePassword:
    """The URL's user name with a password read from a file at every new connection.

    A Secret volume swaps the file when the Redis password rotates; the next
    connection picks it up, with no restart. (redis-py's credential provider
    protocol: ``get_credentials`` and its async twin.)
    """

    def __init__(self, username: str | None, path: Path) -> None:
        self.username = username
        self.path = path

    def get_credentials(self) -> tuple[str] | tuple[str, str]:
        from redis.exceptions import AuthenticationError

        try:
            password = read_secret_file(self.path, "Redis password file")
        except RedisConfigError as exc:
            # A RedisError: the components' Redis-down path (retry, degrade) takes it.
            raise AuthenticationError(str(exc)) from None
        return (self.username, password) if self.username else (password,)

    async def get_credentials_async(self) -> tuple[str] | tuple[str, str]:
        return self.get_credentials()


@dataclass(frozen=True)
class RedisFiles:
    """The file flags: ``--redis-password-file``, ``--redis-ca-file``, ``--redis-cert-file``,
    ``--redis-key-file``."""

    password_file: Path | None = None
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None

    @property
    def any_tls(self) -> bool:
        return any((self.ca_file, self.cert_file, self.key_file))


# --------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class RedisSettings:
    """A checked URL and its files: everything needed to build a client.

    Build it with :func:`settings`, which refuses what cannot work (a bad URL, a
    missing file, a password where it would leak) before anything connects.
    """

    url: str = field(repr=False)
    parsed: RedisURL
    files: RedisFiles = field(default_factory=RedisFiles)

    @property
    def redacted(self) -> str:
        """The URL as logs show it."""
        return redact_url(self.url)

    def __repr__(self) -> str:
        return f"RedisSettings({self.redacted!r}, {self.files!r})"

    def ssl_kwargs(self) -> dict[str, Any]:
        """redis-py's TLS arguments, or {} without TLS."""
        if not self.parsed.tls:
            return {}
        f = self.files
        return {
            "ssl": True,
            "ssl_cert_reqs": "required",
            "ssl_ca_certs": str(f.ca_file) if f.ca_file else None,
            "ssl_certfile": str(f.cert_file) if f.cert_file else None,
            "ssl_keyfile": str(f.key_file) if f.key_file else None,
        }

    def auth_kwargs(self) -> dict[str, Any]:
        p = self.parsed
        if self.files.password_file is not None:
            return {"credential_provider": FilePassword(p.username, self.files.password_file)}
        out: dict[str, Any] = {}
        if p.username:
            out["username"] = p.username
        if p.password:
            out["password"] = p.password
        return out

    def connection_kwargs(self, timeout: float, *, aio: bool = True) -> dict[str, Any]:
        """Arguments every connection (master or sentinel) is built with."""
        return {
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
            "retry": fail_fast_retry(aio=aio),
            # No CLIENT SETINFO on connect: not in any component's ACL rules.
            "driver_info": None,
            **self.auth_kwargs(),
            **self.ssl_kwargs(),
        }


def settings(
    url: str,
    files: RedisFiles | None = None,
    *,
    source: Source = "library",
    flag: str = "--redis",
) -> RedisSettings:
    """Check ``url`` and ``files`` and return settings; raise :class:`RedisConfigError`.

    ``source`` says where the URL came from: a password is refused in a URL
    given as a process argument or an environment variable (both readable
    by anyone who can list processes or inspect them), accepted in one read
    from a file or passed in by library code.
    """
    files = files or RedisFiles()
    parsed = parse_url(url)
    if parsed.password is not None and source in ("argument", "environment"):
        where = "on the command line" if source == "argument" else "in the environment"
        raise RedisConfigError(
            f"the {flag} URL carries a password, which would be visible {where}: "
            f"put the password in a file and give {PASSWORD_FILE_FLAG} FILE "
            f"(or the whole URL in a file: {flag} @FILE)"
        )
    if parsed.password is not None and files.password_file is not None:
        raise RedisConfigError(
            f"a password in the {flag} URL and {PASSWORD_FILE_FLAG} too: give it once"
        )
    if files.password_file is not None:
        read_secret_file(files.password_file, "Redis password file")
    if files.any_tls and not parsed.tls:
        raise RedisConfigError(
            f"TLS files given but the {flag} URL is not TLS: use rediss:// "
            f"(or rediss+sentinel://), got {redact_url(url)!r}"
        )
    if (files.cert_file is None) != (files.key_file is None):
        raise RedisConfigError("--redis-cert-file and --redis-key-file go together")
    if parsed.tls:
        _check_tls_files(files)
    return RedisSettings(url=url.strip(), parsed=parsed, files=files)


def _check_tls_files(files: RedisFiles) -> None:
    """Load the TLS files once now, so a wrong path or a garbled PEM fails at start."""
    ctx = ssl.create_default_context()
    for what, path in (
        ("Redis CA file", files.ca_file),
        ("Redis client certificate file", files.cert_file),
        ("Redis client key file", files.key_file),
    ):
        if path is not None and not path.is_file():
            raise RedisConfigError(f"{what} {path} does not exist")
    try:
        if files.ca_file is not None:
            ctx.load_verify_locations(cafile=str(files.ca_file))
    except (ssl.SSLError, OSError) as exc:
        raise RedisConfigError(
            f"Redis CA file {files.ca_file} holds no usable certificate ({exc.__class__.__name__})"
        ) from None
    try:
        if files.cert_file is not None and files.key_file is not None:
            ctx.load_cert_chain(str(files.cert_file), str(files.key_file))
    except (ssl.SSLError, OSError) as exc:
        raise RedisConfigError(
            f"Redis client certificate {files.cert_file} and key {files.key_file} do not load "
            f"as a pair ({exc.__class__.__name__})"
        ) from None


def read_url_argument(value: str, *, source: Source) -> tuple[str, Source]:
    """``@FILE`` means the URL is in FILE (where it may carry a password)."""
    if value.startswith("@"):
        path = Path(value[1:])
        return read_secret_file(path, "Redis URL file").strip(), "file"
    return value, source


def from_options(
    value: str,
    *,
    password_file: Path | None = None,
    ca_file: Path | None = None,
    cert_file: Path | None = None,
    key_file: Path | None = None,
    source: Source = "argument",
    flag: str = "--redis",
) -> RedisSettings:
    """Settings from a component's flags (``value`` is a URL or ``@FILE``)."""
    url, source = read_url_argument(value, source=source)
    return settings(
        url,
        RedisFiles(password_file, ca_file, cert_file, key_file),
        source=source,
        flag=flag,
    )


# --------------------------------------------------------------------------- clients


def queue_target(s: RedisSettings) -> tuple[str, Any]:
    """A URL with no credential in it, and the credential provider, for a library
    that builds its own clients from a URL (the tasks queue, :mod:`mcpfleet.tasks`).

    The URL keeps the host, port, database and TLS files (as redis-py's URL
    query); the password, from the URL or the password file, travels only in
    the provider, so the library can log or hold its URL without a secret in
    it. A Sentinel URL stays one (``redis+sentinel://s1:26379,s2:26379/<master>/<db>``,
    the form the queue's library resolves through the sentinels as the fleet
    does): the credentials are the master's, the sentinels are asked without
    any, over TLS when the scheme is ``rediss+sentinel`` (the TLS files then
    apply to both, as for the fleet's own clients).
    """
    from urllib.parse import quote, urlencode

    from redis.credentials import UsernamePasswordCredentialProvider

    p = s.parsed
    if not p.hosts:
        raise RedisConfigError(
            "MCP tasks need a Redis reached over TCP (redis://, rediss:// or "
            f"redis+sentinel://), got {s.redacted!r}"
        )
    scheme = ("rediss" if p.tls else "redis") + ("+sentinel" if p.sentinel else "")
    query: dict[str, str] = {}
    if p.tls:
        f = s.files
        query["ssl_cert_reqs"] = "required"
        for name, path in (
            ("ssl_ca_certs", f.ca_file),
            ("ssl_certfile", f.cert_file),
            ("ssl_keyfile", f.key_file),
        ):
            if path is not None:
                query[name] = str(path)
    provider: Any = None
    if s.files.password_file is not None:
        provider = FilePassword(p.username, s.files.password_file)
    elif p.password is not None:
        provider = UsernamePasswordCredentialProvider(p.username, p.password)
    # With a provider, the user name travels in it too (not both, says redis-py).
    user = f"{quote(p.username, safe='')}@" if p.username and provider is None else ""
    hosts = ",".join(f"[{h}]:{port}" if ":" in h else f"{h}:{port}" for h, port in p.hosts)
    where = f"{hosts}/{p.master}" if p.sentinel else hosts
    url = f"{scheme}://{user}{where}/{p.db}"
    if query:
        url += "?" + urlencode(query)
    return url, provider


def fail_fast_retry(*, aio: bool = True) -> Any:
    """redis-py's retry policy for every client: :data:`RETRIES` at once, connection errors only."""
    from redis.backoff import NoBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError

    if aio:
        from redis.asyncio.retry import Retry as AsyncRetry

        return AsyncRetry(NoBackoff(), RETRIES, supported_errors=(RedisConnectionError,))
    from redis.retry import Retry

    return Retry(NoBackoff(), RETRIES, supported_errors=(RedisConnectionError,))


def _plain_kwargs(s: RedisSettings, timeout: float, *, aio: bool = True) -> dict[str, Any]:
    p = s.parsed
    kwargs = s.connection_kwargs(timeout, aio=aio)
    kwargs["db"] = p.db
    if p.scheme == "unix":
        kwargs["unix_socket_path"] = p.path
    else:
        kwargs["host"], kwargs["port"] = p.hosts[0]
    return kwargs


#: The asyncio clients' connection pool: at most this many connections, and a
#: command waits at most ``POOL_WAIT`` seconds for one (then :func:`pool_full`).
POOL_SIZE = 64
POOL_WAIT = 0.5


def async_client(
    s: RedisSettings,
    *,
    timeout: float,
    health_check_interval: float = 0,
    pool_size: int = POOL_SIZE,
    pool_wait: float = POOL_WAIT,
) -> aioredis.Redis:
    """An asyncio client for the replica and the router, on a bounded, blocking pool:
    a burst of commands queues for ``pool_wait`` seconds at most, never opens more
    than ``pool_size`` connections, and a full pool is told apart from a Redis that
    is down (:func:`pool_full`)."""
    import redis.asyncio as aioredis
    import redis.asyncio.sentinel as aiosentinel

    extra: dict[str, Any] = {
        "health_check_interval": health_check_interval,
        "max_connections": pool_size,
        "timeout": pool_wait,
    }
    if s.parsed.sentinel:
        conn = s.connection_kwargs(timeout)
        sentinel = aiosentinel.Sentinel(  # type: ignore[no-untyped-call]
            list(s.parsed.hosts),
            sentinel_kwargs=_sentinel_kwargs(conn),
            **conn,
        )
        client: aioredis.Redis = sentinel.master_for(
            s.parsed.master,
            db=s.parsed.db,
            decode_responses=False,
            connection_pool_class=_blocking_sentinel_pool(),
            **extra,
        )
        return client
    # redis-py turns the URL's parts into a connection class and its arguments (a
    # Unix socket, TLS) when it builds its own pool: take both from that pool.
    default = aioredis.Redis(**_plain_kwargs(s, timeout), decode_responses=False).connection_pool
    pool = aioredis.BlockingConnectionPool(
        connection_class=default.connection_class,
        **{**default.connection_kwargs, **extra},
    )
    return aioredis.Redis.from_pool(pool)


def _blocking_sentinel_pool() -> Any:
    from redis.asyncio import BlockingConnectionPool
    from redis.asyncio.sentinel import SentinelConnectionPool

    class BlockingSentinelPool(SentinelConnectionPool, BlockingConnectionPool):
        """Sentinel's pool (asks for the master), blocking and bounded."""

    return BlockingSentinelPool


def pool_full(exc: BaseException) -> bool:
    """True if ``exc`` is a command that waited its pool wait for a connection:
    the client is busy, not Redis down."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    return (
        isinstance(exc, RedisConnectionError)
        and isinstance(exc.__cause__, TimeoutError)
        and "No connection available" in str(exc)
    )


def sync_client(s: RedisSettings, *, timeout: float) -> redis.Redis:
    """A blocking client (the operator's handlers run in kopf's threads)."""
    import redis
    import redis.sentinel

    if s.parsed.sentinel:
        conn = s.connection_kwargs(timeout, aio=False)
        sentinel = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call]
            list(s.parsed.hosts),
            sentinel_kwargs=_sentinel_kwargs(conn),
            **conn,
        )
        master: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call]
            s.parsed.master, db=s.parsed.db
        )
        return master
    return redis.Redis(**_plain_kwargs(s, timeout, aio=False))


async def follow_master(client: Any) -> bool:
    """For a Sentinel client, ask the sentinels where the master is now; True if it moved.

    redis-py's Sentinel pool asks only when it opens a connection, so a
    demoted master that keeps its clients (``SENTINEL FAILOVER``: the old
    master is reconfigured seconds later) would go on taking writes that are
    then lost. On a move every connection is dropped, in use or not: the next
    command goes to the new master. Asks the sentinels only (no command to
    Redis, no ACL rule); a plain client returns False at once. Raises a
    RedisError when no sentinel answers.
    """
    pool = client.connection_pool
    if not hasattr(pool, "get_master_address"):
        return False
    before = pool.master_address
    now = await pool.get_master_address()
    if before is None or tuple(before) == tuple(now):
        return False
    await pool.disconnect(inuse_connections=True)
    return True


def through_sentinel(client: Any) -> bool:
    """Whether ``client`` finds its master through Sentinel (and may see it move)."""
    return hasattr(getattr(client, "connection_pool", None), "get_master_address")


async def within(deadline: float, step: Awaitable[T]) -> T:
    """``step``, or :class:`TimeoutError` (an ``OSError``) once ``deadline`` seconds passed.

    Every Redis call on a request's path goes through here (or
    :func:`ride_through`): whatever the client does inside (connect, a health
    check PING, a retry), the caller has its answer within the deadline.
    """
    async with asyncio.timeout(deadline):
        return await step


#: Seconds between two tries of a step riding through a failover.
FAILOVER_PAUSE = 0.2


async def ride_through(
    client: Any,
    step: Callable[[], Awaitable[T]],
    *,
    deadline: float,
    failover_wait: float,
) -> T:
    """``step()`` within ``deadline``; through Sentinel, tried again until the master answers.

    A plain Redis: a reply that is only late (the client's socket timeout,
    0.5 s, on a loaded machine) is asked again at once while ``deadline``
    lasts, counted from the first try; a Redis that refuses or does not answer
    at all fails within ``deadline``: it is gone, and waiting for it helps
    nobody. Through Sentinel, a connection error or a timeout may be a
    failover in progress: the step is tried again, every
    :data:`FAILOVER_PAUSE` seconds, until it succeeds or ``failover_wait``
    seconds have passed since the first try, then the last error is raised.
    Any other error (a refusal by Redis: NOPERM, OOM), and a full connection
    pool (:func:`pool_full`: this process is busy), is raised at once.
    ``step`` must be safe to send twice (the once ledger's claim carries a
    token that recognises its own record).
    """
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeout

    first = time.monotonic()
    if not through_sentinel(client):
        while True:
            left = first + deadline - time.monotonic()
            try:
                return await within(max(left, 0.0), step())
            except RedisTimeout:
                if first + deadline - time.monotonic() <= 0:
                    raise
    limit = first + failover_wait
    while True:
        try:
            return await within(deadline, step())
        except (RedisConnectionError, RedisTimeout, OSError) as exc:
            if pool_full(exc) or time.monotonic() + FAILOVER_PAUSE >= limit:
                raise  # a full pool is this process busy, not a failover
        await asyncio.sleep(FAILOVER_PAUSE)


class DirectCommands:
    """A hot path's commands on a few of ``client``'s own connections, used directly.

    redis-py's ``execute_command`` costs a command more than its round trip:
    the blocking pool's lock and timeout, a task per socket write
    (``asyncio.wait_for`` on Python 3.11), the retry wrapper and the command's
    observability hooks. The once ledger's claim and its confirmation sit on
    the final round's answer path, one after the other, so the answer waits
    for all of that twice. Here the same commands go through the connections
    ``client``'s pool makes (its class and arguments: TLS, ACL user and
    password file, database, Sentinel's master lookup and its drop of a
    demoted master, the health check), through the connection's own
    ``send_packed_command`` and ``read_response``, and the same fail-fast
    retry (one, at once, on a connection error only). What is kept:

    * a reply later than the client's socket timeout raises redis-py's
      ``TimeoutError`` and the connection is dropped (:func:`ride_through`
      asks again on a plain Redis while its deadline lasts); a caller
      cancelled mid-command (:func:`within`'s deadline) drops it too, so no
      reply is ever read by the wrong command;
    * at most ``size`` connections; a command waits ``wait`` seconds for one,
      then fails as a full pool does (:func:`pool_full`: this process is
      busy, not Redis down);
    * through Sentinel, a connection to a master the client no longer takes
      for the master (:func:`follow_master` moved it) is closed before it is
      used again, as the pool's are.

    Only the commands the once ledger sends: ``set``, ``get``, ``eval``;
    ``info`` and the pool (for :func:`through_sentinel`) are ``client``'s.
    """

    def __init__(self, client: Any, *, size: int = POOL_SIZE, wait: float = POOL_WAIT) -> None:
        self.client = client
        self.connection_pool = client.connection_pool
        self.size = size
        self.wait = wait
        self._read_timeout: float | None = self.connection_pool.connection_kwargs.get(
            "socket_timeout"
        )
        self._idle: list[Any] = []
        self._made = 0
        self._waiters: collections.deque[asyncio.Future[Any]] = collections.deque()

    async def info(self, section: str) -> Any:
        return await self.client.info(section)

    async def get(self, key: str) -> bytes | None:
        reply: bytes | None = await self._execute("GET", key)
        return reply

    async def set(
        self,
        key: str,
        value: str | bytes,
        *,
        nx: bool = False,
        xx: bool = False,
        get: bool = False,
        px: int | None = None,
    ) -> Any:
        args: list[Any] = ["SET", key, value]
        args += ["NX"] * nx + ["XX"] * xx + ["GET"] * get
        if px is not None:
            args += ["PX", px]
        return await self._execute(*args)

    async def eval(self, script: str, numkeys: int, *keys_and_args: Any) -> Any:
        # EVAL, not EVALSHA: the replica's ACL user may run EVAL only (contract.py).
        return await self._execute("EVAL", script, numkeys, *keys_and_args)

    async def aclose(self) -> None:
        """Close every idle connection (those in use close when their command ends)."""
        idle, self._idle = self._idle, []
        self._made -= len(idle)
        for conn in idle:
            await conn.disconnect()

    async def _execute(self, *args: Any) -> Any:
        conn = await self._take()
        try:
            return await conn.retry.call_with_retry(
                lambda: self._round_trip(conn, args), lambda _err: conn.disconnect()
            )
        finally:
            self._give(conn)

    async def _round_trip(self, conn: Any, args: tuple[Any, ...]) -> Any:
        if not conn.is_connected:
            # As the pool connects one: through Sentinel, the connection's own
            # connect() asks where the master is (a send would not).
            await conn.connect()
        # Health-checked by the connection (a PING after the pool's idle interval);
        # any failure below leaves it closed, to be connected again at its next use.
        await conn.send_packed_command(conn.pack_command(*args))
        if self._read_timeout is None:
            return await conn.read_response()
        try:
            async with asyncio.timeout(self._read_timeout):
                return await conn.read_response()
        except TimeoutError:
            from redis.exceptions import TimeoutError as RedisTimeout

            raise RedisTimeout(f"Timeout reading from Redis ({args[0]})") from None

    async def _take(self) -> Any:
        if self._idle:
            conn = self._idle.pop()
            if self._moved(conn):
                await conn.disconnect()  # connected again, to the master, at its next use
            return conn
        if self._made < self.size:
            self._made += 1
            conn = self.connection_pool.make_connection()
            # No timeout on the write (redis-py would make a task for it per
            # command); the read has the socket timeout, the caller its deadline.
            conn.socket_timeout = None
            return conn
        from redis.exceptions import ConnectionError as RedisConnectionError

        waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(self.wait):
                return await waiter
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled():
                self._give(waiter.result())  # handed over as this wait ended: pass it on
            else:
                waiter.cancel()  # skipped by _give
            if isinstance(exc, TimeoutError):
                raise RedisConnectionError("No connection available.") from exc
            raise

    def _moved(self, conn: Any) -> bool:
        """Whether ``conn`` is connected to a Redis the client no longer takes for the master.

        Through Sentinel the pool learns where the master is at every new
        connection and at every :func:`follow_master` (the heartbeat's): a
        demoted master may go on taking writes for seconds (``SENTINEL
        FAILOVER``), and writes there are lost.
        """
        where = getattr(self.connection_pool, "master_address", None)
        return where is not None and conn.is_connected and (conn.host, conn.port) != tuple(where)

    def _give(self, conn: Any) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        self._idle.append(conn)


def version_error(info: dict[str, Any]) -> str | None:
    """Why the Redis server that answered ``INFO server`` is too old, or None (pure)."""
    raw = str(info.get("redis_version", ""))
    try:
        found = tuple(int(part) for part in raw.split(".")[:2])
    except ValueError:
        return None  # a fork that names its version otherwise: let it try
    if len(found) == 2 and found < MIN_VERSION:
        need = ".".join(map(str, MIN_VERSION))
        return (
            f"Redis {raw} is too old: mcpfleet needs Redis {need} or newer "
            "(SET NX GET for once-flows, PEXPIRE GT)"
        )
    return None


class RedisTooOld(RuntimeError):
    """The fleet's Redis lacks a command mcpfleet needs; the message says which version."""


async def check_version(client: Any, deadline: float) -> None:
    """Refuse to start on a Redis older than 7.0; a Redis that does not answer is let be.

    An unreachable Redis is an outage the replica and the router serve through
    (they retry in the background); a Redis that answers with too old a
    version would fail every once-flow's claim and the routes' expiry
    updates, so the process says so at start and exits.
    """
    try:
        info = await within(deadline, client.info("server"))
    except Exception as exc:
        log.warning("Redis version not checked (%s): it is checked again at the next start", exc)
        return
    problem = version_error(info)
    if problem is not None:
        log.error("%s", problem)
        raise RedisTooOld(problem)


def _sentinel_kwargs(conn: dict[str, Any]) -> dict[str, Any]:
    """The sentinels are reached with the master's timeouts and TLS, without its credentials."""
    return {
        k: v for k, v in conn.items() if k not in ("username", "password", "credential_provider")
    }


def describe(exc: BaseException) -> str:
    """One line on why Redis could not be used, for a log; names the flag to check.

    A certificate the CA file did not sign is the mistake most worth spelling
    out: otherwise it reads like any outage.
    """
    text = str(exc) or type(exc).__name__
    low = text.lower()
    if "certificate verify failed" in low or "certificate_verify_failed" in low:
        return (
            f"TLS certificate verify failed ({_short(text)}): is --redis-ca-file the CA "
            "that signed the Redis server's certificate?"
        )
    if "certificate required" in low or "certificate_required" in low:
        return (
            f"the Redis server wants a client certificate ({_short(text)}): "
            "give --redis-cert-file and --redis-key-file"
        )
    if "wrongpass" in low or "invalid username-password" in low:
        return "authentication failed (WRONGPASS): check the user in the URL and the password file"
    if "noperm" in low:
        return f"permission denied by the Redis ACL ({_short(text)})"
    if isinstance(exc, RedisConfigError):
        return text
    return f"{type(exc).__name__}: {_short(text)}"


def _short(text: str, limit: int = 200) -> str:
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def add_flags(
    parser: Any,
    *,
    url_help: str,
    required: bool = False,
    default: str | None = None,
    env_note: str = "",
) -> None:
    """The Redis flags shared by ``serve``, ``router`` and ``operator``."""
    parser.add_argument(
        "--redis",
        metavar="URL",
        required=required,
        default=default,
        help=f"{url_help}: redis://[user@]host:port/db, rediss://, unix:///path, "
        "redis+sentinel://host:port[,host:port]/master[/db], or @FILE holding the URL"
        f"{env_note}; no password here: use {PASSWORD_FILE_FLAG}",
    )
    parser.add_argument(
        PASSWORD_FILE_FLAG,
        type=Path,
        default=None,
        metavar="FILE",
        help="file holding the Redis password",
    )
    parser.add_argument(
        "--redis-ca-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="CA certificate(s) for rediss:// (PEM)",
    )
    parser.add_argument(
        "--redis-cert-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="client certificate for rediss:// (PEM)",
    )
    parser.add_argument(
        "--redis-key-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="the client certificate's key (PEM)",
    )


def from_args(args: Any, *, source: Source = "argument") -> RedisSettings:
    """Settings from the parsed flags added by :func:`add_flags`."""
    return from_options(
        args.redis,
        password_file=args.redis_password_file,
        ca_file=args.redis_ca_file,
        cert_file=args.redis_cert_file,
        key_file=args.redis_key_file,
        source=source,
    )


__all__: Sequence[str] = (
    "DirectCommands",
    "FilePassword",
    "RedisConfigError",
    "RedisFiles",
    "RedisSettings",
    "RedisTooOld",
    "RedisURL",
    "async_client",
    "check_version",
    "describe",
    "fail_fast_retry",
    "from_args",
    "from_options",
    "parse_url",
    "read_secret_file",
    "redact_url",
    "ride_through",
    "settings",
    "sync_client",
    "version_error",
    "within",
)
