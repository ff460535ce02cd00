"""A checked URL, its files (password, TLS) and the retry policy: what a client is built with."""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from mcpfleet.redisconn._urls import RedisConfigError, RedisURL, parse_url, redact_url

#: The flag a password belongs in, named by every refusal.
PASSWORD_FILE_FLAG = "--redis-password-file"
#: Retries of one command, on a connection error only (a stale pooled connection,
#: a master that just moved), at once: never on a timeout, never with a backoff.
RETRIES = 1

#: Where a URL came from: a password is refused in an argument or the environment.
Source = Literal["argument", "environment", "file", "library"]


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
            f"(or rediss+sentinel://, rediss+cluster://), got {redact_url(url)!r}"
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


def fail_fast_retry(*, aio: bool = True) -> Any:
    """redis-py's retry policy for every client: :data:`RETRIES` at once, connection errors only."""
    from redis.backoff import NoBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError

    if aio:
        from redis.asyncio.retry import Retry as AsyncRetry

        return AsyncRetry(NoBackoff(), RETRIES, supported_errors=(RedisConnectionError,))
    from redis.retry import Retry

    return Retry(NoBackoff(), RETRIES, supported_errors=(RedisConnectionError,))
