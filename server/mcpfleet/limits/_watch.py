"""The limits file, read again when it changes: limits change without a restart.

A ConfigMap mounted as a volume is a directory of symlinks through ``..data``
that the kubelet swaps at once; the file is polled (its resolved target's
identity, size and modification time) every :data:`POLL_INTERVAL` seconds,
which sees both that swap and an edit in place. A file that cannot be read or
parsed never replaces the rules in force: the error is logged once per change.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Final

from mcpfleet.limits._rules import LimitRules, RulesError, load_rules

__all__ = ["POLL_INTERVAL", "RulesWatcher"]

log = logging.getLogger("mcpfleet.limits")

#: Seconds between two looks at the limits file.
POLL_INTERVAL: Final = 2.0


class RulesWatcher:
    """Keeps ``apply`` fed with the rules of ``path`` over ``base`` (the flags')."""

    def __init__(
        self,
        path: Path,
        base: LimitRules,
        apply: Callable[[LimitRules], None],
        *,
        interval: float = POLL_INTERVAL,
    ) -> None:
        self.path = path
        self.base = base
        self.apply = apply
        self.interval = interval
        self._seen: tuple[int, int, int, int] | None = None
        #: What the last successful read put in force (None before one).
        self.rules: LimitRules | None = None

    def _identity(self) -> tuple[int, int, int, int] | None:
        try:
            st = os.stat(self.path)  # follows the ..data symlinks
        except OSError:
            return None
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def check(self) -> bool:
        """Read the file if it changed since the last look; True if new rules went in force."""
        seen = self._identity()
        if seen == self._seen:
            return False
        self._seen = seen
        try:
            rules = load_rules(self.path, self.base)
        except RulesError as e:
            log.error("limits: %s; the limits in force are kept", e)
            return False
        if rules == self.rules:
            return False
        self.rules = rules
        self.apply(rules)
        log.info("limits: %s read; in force now", self.path)
        return True

    async def run(self) -> None:
        """Look every :attr:`interval` seconds, until cancelled."""
        while True:
            await asyncio.sleep(self.interval)
            self.check()
