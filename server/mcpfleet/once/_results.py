"""What the ledger keeps of a final round's result, and how a replay answers with it."""

from __future__ import annotations

import json
from typing import Any

from fastmcp.tools.base import ToolResult
from mcp_types import ContentBlock, TextContent
from pydantic import TypeAdapter

from mcpfleet.once._ledger import ONCE_META_KEY

_CONTENT = TypeAdapter(list[ContentBlock])


def dump(result: ToolResult) -> dict[str, Any]:
    """``result``'s wire fields, as JSON data."""
    return {
        "content": [block.model_dump(mode="json", by_alias=True) for block in result.content],
        "structured_content": result.structured_content,
        "meta": result.meta,
        "is_error": result.is_error,
    }


def restored(stored: dict[str, Any]) -> ToolResult:
    """The ``ToolResult`` :func:`dump` kept."""
    return ToolResult(
        content=_CONTENT.validate_python(stored.get("content") or []),
        structured_content=stored.get("structured_content"),
        meta=stored.get("meta"),
        is_error=bool(stored.get("is_error")),
    )


def marked(result: ToolResult) -> ToolResult:
    """``result`` as a replay: the stored answer, said so in its ``_meta``."""
    meta = dict(result.meta or {})
    meta[ONCE_META_KEY] = {"replayed": True}
    return ToolResult(
        content=result.content,
        structured_content=result.structured_content,
        meta=meta,
        is_error=result.is_error,
    )


def error_result(message: str) -> ToolResult:
    """A replay's answer when no result was kept: an error result, marked as a replay."""
    return ToolResult(
        content=[TextContent(type="text", text=message)],
        meta={ONCE_META_KEY: {"replayed": True}},
        is_error=True,
    )


def storable(value: Any) -> dict[str, Any] | None:
    """What the ledger keeps of ``finish``'s value without converting it, if it can.

    JSON data (a ``str`` above all) is kept as is: a replay converts it with the
    tool, exactly as FastMCP converted the original, so the final round pays
    no conversion of its own. A ``ToolResult`` is kept as its wire fields.
    """
    if isinstance(value, ToolResult):
        return {"tool_result": dump(value)}
    if isinstance(value, str | int | float | bool) or value is None:
        return {"raw": value}
    if isinstance(value, list | dict):
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            return None
        return {"raw": value}
    return None
