"""A FastMCP app for the router's fault tests: slow tools that count what they did.

Replicas load it as ``--app fleetkit.apps.faultapp:app``. Every line goes to the file
named by ``$MCPFLEET_TEST_EFFECTS`` (``O_APPEND``: replicas in several processes
never interleave a line), as ``<order> <event> pid=<pid> at=<time.time()>``:

* ``effect``: the side effect ran (a plain tool at its start, a once-flow in
  ``finish`` before it waits); a request the router re-sent shows two;
* ``cancelled``: the tool saw its request cancelled (the client went away);
* ``done``: the tool finished its wait and answered.

``slow_effect`` is a plain tool; ``slow_charge`` is a ``once=True`` flow whose
``finish`` is slow. Both eras.
"""

from __future__ import annotations

import asyncio
import os
import time

from fastmcp import Context, FastMCP
from mcp_types import InputRequiredResult

from mcpfleet import Outcome, Question, ask_then, first_missing

EFFECTS_ENV = "MCPFLEET_TEST_EFFECTS"

app = FastMCP("mcpfleet-fault-test")


def record(order: str, event: str) -> None:
    fd = os.open(os.environ[EFFECTS_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{order} {event} pid={os.getpid()} at={time.time():.4f}\n".encode())
    finally:
        os.close(fd)


async def _hold(order: str, seconds: float) -> None:
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        record(order, "cancelled")
        raise
    record(order, "done")


@app.tool
async def slow_effect(order: str, seconds: float) -> str:
    """Run the side effect, then hold the request open for ``seconds``."""
    record(order, "effect")
    await _hold(order, seconds)
    return f"{order}: done"


@app.tool
async def slow_charge(order: str, seconds: float, ctx: Context) -> str | InputRequiredResult:
    """A once-flow: asks, then its ``finish`` charges and holds for ``seconds``."""

    async def finish(outcome: Outcome) -> str:
        if not (outcome.done and outcome.answers["ok"]):
            return f"{order}: nothing charged"
        record(order, "effect")
        await _hold(order, seconds)
        return f"{order}: charged"

    questions = first_missing([Question("ok", f"Charge {order}?", bool)])
    return await ask_then(ctx, questions, finish, once=True)
