"""``mcpfleet selftest`` (the chart's ``helm test``) against a real fleet."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fleetkit.fleet import FleetOptions, local_fleet
from mcpfleet.server.dev.fleet import LocalFleet
from mcpfleet.server.selftest import selftest

VENV_BIN = Path(sys.executable).parent


def test_selftest_runs_a_guard_flow_in_each_era_through_the_router(fleet: LocalFleet) -> None:
    out = subprocess.run(
        [str(VENV_BIN / "mcpfleet"), "selftest", fleet.url],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    modern, handshake = out.stdout.splitlines()
    assert modern.startswith("modern: ok,") and "book_flight: Booked economy to Lisbon" in modern
    assert (
        handshake.startswith("handshake: ok,") and "plan_meeting: Planned 'selftest'" in handshake
    )


async def test_selftest_fails_when_the_fleet_does_not_answer(fleet: LocalFleet) -> None:
    lines: list[str] = []
    dead = fleet.url.replace(str(fleet.router_ports[0]), "9")
    assert await selftest(dead, lines.append) == 1
    assert [line.split(":")[0] for line in lines] == ["modern", "handshake"]
    assert all("FAILED" in line for line in lines)


async def test_selftest_with_another_app_lists_its_tools(tmp_path: Path) -> None:
    with local_fleet(tmp_path, FleetOptions(replicas=1, app="fleetkit.streamapp:app")) as other:
        lines: list[str] = []
        assert await selftest(other.url, lines.append) == 0, lines
    assert all("tools/list:" in line for line in lines)


pytestmark = pytest.mark.timeout(180)
