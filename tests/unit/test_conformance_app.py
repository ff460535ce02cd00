"""The conformance app, in memory: what each suite scenario calls answers as the suite expects.

The suite itself runs in ``tests/conformance`` (it needs Node); these tests
prove the app's side of each scenario without it, on both protocol eras where
a tool asks the client for something.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from fastmcp import Client
from fastmcp.exceptions import ToolError
from mcp_types import (
    CreateMessageResult,
    ElicitResult,
    ImageContent,
    PromptReference,
    TextContent,
)

from mcpfleet_examples.conformance import ADDRESS_SCHEMA, PNG, WAV, app

ERAS = ["auto", "legacy"]  # auto negotiates 2026-07-28; legacy a handshake-era session


def _elicit(answer: dict[str, Any] | None, seen: list[dict[str, Any]]) -> Any:
    async def handler(message: str, response_type: Any, params: Any, context: Any) -> Any:
        seen.append({"message": message, "schema": params.requested_schema})
        if answer is None:
            return ElicitResult(action="decline")
        return response_type(**answer)

    return handler


async def test_every_tool_prompt_and_resource_the_suite_names_is_served() -> None:
    async with Client(app) as client:
        tools = {t.name for t in await client.list_tools()}
        prompts = {p.name for p in await client.list_prompts()}
        resources = {str(r.uri) for r in await client.list_resources()}
        templates = {t.uri_template for t in await client.list_resource_templates()}
    assert tools == {
        "test_simple_text",
        "test_image_content",
        "test_audio_content",
        "test_embedded_resource",
        "test_multiple_content_types",
        "test_error_handling",
        "test_tool_with_logging",
        "test_tool_with_progress",
        "test_reconnection",
        "test_sampling",
        "test_elicitation",
        "test_elicitation_sep1034_defaults",
        "test_elicitation_sep1330_enums",
        "json_schema_2020_12_tool",
    }
    assert prompts == {
        "test_simple_prompt",
        "test_prompt_with_arguments",
        "test_prompt_with_embedded_resource",
        "test_prompt_with_image",
    }
    assert resources == {"test://static-text", "test://static-binary", "test://watched-resource"}
    assert templates == {"test://template/{id}/data"}


async def test_content_tools_return_text_image_audio_and_embedded_resources() -> None:
    async with Client(app) as client:
        text = await client.call_tool("test_simple_text", {})
        image = await client.call_tool("test_image_content", {})
        audio = await client.call_tool("test_audio_content", {})
        embedded = await client.call_tool("test_embedded_resource", {})
        mixed = await client.call_tool("test_multiple_content_types", {})
    assert text.content == [
        TextContent(type="text", text="This is a simple text response for testing.")
    ]
    assert image.content[0].type == "image" and image.content[0].mime_type == "image/png"
    assert base64.b64decode(image.content[0].data) == PNG
    assert PNG.startswith(b"\x89PNG\r\n\x1a\n")
    assert audio.content[0].type == "audio" and audio.content[0].mime_type == "audio/wav"
    assert base64.b64decode(audio.content[0].data) == WAV
    assert WAV[:4] == b"RIFF" and WAV[8:12] == b"WAVE"
    assert embedded.content[0].type == "resource"
    assert str(embedded.content[0].resource.uri) == "test://embedded-resource"
    assert [c.type for c in mixed.content] == ["text", "image", "resource"]
    assert json.loads(mixed.content[2].resource.text) == {"test": "data", "value": 123}


async def test_error_tool_reports_is_error_with_its_message() -> None:
    async with Client(app) as client:
        with pytest.raises(ToolError, match="intentionally returns an error"):
            await client.call_tool("test_error_handling", {})
        result = await client.call_tool("test_error_handling", {}, raise_on_error=False)
    assert result.is_error


async def test_logging_tool_sends_three_info_messages_in_order() -> None:
    # Handshake era only: the suite's logging scenarios are, and the logging
    # capability is deprecated from 2026-07-28 on (the library warns).
    logs: list[Any] = []

    async def on_log(message: Any) -> None:
        logs.append(message)

    async with Client(app, mode="legacy", log_handler=on_log) as client:
        await client.call_tool("test_tool_with_logging", {})
    assert [(m.level, m.data["msg"]) for m in logs] == [
        ("info", "Tool execution started"),
        ("info", "Tool processing data"),
        ("info", "Tool execution completed"),
    ]


@pytest.mark.parametrize("mode", ERAS)
async def test_progress_tool_reports_0_50_100_of_100(mode: str) -> None:
    seen: list[tuple[float, float | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total))

    async with Client(app, mode=mode) as client:
        await client.call_tool("test_tool_with_progress", {}, progress_handler=on_progress)
    assert seen == [(0, 100), (50, 100), (100, 100)]


@pytest.mark.parametrize("mode", ERAS)
async def test_sampling_tool_asks_the_client_llm_and_returns_its_answer(mode: str) -> None:
    asked: list[str] = []

    async def sample(messages: Any, params: Any, context: Any) -> CreateMessageResult:
        asked.append(messages[0].content.text)
        assert params.max_tokens == 100
        return CreateMessageResult(
            role="assistant",
            content=TextContent(type="text", text="a reply"),
            model="test-model",
        )

    async with Client(app, mode=mode, sampling_handler=sample) as client:
        result = await client.call_tool("test_sampling", {"prompt": "Say hi"})
    assert asked == ["Say hi"]
    assert result.content[0].text == "LLM response: a reply"


@pytest.mark.parametrize("mode", ERAS)
async def test_elicitation_tool_asks_for_username_and_email(mode: str) -> None:
    seen: list[dict[str, Any]] = []
    answer = {"username": "testuser", "email": "test@example.com"}
    async with Client(app, mode=mode, elicitation_handler=_elicit(answer, seen)) as client:
        result = await client.call_tool("test_elicitation", {"message": "Who are you?"})
    assert seen[0]["message"] == "Who are you?"
    schema = seen[0]["schema"]
    assert set(schema["required"]) == {"username", "email"}
    assert result.content[0].text == f"User response: action=accept, content={json.dumps(answer)}"


@pytest.mark.parametrize("mode", ERAS)
async def test_elicitation_decline_is_reported_not_raised(mode: str) -> None:
    seen: list[dict[str, Any]] = []
    async with Client(app, mode=mode, elicitation_handler=_elicit(None, seen)) as client:
        result = await client.call_tool("test_elicitation_sep1034_defaults", {})
    assert result.content[0].text == "Elicitation completed: action=decline, content=null"


@pytest.mark.parametrize("mode", ERAS)
async def test_sep1034_schema_carries_a_default_for_every_primitive_type(mode: str) -> None:
    seen: list[dict[str, Any]] = []
    answer = {"name": "Jane", "age": 25, "score": 88.0, "status": "inactive", "verified": False}
    async with Client(app, mode=mode, elicitation_handler=_elicit(answer, seen)) as client:
        result = await client.call_tool("test_elicitation_sep1034_defaults", {})
    props = seen[0]["schema"]["properties"]
    assert {k: (v["type"], v["default"]) for k, v in props.items()} == {
        "name": ("string", "John Doe"),
        "age": ("integer", 30),
        "score": ("number", 95.5),
        "status": ("string", "active"),
        "verified": ("boolean", True),
    }
    assert props["status"]["enum"] == ["active", "inactive", "pending"]
    assert "action=accept" in result.content[0].text and '"Jane"' in result.content[0].text


@pytest.mark.parametrize("mode", ERAS)
async def test_sep1330_schema_uses_each_of_the_five_enum_shapes(mode: str) -> None:
    seen: list[dict[str, Any]] = []
    answer = {
        "untitledSingle": "option1",
        "titledSingle": "value1",
        "legacyEnum": "opt1",
        "untitledMulti": ["option1", "option2"],
        "titledMulti": ["value1", "value2"],
    }
    async with Client(app, mode=mode, elicitation_handler=_elicit(answer, seen)) as client:
        result = await client.call_tool("test_elicitation_sep1330_enums", {})
    p = seen[0]["schema"]["properties"]
    assert p["untitledSingle"]["enum"] == ["option1", "option2", "option3"]
    assert "oneOf" not in p["untitledSingle"] and "enumNames" not in p["untitledSingle"]
    assert "enum" not in p["titledSingle"]
    assert all({"const", "title"} <= set(o) for o in p["titledSingle"]["oneOf"])
    assert len(p["legacyEnum"]["enumNames"]) == len(p["legacyEnum"]["enum"]) == 3
    assert p["untitledMulti"]["type"] == "array"
    assert p["untitledMulti"]["items"] == {
        "type": "string",
        "enum": ["option1", "option2", "option3"],
    }
    assert "enum" not in p["titledMulti"]["items"]
    assert all({"const", "title"} <= set(o) for o in p["titledMulti"]["items"]["anyOf"])
    assert "action=accept" in result.content[0].text


async def test_json_schema_2020_12_tool_advertises_its_schema_unchanged() -> None:
    async with Client(app) as client:
        tools = {t.name: t for t in await client.list_tools()}
        result = await client.call_tool(
            "json_schema_2020_12_tool", {"name": "Ada", "address": {"city": "London"}}
        )
    assert tools["json_schema_2020_12_tool"].input_schema == ADDRESS_SCHEMA
    assert result.content[0].text == "name=Ada; address=city=London"


async def test_reconnection_tool_answers_even_without_an_event_store() -> None:
    async with Client(app, mode="legacy") as client:
        result = await client.call_tool("test_reconnection", {})
    assert result.content[0].text == "Reconnection test completed successfully"


async def test_resources_read_as_text_binary_and_from_the_template() -> None:
    async with Client(app) as client:
        text = await client.read_resource("test://static-text")
        binary = await client.read_resource("test://static-binary")
        templated = await client.read_resource("test://template/123/data")
    assert text[0].text == "This is the content of the static text resource."
    assert text[0].mime_type == "text/plain"
    assert base64.b64decode(binary[0].blob) == PNG and binary[0].mime_type == "image/png"
    assert json.loads(templated[0].text) == {
        "id": "123",
        "templateTest": True,
        "data": "Data for ID: 123",
    }


async def test_prompts_substitute_arguments_and_embed_resources_and_images() -> None:
    async with Client(app) as client:
        simple = await client.get_prompt("test_simple_prompt")
        args = await client.get_prompt("test_prompt_with_arguments", {"arg1": "a", "arg2": "b"})
        embedded = await client.get_prompt(
            "test_prompt_with_embedded_resource", {"resourceUri": "test://example-resource"}
        )
        image = await client.get_prompt("test_prompt_with_image")
    assert simple.messages[0].content.text == "This is a simple prompt for testing."
    assert args.messages[0].content.text == "Prompt with arguments: arg1='a', arg2='b'"
    resource = embedded.messages[0].content
    assert resource.type == "resource" and str(resource.resource.uri) == "test://example-resource"
    assert isinstance(image.messages[0].content, ImageContent)
    assert image.messages[1].content.text == "Please analyze the image above."


async def test_completion_offers_prefix_matches_for_the_prompt_arguments() -> None:
    ref = PromptReference(type="ref/prompt", name="test_prompt_with_arguments")
    async with Client(app) as client:
        matches = await client.complete(ref, {"name": "arg1", "value": "par"})
        none = await client.complete(ref, {"name": "arg1", "value": "zzz"})
        other = await client.complete(
            PromptReference(type="ref/prompt", name="test_simple_prompt"),
            {"name": "x", "value": "p"},
        )
    assert matches.values == ["paris", "park", "party"]
    assert none.values == [] and other.values == []
