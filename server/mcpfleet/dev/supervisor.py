"""``mcpfleet dev`` keeps its fleet up the way a Deployment would.

A replica that exits (killed, crashed, or drained to the end) is started
again under its name, after a back-off that doubles while it keeps dying and
resets once it stays up; a router that exits is started again on its port (the
URL users hold); a ``redis-server`` that dies is started again, empty, on its
port, and the replicas and routers write back what they know. Each step is
said on the console. So ``make run`` is also a place to try chaos by hand.

The decision (what is due, when) is :func:`due`, a pure function; the
:class:`Supervisor` around it only observes processes and starts them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

from mcpfleet.dev.fleet import LocalFleet, Proc
from mcpfleet.dev.wait import wait_for

#: First and longest wait before restarting something that exited.
BACKOFF_FIRST = 0.5
BACKOFF_MAX = 10.0
#: Up this long since its last start, a process's back-off starts over.
STABLE_AFTER = 10.0


@dataclass
class Restarts:
    """What the supervisor remembers of one supervised process."""

    started: float = 0.0
    backoff: float = BACKOFF_FIRST
    #: When the exit was first seen (None while it runs).
    exited_at: float | None = None


def due(record: Restarts, alive: bool, now: float) -> tuple[bool, Restarts]:
    """Whether to restart now, and the record afterwards (pure).

    A running process that has stayed up :data:`STABLE_AFTER` seconds has its
    back-off reset. An exited one is restarted once its back-off has passed
    since the exit was seen; the next back-off doubles, up to the maximum.
    """
    if alive:
        if record.exited_at is None and now - record.started >= STABLE_AFTER:
            return False, Restarts(record.started, BACKOFF_FIRST, None)
        return False, record
    exited_at = record.exited_at if record.exited_at is not None else now
    if now - exited_at < record.backoff:
        return False, Restarts(record.started, record.backoff, exited_at)
    return True, Restarts(now, min(record.backoff * 2, BACKOFF_MAX), None)


@dataclass
class Supervisor:
    """Restarts what exited in a :class:`LocalFleet`, saying so through ``say``."""

    fleet: LocalFleet
    say: Callable[[str], None]
    records: dict[str, Restarts] = field(default_factory=dict)

    def tick(self, now: float) -> None:
        """Look at every process once; restart what is due."""
        redis = self.fleet.redis
        if redis is not None:
            self._check("redis-server", redis, now, self._restart_redis)
        for name, member in list(self.fleet.members.items()):
            self._check(name, member.proc, now, functools.partial(self._restart_replica, name))
        for index, proc in enumerate(list(self.fleet.router_procs)):
            self._check(proc.name, proc, now, functools.partial(self._restart_router, index))

    def _check(self, name: str, proc: Proc, now: float, restart: Callable[[], str]) -> None:
        record = self.records.get(name) or Restarts(started=now)
        was_running = record.exited_at is None
        go, record = due(record, proc.alive, now)
        if not proc.alive and was_running and not go:
            code = proc.popen.returncode if proc.popen is not None else None
            self.say(f"{name} exited (status {code}); restarting in {record.backoff:.1f}s")
        if go:
            if was_running:  # exited and due in the same tick (no back-off left)
                code = proc.popen.returncode if proc.popen is not None else None
                self.say(f"{name} exited (status {code}); restarting now")
            try:
                self.say(restart())
            except Exception as exc:  # the next tick tries again, after the back-off
                self.say(f"{name}: restart failed: {type(exc).__name__}: {exc}")
        self.records[name] = record

    def _restart_redis(self) -> str:
        self.fleet.start_redis()
        return (
            f"redis-server restarted, empty, on port {self.fleet.redis_port}; "
            "replicas re-register and routers write their sessions back"
        )

    def _restart_replica(self, name: str) -> str:
        member = self.fleet.add_replica(name, wait=False)
        return (
            f"{name} restarted on port {member.port} "
            "(its sessions are gone: their clients get 404 and re-initialize)"
        )

    def _restart_router(self, index: int) -> str:
        proc = self.fleet.router_procs[index]
        proc.start(self.fleet.env())
        port = self.fleet.router_ports[index]
        wait_for(lambda: _listening(port), timeout=30, what=f"router-{index} to listen")
        return f"router-{index} restarted on port {port}"


def _listening(port: int) -> bool:
    import socket

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False
