"""A FastMCP app for stream and disconnect scenarios, served by replicas in tests.

Replicas load it as ``--app fleetkit.apps.streamapp:app`` (with ``hack/devkit`` on their
``PYTHONPATH``). Its tools hold their response stream open on purpose, or
answer as much text as asked (``blob``: text content only, no structured copy,
so the answer's size is the text's plus its JSON-RPC envelope).
"""

from __future__ import annotations

import asyncio

from fastmcp import Context, FastMCP
from fastmcp.tools.base import ToolResult
from mcp_types import TextContent

from fleetkit.apps.blobtext import blob_text

app = FastMCP("mcpfleet-stream-test")


@app.tool
async def ticker(count: int, interval: float, ctx: Context) -> str:
    """Report progress ``count`` times, ``interval`` seconds apart, then finish."""
    for i in range(1, count + 1):
        await ctx.report_progress(i, count, message=f"tick {i}")
        if i < count:
            await asyncio.sleep(interval)
    return f"ticked {count} times"


@app.tool
async def hold(seconds: float) -> str:
    """Hold the request open for ``seconds`` (a client may leave before)."""
    await asyncio.sleep(seconds)
    return "held"


@app.tool
async def confirm(ctx: Context) -> str:
    """Ask one yes/no question the handshake way."""
    result = await ctx.elicit("Proceed?", bool)
    return f"answer: {getattr(result, 'data', result.action)}"


@app.tool
async def blob(size: int, ctx: Context) -> ToolResult:
    """``size`` characters of text (:func:`fleetkit.apps.blobtext.blob_text`), after one
    progress notification to a request that asked for progress (its answer then
    comes as an SSE stream)."""
    await ctx.report_progress(0, 1)
    return ToolResult(content=[TextContent(type="text", text=blob_text(size))])
