"""The router's upstream side: what it may send again, and how long it keeps connections."""

from __future__ import annotations

from mcpfleet.replica.process import REPLICA_KEEPALIVE
from mcpfleet.router.upstream import UPSTREAM_IDLE_SECONDS, Failure


def test_idle_upstream_connections_retire_well_before_the_replica_closes_them() -> None:
    assert UPSTREAM_IDLE_SECONDS * 10 <= REPLICA_KEEPALIVE


def test_only_failures_before_the_request_was_written_allow_another_replica() -> None:
    resendable = {f for f in Failure if f.nothing_processed}
    assert resendable == {Failure.REFUSED, Failure.TIMEOUT, Failure.DRAINING}
    assert not Failure.DROPPED.nothing_processed
