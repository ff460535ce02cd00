"""How a final round that cannot be served is answered: retryable, or outcome unknown."""

from __future__ import annotations

from typing import Any, Final

from fastmcp.exceptions import ToolError
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from fastmcp.server.middleware.middleware import _dispatch_phase
from fastmcp.tools.base import ToolResult
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolRequestParams

from mcpfleet.once._ledger import OnceOutcome

#: The JSON-RPC error code of :class:`FlowUnavailable` (implementation-defined range).
RETRY_CODE: Final = -32000
#: The JSON-RPC error code of :class:`FlowOutcomeUnknown`: not retryable.
OUTCOME_UNKNOWN_CODE: Final = -32001

UNAVAILABLE: Final = (
    "This action cannot be confirmed right now (the fleet's ledger is unavailable); "
    "nothing was done. Send the same request again."
)
FULL: Final = (
    "This action cannot be confirmed right now (the fleet's ledger is full); "
    "nothing was done. Send the same request again later."
)
PENDING: Final = (
    "This action is being completed by another request; send the same request again "
    "to get its result."
)
UNKNOWN: Final = (
    "The outcome of this action is unknown: the server completing it stopped before it "
    "could record the result. It will not be run again; check whether it took effect "
    "before starting it anew."
)


class FlowUnavailable(ToolError):
    """The final round of a once-flow cannot be served now; the client may send it again.

    Raised before ``finish`` runs (nothing happened). :class:`OnceMiddleware`
    (installed by ``mcpfleet serve``) turns it into a JSON-RPC error with code
    :data:`RETRY_CODE` and ``data = {"retryable": true, "retryAfterSeconds": 1,
    "reason": ...}`` (``unavailable``, ``full`` or ``pending``); without it,
    FastMCP answers it as a tool error with the same message.
    """

    def __init__(self, message: str, reason: OnceOutcome) -> None:
        super().__init__(message)
        self.reason = reason


class FlowOutcomeUnknown(ToolError):
    """The flow's ``finish`` started on a replica that died before storing its result.

    The fleet cannot know whether the side effect happened, and never runs it
    again: answered as a JSON-RPC error with code :data:`OUTCOME_UNKNOWN_CODE`
    and ``data = {"retryable": false, "reason": "unknown"}``; the user checks
    (their order history, say) before starting a new flow.
    """


class OnceMiddleware(Middleware):
    """Answers :class:`FlowUnavailable` and :class:`FlowOutcomeUnknown` as JSON-RPC errors."""

    async def __call__(self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]) -> Any:
        # A tool call's pass (FastMCP's "all" phase, or "typed") goes to the one hook
        # this middleware has: the base class would build the on_message and
        # on_request pass-throughs around it first, three coroutines and their
        # closures on every round. Any other message takes the base class's way.
        if context.method == "tools/call" and _dispatch_phase.get() != "outer":
            return await self.on_call_tool(context, call_next)
        return await super().__call__(context, call_next)

    async def on_call_tool(
        self,
        context: MiddlewareContext[CallToolRequestParams],
        call_next: CallNext[CallToolRequestParams, ToolResult],
    ) -> ToolResult:
        try:
            return await call_next(context)
        except FlowUnavailable as exc:
            data = {"retryable": True, "retryAfterSeconds": 1, "reason": exc.reason.value}
            raise MCPError(RETRY_CODE, str(exc), data) from None
        except FlowOutcomeUnknown as exc:
            data = {"retryable": False, "reason": OnceOutcome.UNKNOWN.value}
            raise MCPError(OUTCOME_UNKNOWN_CODE, str(exc), data) from None
