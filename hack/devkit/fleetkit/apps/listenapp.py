"""A FastMCP app whose tools change what it lists, for the notification scenarios.

Replicas load it as ``--app fleetkit.apps.listenapp:app``. ``retool`` adds a
tool and says so the FastMCP way (``ctx.send_notification`` of a
``ToolListChangedNotification``: FastMCP 4.2 announces nothing by itself for
``add_tool``); ``touch`` publishes ``resources/updated`` for a URI with
mcpfleet's public API, as any app code would.
"""

from __future__ import annotations

from fastmcp import Context, FastMCP
from mcp_types import ToolListChangedNotification

from mcpfleet import publish_resource_updated

app = FastMCP("mcpfleet-listen-test")


@app.resource("memo://{name}")
def memo(name: str) -> str:
    """A memo by name."""
    return f"memo {name}"


@app.tool
async def retool(name: str, ctx: Context) -> str:
    """Add the tool ``name`` here and announce that the tool list changed."""

    def added() -> str:
        return name

    app.tool(added, name=name)
    await ctx.send_notification(ToolListChangedNotification())
    return f"added {name}"


@app.tool
async def touch(uri: str) -> bool:
    """Announce that the resource at ``uri`` changed; whether Redis took the event."""
    return await publish_resource_updated(uri)
