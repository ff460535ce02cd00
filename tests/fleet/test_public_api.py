"""An app written against the public API only serves both eras through a 3-replica fleet."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest

from fleetkit.fleet import FleetOptions, local_fleet
from mcpfleet.dev.fleet import LocalFleet
from mcpfleet.fleetclient import Trace, connect

from .conftest import shared

EXPECTED = "atlas 2026-12-24 held with 45 sign-offs"


@pytest.fixture(scope="module")
def public_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFleet]:
    workdir = tmp_path_factory.mktemp("public")
    with local_fleet(workdir, FleetOptions(app="fleetkit.apps.publicapp:app")) as lf, shared(lf):
        yield lf


async def test_public_api_app_spreads_modern_rounds_over_the_replicas(
    public_fleet: LocalFleet,
) -> None:
    trace = Trace()
    async with connect(public_fleet.url, "modern", trace) as client:
        results = [await client.call_tool("release", {"project": "atlas"}) for _ in range(3)]
    assert [str(r.data) for r in results] == [EXPECTED] * 3
    calls = trace.calls()
    assert len(calls) == 15, "each release is one initial call and four continuations"
    assert len(trace.replicas("tools/call")) >= 2, Counter(c.replica for c in calls)


async def test_public_api_app_keeps_a_handshake_session_on_one_replica(
    public_fleet: LocalFleet,
) -> None:
    trace = Trace()
    async with connect(public_fleet.url, "handshake", trace) as client:
        result = await client.call_tool("release", {"project": "atlas"})
    assert str(result.data) == EXPECTED
    assert len([r for r in trace.rounds if r.rpc == "response"]) == 4
    assert len(trace.replicas()) == 1
