"""The conformance app on the modern era (2026-07-28), through the router.

The suite (0.1.16) has no 2026-07-28 scenarios yet: all of them negotiate a
handshake-era session, which the router pins to one replica. This runs the
same calls the suite's scenarios make, on the modern era, through the router,
with the suite's own pass conditions, and records which replica served each
round: on the modern era every round is independent, so the two rounds of an
asking tool (the ``InputRequiredResult`` and the answered call) may land on
different replicas, and over a few calls they do.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from fastmcp import Client
from mcp_types import CreateMessageResult, PromptReference, TextContent

from mcpfleet.fleetclient import Trace, connect

#: The answers the suite's scenarios give to the app's questions, by the requested
#: schema's first property.
ANSWERS: dict[str, Any] = {
    "username": {"username": "testuser", "email": "test@example.com"},
    "name": {
        "name": "Jane Smith",
        "age": 25,
        "score": 88.0,
        "status": "inactive",
        "verified": False,
    },
    "untitledSingle": {
        "untitledSingle": "option1",
        "titledSingle": "value1",
        "legacyEnum": "opt1",
        "untitledMulti": ["option1", "option2"],
        "titledMulti": ["value1", "value2"],
    },
}

#: How often each asking tool is called: enough for its rounds to meet several replicas.
ASKING_CALLS = 4


def suite_answer(message: str, schema: dict[str, Any]) -> Any:
    """Answer as the suite's client does for the schema asked."""
    first = next(iter(schema.get("properties", {})), "")
    return ANSWERS[first]


async def suite_sampling(messages: Any, params: Any, context: Any) -> CreateMessageResult:
    return CreateMessageResult(
        role="assistant",
        content=TextContent(type="text", text="This is a test response from the client"),
        model="test-model",
        stop_reason="endTurn",
    )


@dataclass
class ModernResult:
    """One call's outcome and the replicas its tools/call rounds reached."""

    name: str
    ok: bool
    rounds: int = 0
    tool_calls: int = 0
    replicas: list[str] = field(default_factory=list)
    detail: str = ""


Probe = Callable[[Client[Any]], Awaitable[str | None]]


def _text(result: Any) -> str:
    return " ".join(getattr(c, "text", f"<{c.type}>") for c in result.content)


async def _tool(client: Client[Any], name: str, args: dict[str, Any], want: str) -> str | None:
    result = await client.call_tool(name, args, raise_on_error=False)
    text = _text(result)
    return None if want in text and not result.is_error else f"got {text!r}"


async def _content(client: Client[Any], name: str, kind: str) -> str | None:
    result = await client.call_tool(name, {})
    types = [c.type for c in result.content]
    return None if kind in types else f"content types {types}"


def probes() -> dict[str, Probe]:
    """Each modern-era call, named after the suite scenario it mirrors; None means it passed."""

    async def error(c: Client[Any]) -> str | None:
        result = await c.call_tool("test_error_handling", {}, raise_on_error=False)
        return None if result.is_error and _text(result) else "no isError result"

    async def progress(c: Client[Any]) -> str | None:
        seen: list[float] = []

        async def on(progress: float, total: float | None, message: str | None) -> None:
            seen.append(progress)

        await c.call_tool("test_tool_with_progress", {}, progress_handler=on)
        return None if seen == [0, 50, 100] else f"progress {seen}"

    async def tools_list(c: Client[Any]) -> str | None:
        tools = await c.list_tools()
        schema = next(t.input_schema for t in tools if t.name == "json_schema_2020_12_tool")
        return None if "$defs" in schema and all(t.description for t in tools) else "schema"

    async def prompt(c: Client[Any]) -> str | None:
        got = await c.get_prompt("test_prompt_with_arguments", {"arg1": "v1", "arg2": "v2"})
        text = json.dumps([m.content.model_dump(mode="json") for m in got.messages])
        return None if "v1" in text and "v2" in text else text

    async def resource(c: Client[Any]) -> str | None:
        got = await c.read_resource("test://template/123/data")
        return None if "123" in str(got[0]) else str(got)

    async def complete(c: Client[Any]) -> str | None:
        ref = PromptReference(type="ref/prompt", name="test_prompt_with_arguments")
        got = await c.complete(ref, {"name": "arg1", "value": "par"})
        return None if got.values == ["paris", "park", "party"] else str(got.values)

    return {
        "tools-list": tools_list,
        "tools-call-simple-text": lambda c: _tool(c, "test_simple_text", {}, "simple text"),
        "tools-call-image": lambda c: _content(c, "test_image_content", "image"),
        "tools-call-audio": lambda c: _content(c, "test_audio_content", "audio"),
        "tools-call-embedded-resource": lambda c: _content(c, "test_embedded_resource", "resource"),
        "tools-call-mixed-content": lambda c: _content(c, "test_multiple_content_types", "image"),
        "tools-call-error": error,
        "tools-call-with-progress": progress,
        "tools-call-sampling": lambda c: _tool(
            c, "test_sampling", {"prompt": "Test prompt"}, "LLM response: This is a test response"
        ),
        "tools-call-elicitation": lambda c: _tool(
            c, "test_elicitation", {"message": "Who?"}, "action=accept"
        ),
        "elicitation-sep1034-defaults": lambda c: _tool(
            c, "test_elicitation_sep1034_defaults", {}, '"Jane Smith"'
        ),
        "elicitation-sep1330-enums": lambda c: _tool(
            c, "test_elicitation_sep1330_enums", {}, '"titledMulti": ["value1", "value2"]'
        ),
        "prompts-get-with-args": prompt,
        "resources-templates-read": resource,
        "completion-complete": complete,
    }


#: Exchanges that set a client up rather than serve a scenario.
SETUP = frozenset({"", "initialize", "notifications/initialized", "server/discover"})

#: The probes whose tool asks the client something: two rounds per call.
ASKING = (
    "tools-call-sampling",
    "tools-call-elicitation",
    "elicitation-sep1034-defaults",
    "elicitation-sep1330-enums",
)


async def run_modern(url: str) -> list[ModernResult]:
    """Every probe once (the asking ones ``ASKING_CALLS`` times) on the modern era via ``url``."""
    out = []
    for name, probe in probes().items():
        calls = ASKING_CALLS if name in ASKING else 1
        trace = Trace()
        failures = []
        client = connect(url, "modern", trace, answer=suite_answer)
        client.set_sampling_callback(suite_sampling)  # before connecting: a capability
        async with client:
            for _ in range(calls):
                try:
                    problem = await probe(client)
                except Exception as exc:  # a probe's failure is a result, not a crash
                    problem = f"{type(exc).__name__}: {exc}"
                if problem is not None:
                    failures.append(problem)
        rounds = [r for r in trace.rounds if r.rpc not in SETUP]
        out.append(
            ModernResult(
                name=name,
                ok=not failures,
                rounds=len(rounds),
                tool_calls=len(trace.calls("tools/call")),
                replicas=sorted({r.replica for r in rounds if r.replica}),
                detail="; ".join(failures),
            )
        )
    return out


def modern_table(results: list[ModernResult]) -> str:
    rows = [("scenario (2026-07-28, via the router)", "result", "rounds", "replicas")]
    rows += [
        (r.name, "pass" if r.ok else f"FAIL {r.detail}", str(r.rounds), ", ".join(r.replicas))
        for r in results
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
