"""A replica process takes startup's objects out of the cyclic collector's sight; nothing else."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from mcpfleet.keys.files import write_ring
from mcpfleet.keys.ring import KeyRing
from mcpfleet.replica import process
from mcpfleet.replica.process import build_asgi
from mcpfleet.replica.runtime import Replica, ReplicaConfig

pytestmark = pytest.mark.unit


def _replica(tmp_path: Path) -> Replica:
    write_ring(tmp_path / "keys", KeyRing.generate())
    return Replica(ReplicaConfig(keys_dir=tmp_path / "keys", name="replica-gc"), KeyRing.generate())


def test_serving_freezes_startups_objects_only_when_asked(tmp_path: Path) -> None:
    before = gc.get_freeze_count()
    try:
        replica = _replica(tmp_path)
        with TestClient(build_asgi(replica)) as http:
            assert http.get("/healthz").status_code == 200
            assert gc.get_freeze_count() == before  # in-process (tests): the default
        replica.freeze_gc = True
        with TestClient(build_asgi(replica)) as http:
            assert http.get("/healthz").status_code == 200
            assert gc.get_freeze_count() > before
    finally:
        gc.unfreeze()  # this test process's objects back in the collector's sight


def test_the_replica_process_asks_for_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[Replica] = []

    class Server:
        def __init__(self, config: Any, replica: Replica) -> None:
            started.append(replica)

        def run(self) -> None:
            return None

    monkeypatch.setattr(process, "_DrainingServer", Server)
    write_ring(tmp_path / "keys", KeyRing.generate())
    process.run_replica(ReplicaConfig(keys_dir=tmp_path / "keys", name="replica-gc"))
    assert [r.freeze_gc for r in started] == [True]
