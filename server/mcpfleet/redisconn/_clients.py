"""Clients built from settings (plain, Unix socket, TLS, Sentinel), and the ways a
step on a request's path waits for Redis: deadlines, a full pool, a failover."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

from mcpfleet.redisconn._settings import FilePassword, RedisSettings
from mcpfleet.redisconn._urls import RedisConfigError

if TYPE_CHECKING:  # redis itself is imported when a client is built: config stays light
    import redis
    import redis.asyncio as aioredis

log = logging.getLogger("mcpfleet.redis")

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

T = TypeVar("T")


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
    apply to both, as for the fleet's own clients). A cluster URL becomes
    ``redis+cluster://<first host>:<port>``: the library's form (one seed node).
    """
    from urllib.parse import quote, urlencode

    from redis.credentials import UsernamePasswordCredentialProvider

    p = s.parsed
    if not p.hosts:
        raise RedisConfigError(
            "MCP tasks need a Redis reached over TCP (redis://, rediss://, "
            f"redis+sentinel:// or redis+cluster://), got {s.redacted!r}"
        )
    kind = "+sentinel" if p.sentinel else "+cluster" if p.cluster else ""
    scheme = ("rediss" if p.tls else "redis") + kind
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
    if p.cluster:
        # The queue's library reads one host from a cluster URL, a seed: it asks
        # that node for the others, and its keys share one hash tag (the name).
        host, port = p.hosts[0]
        url = f"{scheme}://{user}{f'[{host}]' if ':' in host else host}:{port}"
    else:
        where = f"{hosts}/{p.master}" if p.sentinel else hosts
        url = f"{scheme}://{user}{where}/{p.db}"
    if query:
        url += "?" + urlencode(query)
    return url, provider


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

    if s.parsed.cluster:
        return cast("aioredis.Redis", _async_cluster(s, timeout, health_check_interval, pool_size))
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


def _async_cluster(
    s: RedisSettings, timeout: float, health_check_interval: float, pool_size: int
) -> Any:
    """A Redis Cluster client: the URL's hosts are seeds, the slot map is asked of them.

    redis-py follows MOVED (it updates its slot map) and ASK (one ASKING command)
    itself, at most 16 redirections per command; a node that does not answer makes
    it read the slot map again at the next command. A node's pool holds at most
    ``pool_size`` connections and a command past them fails at once with
    ``MaxConnectionsError`` (:func:`pool_full`): redis-py's cluster pools do not wait.
    The same credentials, password file, TLS and fail-fast retry as every client.
    """
    from redis.asyncio.cluster import ClusterNode

    return _cluster_classes()[0](
        startup_nodes=[ClusterNode(host, port) for host, port in s.parsed.hosts],
        max_connections=pool_size,
        health_check_interval=health_check_interval,
        decode_responses=False,
        **s.connection_kwargs(timeout),
    )


def _sync_cluster(s: RedisSettings, timeout: float) -> Any:
    """:func:`_async_cluster`'s blocking twin (the operator's handlers run in threads).

    redis-py's blocking cluster client reads the slot map as it is made: a
    cluster that cannot be reached is a ``ConnectionError`` here already."""
    from redis.cluster import ClusterNode
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import RedisClusterException

    try:
        return _cluster_classes()[1](
            startup_nodes=[
                ClusterNode(host, port)  # type: ignore[no-untyped-call]
                for host, port in s.parsed.hosts
            ],
            **s.connection_kwargs(timeout, aio=False),
        )
    except RedisClusterException as exc:
        raise RedisConnectionError(f"Redis Cluster: {exc}") from exc


@functools.cache
def _cluster_classes() -> tuple[type[Any], type[Any]]:
    """redis-py's cluster clients (asyncio, blocking), whose every failure is a
    ``RedisError``: no node reachable, a slot no node serves (``RedisClusterException``,
    which is not one) become a ``ConnectionError``, so every component's Redis-down
    path (retry, degrade, fail closed) takes a cluster that is away as it takes any
    Redis that is away."""
    from redis.asyncio.cluster import RedisCluster as AsyncCluster
    from redis.cluster import RedisCluster
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import RedisClusterException

    class FleetAsyncCluster(AsyncCluster):
        async def initialize(self, *args: Any, **kwargs: Any) -> Any:
            try:
                return await super().initialize(*args, **kwargs)
            except RedisClusterException as exc:
                raise RedisConnectionError(f"Redis Cluster: {exc}") from exc

        async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
            try:
                return await super().execute_command(*args, **kwargs)
            except RedisClusterException as exc:
                raise RedisConnectionError(f"Redis Cluster: {exc}") from exc

    class FleetCluster(RedisCluster):
        def execute_command(self, *args: Any, **kwargs: Any) -> Any:
            try:
                return super().execute_command(*args, **kwargs)  # type: ignore[no-untyped-call]
            except RedisClusterException as exc:
                raise RedisConnectionError(f"Redis Cluster: {exc}") from exc

    return FleetAsyncCluster, FleetCluster


def on_cluster(client: Any) -> bool:
    """Whether ``client`` speaks to a Redis Cluster (a ``RedisCluster``, or a driver
    over one that says so with a true ``cluster`` attribute)."""
    from redis.asyncio.cluster import RedisCluster as AsyncCluster
    from redis.cluster import RedisCluster

    if isinstance(client, AsyncCluster | RedisCluster):
        return True
    return getattr(client, "cluster", False) is True


async def mget_by_slot(client: Any, keys: Sequence[str]) -> list[Any]:
    """``MGET keys``; on a Redis Cluster one ``MGET`` per hash slot, all in one pipeline.

    The cluster client's pipeline sends each node its slots' commands in one
    write and reads them back together: a batch of lookups costs one round trip
    per node whatever the slots, and a command redirected (MOVED, ASK: a slot
    being migrated) is sent again to the node that holds it now. The values
    come back in the order of ``keys``.
    """
    if not on_cluster(client):
        return list(await client.mget(keys))
    from redis.crc import key_slot

    by_slot: dict[int, list[int]] = {}
    for i, key in enumerate(keys):
        by_slot.setdefault(key_slot(key.encode()), []).append(i)
    values: list[Any] = [None] * len(keys)
    async with client.pipeline(transaction=False) as pipe:
        for places in by_slot.values():
            pipe.execute_command("MGET", *(keys[i] for i in places))
        replies = await pipe.execute()
    for places, reply in zip(by_slot.values(), replies, strict=True):
        for i, value in zip(places, reply, strict=True):
            values[i] = value
    return values


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
    from redis.exceptions import MaxConnectionsError

    if isinstance(exc, MaxConnectionsError):
        return True  # a cluster node's pool: full at once, never waited on
    return (
        isinstance(exc, RedisConnectionError)
        and isinstance(exc.__cause__, TimeoutError)
        and "No connection available" in str(exc)
    )


def sync_client(s: RedisSettings, *, timeout: float) -> redis.Redis:
    """A blocking client (the operator's handlers run in kopf's threads)."""
    import redis
    import redis.sentinel

    if s.parsed.cluster:
        return cast("redis.Redis", _sync_cluster(s, timeout))
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

    On a Redis Cluster: reads the slot map again (one ``CLUSTER SLOTS``) and
    returns True when the masters it names are not those of the last call (a
    replica was promoted, a master added or removed): the caller may then write
    back what a failover may have lost (routes). A process that sends nothing
    to a failed master's slots would otherwise learn of it only at its next
    command there. Raises a RedisError when no node answers.
    """
    if on_cluster(client):
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import RedisClusterException

        try:
            await client.nodes_manager.initialize()
        except RedisClusterException as exc:
            raise RedisConnectionError(f"Redis Cluster: {exc}") from exc
        masters = frozenset(node.name for node in client.get_primaries())
        before = getattr(client, "mcpfleet_masters", None)
        client.mcpfleet_masters = masters
        return before is not None and before != masters
    pool: Any = getattr(client, "connection_pool", None)
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
    nobody. Through Sentinel or on a Redis Cluster (a master lost, its replica
    not yet promoted), a connection error or a timeout may be a
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
    if not (through_sentinel(client) or on_cluster(client)):
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
