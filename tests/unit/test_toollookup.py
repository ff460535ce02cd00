"""FastMCP's tool lookup without a task group for one local provider (mcpfleet.replica.toollookup).

Each test puts FastMCP's own method back afterwards. The same lookups are made
with FastMCP's way and with the fast path, and must answer alike.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any

import pytest
from fastmcp import Client, FastMCP
from fastmcp.exceptions import NotFoundError
from fastmcp.server.providers import aggregate
from fastmcp.server.providers.aggregate import AggregateProvider

from fleetkit.upstream import assert_left_alone
from mcpfleet.replica.toollookup import lookup_tasks_skipped, skip_lookup_tasks

pytestmark = pytest.mark.unit

FASTMCPS = AggregateProvider.__dict__["_get_tool"]
FASTMCPS = getattr(FASTMCPS, "__wrapped__", FASTMCPS)


@pytest.fixture
def gathers(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """FastMCP's own lookup in place for the test (put back after it); the gathers of its
    tool lookups counted (the lifespan and tools/list gather too: not counted)."""
    monkeypatch.setattr(AggregateProvider, "_get_tool", FASTMCPS)
    counted: list[str] = []
    gather = aggregate.gather

    def counting(*args: Any, **kwargs: Any) -> Any:
        if sys._getframe(1).f_code is FASTMCPS.__code__:
            counted.append("gather")
        return gather(*args, **kwargs)

    monkeypatch.setattr(aggregate, "gather", counting)
    return counted


def _app(name: str = "lookup") -> FastMCP[Any]:
    app = FastMCP(name)

    @app.tool
    def add(a: int, b: int) -> int:
        return a + b

    @app.tool(version="1.0")
    def greet(who: str) -> str:
        return f"hello {who}"

    @app.tool(version="2.0", name="greet")
    def greet_again(who: str) -> str:
        return f"hello again {who}"

    return app


async def _lookups(app: FastMCP[Any]) -> list[Any]:
    found = []
    for name in ("add", "greet", "missing"):
        tool = await app.get_tool(name)
        found.append(None if tool is None else (tool.name, tool.version, tool.key))
    return found


async def test_one_local_provider_is_looked_up_without_a_task_group_and_answers_alike(
    gathers: list[str],
) -> None:
    app = _app()
    before = await _lookups(app)
    async with Client(app) as client:
        assert (await client.call_tool("add", {"a": 2, "b": 3})).data == 5
    assert gathers, "FastMCP no longer looks tools up through gather"
    gathers.clear()
    assert skip_lookup_tasks() and lookup_tasks_skipped()
    assert await _lookups(app) == before
    assert before[1][:2] == ("greet", "2.0")  # the highest version, as FastMCP picks
    async with Client(app) as client:
        assert (await client.call_tool("add", {"a": 2, "b": 3})).data == 5
        assert (await client.call_tool("greet", {"who": "ann"})).data == "hello again ann"
    assert gathers == []


async def test_a_server_with_a_mounted_one_takes_fastmcps_way(gathers: list[str]) -> None:
    app, child = _app(), FastMCP("child")

    @child.tool
    def shout(text: str) -> str:
        return text.upper()

    app.mount(child, namespace="child")
    assert skip_lookup_tasks()
    async with Client(app) as client:
        assert (await client.call_tool("child_shout", {"text": "hi"})).data == "HI"
        assert (await client.call_tool("add", {"a": 1, "b": 1})).data == 2
    assert gathers, "two providers are looked up as FastMCP does"


@pytest.mark.parametrize("strategy", ["warn", "raise"])
async def test_a_failing_lookup_is_handed_on_as_the_aggregate_does(
    gathers: list[str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    strategy: str,
) -> None:
    async def fails(name: str, version: Any = None) -> Any:
        raise RuntimeError("the store is down")

    async def not_found(name: str, version: Any = None) -> Any:
        raise NotFoundError(name)

    outcomes = {}
    for way in ("fastmcp", "fast path"):
        if way == "fast path":
            assert skip_lookup_tasks()
        app = _app()
        monkeypatch.setattr(app, "provider_error_strategy", strategy)
        (provider,) = app.providers
        monkeypatch.setattr(provider, "get_tool", not_found)
        missing = await app.get_tool("add")
        monkeypatch.setattr(provider, "get_tool", fails)
        with caplog.at_level(logging.WARNING):
            try:
                outcome: Any = await app.get_tool("add")
            except RuntimeError as exc:
                outcome = f"raised {exc}"
        outcomes[way] = (missing, outcome, "the store is down" in caplog.text)
        caplog.clear()
    assert outcomes["fast path"] == outcomes["fastmcp"]
    expected = "raised the store is down" if strategy == "raise" else None
    assert outcomes["fastmcp"][:2] == (None, expected)


async def test_a_cancelled_lookup_is_cancelled(
    gathers: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert skip_lookup_tasks()
    app = _app()
    (provider,) = app.providers
    started = asyncio.Event()

    async def slow(name: str, version: Any = None) -> Any:
        started.set()
        await asyncio.sleep(30)

    monkeypatch.setattr(provider, "get_tool", slow)
    lookup = asyncio.ensure_future(app.get_tool("add"))
    await started.wait()
    lookup.cancel()
    with pytest.raises(asyncio.CancelledError):
        await lookup


def test_twice_is_once_and_a_method_that_is_not_fastmcps_is_left_alone(
    gathers: list[str], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    assert skip_lookup_tasks()
    fast = AggregateProvider.__dict__["_get_tool"]
    assert skip_lookup_tasks()
    assert AggregateProvider.__dict__["_get_tool"] is fast
    assert_left_alone(AggregateProvider, "_get_tool", skip_lookup_tasks, monkeypatch, caplog)
