"""``mcpfleet dev`` behaves like a Deployment: what dies comes back, and says so."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fleetkit.clients.wire import initialize_body, modern_call
from fleetkit.fleet import require_redis
from mcpfleet.dev.fleet import mcpfleet_argv
from mcpfleet.dev.ports import free_port
from mcpfleet.dev.wait import wait_for


class Dev:
    """A running ``mcpfleet dev`` and everything it printed."""

    def __init__(self, workdir: Path, port: int, *args: str) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            mcpfleet_argv("dev", "--port", str(port), "--workdir", str(workdir), *args),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.url = f"http://127.0.0.1:{port}/mcp"

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())

    def said(self, pattern: str) -> re.Match[str] | None:
        return next((m for line in self.lines if (m := re.search(pattern, line))), None)

    def wait_said(self, pattern: str, timeout: float) -> re.Match[str]:
        wait_for(
            lambda: self.said(pattern) is not None,
            timeout=timeout,
            what=f"`mcpfleet dev` to print /{pattern}/",
            retry_on=(Exception,),
        )
        found = self.said(pattern)
        assert found is not None
        return found


@contextlib.contextmanager
def running_dev(workdir: Path, *args: str) -> Iterator[Dev]:
    """``mcpfleet dev ARGS`` until the block ends; its output printed at the end."""
    running = Dev(workdir, free_port(), *args)
    try:
        yield running
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(running.proc.pid, signal.SIGINT)
        try:
            running.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(running.proc.pid, signal.SIGKILL)
            running.proc.wait(10)
        running.reader.join(10)
        assert running.proc.stdout is not None
        running.proc.stdout.close()
        print("\n".join(running.lines[-60:]))


@pytest.fixture
def dev(tmp_path: Path) -> Iterator[Dev]:
    require_redis()
    with running_dev(tmp_path / "dev") as running:
        yield running


def _pids(match: str) -> list[int]:
    """Pids of processes whose command line contains ``match``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
                if match.encode() in cmdline:
                    found.append(int(entry))
    return found


def _serving(url: str) -> int:
    return int(httpx.get(url.replace("/mcp", "/readyz"), timeout=2).json()["serving"])


@pytest.mark.timeout(180)
def test_dev_restarts_a_killed_replica_and_redis_and_keeps_answering(dev: Dev) -> None:
    dev.wait_said(r"behind the router at", 90)
    redis_port = dev.wait_said(r"redis redis://127\.0\.0\.1:(\d+)/0", 5).group(1)
    workdir = str(Path(dev.said(r"logs in (\S+)").group(1)))  # type: ignore[union-attr]
    wait_for(
        lambda: _serving(dev.url) == 3, timeout=30, what="3 serving replicas", retry_on=(Exception,)
    )

    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
    opened = httpx.post(dev.url, content=initialize_body("dev-chaos"), headers=headers, timeout=10)
    session, owner = opened.headers["mcp-session-id"], opened.headers["x-mcpfleet-replica"]

    keys = f"{workdir}/keys --redis redis://127.0.0.1:{redis_port}/0"
    (replica,) = _pids(f"--keys {keys} --name {owner} ")
    (redis,) = _pids(f"redis-server 127.0.0.1:{redis_port}")
    os.kill(replica, signal.SIGKILL)
    os.kill(redis, signal.SIGKILL)

    answered = [
        modern_call(dev.url, "confirm_purchase", {"item": "pen", "amount_eur": 2}).status
        for _ in range(10)
    ]
    assert answered == [200] * 10, "the other replicas answer while one is down"
    ping = json.dumps({"jsonrpc": "2.0", "id": 2, "method": "ping"})
    gone = httpx.post(dev.url, content=ping, headers={**headers, "mcp-session-id": session})
    assert gone.status_code == 404, "the killed owner's session is gone: the client re-initializes"
    reopened = httpx.post(dev.url, content=initialize_body("again"), headers=headers, timeout=10)
    assert reopened.status_code == 200, "a new session opens at once"

    dev.wait_said(rf"{owner} exited \(status -9\)", 10)
    dev.wait_said(r"redis-server exited", 10)
    dev.wait_said(rf"{owner} restarted on port \d+", 30)
    dev.wait_said(r"redis-server restarted, empty", 30)
    wait_for(
        lambda: _serving(dev.url) == 3,
        timeout=60,
        what="all 3 replicas serving again",
        retry_on=(Exception,),
    )
    assert dev.proc.poll() is None, "the fleet stayed up"
    again = modern_call(dev.url, "confirm_purchase", {"item": "tea", "amount_eur": 3})
    assert again.status == 200


@pytest.mark.timeout(120)
def test_dev_passes_the_limit_flags_given_to_it_to_every_replica(tmp_path: Path) -> None:
    """`mcpfleet dev --limit-rounds 1 --limit-burst 3`: each replica runs with both
    flags, and one client's burst of ten rounds is refused past about three (the
    replicas' defaults, 50/s with a burst of 100, would serve all ten)."""
    require_redis()
    with running_dev(
        tmp_path / "dev", "--replicas", "2", "--limit-rounds", "1", "--limit-burst", "3"
    ) as dev:
        dev.wait_said(r"behind the router at", 90)
        replicas = _pids(f"--keys {tmp_path / 'dev'}/keys ")
        assert len(replicas) == 2
        for pid in replicas:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            assert b"--limit-rounds=1.0" in argv and b"--limit-burst=3" in argv, argv
        with httpx.Client(timeout=10) as client:
            answers = [
                modern_call(
                    dev.url, "confirm_purchase", {"item": "pen", "amount_eur": 2}, client=client
                )
                for _ in range(10)
            ]
        statuses = [a.status for a in answers]
        # The burst of 3 (and what 1/s refills while the ten are sent) is served, no more.
        assert statuses[0] == 200 and 429 in statuses, statuses
        assert statuses.count(200) <= 5, statuses
        refused = next(a for a in answers if a.status == 429)
        assert "rounds" in json.dumps(refused.body), refused.body
