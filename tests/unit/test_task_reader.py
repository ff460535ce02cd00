"""A read of a task racing its ``tasks/update``: a listen stream's (mcpfleet.tasks.TaskReader)
and a client's ``tasks/get`` on a fleet's replica (mcpfleet.tasks.read_task).

The engine's ``tasks/get`` reads the task's current leg, then whether that leg
still has questions outstanding. A ``tasks/update`` that lands between the two
moves the task to its next leg and clears the answered leg's questions, so the
read finds a leg that ended with nothing outstanding: a task ``completed`` with
no result. This runs FastMCP's own engine in memory and lands the update in that
window, every time.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from fastmcp import Context, FastMCP

pytest.importorskip("fastmcp_tasks", reason="the [tasks] extra: make venv-tasks, make test-tasks")

from fastmcp import Client
from fastmcp_tasks import TasksExtension, handlers
from fastmcp_tasks.client import call_tool_task
from mcp_types import ElicitRequest, ElicitRequestFormParams, ElicitResult, InputRequiredResult

from mcpfleet.tasks import FleetQueue, TaskReader, wire_tasks
from mcpfleet.tasks._engine_hooks import ENGINE_HOOKS

pytestmark = [pytest.mark.unit, pytest.mark.tasks]


def _app() -> FastMCP[Any]:
    app = FastMCP("reader")
    app.add_extension(TasksExtension())

    @app.tool(task=True)
    async def confirm(tag: str, ctx: Context) -> str | InputRequiredResult:
        answer = (ctx.input_responses or {}).get("ok")
        if answer is None:
            schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}}
            ask = ElicitRequestFormParams(message=f"Go on with {tag}?", requested_schema=schema)
            return InputRequiredResult(input_requests={"ok": ElicitRequest(params=ask)})
        assert isinstance(answer, ElicitResult)
        return f"{tag}: confirmed"

    return app


async def _asked(app: FastMCP[Any], task_id: str) -> str:
    """The surfaced key of the task's question, once it asks."""
    deadline = time.monotonic() + 20
    while True:
        got = await handlers.tasks_get(app, task_id)
        if got.status == "input_required" and got.input_requests:
            (key,) = got.input_requests
            return str(key)
        assert time.monotonic() < deadline, got
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("reader", ["listen stream", "client's tasks/get"])
async def test_an_update_that_lands_inside_a_read_never_reads_as_completed_without_a_result(
    monkeypatch: pytest.MonkeyPatch, reader: str
) -> None:
    app = _app()
    if reader == "client's tasks/get":  # on a replica: the fleet's extension and engine hooks
        wire_tasks(app, FleetQueue("mcpfleet:t:tasks", "memory://", None, "r0", 5, 2))
    try:
        async with Client(app) as client:
            task = await call_tool_task(client, "confirm", {"tag": "heard"})
            task_id = task.task_id
            key = await _asked(app, task_id)
            answer = {key: {"action": "accept", "content": {"ok": True}}}
            read_outstanding = handlers.read_outstanding_inputs
            landed: list[bool] = []

            async def update_lands_first(*args: Any, **kwargs: Any) -> Any:
                if not landed:
                    landed.append(True)
                    await handlers.tasks_update(app, task_id, answer)
                return await read_outstanding(*args, **kwargs)

            monkeypatch.setattr(handlers, "read_outstanding_inputs", update_lands_first)
            if reader == "listen stream":
                detail = await TaskReader(app, deadline=10).detail(task_id)
                assert detail is not None
                status = detail["status"]
                structured = detail.get("result", {}).get("structuredContent")
            else:
                got = await task.status()
                status = got.status
                structured = (got.result or {}).get("structuredContent")
            monkeypatch.setattr(handlers, "read_outstanding_inputs", read_outstanding)
            assert landed, "the update did not land inside the read"
            if status == "completed":
                assert structured == {"result": "heard: confirmed"}, status
            else:
                assert status == "working", status
            result = await task.result()
            assert result.structured_content == {"result": "heard: confirmed"}
    finally:
        ENGINE_HOOKS.detach()
