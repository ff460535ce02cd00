"""A FastMCP app written against mcpfleet's public API only (nothing from ``example``).

Replicas load it as ``--app fleetkit.apps.publicapp:app``. Its answer keys are the
very names mcpfleet's request-state envelope uses (``v``, ``answers``,
``pending``) and the old reserved ``_pending``, to prove they are the tool's own.
"""

from __future__ import annotations

from fastmcp import Context, FastMCP
from mcp_types import InputRequiredResult

from mcpfleet import Outcome, Question, ask_then, first_missing

app = FastMCP("mcpfleet-public-api-test")

QUESTIONS = [
    Question("v", "Which version to release?", str),
    Question("answers", "How many reviewers signed off?", int),
    Question("pending", "Anything still pending?", bool),
    Question("_pending", "Release now?", bool),
]


@app.tool
async def release(project: str, ctx: Context) -> str | InputRequiredResult:
    """Release a project after four questions."""

    async def finish(outcome: Outcome) -> str:
        if not outcome.done:
            return f"release {outcome.status} at {outcome.key}"
        a = outcome.answers
        verdict = "released" if a["_pending"] and not a["pending"] else "held"
        return f"{project} {a['v']} {verdict} with {a['answers']} sign-offs"

    return await ask_then(ctx, first_missing(QUESTIONS), finish)
