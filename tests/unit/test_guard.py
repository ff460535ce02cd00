"""mcpfleet's public guard API (``mcpfleet``), in memory, on both protocol eras."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastmcp import Client, Context, FastMCP
from fastmcp.exceptions import ToolError
from mcp_types import ElicitResult, InputRequiredResult

import mcpfleet
from fleetkit.apps.publicapp import app
from mcpfleet import Outcome, Question, ask_then, first_missing, is_modern

ERAS = ["auto", "legacy"]
REPLIES = {"version": "2.0", "reviewers": 3, "pending": False, "now": True}


def _client(target: FastMCP[Any], action: str = "accept") -> Client[Any]:
    async def handler(message: str, response_type: Any, params: Any, context: Any) -> Any:
        if action != "accept":
            return ElicitResult(action=action)  # type: ignore[arg-type]
        value = next(v for k, v in REPLIES.items() if k in message.lower())
        return response_type(value=value)

    return Client(target, mode="auto", elicitation_handler=handler)


def test_the_public_api_is_exported_with_all() -> None:
    for name in ("Question", "Outcome", "ask", "ask_then", "first_missing", "is_modern"):
        assert name in mcpfleet.__all__
        assert getattr(mcpfleet, name) is getattr(mcpfleet.guard, name)


@pytest.mark.parametrize("mode", ERAS)
async def test_answer_keys_never_collide_with_the_state_envelope(mode: str) -> None:
    async def handler(message: str, response_type: Any, params: Any, context: Any) -> Any:
        value = next(v for k, v in REPLIES.items() if k in message.lower())
        return response_type(value=value)

    async with Client(app, mode=mode, elicitation_handler=handler) as client:
        result = await client.call_tool("release", {"project": "atlas"})
    assert str(result.data) == "atlas 2.0 released with 3 sign-offs"


@pytest.mark.parametrize("action", ["decline", "cancel"])
async def test_a_declined_or_cancelled_question_reaches_finish(action: str) -> None:
    async with _client(app, action) as client:
        result = await client.call_tool("release", {"project": "atlas"})
    status = "declined" if action == "decline" else "cancelled"
    assert str(result.data) == f"release {status} at v"


async def test_ask_then_returns_the_input_request_on_the_modern_era() -> None:
    """Called directly (not through a client), a first modern round yields the question."""
    probe = FastMCP("probe")
    seen: list[object] = []

    @probe.tool
    async def one(ctx: Context) -> str | InputRequiredResult:
        out = await ask_then(
            ctx, first_missing([Question("ok", "ok?", bool)]), lambda o: f"done {o.answers}"
        )
        seen.append(out)
        return out

    async def handler(message: str, response_type: Any, params: Any, context: Any) -> Any:
        return response_type(value=True)

    async with Client(probe, mode="auto", elicitation_handler=handler) as client:
        result = await client.call_tool("one", {})
    assert str(result.data) == "done {'ok': True}"
    assert isinstance(seen[0], InputRequiredResult)
    state = json.loads(seen[0].request_state or "{}")
    assert state == {"v": 1, "answers": {}, "pending": "ok"}


def test_outcome_done_only_when_done() -> None:
    assert Outcome("done", {}).done
    assert not Outcome("declined", {}, "k").done


def test_state_sealed_before_the_envelope_is_still_read() -> None:
    """A round sealed by a replica of the previous version, mid rolling update."""
    from types import SimpleNamespace

    from mcpfleet.guard import _restore

    legacy = SimpleNamespace(request_state=json.dumps({"date": "2026-12-24", "_pending": "seat"}))
    old = _restore(legacy)  # type: ignore[arg-type]
    assert (old.answers, old.pending, old.flow) == ({"date": "2026-12-24"}, "seat", None)
    current = SimpleNamespace(
        request_state=json.dumps({"v": 1, "answers": {"_pending": 1}, "pending": "x"})
    )
    now = _restore(current)  # type: ignore[arg-type]
    assert (now.answers, now.pending, now.flow) == ({"_pending": 1}, "x", None)
    with pytest.raises(ValueError, match="answers and a pending key"):
        _restore(SimpleNamespace(request_state='{"v": 1, "answers": []}'))  # type: ignore[arg-type]


def test_the_contract_imports_without_fastmcp() -> None:
    """The operator and `mcpfleet keys` need the contract, not FastMCP: exports load lazily."""
    import subprocess
    import sys

    probe = "import sys, mcpfleet.contract; print('fastmcp' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        mcpfleet.nope  # noqa: B018


@pytest.mark.parametrize("mode", ERAS)
async def test_a_once_flow_completes_in_memory_on_both_eras(mode: str) -> None:
    """Each call is its own flow: once guards replays of a flow's end, not new calls."""
    probe = FastMCP("probe-once")
    runs: list[str] = []

    @probe.tool
    async def buy(item: str, ctx: Context) -> str | InputRequiredResult:
        def finish(outcome: Outcome) -> str:
            runs.append(item)
            return f"bought {item}" if outcome.done and outcome.answers["ok"] else "no"

        return await ask_then(ctx, first_missing([Question("ok", "ok?", bool)]), finish, once=True)

    async def handler(message: str, response_type: Any, params: Any, context: Any) -> Any:
        return response_type(value=True)

    async with Client(probe, mode=mode, elicitation_handler=handler) as client:
        first = await client.call_tool("buy", {"item": "tea"})
        second = await client.call_tool("buy", {"item": "tea"})
    assert str(first.data) == str(second.data) == "bought tea"
    assert runs == ["tea", "tea"]


async def test_once_refuses_a_prompt() -> None:
    probe = FastMCP("probe-once-prompt")

    @probe.prompt
    async def tone(ctx: Context) -> str | InputRequiredResult:
        q = first_missing([Question("t", "tone?", str)])
        return await ask_then(ctx, q, lambda o: "x", once=True)

    async def handler(message: str, response_type: Any, params: Any, context: Any) -> Any:
        return response_type(value="warm")

    async with Client(probe, mode="auto", elicitation_handler=handler) as client:
        with pytest.raises(Exception, match="guards tools"):
            await client.get_prompt("tone", {})


def test_an_elicitation_config_is_built_once_per_response_type() -> None:
    """Every modern round asks for its question's config: FastMCP's parse rebuilds the
    schema each time, so the guard keeps one per response type (by value for the
    dict/list shorthand), bounded, and builds anything unkeyable afresh."""
    from fastmcp.server.elicitation import parse_elicit_response_type

    from mcpfleet import guard

    assert guard._elicit_config(bool) is guard._elicit_config(bool)
    assert guard._elicit_config(bool).schema == parse_elicit_response_type(bool).schema
    titled = {"low": {"title": "Low"}, "high": {"title": "High"}}
    assert guard._elicit_config(dict(titled)) is guard._elicit_config(dict(titled))
    assert guard._elicit_config(["a", "b"]) is not guard._elicit_config(["b", "a"])
    for i in range(guard._CONFIG_LIMIT + 5):
        guard._elicit_config([f"choice-{i}", "other"])
    assert len(guard._CONFIGS) == guard._CONFIG_LIMIT


def test_pydantic_keeps_the_accepted_elicitation_class_while_the_guard_holds_it() -> None:
    """FastMCP's ``handle_elicit_accept`` subscripts ``AcceptedElicitation[Any]`` per
    answer; pydantic caches the class weakly, so the guard holds one reference. If
    pydantic stops returning the cached class, that reference no longer saves the
    rebuild (~1.5 ms an answer after a garbage collection): this says so."""
    import gc

    from fastmcp.server.elicitation import AcceptedElicitation

    from mcpfleet import guard

    gc.collect()
    assert AcceptedElicitation[Any] is guard._ACCEPTED_ANY


async def test_a_flow_inside_an_mcp_task_asks_the_modern_way_and_refuses_once() -> None:
    """A task's worker has no request (so no protocol version): ``ask_then`` must
    still return the question, never call ``ctx.elicit``, which the tasks engine
    refuses; ``once=True`` is refused with a message saying why."""
    flow = first_missing([Question("ok", "ok?", bool)])
    ctx = Context(fastmcp=FastMCP("tasked"), task_id="t-1")
    assert is_modern(ctx)
    assert not is_modern(Context(fastmcp=FastMCP("foreground")))
    async with ctx:
        out = await ask_then(ctx, flow, lambda o: o)
        assert isinstance(out, InputRequiredResult)
        assert out.input_requests is not None and list(out.input_requests) == ["ok"]
        with pytest.raises(ToolError, match="not available inside an MCP task"):
            await ask_then(ctx, flow, lambda o: o, once=True)
