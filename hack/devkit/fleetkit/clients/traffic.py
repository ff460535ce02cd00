"""Traffic under load: users that call the demo's tools round after round until stopped.

Every scenario that changes a fleet while it serves (a rotation, a drain, a
rolling update, a Redis failover or outage) runs the same users: a modern
user connects once and calls a tool round after round, checking each answer;
a handshake user plans one meeting per session, session after session. Each
round counts as done (with its label and when it finished) or failed (with
what went wrong); a user whose connection failed connects again.
:class:`Traffic` holds the users, their counts, and the stop signal.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from mcpfleet.fleetclient import Trace, connect


@dataclass(frozen=True)
class Round:
    """One round a user completed: its label and ``time.monotonic()`` when it did."""

    label: str
    at: float


class Traffic:
    """Users started with :meth:`modern` and :meth:`handshake`, stopped by :meth:`stop`."""

    def __init__(self) -> None:
        self.stopping = asyncio.Event()
        self.rounds: list[Round] = []
        self.failures: list[str] = []
        self.failed: Counter[str] = Counter()
        self._tasks: list[asyncio.Task[None]] = []

    def done(self, label: str | None = None) -> int:
        """Rounds completed (with ``label`` only, if given)."""
        if label is None:
            return len(self.rounds)
        return sum(1 for r in self.rounds if r.label == label)

    def labels(self) -> set[str]:
        return {r.label for r in self.rounds}

    def _ok(self, label: str) -> None:
        self.rounds.append(Round(label, time.monotonic()))

    def _fail(self, kind: str, message: str) -> None:
        self.failed[kind] += 1
        self.failures.append(f"{kind}: {message}")

    def _start(self, user: Coroutine[Any, Any, None]) -> None:
        self._tasks.append(asyncio.create_task(user))

    def modern(
        self,
        url: str,
        tool: str,
        args: dict[str, Any],
        expect: str,
        *,
        kind: str = "modern",
        label: Callable[[], str] | None = None,
        timeout: float | None = None,
    ) -> None:
        """A modern user calling ``tool(args)``, each answer starting with ``expect``.

        A round is labelled ``label()`` (the ring's phase, say) or ``kind``; a
        wrong answer or an error is a failure of ``kind``, after which the user
        connects again.
        """
        extra: dict[str, Any] = {} if timeout is None else {"timeout": timeout}

        async def user() -> None:
            while not self.stopping.is_set():
                try:
                    async with connect(url, "modern", **extra) as client:
                        while not self.stopping.is_set():
                            result = await client.call_tool(tool, args)
                            text = str(result.data)
                            if not text.startswith(expect):
                                self._fail(kind, f"{tool} answered {text!r}")
                                continue
                            self._ok(label() if label else kind)
                except Exception as exc:  # any failed round is a failure of the scenario
                    self._fail(kind, f"{type(exc).__name__}: {exc}")

        self._start(user())

    def handshake(
        self, url: str, prefix: str, *, kind: str = "handshake", one_replica: bool = False
    ) -> None:
        """A handshake user planning meetings ``{prefix}-1``, ``{prefix}-2``, ... one per session.

        Each plan must name its topic, after all three questions were asked;
        with ``one_replica``, every request of a session must reach one replica.
        """

        async def user() -> None:
            i = 0
            while not self.stopping.is_set():
                i += 1
                topic = f"{prefix}-{i}"
                try:
                    trace = Trace()
                    async with connect(url, "handshake", trace) as client:
                        result = await client.call_tool("plan_meeting", {"topic": topic})
                    text = str(result.data)
                    answers = [r for r in trace.rounds if r.rpc == "response"]
                    replicas = trace.replicas()
                    if not text.startswith(f"Planned '{topic}'"):
                        self._fail(kind, f"plan_meeting answered {text!r}")
                    elif len(answers) != 3:
                        self._fail(kind, f"{topic}: {len(answers)} questions answered, not 3")
                    elif one_replica and len(replicas) != 1:
                        self._fail(kind, f"{topic} reached several replicas: {replicas}")
                    else:
                        self._ok(kind)
                except Exception as exc:
                    self._fail(kind, f"{type(exc).__name__}: {exc}")

        self._start(user())

    async def progress(self, rounds: int, *, timeout: float = 60, what: str = "traffic") -> None:
        """Wait until ``rounds`` more rounds complete; fail, naming ``what``, if they stall."""
        target = len(self.rounds) + rounds
        deadline = time.monotonic() + timeout
        while len(self.rounds) < target and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert len(self.rounds) >= target, (
            f"{what} stalled at {len(self.rounds)} rounds: {self.failures[:3]}"
        )

    async def stop(self) -> None:
        """Tell every user to stop; wait until each has."""
        self.stopping.set()
        await asyncio.gather(*self._tasks)


@asynccontextmanager
async def traffic() -> AsyncIterator[Traffic]:
    """A :class:`Traffic` whose users are stopped (and awaited) on the way out."""
    load = Traffic()
    try:
        yield load
    finally:
        await load.stop()
