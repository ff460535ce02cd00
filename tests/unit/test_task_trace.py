"""A task's snapshot carries its creator's trace context only when tracing is on, sealed
with the snapshot, and read back as the worker opens it."""

from __future__ import annotations

import json

import pytest

from mcpfleet import tracing
from mcpfleet.tasks._sealing import ScrubbingCodec
from mcpfleet.tasks._trace import CREATOR, CREATOR_FIELD, forget_creator

pytestmark = pytest.mark.unit

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
SNAPSHOT = json.dumps({"http_headers": {"authorization": "Bearer x"}, "session_id": None})


class Plain:
    """The engine's plaintext codec, as the fleet's codec wraps it."""

    protected = False

    def encode(self, payload: str) -> str:
        return payload

    def decode(self, stored: str | bytes) -> str:
        return stored.decode() if isinstance(stored, bytes) else stored


@pytest.fixture
def traced(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tracing on, with a current span whose context is :data:`PARENT`."""
    monkeypatch.setattr(tracing, "ON", True)
    monkeypatch.setattr(tracing, "traceparent", lambda: PARENT.encode())


def test_with_tracing_off_the_snapshot_is_only_scrubbed() -> None:
    stored = ScrubbingCodec(Plain()).encode(SNAPSHOT)
    assert json.loads(stored) == {"http_headers": None, "session_id": None}


def test_with_tracing_on_the_creators_context_travels_and_is_read_back(traced: None) -> None:
    codec = ScrubbingCodec(Plain())
    stored = codec.encode(SNAPSHOT)
    assert json.loads(stored)[CREATOR_FIELD] == PARENT
    forget_creator()
    assert CREATOR.get() is None
    codec.decode(stored)
    assert CREATOR.get() == PARENT
    # A snapshot stored without one (tracing off at its creation) leaves none.
    codec.decode(ScrubbingCodec(Plain()).encode(SNAPSHOT).replace(PARENT, ""))
    assert CREATOR.get() is None


@pytest.mark.tasks
def test_the_creators_context_is_sealed_with_the_snapshot_and_the_engine_ignores_it(
    traced: None,
) -> None:
    pytest.importorskip("fastmcp_tasks", reason="the [tasks] extra: make test-tasks")
    from fastmcp_tasks.context import TaskContextSnapshot

    from mcpfleet.keys.ring import KeyRing
    from mcpfleet.tasks import RingSnapshotCodec

    ring = KeyRing.generate()
    codec = ScrubbingCodec(RingSnapshotCodec(lambda: ring))
    stored = codec.encode(SNAPSHOT)
    assert stored.startswith("mcpfleet:v1:") and TRACE_ID not in stored
    opened = codec.decode(stored)
    assert CREATOR.get() == PARENT
    assert TaskContextSnapshot.from_json(opened).session_id is None
