"""The two-round guard tool :mod:`benchkit.roundcost` times, as plain FastMCP and as mcpfleet.

``plain`` is a FastMCP app with nothing of mcpfleet's: its ``confirm`` asks one
yes/no question the way a FastMCP author writes it by hand (an
``InputRequiredResult`` with the elicitation schema built once, the answer read
from ``ctx.input_responses``). ``fleet()`` builds the same tool with
:func:`mcpfleet.ask_then`, twice: ``confirm`` and ``confirm_once``
(``once=True``); ``mcpfleet serve --app benchkit.roundapp:fleet`` runs it. Both
apps answer the same arguments with the same text, so the two servers do the
same work apart from what mcpfleet adds.
"""

from __future__ import annotations

import json
from typing import Any

from fastmcp import Context, FastMCP
from fastmcp.server.elicitation import parse_elicit_response_type
from mcp_types import ElicitRequest, ElicitRequestFormParams, ElicitResult, InputRequiredResult

TOOL, ONCE_TOOL = "confirm", "confirm_once"
ARGS: dict[str, Any] = {"item": "tea", "amount_eur": 2}

plain = FastMCP("roundcost-plain")
_SCHEMA = parse_elicit_response_type(bool).schema


def _question(item: str, amount_eur: float) -> str:
    return f"Buy {item} for EUR {amount_eur:.2f}?"


def _answer(item: str, amount_eur: float, ok: bool) -> str:
    if not ok:
        return f"Purchase of {item} not confirmed; nothing was charged."
    return f"Purchased {item} for EUR {amount_eur:.2f}."


@plain.tool(name=TOOL)
async def plain_confirm(item: str, amount_eur: float, ctx: Context) -> str | InputRequiredResult:
    """Ask the user to confirm a purchase before it is made."""
    responses = ctx.input_responses
    if ctx.request_state is not None and responses and "ok" in responses:
        pending = json.loads(ctx.request_state)["pending"]
        result = responses[pending]
        if not isinstance(result, ElicitResult) or result.action != "accept":
            return "Purchase cancelled."
        content = result.content or {}
        return _answer(item, amount_eur, content.get("value") is True)
    request = ElicitRequest(
        params=ElicitRequestFormParams(
            message=_question(item, amount_eur), requested_schema=_SCHEMA
        )
    )
    return InputRequiredResult(input_requests={"ok": request}, request_state='{"pending":"ok"}')


def fleet() -> FastMCP[Any]:
    """The same tool written with :func:`mcpfleet.ask_then`, without and with ``once``."""
    from mcpfleet import Outcome, Question, ask_then, first_missing

    app = FastMCP("roundcost-fleet")

    def finish(item: str, amount_eur: float):  # type: ignore[no-untyped-def]
        def done(outcome: Outcome) -> str:
            if not outcome.done:
                return "Purchase cancelled."
            return _answer(item, amount_eur, outcome.answers["ok"] is True)

        return done

    @app.tool(name=TOOL)
    async def confirm(item: str, amount_eur: float, ctx: Context) -> str | InputRequiredResult:
        """Ask the user to confirm a purchase before it is made."""
        flow = first_missing([Question("ok", _question(item, amount_eur), bool)])
        return await ask_then(ctx, flow, finish(item, amount_eur))

    @app.tool(name=ONCE_TOOL)
    async def confirm_once(item: str, amount_eur: float, ctx: Context) -> str | InputRequiredResult:
        """The same, once per flow across the fleet."""
        flow = first_missing([Question("ok", _question(item, amount_eur), bool)])
        return await ask_then(ctx, flow, finish(item, amount_eur), once=True)

    return app
