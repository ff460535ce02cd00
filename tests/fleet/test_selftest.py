"""``mcpfleet selftest`` (the chart's ``helm test``) against a real fleet."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetkit.clients.jwtkit import TokenIssuer
from fleetkit.fleet import DEVKIT_DIR, FleetOptions, ProcessFleet, diagnostics, local_fleet, running
from mcpfleet.selftest import metadata_url, selftest

VENV_BIN = Path(sys.executable).parent


def test_selftest_initializes_and_lists_tools_in_each_era_through_the_router(
    fleet: ProcessFleet,
) -> None:
    out = subprocess.run(
        [str(VENV_BIN / "mcpfleet"), "selftest", fleet.url],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    modern, handshake = out.stdout.splitlines()
    for era, line in (("modern", modern), ("handshake", handshake)):
        assert line.startswith(f"{era}: ok, initialize and tools/list in "), line
        replicas = line.split("replicas ", 1)[1].split(";")[0].split(", ")
        assert set(replicas) <= set(fleet.replica_names()) and replicas, line
    # The handshake era's session stayed on one replica.
    assert "," not in handshake.split("replicas ", 1)[1].split(";")[0]
    count = int(modern.rsplit("; ", 1)[1].split()[0])
    assert count >= 5 and handshake.endswith(f"; {count} tools")


async def test_selftest_fails_when_the_fleet_does_not_answer(fleet: ProcessFleet) -> None:
    lines: list[str] = []
    dead = fleet.url.replace(str(fleet.router_ports[0]), "9")
    assert await selftest(dead, lines.append) == 1
    assert [line.split(":")[0] for line in lines] == ["modern", "handshake"]
    assert all("FAILED" in line for line in lines)


async def test_selftest_with_another_app_lists_its_tools(tmp_path: Path) -> None:
    with local_fleet(
        tmp_path, FleetOptions(replicas=1, app="fleetkit.apps.streamapp:app")
    ) as other:
        lines: list[str] = []
        assert await selftest(other.url, lines.append) == 0, lines
    assert all(" ok, initialize and tools/list " in line for line in lines), lines


def test_the_metadata_is_asked_of_the_router_at_the_challenges_path() -> None:
    challenge = 'Bearer error="invalid_token", resource_metadata="https://mcp.example.com/.well-known/oauth-protected-resource/mcp"'
    assert (
        metadata_url("http://mcpfleet-router:80/mcp", challenge)
        == "http://mcpfleet-router:80/.well-known/oauth-protected-resource/mcp"
    )
    assert (
        metadata_url("http://r/mcp", "Bearer")
        == "http://r/.well-known/oauth-protected-resource/mcp"
    )


pytestmark = pytest.mark.timeout(180)


async def test_selftest_with_an_auth_app_sees_the_401_and_its_metadata_in_each_era(
    tmp_path: Path,
) -> None:
    """deploy/own-app's app requires a token: the selftest holds none, so what it can
    prove is the refusal and the metadata that tells a client where to get one."""
    issuer = TokenIssuer()
    key = issuer.write_public_key(tmp_path / "public.pem")
    # The public URL is the router's behind some Ingress: not reachable from here.
    env = issuer.app_env(key, "https://mcp.example.com")
    own_app = Path(__file__).resolve().parents[2] / "deploy" / "own-app"
    fleet = ProcessFleet(
        tmp_path / "fleet",
        replicas=2,
        app="ownapp.server:mcp",
        extra_env={**env, "PYTHONPATH": os.pathsep.join([str(DEVKIT_DIR), str(own_app)])},
    )
    with running(fleet, diagnostics):
        lines: list[str] = []
        assert await selftest(fleet.url, lines.append) == 0, lines
    for era, line in zip(("modern", "handshake"), lines, strict=True):
        assert line.startswith(f"{era}: ok, auth required: 401 with a Bearer challenge; "), line
        assert "metadata of https://mcp.example.com/mcp " in line, line
        assert f"(authorization servers {issuer.issuer}" in line, line
