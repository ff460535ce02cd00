"""A FastMCP app for stream and disconnect scenarios, served by replicas in tests.

Replicas load it as ``--app fleetkit.streamapp:app`` (with ``tests/`` on their
``PYTHONPATH``). Its tools hold their response stream open on purpose.
"""

from __future__ import annotations

import asyncio

from fastmcp import Context, FastMCP

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
