"""Polling until a condition holds: the one wait helper of the local fleet and the test rigs."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(TimeoutError):
    """A condition did not hold within its timeout; the message names what was awaited."""


def wait_for(
    condition: Callable[[], T | None],
    *,
    timeout: float,
    what: str = "condition",
    interval: float = 0.05,
    retry_on: tuple[type[BaseException], ...] = (),
) -> T:
    """Poll ``condition`` until it returns something truthy, and return that value.

    An exception from ``condition`` propagates at once (a condition that sees
    the awaited thing can never happen, say a process that exited, raises),
    unless it is one of ``retry_on``: those count as "not yet" (a server not
    listening yet), and the last one is chained to the :class:`WaitTimeout`.
    """
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            result = condition()
        except retry_on as exc:
            last = exc
        else:
            if result:
                return result
        if time.monotonic() >= deadline:
            detail = f" (last: {type(last).__name__}: {last})" if last is not None else ""
            raise WaitTimeout(
                f"timed out after {timeout:.1f}s waiting for {what}{detail}"
            ) from last
        time.sleep(interval)
