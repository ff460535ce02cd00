"""Through Redis Sentinel: the master killed under load, and the fleet follows the promotion.

Three redis-sentinel processes (quorum 2) watch a master and one replica;
two replicas and two routers connect with ``redis+sentinel://`` under their
own ACL users. The scenario is :func:`fleetkit.failover.failover_under_load`
(``make bench`` runs it too and reports its timings).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetkit.failover import SentinelFleet, failover_under_load, graceful_failover, sentinel_fleet
from fleetkit.failure import explain_on_failure


@pytest.fixture
def setup(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[SentinelFleet]:
    with sentinel_fleet(tmp_path) as sf:
        yield sf
        explain_on_failure(request, sf.logs)


async def test_a_master_killed_under_load_loses_no_live_session(setup: SentinelFleet) -> None:
    report = await failover_under_load(setup, sessions=5)
    print(report)
    # Replication was held back: the new master never got these routes...
    assert report.unreplicated == 5
    # ...yet the other router routes every one of them to its owner (router 0 wrote them back).
    assert report.kept == 5, report.failures
    # Modern rounds never touch Redis; handshake sessions ride on the routers' caches.
    assert report.modern_failed == 0, report.failures
    assert report.handshake_failed == 0, report.failures
    assert report.modern_ok > 0 and report.handshake_ok > 0
    # Router, replicas and the operator's client all reconnected, as their own users.
    assert 0 < report.promoted <= report.routers_back
    assert report.replicas_back > 0 and report.operator_back > 0
    assert report.denied == 0


async def test_a_graceful_failover_loses_no_live_session(setup: SentinelFleet) -> None:
    """The old master demoted, not killed: no outage for the routers to notice, same loss."""
    unreplicated, kept = await graceful_failover(setup, sessions=3)
    assert unreplicated == 3
    assert kept == 3
