"""mcpfleet.dev.ports: a port handed out is not handed out again, by any process, while held."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcpfleet.dev import ports

ASKS = 400


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The registry file of this test alone (the real one stays untouched)."""
    path = tmp_path / "ports"
    monkeypatch.setattr(ports, "registry_file", lambda: path)
    return path


def kernel_gives(monkeypatch: pytest.MonkeyPatch, given: list[int]) -> None:
    """Make the kernel's bind to port 0 answer ``given``, in order."""
    answers: Iterator[int] = iter(given)
    monkeypatch.setattr(ports, "_kernel_port", lambda host: next(answers))


def test_two_processes_asking_at_once_are_never_given_the_same_port(tmp_path: Path) -> None:
    # 400 ports each out of the kernel's ~14,000 for a bind to port 0: without the
    # shared file, the two would be given some dozen ports alike.
    script = textwrap.dedent(
        f"""
        from mcpfleet.dev.ports import free_port
        print(" ".join(str(free_port()) for _ in range({ASKS})))
        """
    )
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    procs = [
        subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    first, second = ({int(p) for p in out.split()} for out in outs)
    assert len(first) == len(second) == ASKS
    assert first.isdisjoint(second)
    (registry,) = tmp_path.glob("mcpfleet-ports-*")
    assert {int(line.split()[0]) for line in registry.read_text().splitlines()} == first | second


def test_a_port_held_by_another_process_is_skipped(
    registry: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry.write_text(f"40001 {time.time() + 60:.0f}\n")
    kernel_gives(monkeypatch, [40001, 40003])
    assert ports.free_port() == 40003
    held = dict(line.split() for line in registry.read_text().splitlines())
    assert set(held) == {"40001", "40003"}
    assert float(held["40003"]) == pytest.approx(time.time() + ports.HOLD_SECONDS, abs=5)


def test_a_port_is_given_again_once_its_hold_ran_out(
    registry: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = time.time()
    registry.write_text(
        f"40005 {now - 1:.0f}\n"  # ran out
        f"40007 {now + 2 * ports.HOLD_SECONDS:.0f}\n"  # past any hold: the clock went back
        "40009 not-a-time\n"
    )
    kernel_gives(monkeypatch, [40005])
    assert ports.free_port() == 40005
    assert [line.split()[0] for line in registry.read_text().splitlines()] == ["40005"]


def test_without_the_shared_file_a_process_still_never_repeats_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ports, "registry_file", lambda: tmp_path / "missing" / "ports")
    kernel_gives(monkeypatch, [40011, 40011, 40013])
    assert [ports.free_port(), ports.free_port()] == [40011, 40013]
