"""What a principal refused under a limit is told, and its refusals logged once a window.

A :class:`Refusal` carries the limit, the time to retry after and the message
the client reads; :class:`Refusals` makes them for a rate (rounds, of every
tool or of one) and for a cap (sessions, listen streams), logs a principal's
first refusal under a limit in each :data:`LOG_WINDOW` and counts the
principals refused lately (a metric). Counting each refusal is the caller's:
it knows the bounded label of the tool.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from mcpfleet.limits._rules import Rate
from mcpfleet.logthrottle import LogThrottle

__all__ = ["LOG_WINDOW", "Refusal", "Refusals"]

log = logging.getLogger("mcpfleet.limits")

#: Seconds within which one principal's refusals are logged once.
LOG_WINDOW: Final = 60.0


@dataclass(frozen=True)
class Refusal:
    """A request refused under ``limit``: what the client is told.

    ``principal_wide``: every request of the principal is refused until
    ``retry_after`` (its own rate, not a tool's, not a cap that ends when
    something it holds ends): what may be refused from memory by credential
    (:mod:`mcpfleet.limits._refusals`).
    """

    limit: str
    retry_after: float
    message: str
    principal_wide: bool = False

    @property
    def retry_seconds(self) -> int:
        """``Retry-After`` as HTTP states it: whole seconds, at least 1."""
        return max(1, math.ceil(self.retry_after))


class Refusals:
    """The refusals of one limiter: made, logged once a window per principal, counted."""

    def __init__(self, clock: Callable[[], float], *, max_keys: int) -> None:
        self.clock = clock
        self._logged = LogThrottle[tuple[str, str]](LOG_WINDOW, max_keys=max_keys)

    def over_rate(
        self,
        limit: str,
        principal: str,
        wait: float,
        rate: Rate,
        tool: str | None,
        *,
        wide: bool = False,
    ) -> Refusal:
        """``principal`` over ``rate`` (``tool``'s, unless ``wide``): retry in ``wait``."""
        scope = f" of tool {tool!r}" if tool and not wide else ""
        message = (
            f"Rate limited: rounds{scope} over {rate.rate:g}/s (burst {rate.effective_burst()})"
            f" for this principal; retry after {max(1, math.ceil(wait))} s"
        )
        self._note(limit, principal, tool or "")
        return Refusal(limit, wait, message, principal_wide=wide)

    def at_cap(self, limit: str, principal: str, cap: int, wait: float) -> Refusal:
        """``principal`` holds ``cap`` of ``limit`` already: retry in ``wait``."""
        message = (
            f"Limit reached: {cap} {limit} held by this principal; end one, or retry after"
            f" {max(1, math.ceil(wait))} s"
        )
        self._note(limit, principal, "")
        return Refusal(limit, wait, message)

    def _note(self, limit: str, principal: str, tool: str) -> None:
        """Log the first refusal of ``principal`` in a window (counting is the caller's:
        it knows the bounded label of ``tool``)."""
        if self._logged.due((limit, principal), now=self.clock()):
            log.warning(
                "limit %s: principal %s refused; its refusals in the next %.0f s are counted,"
                " not logged",
                limit,
                principal,
                LOG_WINDOW,
            )

    def recent(self, limit: str, now: float | None = None) -> int:
        """Principals refused under ``limit`` within the last :data:`LOG_WINDOW` seconds."""
        now = self.clock() if now is None else now
        return sum(1 for name, _ in self._logged.recent(now) if name == limit)
