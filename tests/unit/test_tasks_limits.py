"""The tasks limit per principal, its pure parts: who the principal is, the refusal, the
bounds on Redis, and the share's parameter on a task tool's registered wrapper.

The Redis scripts and pydocket's ``ConcurrencyLimit`` run on a real fleet
(tests/fleet/test_tasks_fair.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator
from typing import Any

import pytest
from mcp.shared.exceptions import MCPError

from mcpfleet.limits import CURRENT_PRINCIPAL, Count, LimitRules, PrincipalRule
from mcpfleet.tasks._limits import (
    SHARED,
    Admission,
    TaskLimiter,
    capped,
    held_key,
    limited_error,
    owner_key,
    request_principal,
    shared_out,
    task_principal,
)
from mcpfleet.tasks._share import SHARE_PARAM, with_share

pytestmark = pytest.mark.unit


def test_an_anonymous_task_is_the_shared_principals_and_a_scope_is_hashed() -> None:
    assert task_principal(None) == SHARED
    alice = task_principal("app|alice")
    assert alice == task_principal("app|alice") != task_principal("app|bob")
    assert len(alice) == 32 and "alice" not in alice and int(alice, 16) >= 0


def test_the_limit_gates_principal_wins_over_the_scopes() -> None:
    assert request_principal("app|alice") == task_principal("app|alice")
    token = CURRENT_PRINCIPAL.set("addr:0f0f")
    try:
        assert request_principal("app|alice") == "addr:0f0f"
        assert request_principal(None) == "addr:0f0f"
    finally:
        CURRENT_PRINCIPAL.reset(token)


def test_the_counts_lie_under_the_queues_prefix() -> None:
    assert held_key("mcpfleet:f:tasks", "abc") == "mcpfleet:f:tasks:mcpfleet-limits:held:abc"
    assert owner_key("mcpfleet:f:tasks", "m1") == "mcpfleet:f:tasks:mcpfleet-limits:owner:m1"


def test_a_cap_or_a_share_is_on_when_any_principal_has_one() -> None:
    assert not capped(LimitRules()) and not shared_out(LimitRules())
    assert capped(LimitRules(tasks=Count(3))) and not shared_out(LimitRules(tasks=Count(3)))
    assert shared_out(LimitRules(tasks=Count(0, 2)))
    one = LimitRules(principals={"p": PrincipalRule(tasks=Count(1, 1))})
    assert capped(one) and shared_out(one)
    assert not capped(LimitRules(principals={"p": PrincipalRule(sessions=3)}))


@pytest.mark.parametrize(
    ("earliest_ms", "retry_after"), [(0, 2.0), (300, 1.0), (1500, 2.0), (900_000, 2.0)]
)
def test_the_client_is_told_to_retry_within_two_seconds(
    earliest_ms: int, retry_after: float
) -> None:
    assert Admission(False, 5, earliest_ms).retry_after() == retry_after


def test_the_refusal_is_a_32000_naming_the_limit_and_the_cap() -> None:
    error = limited_error(5, 5, 2.0)
    assert error.code == -32000
    assert "'tasks'" in error.message and "cap is 5" in error.message
    assert error.data == {"limit": "tasks", "retryAfter": 2.0}


class _Redis:
    def __init__(self, answer: Any = None, stall: bool = False, fail: bool = False) -> None:
        self.answer, self.stall, self.fail = answer, stall, fail
        self.calls: list[tuple[Any, ...]] = []

    async def eval(self, *args: Any) -> Any:
        self.calls.append(args)
        if self.fail:
            raise ConnectionError("refused")
        if self.stall:
            await asyncio.sleep(30)
        return self.answer

    async def set(self, *args: Any, **kwargs: Any) -> None:
        self.calls.append(("set", *args, kwargs))


class _Docket:
    prefix = "mcpfleet:t:tasks"

    def __init__(self, redis: _Redis) -> None:
        self._redis = redis

    @contextlib.asynccontextmanager
    async def redis(self) -> AsyncIterator[_Redis]:
        yield self._redis


def _limiter(cap: int, limited: list[tuple[str, str]] | None = None) -> TaskLimiter:
    rules = LimitRules(tasks=Count(cap))
    hook = limited.append if limited is not None else None
    return TaskLimiter(lambda: rules, 0.05, (lambda n, t: hook((n, t))) if hook else None)


async def test_past_the_cap_the_creation_is_refused_and_counted_for_its_tool() -> None:
    limited: list[tuple[str, str]] = []
    docket = _Docket(_Redis([0, 3, 400]))
    with pytest.raises(MCPError) as raised:
        await _limiter(3, limited).admit(docket, "double", "app|alice")
    assert raised.value.code == -32000 and raised.value.data["retryAfter"] == 1.0
    assert limited == [("tasks", "double")]
    key = docket._redis.calls[0][2]
    assert key == held_key(docket.prefix, task_principal("app|alice"))


async def test_under_the_cap_a_place_is_reserved_and_without_one_nothing_is_asked() -> None:
    docket = _Docket(_Redis([1, 1, 0]))
    reservation = await _limiter(3).admit(docket, "double", None)
    assert reservation is not None and reservation.principal == SHARED
    assert reservation.member.startswith("reserved:")
    nothing = _Docket(_Redis())
    assert await _limiter(0).admit(nothing, "double", None) is None
    assert nothing._redis.calls == []


@pytest.mark.parametrize("redis", [_Redis(fail=True), _Redis(stall=True)], ids=["down", "stalled"])
async def test_a_redis_down_or_stalled_lets_the_creation_through_counted(redis: _Redis) -> None:
    limiter = _limiter(3)
    started = asyncio.get_running_loop().time()
    assert await limiter.admit(_Docket(redis), "double", None) is None
    assert asyncio.get_running_loop().time() - started < 1.0
    assert limiter.unchecked == 1


async def test_a_worker_finds_the_gates_principal_only_where_it_is_not_the_scopes() -> None:
    """With shares and no cap, a creation records its principal for the worker only
    when the limit gate named one other than the scope's."""
    rules = LimitRules(tasks=Count(0, 2))
    limiter = TaskLimiter(lambda: rules, 0.05)
    docket = _Docket(_Redis())
    await limiter.record(docket, "app|alice", "t1", 60)
    token = CURRENT_PRINCIPAL.set(task_principal("app|alice"))
    try:
        await limiter.record(docket, "app|alice", "t1", 60)
    finally:
        CURRENT_PRINCIPAL.reset(token)
    assert docket._redis.calls == []
    token = CURRENT_PRINCIPAL.set("addr:0f0f")
    try:
        await limiter.record(docket, None, "t2", 60)
    finally:
        CURRENT_PRINCIPAL.reset(token)
    [(verb, key, value, kwargs)] = docket._redis.calls
    assert verb == "set" and value == "addr:0f0f" and kwargs == {"ex": 60}
    assert key.startswith(f"{docket.prefix}:mcpfleet-limits:owner:") and "t2" not in key


def test_the_share_is_one_more_keyword_parameter_never_a_second() -> None:
    def tool(n: int, seconds: float = 0.0, **extra: Any) -> None: ...

    share = object()
    signature = with_share(inspect.signature(tool), share)
    assert signature is not None
    assert list(signature.parameters) == ["n", "seconds", SHARE_PARAM, "extra"]
    assert signature.parameters[SHARE_PARAM].kind is inspect.Parameter.KEYWORD_ONLY
    assert signature.parameters[SHARE_PARAM].default is share
    assert with_share(signature, share) is None


async def test_a_task_tools_registered_wrapper_declares_the_share_and_never_passes_it_on() -> None:
    """The engine's registration of a task tool, through the fleet's hook: pydocket
    sees a ``ConcurrencyLimit`` parameter; the tool is called without it."""
    pytest.importorskip("fastmcp_tasks", reason="the [tasks] extra: make test-tasks")
    import importlib

    from docket.dependencies import ConcurrencyLimit
    from fastmcp import FastMCP
    from fastmcp_tasks import TasksExtension
    from uncalled_for import get_dependency_parameters

    from mcpfleet.tasks import FleetQueue, wire_tasks
    from mcpfleet.tasks._engine_hooks import ENGINE_HOOKS

    server = FastMCP("with-tasks")
    server.add_extension(TasksExtension())
    queue = FleetQueue("mcpfleet:t:tasks", "memory://", None, "r0", 5, 2)
    wire_tasks(server, queue)
    seen: list[dict[str, Any]] = []

    async def double(n: int) -> int:
        seen.append({"n": n})
        return 2 * n

    one_at_a_time = ConcurrencyLimit(max_concurrent=1)

    async def limited(n: int, c: ConcurrencyLimit = one_at_a_time) -> int:
        return n

    try:
        components: Any = importlib.import_module("fastmcp_tasks.components")
        leg = components.reentrant_task_fn(double, "double")
        dependencies = get_dependency_parameters(leg)
        assert list(dependencies) == [SHARE_PARAM]
        assert isinstance(dependencies[SHARE_PARAM], ConcurrencyLimit)
        assert await leg(n=2, **{SHARE_PARAM: dependencies[SHARE_PARAM]}) == 4
        assert seen == [{"n": 2}]
        own = components.reentrant_task_fn(limited, "limited")
        assert list(get_dependency_parameters(own)) == ["c"], "its own limit stays, alone"
    finally:
        ENGINE_HOOKS.detach()
