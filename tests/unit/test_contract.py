"""The contract module: Redis names and the attestation record."""

from __future__ import annotations

import pytest

from mcpfleet.contract import Attestation, RedisKeys


def test_redis_keys_are_scoped_by_fleet() -> None:
    a, b = RedisKeys("one"), RedisKeys("two")
    assert a.session("s") != b.session("s")
    assert a.replica("r").startswith("mcpfleet:one:")
    with pytest.raises(ValueError, match="DNS label"):
        RedisKeys("Bad Fleet")


def test_attestation_round_trips() -> None:
    att = Attestation(
        name="r0",
        address="http://127.0.0.1:1",
        state="draining",
        kids=("aa", "bb"),
        heartbeat=1.5,
        sessions=3,
        inflight=2,
        started=1.0,
        paused=4,
        listens=5,
        tasks=6,
    )
    assert Attestation.from_json(att.to_json()) == att


def test_a_record_from_before_the_held_counts_reads_them_as_zero() -> None:
    raw = '{"name":"r","address":"a","state":"serving","kids":[],"heartbeat":1,"sessions":2}'
    att = Attestation.from_json(raw)
    assert (att.sessions, att.paused, att.listens, att.tasks) == (2, 0, 0, 0)


@pytest.mark.parametrize("value", ["-1", '"3"', "1.5", "true", "null"])
def test_a_held_count_that_is_not_a_count_is_refused(value: str) -> None:
    raw = f'{{"name":"r","address":"a","state":"serving","kids":[],"heartbeat":1,"paused":{value}}}'
    with pytest.raises(ValueError, match="paused must be a non-negative integer"):
        Attestation.from_json(raw)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("nope", "not JSON"),
        ("[]", "not a JSON object"),
        ('{"name": "r"}', "lacks"),
        ('{"name":"r","address":"a","state":"dead","kids":[],"heartbeat":1}', "state"),
        ('{"name":"r","address":"a","state":"serving","kids":"ab","heartbeat":1}', "kids"),
        ('{"name":"r","address":"a","state":"serving","kids":[],"heartbeat":"x"}', "heartbeat"),
    ],
)
def test_malformed_attestations_are_refused(raw: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        Attestation.from_json(raw)
