"""Redis URLs: the forms every component accepts, parsed, and redacted for logs."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import unquote

#: Every scheme a Redis URL may have.
SCHEMES = (
    "redis",
    "rediss",
    "unix",
    "redis+sentinel",
    "rediss+sentinel",
    "redis+cluster",
    "rediss+cluster",
)
DEFAULT_PORT = 6379
DEFAULT_SENTINEL_PORT = 26379


class RedisConfigError(ValueError):
    """A Redis URL or file the user must fix; the message is one clear line, never a secret."""


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

    @property
    def cluster(self) -> bool:
        """A Redis Cluster: ``hosts`` are seed nodes, the client finds the others."""
        return self.scheme.endswith("+cluster")


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


def _parse_unix(rest: str, query: str, url: str) -> RedisURL:
    """``unix://[[user]:password@]/path[?db=N]``, after the scheme."""
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
    return RedisURL("unix", path=path, db=db, username=user, password=password)


def parse_url(url: str) -> RedisURL:
    """Parse any URL a component accepts; raise :class:`RedisConfigError` if it is not one."""
    url = url.strip()
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in SCHEMES:
        raise RedisConfigError(
            "a Redis URL starts with redis://, rediss://, unix://, redis+sentinel:// "
            "or redis+cluster://, "
            f"got {redact_url(url)!r}"
        )
    scheme = scheme.lower()
    rest, _, query = rest.partition("?")
    if scheme == "unix":
        return _parse_unix(rest, query, url)
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
    if scheme.endswith("+cluster"):
        return _parse_cluster(scheme, hosts_text, parts, user, password, url)
    if "," in hosts_text:
        raise RedisConfigError(
            f"several hosts need redis+sentinel:// or redis+cluster://, got {redact_url(url)!r}"
        )
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


def _parse_cluster(
    scheme: str,
    hosts_text: str,
    parts: list[str],
    user: str | None,
    password: str | None,
    url: str,
) -> RedisURL:
    """``redis+cluster://[[user]:password@]host:port[,host:port...][/0]``: seed nodes.

    A Redis Cluster has one database only: a path other than ``/0`` is refused.
    """
    hosts = tuple(_host_port(h, DEFAULT_PORT, url) for h in hosts_text.split(",") if h)
    if not hosts:
        raise RedisConfigError(f"no cluster node in {redact_url(url)}")
    if len(parts) > 1 or (parts and _db(parts[0], url) != 0):
        raise RedisConfigError(
            f"a Redis Cluster has database 0 only: drop the path of {redact_url(url)!r}"
        )
    return RedisURL(scheme, hosts=hosts, username=user, password=password)
