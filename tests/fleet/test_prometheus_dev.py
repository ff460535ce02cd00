"""``mcpfleet dev`` starts Debian's Prometheus next to the fleet, or says it cannot and runs on."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetkit import monitoring
from fleetkit.fleet import require_redis
from mcpfleet.dev.ports import free_port
from mcpfleet.dev.wait import wait_for

DEV = [sys.executable, "-m", "mcpfleet.cli", "dev", "--replicas", "1"]


class Dev:
    """``mcpfleet dev`` as a child process, its output collected line by line."""

    def __init__(self, workdir: Path, env: dict[str, str]) -> None:
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [*DEV, "--port", str(free_port()), "--workdir", str(workdir)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_line(self, pattern: str, timeout: float = 90) -> re.Match[str]:
        found: list[re.Match[str]] = []

        def seen() -> bool:
            if self.proc.poll() is not None and not found:
                raise AssertionError("mcpfleet dev exited:\n" + "\n".join(self.lines))
            found.extend(m for line in list(self.lines) if (m := re.search(pattern, line)))
            return bool(found)

        try:
            wait_for(
                seen,
                timeout=timeout,
                what=f"mcpfleet dev to print {pattern!r}",
                interval=0.1,
                retry_on=(Exception,),
            )
        except Exception:
            print("\n".join(self.lines))
            raise
        return found[0]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            code = self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(5)
        self._reader.join(5)
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        return code


def _env(path: str | None = None) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if path is not None:
        env["PATH"] = path
    return env


@pytest.fixture
def dev_dir(tmp_path: Path) -> Iterator[Path]:
    require_redis()
    yield tmp_path / "dev"


def test_dev_starts_prometheus_scraping_the_fleet_with_the_rules_loaded(dev_dir: Path) -> None:
    monitoring.require_binary("prometheus")
    dev = Dev(dev_dir, _env())
    try:
        m = dev.wait_line(
            r"prometheus (http://127\.0\.0\.1:\d+) scraping (\d+) processes, alert rules loaded"
        )
        url, processes = m.group(1), int(m.group(2))
        assert processes == 2, "one replica and one router"
        graph = dev.wait_line(r"asking vs final rounds: (\S+)").group(1)
        assert graph.startswith(url + "/graph?g0.expr=") and "mcpfleet_rounds_total" in graph

        def targets_up() -> bool:
            with urllib.request.urlopen(url + "/api/v1/targets", timeout=5) as resp:
                active = json.loads(resp.read())["data"]["activeTargets"]
            return sum(t["health"] == "up" for t in active) == 2

        wait_for(
            targets_up,
            timeout=60,
            what="Prometheus to scrape the replica and the router",
            retry_on=(Exception,),
        )
        with urllib.request.urlopen(url + "/api/v1/rules", timeout=5) as resp:
            groups = json.loads(resp.read())["data"]["groups"]
        names = {r["name"] for g in groups for r in g["rules"]}
        assert names == {a.name for a in monitoring.alerts()}
    finally:
        code = dev.stop()
    assert code == 0, "\n".join(dev.lines)
    with pytest.raises(OSError):
        urllib.request.urlopen(url + "/-/ready", timeout=2)  # stopped with the fleet


def test_dev_without_prometheus_says_so_and_runs_on(dev_dir: Path, tmp_path: Path) -> None:
    # A PATH with redis-server and nothing else: no prometheus to be found.
    only = tmp_path / "bin"
    only.mkdir()
    redis = shutil.which("redis-server")
    assert redis is not None
    (only / "redis-server").symlink_to(redis)
    dev = Dev(dev_dir, _env(str(only)))
    try:
        dev.wait_line(r"prometheus not found \(apt-get install prometheus\): running without")
        dev.wait_line(r"try: mcpfleet demo --url")
        assert dev.proc.poll() is None, "the fleet runs on"
    finally:
        code = dev.stop()
    assert code == 0, "\n".join(dev.lines)
