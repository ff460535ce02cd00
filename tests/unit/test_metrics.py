"""The rounds middleware counts exactly the rounds that happen, in both eras."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastmcp import Client, Context, FastMCP
from fastmcp.exceptions import ToolError
from mcp_types import ElicitRequest, ElicitRequestFormParams, ElicitResult, InputRequiredResult
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from prometheus_client import CollectorRegistry, generate_latest

from mcpfleet import PrometheusMiddleware
from mcpfleet.fleetclient import default_answer
from mcpfleet_examples.app import app

MODERN, HANDSHAKE = "auto", "legacy"
ERA = {MODERN: "modern", HANDSHAKE: "handshake"}


@pytest.fixture
def metrics() -> Iterator[PrometheusMiddleware]:
    """The example app with a fresh middleware (removed again: the app is shared)."""
    mw = PrometheusMiddleware(CollectorRegistry())
    app.add_middleware(mw)
    try:
        yield mw
    finally:
        app.middleware.remove(mw)


def _client(target: FastMCP[Any], mode: str, action: str = "accept") -> Client[Any]:
    async def handler(message: str, response_type: Any, params: Any, context: Any) -> Any:
        if action != "accept":
            return ElicitResult(action=action)  # type: ignore[arg-type]
        schema = params.requested_schema
        value = default_answer(message, schema)
        props = schema.get("properties", {})
        return response_type(value=value) if set(props) == {"value"} else response_type(**value)

    return Client(target, mode=mode, elicitation_handler=handler)


def rounds(mw: PrometheusMiddleware, **labels: str) -> float:
    """Sum of ``mcpfleet_rounds_total`` over the series matching ``labels``."""
    return _sum(mw, "mcpfleet_rounds_total", labels)


def answers(mw: PrometheusMiddleware, **labels: str) -> float:
    return _sum(mw, "mcpfleet_elicitation_responses_total", labels)


def _sum(mw: PrometheusMiddleware, name: str, labels: dict[str, str]) -> float:
    total = 0.0
    for family in mw.registry.collect():
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


async def test_modern_booking_is_three_asking_rounds_and_one_final(
    metrics: PrometheusMiddleware,
) -> None:
    async with _client(app, MODERN) as client:
        result = await client.call_tool("book_flight", {"destination": "Oslo"})
    assert str(result.data).startswith("Booked")
    tool = {"component_type": "tool", "component": "book_flight", "era": "modern"}
    assert rounds(metrics, kind="asking", **tool) == 3
    assert rounds(metrics, kind="final", outcome="ok", **tool) == 1
    assert rounds(metrics, step="start", **tool) == 1, "only the first request starts the call"
    assert rounds(metrics, step="continue", **tool) == 3
    assert answers(metrics, era="modern", action="accept", component="book_flight") == 3
    assert rounds(metrics, era="handshake") == 0


async def test_handshake_booking_is_three_elicitations_and_one_final(
    metrics: PrometheusMiddleware,
) -> None:
    async with _client(app, HANDSHAKE) as client:
        result = await client.call_tool("book_flight", {"destination": "Oslo"})
    assert str(result.data).startswith("Booked")
    tool = {"component_type": "tool", "component": "book_flight", "era": "handshake"}
    assert rounds(metrics, kind="asking", outcome="ok", **tool) == 3
    assert rounds(metrics, kind="final", outcome="ok", **tool) == 1
    assert rounds(metrics, kind="asking", step="start", **tool) == 1
    assert rounds(metrics, kind="final", step="continue", **tool) == 1
    assert answers(metrics, era="handshake", action="accept", component="book_flight") == 3
    assert rounds(metrics, era="modern") == 0
    # Durations: one observation per round, the user's answering time excluded.
    text = generate_latest(metrics.registry).decode()
    assert (
        'mcpfleet_round_duration_seconds_count{component="book_flight",component_type="tool",'
        'era="handshake",kind="asking"} 3.0' in text
    )


@pytest.mark.parametrize("mode", [MODERN, HANDSHAKE])
@pytest.mark.parametrize("action", ["decline", "cancel"])
async def test_declines_and_cancels_are_counted_as_such(
    metrics: PrometheusMiddleware, mode: str, action: str
) -> None:
    async with _client(app, mode, action) as client:
        result = await client.call_tool("book_flight", {"destination": "Rome"})
    assert "nothing was done" in str(result.data)
    era = ERA[mode]
    assert answers(metrics, era=era, action=action, component="book_flight") == 1
    assert answers(metrics, era=era, action="accept") == 0
    assert rounds(metrics, kind="asking", component="book_flight") == 1
    assert rounds(metrics, kind="final", outcome="ok", component="book_flight") == 1


@pytest.mark.parametrize("mode", [MODERN, HANDSHAKE])
async def test_every_component_kind_of_the_example_app_is_counted(
    metrics: PrometheusMiddleware, mode: str
) -> None:
    era = ERA[mode]
    async with _client(app, mode) as client:
        await client.call_tool("plan_meeting", {"topic": "Sync"})
        await client.call_tool("confirm_purchase", {"item": "lamp", "amount_eur": 20})
        await client.call_tool("tag_document", {"document": "a.pdf"})
        await client.call_tool("create_task", {"project": "infra"})
        await client.get_prompt("draft_email", {"recipient": "bob"})
        await client.read_resource("report://weekly")
    expected = {
        ("tool", "plan_meeting"): 3,
        ("tool", "confirm_purchase"): 1,
        ("tool", "tag_document"): 1,
        ("tool", "create_task"): 1,
        ("prompt", "draft_email"): 1,
        ("resource", "report://weekly"): 1,
    }
    for (ctype, name), asking in expected.items():
        labels = {"component_type": ctype, "component": name, "era": era}
        assert rounds(metrics, kind="asking", **labels) == asking, (ctype, name)
        assert rounds(metrics, kind="final", outcome="ok", **labels) == 1, (ctype, name)
    assert answers(metrics, era=era, action="accept") == sum(expected.values())


@pytest.mark.parametrize("mode", [MODERN, HANDSHAKE])
async def test_an_error_round_is_counted_as_error_and_unknown_names_are_not_labels(
    metrics: PrometheusMiddleware, mode: str
) -> None:
    async with _client(app, mode) as client:
        with pytest.raises(ToolError):
            await client.call_tool("no_such_tool_secret_4711", {})
        with pytest.raises(ToolError):
            # Fails argument validation: an error round of a known tool.
            await client.call_tool("book_flight", {"destination": "x"})
        with pytest.raises(Exception, match=r"nknown|not found"):
            await client.read_resource("report://secret-4711")
    era = ERA[mode]
    assert rounds(metrics, kind="final", outcome="error", component="unknown", era=era) == 2
    assert rounds(metrics, kind="final", outcome="error", component="book_flight", era=era) == 1
    assert "secret-4711" not in generate_latest(metrics.registry).decode()


def _plain_app() -> FastMCP[Any]:
    """A FastMCP app that uses nothing of mcpfleet but the middleware."""
    mcp = FastMCP("plain")

    @mcp.tool
    async def pick(ctx: Context) -> str | InputRequiredResult:
        """Asks one number, with the framework's own API for each era."""
        rc = ctx.request_context
        if rc is not None and rc.protocol_version in MODERN_PROTOCOL_VERSIONS:
            responses = ctx.input_responses
            if not responses:
                request = ElicitRequest(
                    params=ElicitRequestFormParams(
                        message="How many?",
                        requested_schema={
                            "type": "object",
                            "properties": {"value": {"type": "integer"}},
                        },
                    )
                )
                return InputRequiredResult(input_requests={"n": request}, request_state="s")
            answer = responses["n"]
            assert isinstance(answer, ElicitResult) and answer.content is not None
            return f"picked {answer.content['value']}"
        result = await ctx.elicit("How many?", int)
        return f"picked {getattr(result, 'data', None)}"

    @mcp.tool
    def boom() -> str:
        raise ValueError("boom")

    @mcp.resource("users://{user_id}/profile")
    def profile(user_id: str) -> str:
        return f"profile of {user_id}"

    return mcp


@pytest.mark.parametrize("mode", [MODERN, HANDSHAKE])
async def test_middleware_works_on_a_plain_fastmcp_app(mode: str) -> None:
    mcp = _plain_app()
    mw = PrometheusMiddleware(CollectorRegistry())
    mcp.add_middleware(mw)
    async with _client(mcp, mode) as client:
        assert str((await client.call_tool("pick", {})).data).startswith("picked ")
        with pytest.raises(ToolError):
            await client.call_tool("boom", {})
        await client.read_resource("users://alice-private/profile")
    era = ERA[mode]
    assert rounds(mw, kind="asking", component="pick", era=era) == 1
    assert rounds(mw, kind="final", outcome="ok", component="pick", era=era) == 1
    assert rounds(mw, kind="final", outcome="error", component="boom", era=era) == 1
    assert rounds(mw, kind="final", component="users://{user_id}/profile", era=era) == 1
    assert "alice-private" not in generate_latest(mw.registry).decode()


async def test_a_handshake_ask_counts_as_paused_until_its_answer(
    metrics: PrometheusMiddleware,
) -> None:
    seen: list[int] = []

    async def handler(message: str, response_type: Any, params: Any, context: Any) -> Any:
        seen.append(metrics.paused)  # the tool waits for this answer now
        schema = params.requested_schema
        value = default_answer(message, schema)
        props = schema.get("properties", {})
        return response_type(value=value) if set(props) == {"value"} else response_type(**value)

    assert metrics.paused == 0
    async with Client(app, mode=HANDSHAKE, elicitation_handler=handler) as client:
        result = await client.call_tool("book_flight", {"destination": "Oslo"})
    assert str(result.data).startswith("Booked")
    assert seen == [1, 1, 1], "each of the three questions paused the tool once"
    assert metrics.paused == 0


async def test_a_handshake_ask_left_unanswered_stops_counting_as_paused(
    metrics: PrometheusMiddleware,
) -> None:
    async def handler(message: str, response_type: Any, params: Any, context: Any) -> Any:
        assert metrics.paused == 1
        raise RuntimeError("the client gives up on the question")

    async with Client(app, mode=HANDSHAKE, elicitation_handler=handler) as client:
        with pytest.raises(ToolError):
            await client.call_tool("book_flight", {"destination": "Oslo"})
    assert metrics.paused == 0


class _Seen(PrometheusMiddleware):
    """A subclass with hooks of its own around the tool call's."""

    def __init__(self) -> None:
        super().__init__(CollectorRegistry())
        self.seen: list[str] = []

    async def on_message(self, context: Any, call_next: Any) -> Any:
        self.seen.append(f"message {context.method}")
        return await call_next(context)

    async def on_request(self, context: Any, call_next: Any) -> Any:
        self.seen.append(f"request {context.method}")
        return await call_next(context)


@pytest.mark.parametrize("mode", [MODERN, HANDSHAKE])
async def test_a_subclass_with_its_own_outer_hooks_still_sees_each_tool_call(mode: str) -> None:
    mw = _Seen()
    target = _plain_app()
    target.add_middleware(mw)
    async with _client(target, mode) as client:
        assert str((await client.call_tool("pick", {})).data).startswith("picked ")
    assert "message tools/call" in mw.seen and "request tools/call" in mw.seen
    assert rounds(mw, kind="final", outcome="ok", component="pick") == 1
