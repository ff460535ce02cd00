"""Both protocol eras through the router of a three-replica fleet (local processes)."""

from __future__ import annotations

from fleetkit import scenarios
from fleetkit.fleet import ProcessFleet


async def test_modern_booking_rounds_land_on_several_replicas(fleet: ProcessFleet) -> None:
    await scenarios.modern_rounds_spread(fleet)


async def test_handshake_session_stays_on_the_replica_that_owns_it(fleet: ProcessFleet) -> None:
    await scenarios.handshake_session_sticks(fleet)


async def test_twenty_concurrent_handshake_sessions_all_succeed(fleet: ProcessFleet) -> None:
    await scenarios.concurrent_handshake_sessions(fleet, 20)
