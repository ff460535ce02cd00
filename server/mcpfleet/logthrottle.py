"""When a repeated warning is due: at most once per window, per key.

A warning that can fire on every request (a refusal, a creation let through
unchecked, a task no replica had yet) would flood the log exactly when the
process is busiest. The limiter, the tasks engine's limits and the tasks
queue each log such a warning at most once a minute (per principal and limit
for the limiter) and count the rest in metrics; :class:`LogThrottle` is that
rule, in one place.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar

__all__ = ["LogThrottle"]

K = TypeVar("K", bound=Hashable)


class LogThrottle(Generic[K]):
    """Says whether a warning of ``key`` is due: the first one, and then one per
    ``window`` seconds (of ``clock``). Past ``max_keys`` remembered keys, those
    whose window has passed are forgotten before the next is remembered."""

    def __init__(
        self,
        window: float,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int | None = None,
    ) -> None:
        self.window = window
        self.clock = clock
        self.max_keys = max_keys
        self._last: dict[K, float] = {}

    def due(self, key: K, now: float | None = None) -> bool:
        """True (and the window of ``key`` starts at ``now``, else the clock's time) when
        ``key`` was never logged or its last log is ``window`` seconds old or more."""
        now = self.clock() if now is None else now
        last = self._last.get(key)
        if last is not None and now - last < self.window:
            return False
        if self.max_keys is not None and len(self._last) > self.max_keys:
            self._last = {k: t for k, t in self._last.items() if now - t < self.window}
        self._last[key] = now
        return True

    def recent(self, now: float | None = None) -> Iterator[K]:
        """The keys logged within the last ``window`` seconds (of ``now``, else the clock)."""
        now = self.clock() if now is None else now
        return (key for key, t in self._last.items() if now - t < self.window)
