"""The once ledger's commands on connections of their own, driven directly.

:class:`DirectCommands` drives redis-py's connections below its public API
(``make_connection``, ``pack_command``, ``send_packed_command``,
``read_response``), so it is used only on the redis-py versions it is tested
with (:data:`TESTED_REDIS_PY`) and only while the internals it calls look as
it expects (:data:`INTERNALS`): on any other redis-py the same commands go
through the client's pool, with a warning at start. pyproject.toml bounds
redis-py below its next major version, which may change them at will.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import importlib
import inspect
import logging
from collections.abc import Callable, Mapping
from typing import Any

from mcpfleet.redisconn._clients import POOL_SIZE, POOL_WAIT, on_cluster

log = logging.getLogger("mcpfleet.redis")

#: redis-py ``major.minor`` versions whose connection internals
#: :class:`DirectCommands` is tested on (the versions hack/lock/*.txt pin).
TESTED_REDIS_PY = ("8.0", "8.1", "8.2")


class Arg(enum.Enum):
    """How the driver passes a parameter that has no default it relies on."""

    REQUIRED = "passed by position"
    VAR = "passed as *args"


#: The redis-py internals the driver calls, ``(module, class, method)``, each
#: with the parameters it relies on: passed (:class:`Arg`), or left to the
#: default named here (``check_health``: the health check PING after an idle
#: interval; ``disconnect_on_error``: a read that fails or is cancelled closes
#: the connection, so no reply is read by the wrong command). A parameter not
#: named must have a default. Read or set on each connection and its pool:
#: :data:`CONNECTION_ATTRIBUTES`, the pool's ``connection_kwargs`` and, through
#: Sentinel, its ``master_address``.
INTERNALS: Mapping[tuple[str, str, str], Mapping[str, object]] = {
    ("redis.asyncio.connection", "ConnectionPool", "make_connection"): {},
    ("redis.asyncio.connection", "AbstractConnection", "connect"): {},
    ("redis.asyncio.connection", "AbstractConnection", "pack_command"): {"args": Arg.VAR},
    ("redis.asyncio.connection", "AbstractConnection", "send_packed_command"): {
        "command": Arg.REQUIRED,
        "check_health": True,
    },
    ("redis.asyncio.connection", "AbstractConnection", "read_response"): {
        "disable_decoding": False,
        "timeout": None,
        "disconnect_on_error": True,
    },
    ("redis.asyncio.connection", "AbstractConnection", "disconnect"): {},
    ("redis.asyncio.retry", "Retry", "call_with_retry"): {
        "do": Arg.REQUIRED,
        "fail": Arg.REQUIRED,
    },
}

#: What the driver reads or sets on a connection its client's pool makes.
CONNECTION_ATTRIBUTES = ("is_connected", "socket_timeout", "retry", "host", "port")


def signature_changes(func: Callable[..., Any], relied: Mapping[str, object]) -> list[str]:
    """How ``func``'s parameters differ from those the driver relies on (pure)."""
    try:
        params = inspect.signature(func).parameters
    except (TypeError, ValueError):
        return ["no signature"]
    found = []
    for name, expected in relied.items():
        param = params.get(name)
        if param is None:
            found.append(f"no parameter {name!r}")
        elif expected is Arg.VAR:
            if param.kind is not param.VAR_POSITIONAL:
                found.append(f"{name!r} is not *{name}")
        elif expected is Arg.REQUIRED:
            if param.kind not in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
                found.append(f"{name!r} is not positional")
        elif param.default is param.empty or param.default != expected:
            found.append(f"{name!r} defaults to {param.default!r}, not {expected!r}")
    for name, param in params.items():
        required = param.default is param.empty and param.kind not in (
            param.VAR_POSITIONAL,
            param.VAR_KEYWORD,
        )
        if name != "self" and name not in relied and required:
            found.append(f"a new required parameter {name!r}")
    return found


def internals_changed() -> list[str]:
    """Each way the installed redis-py's internals differ from :data:`INTERNALS`."""
    found = []
    for (module, owner, method), relied in INTERNALS.items():
        func = getattr(getattr(importlib.import_module(module), owner, None), method, None)
        if not callable(func):
            found.append(f"{owner}.{method} is gone")
            continue
        found += [f"{owner}.{method}: {change}" for change in signature_changes(func, relied)]
    return found


def direct_driver_problem(version: str | None = None) -> str | None:
    """Why :class:`DirectCommands` does not drive the installed redis-py's connections
    (an untested version, changed internals), or None."""
    import redis

    version = version or redis.__version__
    if ".".join(version.split(".")[:2]) not in TESTED_REDIS_PY:
        tested = ", ".join(v + ".x" for v in TESTED_REDIS_PY)
        return (
            f"redis-py {version} is not a version mcpfleet's direct commands are tested on "
            f"({tested})"
        )
    changed = internals_changed()
    if changed:
        return f"redis-py {version}'s connections are not as tested ({'; '.join(changed)})"
    return None


def _redis_py_version() -> str:
    import redis

    return str(redis.__version__)


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
    On a redis-py it is not tested with (:func:`direct_driver_problem`) the
    three go through ``client`` itself (``pooled``); which of the two paths the
    commands take is logged once, when the driver is made (at start).
    """

    def __init__(self, client: Any, *, size: int = POOL_SIZE, wait: float = POOL_WAIT) -> None:
        self.client = client
        #: Whether ``client`` is a Redis Cluster's (:func:`on_cluster`): its commands
        #: then go through the client, which finds each key's node and follows
        #: MOVED and ASK.
        self.cluster = on_cluster(client)
        self.connection_pool: Any = None if self.cluster else client.connection_pool
        self.size = size
        self.wait = wait
        self._read_timeout: float | None = (
            None if self.cluster else client.connection_pool.connection_kwargs.get("socket_timeout")
        )
        self._idle: list[Any] = []
        self._made = 0
        self._waiters: collections.deque[asyncio.Future[Any]] = collections.deque()
        problem = None if self.cluster else direct_driver_problem()
        #: Whether the commands go through ``client``'s pool (an untested redis-py,
        #: or a cluster).
        self.pooled = self.cluster or problem is not None
        if problem is not None:
            log.warning("%s: the once ledger's commands go through the client's pool", problem)
        elif self.cluster:
            log.info("redis: a Redis Cluster: the once ledger's commands go through its client")
        else:
            log.info(
                "redis: redis-py %s (tested on %s): the once ledger's commands drive its "
                "connections directly",
                _redis_py_version(),
                ", ".join(v + ".x" for v in TESTED_REDIS_PY),
            )

    async def info(self, section: str) -> Any:
        return await self.client.info(section)

    async def get(self, key: str) -> bytes | None:
        if self.pooled:
            pooled: bytes | None = await self.client.get(key)
            return pooled
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
        if self.pooled:
            return await self.client.set(key, value, nx=nx, xx=xx, get=get, px=px)
        args: list[Any] = ["SET", key, value]
        args += ["NX"] * nx + ["XX"] * xx + ["GET"] * get
        if px is not None:
            args += ["PX", px]
        return await self._execute(*args)

    async def eval(self, script: str, numkeys: int, *keys_and_args: Any) -> Any:
        # EVAL, not EVALSHA: the replica's ACL user may run EVAL only (contract.py).
        if self.pooled:
            return await self.client.eval(script, numkeys, *keys_and_args)
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
