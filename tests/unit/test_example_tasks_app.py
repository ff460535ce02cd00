"""The example app with MCP tasks (mcpfleet_examples.tasks), alone, on FastMCP's own engine.

On the fleet the e2e tier serves it from the tasks image (tests/e2e/test_tasks_node_lost.py);
here it runs in memory, on the engine's in-process queue, where the [tasks]
extra is installed (``make test-tasks``).
"""

from __future__ import annotations

import asyncio
import re
import socket
import time

import pytest
from fastmcp import Client
from fastmcp.exceptions import ToolError

pytest.importorskip("fastmcp_tasks", reason="the [tasks] extra: make venv-tasks, make test-tasks")

from fastmcp_tasks.client import call_tool_task

from mcpfleet_examples.tasks import app

pytestmark = [pytest.mark.unit, pytest.mark.tasks]


async def test_a_report_runs_as_a_task_naming_its_host_in_each_step_and_its_result() -> None:
    host = socket.gethostname()
    seen: list[str] = []
    async with Client(app) as client:
        task = await call_tool_task(
            client, "build_report", {"topic": "q3", "steps": 3, "step_seconds": 0.2}
        )
        deadline = time.monotonic() + 20
        while (status := await task.status()).status == "working":
            assert time.monotonic() < deadline, f"still working after 20 s: {seen}"
            if status.status_message and status.status_message not in seen:
                seen.append(status.status_message)
            await asyncio.sleep(0.05)
        assert status.status == "completed", status
        result = await task.result()
    assert result.structured_content == {"topic": "q3", "steps": 3, "built_by": host}
    assert seen, "no step was reported"
    assert all(re.fullmatch(rf"step [123]/3 on {re.escape(host)}", m) for m in seen), seen


async def test_a_report_of_no_steps_is_refused() -> None:
    async with Client(app) as client:
        with pytest.raises(ToolError):
            await client.call_tool("build_report", {"topic": "q3", "steps": 0})
