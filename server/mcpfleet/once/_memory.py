"""The in-process ledger: one process's claims and results, in memory."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from mcpfleet.once._ledger import Confirmed, LedgerFull, Record


class MemoryLedger:
    """A process's own ledger (standalone replicas, in-memory clients, tests).

    Bounded: expired entries are pruned on every claim, and at ``capacity`` live
    entries a new claim is refused (:class:`LedgerFull`) rather than an old one
    evicted, which would let its flow run again. Its claimer is this process,
    alive by definition.
    """

    def __init__(
        self, capacity: int = 100_000, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.capacity = capacity
        self._clock = clock
        self._entries: dict[str, tuple[float, Record]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def _live(self, flow: str) -> Record | None:
        entry = self._entries.get(flow)
        if entry is None:
            return None
        expires, record = entry
        if expires <= self._clock():
            del self._entries[flow]
            return None
        return record

    async def claim(self, flow: str, record: Record, lease: float) -> Record | None:
        held = self._live(flow)
        if held is not None:
            return held
        if len(self._entries) >= self.capacity:
            now = self._clock()
            for key in [k for k, (exp, _) in self._entries.items() if exp <= now]:
                del self._entries[key]
            if len(self._entries) >= self.capacity:
                raise LedgerFull(f"the in-process ledger is full ({self.capacity} flows)")
        self._entries[flow] = (self._clock() + lease, record)
        return None

    async def confirm(self, flow: str, mine: Record, lifetime: float, replied: float) -> Confirmed:
        held, confirmed = self._live(flow), replace(mine, finishing=True)
        if held is None:
            return Confirmed.GONE
        if held not in (mine, confirmed):
            return Confirmed.LOST
        self._entries[flow] = (self._clock() + lifetime, confirmed)
        return Confirmed.YES

    async def store(self, flow: str, record: Record, lifetime: float) -> None:
        if self._live(flow) is not None:
            self._entries[flow] = (self._clock() + lifetime, record)

    async def release(self, flow: str, mine: Record) -> bool:
        if self._live(flow) in (mine, replace(mine, finishing=True)):
            del self._entries[flow]
            return True
        return False

    async def get(self, flow: str) -> Record | None:
        return self._live(flow)

    async def alive(self, replica: str, boot: str) -> bool:
        return True
