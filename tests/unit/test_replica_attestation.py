"""What a replica attests of the load it holds: the counts a scale-in would cut."""

from __future__ import annotations

from pathlib import Path

from mcpfleet.contract import Attestation
from mcpfleet.keys.files import write_ring
from mcpfleet.keys.ring import KeyRing
from mcpfleet.replica.runtime import Replica, ReplicaConfig


def test_a_fresh_replica_attests_that_it_holds_nothing(tmp_path: Path) -> None:
    write_ring(tmp_path / "keys", KeyRing.generate())
    replica = Replica(ReplicaConfig(keys_dir=tmp_path / "keys", name="r-t"), KeyRing.generate())
    record = Attestation.from_json(replica.attestation().to_json())
    held = (record.sessions, record.inflight, record.paused, record.listens, record.tasks)
    assert held == (0, 0, 0, 0, 0)


def test_the_attestation_counts_what_the_replica_holds_now(tmp_path: Path) -> None:
    write_ring(tmp_path / "keys", KeyRing.generate())
    replica = Replica(ReplicaConfig(keys_dir=tmp_path / "keys", name="r-t"), KeyRing.generate())
    replica.rounds.paused = 2
    replica.state.inflight = 3
    replica.state.sessions["s1"] = replica.state.sessions["s2"] = 1e18  # seen "now" forever
    record = Attestation.from_json(replica.attestation().to_json())
    assert (record.paused, record.inflight, record.sessions) == (2, 3, 2)
    assert "s1" not in replica.attestation().to_json(), "counts only, never a session id"
