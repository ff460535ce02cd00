"""A call to the task store answering within a deadline, else an MCP error saying so.

The engine's Redis client reads without a timeout (its blocking reads need
it): a stalled Redis would hold a request forever. :func:`bounded` wraps the
engine's calls a request waits on (a task's creation, ``tasks/get``,
``tasks/update``, ``tasks/cancel``: :mod:`._engine_hooks`).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR

T = TypeVar("T")

#: Set on a call :func:`bounded` made.
_BOUNDED = "_mcpfleet_bounded"


def bounded(
    call: Callable[..., Awaitable[T]], deadline: float, what: str
) -> Callable[..., Awaitable[T]]:
    """``call`` answering within ``deadline`` seconds, else an MCP error saying so."""

    @functools.wraps(call)
    async def within(*args: Any, **kwargs: Any) -> T:
        try:
            async with asyncio.timeout(deadline):
                return await call(*args, **kwargs)
        except TimeoutError:
            raise MCPError(
                code=INTERNAL_ERROR,
                message=(
                    f"The task store did not answer within {deadline:g} s; the outcome of "
                    f"{what} is unknown: retry tasks/get"
                ),
            ) from None

    setattr(within, _BOUNDED, True)
    return within
