"""The once ledger's direct command driver is pinned to the redis-py it is tested with.

:class:`mcpfleet.redisconn.DirectCommands` calls redis-py below its public
API. These checks fail when the installed redis-py is not a tested version,
when the internals the driver calls change shape, or when pyproject.toml
admits a redis-py major the driver was never run on; and on an untested
redis-py the driver hands the ledger's commands to the client's pool.
The driver against a real Redis: tests/faults/test_redis_direct.py.
"""

from __future__ import annotations

import logging
import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis
import redis.asyncio.connection
from packaging.requirements import Requirement
from redis.asyncio.retry import Retry

from mcpfleet.redisconn import (
    TESTED_REDIS_PY,
    DirectCommands,
    async_client,
    direct_driver_problem,
    settings,
)
from mcpfleet.redisconn._direct import (
    CONNECTION_ATTRIBUTES,
    INTERNALS,
    internals_changed,
    signature_changes,
)

ROOT = Path(__file__).resolve().parents[2]


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def test_the_installed_redis_py_is_one_the_direct_driver_is_tested_on() -> None:
    assert _minor(redis.__version__) in TESTED_REDIS_PY
    assert direct_driver_problem() is None


def test_pyproject_admits_the_tested_redis_py_and_not_the_next_major() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (spec,) = [Requirement(r) for r in project["dependencies"] if Requirement(r).name == "redis"]
    majors = {int(v.split(".")[0]) for v in TESTED_REDIS_PY}
    for minor in TESTED_REDIS_PY:
        assert spec.specifier.contains(f"{minor}.0"), (spec, minor)
    assert not spec.specifier.contains(f"{max(majors) + 1}.0.0"), spec


def test_the_redis_py_methods_the_driver_calls_have_the_shape_it_calls_them_with() -> None:
    assert internals_changed() == []
    named = {(owner, method) for _, owner, method in INTERNALS}
    assert {
        ("ConnectionPool", "make_connection"),
        ("AbstractConnection", "pack_command"),
        ("AbstractConnection", "send_packed_command"),
        ("AbstractConnection", "read_response"),
    } <= named


async def test_a_connection_the_pool_makes_has_what_the_driver_reads_and_sets() -> None:
    plain = async_client(settings("redis://127.0.0.1:1/0"), timeout=0.5)
    sentinelled = async_client(settings("redis+sentinel://127.0.0.1:1/mymaster/0"), timeout=0.5)
    try:
        for client in (plain, sentinelled):
            pool = client.connection_pool
            assert pool.connection_kwargs["socket_timeout"] == 0.5
            conn = pool.make_connection()
            for name in CONNECTION_ATTRIBUTES:
                assert hasattr(conn, name), name
            # A property, not a method: `not conn.is_connected` must be able to be true.
            assert conn.is_connected is False
            assert isinstance(conn.retry, Retry)
            conn.socket_timeout = None
            assert conn.socket_timeout is None
            assert conn.pack_command("GET", "k") == [b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"]
        # Through Sentinel, the master the pool last learned (None before it asked).
        assert sentinelled.connection_pool.master_address is None
    finally:
        await plain.aclose()
        await sentinelled.aclose()


@pytest.mark.parametrize(
    ("changed", "says"),
    [
        (lambda self, command: None, "'check_health'"),
        (lambda self, command, check_health=False: None, "defaults to False"),
        (lambda self, *, command, check_health=True: None, "'command' is not positional"),
        (lambda self, command, check_health=True, *, flag: None, "new required parameter 'flag'"),
    ],
)
def test_a_changed_signature_is_seen(changed: Any, says: str) -> None:
    relied = INTERNALS[("redis.asyncio.connection", "AbstractConnection", "send_packed_command")]
    assert signature_changes(lambda self, command, check_health=True, **kw: None, relied) == []
    found = signature_changes(changed, relied)
    assert any(says in change for change in found), found


def test_changed_internals_turn_the_driver_off(monkeypatch: pytest.MonkeyPatch) -> None:
    async def read_response(self: Any, disable_decoding: bool = False) -> None:
        """A read that no longer takes a timeout nor closes on error."""

    monkeypatch.setattr(redis.asyncio.connection.AbstractConnection, "read_response", read_response)
    monkeypatch.delattr(redis.asyncio.connection.ConnectionPool, "make_connection")
    changed = internals_changed()
    assert any(c.startswith("AbstractConnection.read_response: no parameter") for c in changed)
    assert "ConnectionPool.make_connection is gone" in changed
    problem = direct_driver_problem()
    assert problem is not None and "not as tested" in problem and "read_response" in problem


class _Client:
    """What the ledger's commands reach when the driver is off: the client's own methods."""

    def __init__(self) -> None:
        self.connection_pool = SimpleNamespace(connection_kwargs={"socket_timeout": 0.5})
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    async def set(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append(("set", args, kwargs))
        return b"before"

    async def get(self, *args: Any) -> Any:
        self.calls.append(("get", args, {}))
        return b"value"

    async def eval(self, *args: Any) -> Any:
        self.calls.append(("eval", args, {}))
        return 1


@pytest.mark.parametrize("version", ["8.3.0", "9.0.0", "7.4.0"])
async def test_an_untested_redis_py_sends_the_ledgers_commands_through_the_pool(
    version: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(redis, "__version__", version)
    client = _Client()
    with caplog.at_level(logging.WARNING, logger="mcpfleet.redis"):
        direct = DirectCommands(client)
    assert direct.pooled
    (record,) = [r for r in caplog.records if r.name == "mcpfleet.redis"]
    assert f"redis-py {version} is not a version" in record.getMessage()
    assert "through the client's pool" in record.getMessage()

    assert await direct.set("k", "v", nx=True, get=True, px=5000) == b"before"
    assert await direct.get("k") == b"value"
    assert await direct.eval("return 1", 1, "k", "a") == 1
    assert client.calls == [
        ("set", ("k", "v"), {"nx": True, "xx": False, "get": True, "px": 5000}),
        ("get", ("k",), {}),
        ("eval", ("return 1", 1, "k", "a"), {}),
    ]
    assert direct._made == 0  # no connection of its own was opened


def test_the_tested_redis_py_drives_its_own_connections_and_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="mcpfleet.redis"):
        direct = DirectCommands(_Client())
    assert not direct.pooled
    (record,) = [r for r in caplog.records if r.name == "mcpfleet.redis"]
    assert record.levelno == logging.INFO
    assert f"redis-py {redis.__version__} (tested on" in record.getMessage()
    assert "drive its connections directly" in record.getMessage()


@pytest.mark.parametrize("minor", ["8.0", "8.1", "8.2"])
def test_each_tested_minor_passes_the_version_gate(minor: str) -> None:
    problem = direct_driver_problem(f"{minor}.0")
    assert problem is None or "not a version" not in problem


def test_on_a_cluster_the_ledgers_commands_go_through_its_client_and_it_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = _Client()
    client.cluster = True  # type: ignore[attr-defined]
    with caplog.at_level(logging.INFO, logger="mcpfleet.redis"):
        direct = DirectCommands(client)
    assert direct.pooled
    (record,) = [r for r in caplog.records if r.name == "mcpfleet.redis"]
    assert "a Redis Cluster" in record.getMessage()
