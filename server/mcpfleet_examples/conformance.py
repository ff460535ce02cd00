"""The conformance app: what the official MCP conformance suite's server scenarios call.

``@modelcontextprotocol/conformance`` (pinned in ``hack/conformance/``) tests a
server from outside: it calls tools, prompts and resources with fixed names
(``test_simple_text``, ``test_prompt_with_arguments``, ``test://static-text``,
...) and checks what comes back. This app implements every one of them, written
against FastMCP's public API only, so ``make conformance`` can ask one question
of the fleet: does anything a server does right directly go wrong through the
router?

It is also a second example of writing tools for the fleet: the tools that ask
the user for input (``test_elicitation``, ``test_elicitation_sep1034_defaults``,
``test_elicitation_sep1330_enums``) go through mcpfleet's guard API
(:func:`mcpfleet.ask_then`), so they serve both protocol eras from one
definition, and ``test_sampling`` shows the same two-era shape by hand for a
sampling request.

Run it with ``mcpfleet dev --app mcpfleet_examples.conformance:app``.

What the installed fastmcp does not offer, the replica runtime adds for any
app, and this app writes nothing for it (docs/notifications.md):

* ``resources/subscribe`` / ``resources/unsubscribe``: FastMCP has no public
  hook for them; the replica serves them (:mod:`mcpfleet.notify`);
* SSE polling (``test_reconnection``): ``ctx.close_sse_stream()`` closes the
  stream only when the HTTP app has an event store; a replica with Redis has
  one (in the fleet's Redis), so the stream closes, and the client resumes
  it with ``Last-Event-ID`` and gets the answer there. A standalone replica
  has none: the tool answers on the open stream.
"""

from __future__ import annotations

import asyncio
import io
import json
import struct
import warnings
import wave
import zlib
from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastmcp import Context, FastMCP
from fastmcp.exceptions import ToolError
from fastmcp.prompts import Message
from fastmcp.tools import Tool
from fastmcp.utilities.types import Audio, Image
from mcp.shared.exceptions import MCPDeprecationWarning
from mcp_types import (
    CompletionArgument,
    CompletionContext,
    CreateMessageRequest,
    CreateMessageRequestParams,
    CreateMessageResult,
    EmbeddedResource,
    ImageContent,
    InputRequiredResult,
    PromptReference,
    ResourceTemplateReference,
    SamplingMessage,
    TextContent,
    TextResourceContents,
)
from pydantic import BaseModel, Field

from mcpfleet import Outcome, Question, ask_then, first_missing, is_modern

app = FastMCP(
    "mcpfleet-conformance",
    instructions="The tools, prompts and resources the MCP conformance suite's server "
    "scenarios call. Not a product: a yardstick for the fleet.",
    # Advertise input schemas as written: FastMCP's default inlines ``$ref``s and
    # drops ``$defs``, which the JSON Schema 2020-12 scenario checks survive.
    dereference_schemas=False,
)


def _png_pixel() -> bytes:
    """A valid 1x1 red PNG, built here so the app carries no binary blobs."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)  # 1x1, 8-bit RGB
    pixels = zlib.compress(b"\x00\xff\x00\x00")  # filter byte + one red pixel
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    )


def _wav_silence() -> bytes:
    """A valid WAV file: 10 ms of 8 kHz mono silence."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(1)
        out.setframerate(8000)
        out.writeframes(b"\x80" * 80)
    return buf.getvalue()


PNG = _png_pixel()
WAV = _wav_silence()

# --- tools: content -------------------------------------------------------------------


@app.tool
def test_simple_text() -> str:
    """Returns one text block."""
    return "This is a simple text response for testing."


@app.tool
def test_image_content() -> Image:
    """Returns one image block (a 1x1 PNG)."""
    return Image(data=PNG, format="png")


@app.tool
def test_audio_content() -> Audio:
    """Returns one audio block (a short WAV)."""
    return Audio(data=WAV, format="wav")


@app.tool
def test_embedded_resource() -> EmbeddedResource:
    """Returns a resource embedded in the result."""
    return EmbeddedResource(
        type="resource",
        resource=TextResourceContents(
            uri="test://embedded-resource",
            mime_type="text/plain",
            text="This is an embedded resource content.",
        ),
    )


@app.tool
def test_multiple_content_types() -> list[TextContent | ImageContent | EmbeddedResource]:
    """Returns text, an image and an embedded resource in one result."""
    return [
        TextContent(type="text", text="Multiple content types test:"),
        Image(data=PNG, format="png").to_image_content(),
        EmbeddedResource(
            type="resource",
            resource=TextResourceContents(
                uri="test://mixed-content-resource",
                mime_type="application/json",
                text=json.dumps({"test": "data", "value": 123}),
            ),
        ),
    ]


@app.tool
def test_error_handling() -> str:
    """Always fails: the client sees ``isError: true`` and the message."""
    raise ToolError("This tool intentionally returns an error for testing")


# --- tools: notifications during a call -----------------------------------------------

#: The pause between notifications the suite asks for (~50 ms): long enough that
#: they leave as separate SSE events, short enough not to matter.
STEP_SECONDS = 0.05


async def _log(ctx: Context, message: str) -> None:
    """An info log notification; the suite tests the 2025 logging capability.

    mcp deprecates logging from 2026-07-28 on and warns on every message;
    the warning says nothing about this app, so it is not passed on.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MCPDeprecationWarning)
        await ctx.info(message)


@app.tool
async def test_tool_with_logging(ctx: Context) -> str:
    """Sends three info-level log notifications while it runs."""
    await _log(ctx, "Tool execution started")
    await asyncio.sleep(STEP_SECONDS)
    await _log(ctx, "Tool processing data")
    await asyncio.sleep(STEP_SECONDS)
    await _log(ctx, "Tool execution completed")
    return "Tool with logging executed successfully"


@app.tool
async def test_tool_with_progress(ctx: Context) -> str:
    """Reports progress 0, 50 and 100 of 100 (when the client sent a progress token)."""
    for step, progress in enumerate((0, 50, 100)):
        if step:
            await asyncio.sleep(STEP_SECONDS)
        await ctx.report_progress(progress, 100)
    return "Tool with progress executed successfully"


@app.tool
async def test_reconnection(ctx: Context) -> str:
    """Closes its SSE stream mid-call (SEP-1699) where the transport can, then answers."""
    await ctx.close_sse_stream()
    await asyncio.sleep(STEP_SECONDS)
    return "Reconnection test completed successfully"


# --- tools: asking the client ---------------------------------------------------------


@app.tool
async def test_sampling(prompt: str, ctx: Context) -> str | InputRequiredResult:
    """Asks the client's LLM to complete ``prompt`` and returns what it said.

    Handshake era: a ``sampling/createMessage`` request over the session's
    back-channel. Modern era: the same request as an ``InputRequiredResult``;
    the client calls again with the answer, on any replica.
    """
    request = CreateMessageRequestParams(
        messages=[SamplingMessage(role="user", content=TextContent(type="text", text=prompt))],
        max_tokens=100,
    )
    if is_modern(ctx):
        answer = (ctx.input_responses or {}).get("llm")
        if answer is None:
            return InputRequiredResult(input_requests={"llm": CreateMessageRequest(params=request)})
        if not isinstance(answer, CreateMessageResult):
            raise ToolError("expected a sampling result for 'llm'")
        return f"LLM response: {_text_of(answer)}"
    with warnings.catch_warnings():
        # Sampling is deprecated from 2026-07-28 on; this branch only runs on
        # handshake-era sessions, where it is current.
        warnings.simplefilter("ignore", MCPDeprecationWarning)
        result = await ctx.session.create_message(
            request.messages, max_tokens=request.max_tokens, related_request_id=ctx.request_id
        )
    return f"LLM response: {_text_of(result)}"


def _text_of(result: CreateMessageResult) -> str:
    content = result.content
    return content.text if isinstance(content, TextContent) else f"<{content.type}>"


class UserInfo(BaseModel):
    """What ``test_elicitation`` asks for."""

    username: str = Field(description="User's response")
    email: str = Field(description="User's email address")


class Profile(BaseModel):
    """SEP-1034: a default for every primitive type."""

    name: str = Field("John Doe", description="User name")
    age: int = Field(30, description="User age")
    score: float = Field(95.5, description="User score")
    status: Literal["active", "inactive", "pending"] = Field("active", description="User status")
    verified: bool = Field(True, description="Verification status")


def _titled(*pairs: tuple[str, str]) -> list[dict[str, str]]:
    return [{"const": const, "title": title} for const, title in pairs]


class EnumChoices(BaseModel):
    """SEP-1330: the five enum shapes an elicitation schema may use."""

    untitledSingle: Literal["option1", "option2", "option3"]
    titledSingle: Annotated[
        str,
        Field(
            json_schema_extra={
                "oneOf": _titled(
                    ("value1", "First Option"),
                    ("value2", "Second Option"),
                    ("value3", "Third Option"),
                )
            }
        ),
    ]
    legacyEnum: Annotated[
        Literal["opt1", "opt2", "opt3"],
        Field(json_schema_extra={"enumNames": ["Option One", "Option Two", "Option Three"]}),
    ]
    untitledMulti: list[Literal["option1", "option2", "option3"]]
    titledMulti: Annotated[
        list[str],
        Field(
            json_schema_extra={
                "items": {
                    "anyOf": _titled(
                        ("value1", "First Choice"),
                        ("value2", "Second Choice"),
                        ("value3", "Third Choice"),
                    )
                }
            }
        ),
    ]


@app.tool
async def test_elicitation(message: str, ctx: Context) -> str | InputRequiredResult:
    """Asks the user for a username and an email address, with ``message``."""

    def finish(outcome: Outcome) -> str:
        if not outcome.done:
            return f"User response: action={_action(outcome)}"
        return f"User response: action=accept, content={json.dumps(outcome.answers['user'])}"

    return await ask_then(ctx, first_missing([Question("user", message, UserInfo)]), finish)


@app.tool
async def test_elicitation_sep1034_defaults(ctx: Context) -> str | InputRequiredResult:
    """Asks for a profile whose every field carries a default (SEP-1034)."""
    question = Question("profile", "Please review your profile", Profile)
    return await ask_then(ctx, first_missing([question]), _completed("profile"))


@app.tool
async def test_elicitation_sep1330_enums(ctx: Context) -> str | InputRequiredResult:
    """Asks for five choices, one per enum schema shape (SEP-1330)."""
    question = Question("choices", "Please pick your options", EnumChoices)
    return await ask_then(ctx, first_missing([question]), _completed("choices"))


def _action(outcome: Outcome) -> str:
    return {"done": "accept", "declined": "decline", "cancelled": "cancel"}[outcome.status]


def _completed(key: str) -> Callable[[Outcome], str]:
    def finish(outcome: Outcome) -> str:
        content = outcome.answers.get(key) if outcome.done else None
        return f"Elicitation completed: action={_action(outcome)}, content={json.dumps(content)}"

    return finish


# --- a tool whose input schema uses JSON Schema 2020-12 keywords (SEP-1613) -----------

JSON_SCHEMA_2020_12 = "https://json-schema.org/draft/2020-12/schema"
ADDRESS_SCHEMA: dict[str, Any] = {
    "$schema": JSON_SCHEMA_2020_12,
    "type": "object",
    "$defs": {
        "address": {
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
        }
    },
    "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
    "additionalProperties": False,
}


def json_schema_2020_12_tool(name: str | None = None, address: dict[str, str] | None = None) -> str:
    """Echoes a name and an address; its advertised schema is hand-written 2020-12."""
    where = ", ".join(f"{k}={v}" for k, v in sorted((address or {}).items()))
    return f"name={name or ''}; address={where}"


# The function's own signature validates the arguments; the advertised schema is
# the hand-written one, which keeps the keywords (``$schema``, ``$defs``,
# ``additionalProperties``) a generated schema would not carry.
app.add_tool(
    Tool.from_function(
        json_schema_2020_12_tool,
        description="Tool with JSON Schema 2020-12 features",
    ).model_copy(update={"parameters": ADDRESS_SCHEMA})
)


# --- resources ------------------------------------------------------------------------


@app.resource("test://static-text", mime_type="text/plain", description="A static text resource")
def static_text() -> str:
    return "This is the content of the static text resource."


@app.resource("test://static-binary", mime_type="image/png", description="A static binary resource")
def static_binary() -> bytes:
    return PNG


@app.resource(
    "test://watched-resource",
    mime_type="text/plain",
    description="The resource the subscription scenarios watch",
)
def watched_resource() -> str:
    return "Watched resource content."


@app.resource(
    "test://template/{id}/data",
    mime_type="application/json",
    description="A resource template: the id is substituted into the data",
)
def template_data(id: str) -> str:
    return json.dumps({"id": id, "templateTest": True, "data": f"Data for ID: {id}"})


# --- prompts --------------------------------------------------------------------------


@app.prompt
def test_simple_prompt() -> str:
    """A prompt without arguments."""
    return "This is a simple prompt for testing."


@app.prompt
def test_prompt_with_arguments(
    arg1: Annotated[str, Field(description="First test argument")],
    arg2: Annotated[str, Field(description="Second test argument")],
) -> str:
    """A prompt whose text carries both arguments."""
    return f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'"


@app.prompt
def test_prompt_with_embedded_resource(
    resourceUri: Annotated[str, Field(description="URI of the resource to embed")],
) -> list[Message]:
    """A prompt that embeds the resource it is given."""
    resource = EmbeddedResource(
        type="resource",
        resource=TextResourceContents(
            uri=resourceUri, mime_type="text/plain", text="Embedded resource content for testing."
        ),
    )
    return [Message(resource), Message("Please process the embedded resource above.")]


@app.prompt
def test_prompt_with_image() -> list[Message]:
    """A prompt that carries an image."""
    return [
        Message(Image(data=PNG, format="png").to_image_content()),
        Message("Please analyze the image above."),
    ]


# --- completion -----------------------------------------------------------------------

#: Candidates for ``test_prompt_with_arguments``'s arguments, matched by prefix.
COMPLETIONS = ["paris", "park", "party", "test", "testing", "tested"]


@app.completion
def complete(
    ref: PromptReference | ResourceTemplateReference,
    argument: CompletionArgument,
    context: CompletionContext | None,
) -> list[str]:
    """Prefix matches for the prompt's arguments; nothing for anything else."""
    if isinstance(ref, PromptReference) and ref.name == "test_prompt_with_arguments":
        return [c for c in COMPLETIONS if c.startswith(argument.value)]
    return []
