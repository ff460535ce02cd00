"""A FastMCP app whose one-time action leaves a side effect the tests can count.

Replicas load it as ``--app fleetkit.apps.onceapp:app``. ``charge`` asks one question,
then appends one line to the file named by ``$MCPFLEET_TEST_EFFECTS`` per run of
``finish`` (with ``O_APPEND``, so replicas in several processes never interleave
a line): the tests count side effects, not answers. ``charge_plain`` is the same
flow without ``once``. ``charge_slow`` marks ``start <order>`` when its
``finish`` begins, waits ``before`` seconds, charges, then waits ``after``
seconds before answering: a replica killed in either wait died between the
claim and the side effect, or between the side effect and the stored result.
``charge_receipt`` is ``charge`` whose result carries a receipt of ``size``
bytes: once-results that fill Redis.
"""

from __future__ import annotations

import asyncio
import os

from fastmcp import Context, FastMCP
from mcp_types import InputRequiredResult

from mcpfleet import Outcome, Question, ask_then, first_missing

EFFECTS_ENV = "MCPFLEET_TEST_EFFECTS"

app = FastMCP("mcpfleet-once-test")


def _effect(line: str) -> None:
    fd = os.open(os.environ[EFFECTS_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _finish(order: str, once: bool):  # type: ignore[no-untyped-def]
    def finish(outcome: Outcome) -> str:
        if not (outcome.done and outcome.answers["ok"]):
            return f"{order}: nothing charged"
        _effect(f"{order} once={once} pid={os.getpid()}")
        return f"{order}: charged"

    return finish


@app.tool
async def charge(order: str, ctx: Context) -> str | InputRequiredResult:
    """Charge an order once the user confirms (exactly once per flow)."""
    questions = first_missing([Question("ok", f"Charge {order}?", bool)])
    return await ask_then(ctx, questions, _finish(order, True), once=True)


@app.tool
async def charge_plain(order: str, ctx: Context) -> str | InputRequiredResult:
    """The same flow without ``once``: every replay of the final round charges again."""
    questions = first_missing([Question("ok", f"Charge {order}?", bool)])
    return await ask_then(ctx, questions, _finish(order, False))


@app.tool
async def charge_slow(
    order: str, ctx: Context, before: float = 0.0, after: float = 0.0
) -> str | InputRequiredResult:
    """``charge`` with waits around the side effect, for kills in between."""

    async def finish(outcome: Outcome) -> str:
        _effect(f"start {order}")
        await asyncio.sleep(before)
        _effect(f"{order} once=True pid={os.getpid()}")
        await asyncio.sleep(after)
        return f"{order}: charged"

    questions = first_missing([Question("ok", f"Charge {order}?", bool)])
    return await ask_then(ctx, questions, finish, once=True)


@app.tool
async def charge_receipt(order: str, size: int, ctx: Context) -> str | InputRequiredResult:
    """``charge`` whose result is ``size`` bytes longer (the ledger keeps it)."""

    def finish(outcome: Outcome) -> str:
        _effect(f"{order} once=True pid={os.getpid()}")
        return f"{order}: charged " + "r" * size

    questions = first_missing([Question("ok", f"Charge {order}?", bool)])
    return await ask_then(ctx, questions, finish, once=True)
