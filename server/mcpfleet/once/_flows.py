"""An app's once-flows: the ledger they use, their settings, and their writes under way.

Everything a once-flow needs between rounds and after its answer is held by
one :class:`OnceFlows` attached to the FastMCP app: :func:`install_ledger`
attaches one (``mcpfleet serve`` does), and an app nobody configured gets its
own in-process ledger on first use. Nothing is kept in module globals, so two
apps (or two tests) never share a ledger, a pending release or a background
write.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Final

from fastmcp import FastMCP

from mcpfleet.once._errors import OnceMiddleware
from mcpfleet.once._ledger import Ledger, OnceOutcome, Record, boot_of
from mcpfleet.once._memory import MemoryLedger

#: Stored results larger than this (bytes of JSON) are not kept; a replay says so.
DEFAULT_RESULT_LIMIT: Final = 64 * 1024
#: How long a replay waits for a racing claimer's result before the retryable error.
DEFAULT_WAIT: Final = 5.0
#: The token TTL where no replica runtime told it.
DEFAULT_TTL: Final = 600.0

#: The attribute of the app that holds its :class:`OnceFlows`.
_ATTR = "_mcpfleet_once_ledger"
#: The name of every background task of a once-flow (the running loop's tasks
#: carry it, so :func:`settle` finds them without a registry of its own).
_TASK_NAME = "mcpfleet.once"


@dataclass
class Release:
    """A claim a round may have made without knowing it, to take back."""

    flow: str
    mine: Record
    give_up: float
    #: Since when Redis has answered without the claim being there.
    answered_since: float | None = None


@dataclass
class OnceFlows:
    """One app's once-flows: its ledger and settings, and the work they leave running."""

    ledger: Ledger
    #: The token TTL of this replica (seconds): a flow started here ends this long after.
    token_ttl: float
    replica: str
    observe: Callable[[OnceOutcome], None] | None
    result_limit: int
    wait: float
    boot: str = ""
    #: Claims to take back (by claim token), and the one task that does it for all.
    releases: dict[str, Release] = field(default_factory=dict)
    releaser: asyncio.Task[None] | None = None
    #: Background ledger writes under way: held so that none is collected before it ran.
    background: set[asyncio.Task[None]] = field(default_factory=set)

    def seen(self, outcome: OnceOutcome) -> None:
        """Tell the observer (the replica's metrics) what the ledger said."""
        if self.observe is not None:
            self.observe(outcome)

    def start(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``coro`` in the background, held until it is done (:func:`settle` waits)."""
        task = asyncio.get_running_loop().create_task(coro, name=_TASK_NAME)
        self.background.add(task)
        task.add_done_callback(self.background.discard)
        return task


def install_ledger(
    app: FastMCP[Any],
    ledger: Ledger,
    *,
    token_ttl: float,
    replica: str = "",
    observe: Callable[[OnceOutcome], None] | None = None,
    result_limit: int = DEFAULT_RESULT_LIMIT,
    wait: float = DEFAULT_WAIT,
    boot: str | float = "",
) -> None:
    """Make ``app``'s once-flows use ``ledger``; flows started here end ``token_ttl`` later.

    ``boot`` is this replica's incarnation (its attestation's ``started``): a
    replay elsewhere tells from it that this process died mid-``finish``. The
    background writes of a ledger installed before stay held with the new one.
    """
    if token_ttl <= 0:
        raise ValueError(f"token_ttl must be positive, got {token_ttl}")
    incarnation = boot_of(boot) if isinstance(boot, float) else boot
    flows = OnceFlows(ledger, token_ttl, replica, observe, result_limit, wait, incarnation)
    before = getattr(app, _ATTR, None)
    if isinstance(before, OnceFlows):
        flows.background = before.background
    setattr(app, _ATTR, flows)
    if not any(isinstance(mw, OnceMiddleware) for mw in app.middleware):
        app.add_middleware(OnceMiddleware())


def flows_of(app: FastMCP[Any]) -> OnceFlows:
    """``app``'s once-flows; an app no replica runtime configured gets an in-process ledger."""
    flows = getattr(app, _ATTR, None)
    if isinstance(flows, OnceFlows):
        return flows
    flows = OnceFlows(MemoryLedger(), DEFAULT_TTL, "", None, DEFAULT_RESULT_LIMIT, DEFAULT_WAIT)
    setattr(app, _ATTR, flows)
    return flows


def ledger_for(app: FastMCP[Any]) -> Ledger:
    """The ledger ``app``'s once-flows use (its own in-process one unless one was installed)."""
    return flows_of(app).ledger


def flow_end(app: FastMCP[Any], now: float | None = None) -> float:
    """The end (wall clock) of a once-flow whose first round ``app`` serves now."""
    return (time.time() if now is None else now) + flows_of(app).token_ttl


async def settle() -> None:
    """Wait until every result this process is storing has been stored (or failed to).

    The background writes are the running loop's tasks named for once-flows,
    whichever app started them.
    """
    while True:
        current = asyncio.current_task()
        pending = [
            t for t in asyncio.all_tasks() if t.get_name() == _TASK_NAME and t is not current
        ]
        if not pending:
            return
        await asyncio.gather(*pending, return_exceptions=True)
