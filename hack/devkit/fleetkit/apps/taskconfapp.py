"""What the conformance suite's ``tasks-*`` scenarios call, on FastMCP's tasks engine, unchanged.

The pre-release suite pinned in ``hack/conformance/tasks/`` tests SEP-2663 (the
extension ``io.modelcontextprotocol/tasks``) from outside, on the 2026-07-28
era, calling tools of fixed names. Each scenario's description lists the
fixtures it needs (``tools/list`` MUST include them); this app has every one,
written as an author writes for the engine (``@app.tool(task=...)`` and
``TasksExtension()``), so ``fleetkit.conformance.tasks`` asks one question:
does a scenario that passes against one replica give the same result through
the fleet?

* ``greet``: sync only, ``Hello, {name}!``;
* ``slow_compute``: a task (optional: synchronous for a client that did not
  declare the extension), ``seconds`` of sleep, then its ``label``; cancelled
  while it sleeps, the engine records ``cancelled``;
* ``failing_job``: a task only (``required``), a tool execution error after
  about 1 s (the task completes with ``isError``);
* ``protocol_error_job``: a task that raises an MCP error (the engine fails the
  task: ``failed`` with the error inlined);
* ``confirm_delete``: a task that asks one question (``elicitation/create``)
  by returning an ``InputRequiredResult`` (the guard pattern), then answers;
* ``multi_input``: a task that asks two questions at once, so a client can
  answer them one ``tasks/update`` at a time;
* ``test_tool_with_task``: a task only (``required``) that asks for a
  ``user_name`` and answers with it. The scenario wants the question asked
  synchronously (a plain MRTR round, no task) and the task created only on the
  answered call; the engine creates a task for every call of a task tool, so
  the question is asked from inside the task (docs/tasks.md says why that
  scenario fails, direct and through the fleet alike).

Replicas load it as ``--app fleetkit.apps.taskconfapp:app`` (the [tasks] extra:
``make venv-tasks``); the fleet replaces its ``TasksExtension`` with one on the
fleet's queue.
"""

from __future__ import annotations

import asyncio

from fastmcp import Context, FastMCP
from fastmcp.exceptions import ToolError
from fastmcp.utilities.tasks import TaskConfig
from fastmcp_tasks import TasksExtension
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INTERNAL_ERROR,
    CreateMessageRequest,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitResult,
    InputRequiredResult,
    ListRootsRequest,
)

app = FastMCP(
    "mcpfleet-tasks-conformance",
    instructions="The tools the MCP conformance suite's tasks-* scenarios call. Not a "
    "product: a yardstick for the fleet.",
)
app.add_extension(TasksExtension())

REQUIRED = TaskConfig(mode="required")


def _ask(message: str, properties: dict[str, object]) -> ElicitRequest:
    schema = {"type": "object", "properties": properties, "required": list(properties)}
    return ElicitRequest(params=ElicitRequestFormParams(message=message, requested_schema=schema))


def _accepted(answer: object) -> dict[str, object] | None:
    """The content of an accepted elicitation answer, else ``None``."""
    if isinstance(answer, ElicitResult) and answer.action == "accept":
        return dict(answer.content or {})
    return None


@app.tool
def greet(name: str) -> str:
    """Greets ``name`` (sync only: never a task)."""
    return f"Hello, {name}!"


@app.tool(task=True)
async def slow_compute(seconds: float = 0.0, label: str = "") -> str:
    """Sleeps ``seconds``, then answers with ``label`` (a task for a client that declared tasks)."""
    await asyncio.sleep(seconds)
    return f"computed {label or 'result'} after {seconds:g} s"


@app.tool(task=REQUIRED)
async def failing_job() -> str:
    """Fails as a tool (the task completes with ``isError``) after about 1 s; only as a task."""
    await asyncio.sleep(1.0)
    raise ToolError("failing_job failed on purpose")


@app.tool(task=True)
async def protocol_error_job() -> str:
    """Raises an MCP error: the engine fails the task (``failed``, the error inlined)."""
    raise MCPError(code=INTERNAL_ERROR, message="protocol_error_job failed on purpose")


@app.tool(task=True)
async def confirm_delete(filename: str, ctx: Context) -> str | InputRequiredResult:
    """Asks whether to delete ``filename`` (one question), then says what it did."""
    answer = (ctx.input_responses or {}).get("confirm")
    if answer is None:
        ask = _ask(f"Delete {filename}?", {"confirm": {"type": "boolean"}})
        return InputRequiredResult(input_requests={"confirm": ask})
    content = _accepted(answer)
    if content is not None and content.get("confirm"):
        return f"Deleted {filename}"
    return f"Kept {filename}"


@app.tool(task=True)
async def multi_input(ctx: Context) -> str | InputRequiredResult:
    """Asks two questions at once; answers once both are answered."""
    answers = ctx.input_responses or {}
    missing: dict[str, ElicitRequest | CreateMessageRequest | ListRootsRequest] = {
        key: _ask(message, {"name": {"type": "string"}, "confirm": {"type": "boolean"}})
        for key, message in (("first", "First input?"), ("second", "Second input?"))
        if key not in answers
    }
    if missing:
        return InputRequiredResult(input_requests=missing)
    names = [str((_accepted(answers[key]) or {}).get("name", "")) for key in ("first", "second")]
    return f"got {', '.join(names)}"


@app.tool(task=REQUIRED)
async def test_tool_with_task(ctx: Context) -> str | InputRequiredResult:
    """Asks for a ``user_name``, then answers with it (only as a task)."""
    answer = (ctx.input_responses or {}).get("user_name")
    content = _accepted(answer)
    if content is None:
        ask = _ask("Your name?", {"name": {"type": "string"}})
        return InputRequiredResult(input_requests={"user_name": ask})
    return f"Hello, {content.get('name', '')}! (gathered before the task)"
