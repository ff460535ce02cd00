"""Ports for the local fleet's processes, none handed out twice while it may be in use.

:func:`free_port` asks the kernel for a port free a moment ago (a bind to port
0) and hands it to a process that binds it only later: a replica a second or
more after it starts, a Redis restarted on the port it had before. A second
asker in that gap, in this process or in another (the test tiers' parallel
workers, a second ``mcpfleet dev``, a fleet beside the tests), could be given
the same port by the kernel, and one of the two processes would then fail to
bind. So every port handed out is recorded in one file per user in the
temporary directory, read and written under an exclusive lock, and is not
handed out again by any process for :data:`HOLD_SECONDS`.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import os
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

#: How long a port handed out stays reserved for whoever it was given to:
#: longer than a fleet of the fleet tier lives, short enough that the file
#: holds a few thousand ports at most (of the kernel's ~28,000).
HOLD_SECONDS = 1800.0

#: Ports handed out lately in this process: what holds them when the shared
#: file cannot be opened (a read-only temporary directory).
_GIVEN: collections.deque[int] = collections.deque(maxlen=512)


def registry_file() -> Path:
    """The file of ports handed out lately, one per user (ports are per machine)."""
    return Path(tempfile.gettempdir()) / f"mcpfleet-ports-{os.getuid()}"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free a moment ago, handed out by no process of this user lately."""
    with _held() as held:
        while True:
            port = _kernel_port(host)
            if port not in held and port not in _GIVEN:
                held[port] = time.time() + HOLD_SECONDS
                _GIVEN.append(port)
                return port


def _kernel_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def _held() -> Iterator[dict[int, float]]:
    """The ports still held (port -> until, Unix time), locked; written back on exit."""
    try:
        fh = registry_file().open("a+")
    except OSError:
        yield {}
        return
    with fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        held = _read(fh)
        yield held
        fh.seek(0)
        fh.truncate()
        fh.write("".join(f"{port} {int(until)}\n" for port, until in held.items()))


def _read(fh: IO[str]) -> dict[int, float]:
    """The entries not yet expired; a line that does not parse is dropped."""
    fh.seek(0)
    now = time.time()
    held: dict[int, float] = {}
    for line in fh:
        with contextlib.suppress(ValueError):
            port, until = line.split()
            if now < float(until) <= now + HOLD_SECONDS:
                held[int(port)] = float(until)
    return held
