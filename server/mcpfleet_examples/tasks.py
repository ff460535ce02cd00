"""An example app with MCP tasks (SEP-2663): a long report, built on any replica.

It is written as FastMCP's tasks engine wants an app, unchanged: it registers
``TasksExtension()`` and marks its long tool ``task=True``; ``mcpfleet serve``
replaces the extension with one on the fleet's shared queue (docs/tasks.md).
It needs the ``[tasks]`` extra, so it runs in the image made for it
(``make image-tasks``: ``localhost/mcpfleet:<version>-tasks``), in
``.venv-tasks``, or wherever ``pip install 'mcpfleet[tasks]'`` resolved:

    mcpfleet serve --app mcpfleet_examples.tasks:app --redis redis://...
    helm install mcp charts/mcpfleet --set server.app=mcpfleet_examples.tasks:app \\
        --set server.image.tag=0.1.0-tasks

``build_report`` works through ``steps`` steps of ``step_seconds`` each and
reports each one as the task's status message (``tasks/get`` shows ``step
3/10 on <host>``), then answers a structured report naming the host that
finished it. On the fleet the host is the replica's Pod, so a client sees
which replica runs its task, and which finished it after a replica was lost
(delivery is at least once: a task whose replica died starts again from its
first step on another one). It has no side effect, so running it twice is
harmless; a tool with side effects must make them idempotent.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Annotated

from fastmcp import Context, FastMCP
from fastmcp_tasks import TasksExtension
from pydantic import BaseModel, Field

app = FastMCP(
    "mcpfleet-example-tasks",
    instructions="Long-running tools as MCP tasks: create one, then poll tasks/get for it.",
)
# The engine's own queue when the app runs alone (fastmcp run); on the fleet,
# mcpfleet serve puts one on the fleet's Redis in its place.
app.add_extension(TasksExtension())


class Report(BaseModel):
    """What ``build_report`` answers."""

    topic: str
    steps: int
    #: The host (on the fleet: the replica's Pod) whose worker ran the last step.
    built_by: str


@app.tool(task=True)
async def build_report(
    topic: Annotated[str, Field(min_length=1, max_length=120)],
    ctx: Context,
    steps: Annotated[int, Field(ge=1, le=1000)] = 10,
    step_seconds: Annotated[float, Field(ge=0, le=60)] = 1.0,
) -> Report:
    """Build a report on ``topic`` in ``steps`` steps of ``step_seconds`` each (a task)."""
    host = socket.gethostname()
    for step in range(1, steps + 1):
        await ctx.report_progress(step - 1, steps, f"step {step}/{steps} on {host}")
        await asyncio.sleep(step_seconds)
    return Report(topic=topic, steps=steps, built_by=host)
