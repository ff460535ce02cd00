"""A request's multi-round-trip fields parsed once (mcpfleet.replica.roundparams).

Each test puts FastMCP's own method back afterwards. Guard flows run through a
real FastMCP app and client on the modern era, FastMCP's way and with the memo,
and must answer alike; FastMCP's parses of the fields are counted.
"""

from __future__ import annotations

import asyncio
from typing import Any

import mcp_types
import pytest
from fastmcp import Client, Context, FastMCP
from mcp_types import InputRequiredResult

from fleetkit.upstream import assert_left_alone
from mcpfleet import Question, ask_then, first_missing
from mcpfleet.replica import roundparams
from mcpfleet.replica.roundparams import (
    MEMO_SIZE,
    parse_round_params_once,
    round_params_parsed_once,
)

pytestmark = pytest.mark.unit

FASTMCPS = Context.__dict__["_input_response_params"]
FASTMCPS = getattr(FASTMCPS, "__wrapped__", FASTMCPS)


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """FastMCP's own method in place for the test (put back after it); the params of
    each of its parses of a round's fields, counted."""
    monkeypatch.setattr(Context, "_input_response_params", FASTMCPS)
    counted: list[dict[str, Any]] = []
    model = mcp_types.InputResponseRequestParams
    validate = model.model_validate.__func__  # type: ignore[attr-defined]

    def counting(cls: Any, obj: Any, *args: Any, **kwargs: Any) -> Any:
        if cls is model:  # not its subclasses' (a tools/call's own params)
            counted.append(obj)
        return validate(cls, obj, *args, **kwargs)

    monkeypatch.setattr(model, "model_validate", classmethod(counting))
    return counted


def _app() -> FastMCP[Any]:
    app = FastMCP("roundparams")

    @app.tool
    async def book(ctx: Context, city: str) -> str | InputRequiredResult:
        questions = [Question("seat", f"A window seat to {city}?", bool)]
        return await ask_then(
            ctx, first_missing(questions), lambda o: f"{city}: {o.status} {o.answers}"
        )

    return app


def _answer(seen: list[str]) -> Any:
    async def handler(message: str, response_type: Any, params: Any, context: Any) -> Any:
        seen.append(message)
        return response_type(value=message.endswith("Oslo?"))

    return handler


async def _flows(app: FastMCP[Any], cities: list[str]) -> tuple[list[str], list[str]]:
    seen: list[str] = []
    async with Client(app, mode="auto", elicitation_handler=_answer(seen)) as client:
        results = await asyncio.gather(*(client.call_tool("book", {"city": c}) for c in cities))
    return [str(r.data) for r in results], sorted(seen)


async def test_an_answer_round_parses_its_fields_once_and_answers_alike(
    parses: list[dict[str, Any]],
) -> None:
    app = _app()
    before = await _flows(app, ["Oslo"])
    assert before[0] == ["Oslo: done {'seat': True}"]
    fastmcps = len(parses)
    answered = [p for p in parses if "inputResponses" in p]
    # FastMCP's middleware view reads both fields, the guard reads them again.
    assert fastmcps >= 5 and len(answered) >= 3, parses
    parses.clear()
    assert parse_round_params_once() and round_params_parsed_once()
    assert await _flows(app, ["Oslo"]) == before
    assert len(parses) == 2, "one parse a round: the asking round and the answer round"
    assert "inputResponses" in parses[1] and "requestState" in parses[1]


async def test_flows_in_flight_together_each_read_their_own_fields(
    parses: list[dict[str, Any]],
) -> None:
    cities = [f"city{i}" for i in range(MEMO_SIZE * 2)] + ["Oslo"]
    app = _app()
    expected = await _flows(app, cities)
    assert parse_round_params_once()
    assert await _flows(app, cities) == expected
    assert expected[0][-1] == "Oslo: done {'seat': True}"
    assert expected[0][0] == "city0: done {'seat': False}"


class _Request:
    def __init__(self, params: Any) -> None:
        self._srctx = type("Srctx", (), {"params": params})()


class _Ctx:
    """What the memo reads of a FastMCP ``Context``: its request context."""

    def __init__(self, params: Any) -> None:
        self.request_context = _Request(params)


def _memo() -> tuple[Any, list[Any]]:
    """The memo around a parse that counts and fails on ``"bad"``."""
    calls: list[Any] = []

    def parse(ctx: Any) -> Any:
        params = ctx.request_context._srctx.params
        calls.append(params)
        if params.get("requestState") == "bad":
            raise ValueError("not a round's fields")
        return {"parsed": dict(params)}

    return roundparams._memoized(parse), calls


def test_the_same_params_are_parsed_once_and_changed_ones_again() -> None:
    memo, calls = _memo()
    params: dict[str, Any] = {"name": "book", "requestState": "s1"}
    ctx = _Ctx(params)
    first = memo(ctx)
    assert memo(ctx) is first and len(calls) == 1
    params["requestState"] = "s2"  # another value in the same mapping: parsed again
    assert memo(ctx) == {"parsed": {"name": "book", "requestState": "s2"}}
    params["inputResponses"] = {"seat": {"action": "accept"}}
    memo(ctx)
    assert len(calls) == 3
    # An equal mapping of another request is that request's own parse.
    assert memo(_Ctx(dict(params))) is not memo(ctx)


def test_a_failing_parse_is_not_kept_and_what_is_not_a_dict_is_not_memoized() -> None:
    memo, calls = _memo()
    bad = _Ctx({"requestState": "bad"})
    for _ in range(2):
        with pytest.raises(ValueError, match="not a round's fields"):
            memo(bad)
    assert len(calls) == 2

    class Params(dict[str, Any]):
        pass

    other = _Ctx(Params(requestState="s"))
    memo(other)
    memo(other)
    assert len(calls) == 4


def test_the_memo_keeps_the_last_requests_only() -> None:
    memo, calls = _memo()
    ctxs = [_Ctx({"requestState": str(i)}) for i in range(MEMO_SIZE + 1)]
    for ctx in ctxs:
        memo(ctx)
    memo(ctxs[-1])
    assert len(calls) == MEMO_SIZE + 1
    memo(ctxs[0])  # forgotten: the oldest
    assert len(calls) == MEMO_SIZE + 2


def test_twice_is_once_and_a_method_that_is_not_fastmcps_is_left_alone(
    parses: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert parse_round_params_once() and parse_round_params_once()
    assert Context.__dict__["_input_response_params"].__wrapped__ is FASTMCPS
    assert_left_alone(
        Context, "_input_response_params", parse_round_params_once, monkeypatch, caplog
    )
