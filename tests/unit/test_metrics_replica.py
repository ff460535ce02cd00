"""A replica's /metrics: rounds, request state by kid and reason, key ring, gate state."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from fleetkit.clients.wire import accept, modern_call
from mcpfleet.keys.files import write_ring, write_volume
from mcpfleet.keys.ring import KeyRing
from mcpfleet.replica.metrics import REJECTION_REASONS, rejection_label
from mcpfleet.replica.process import build_asgi
from mcpfleet.replica.runtime import Replica, ReplicaConfig

URL = "http://testserver/mcp"


@pytest.fixture
def replica(tmp_path: Path) -> Replica:
    write_ring(tmp_path / "keys", KeyRing.generate())
    return Replica(ReplicaConfig(keys_dir=tmp_path / "keys", name="replica-t"), KeyRing.generate())


@pytest.fixture
def http(replica: Replica) -> Iterator[TestClient]:
    # The lifespan runs the watcher and the rejection counter, as under uvicorn.
    with TestClient(build_asgi(replica)) as client:
        yield client


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(http: TestClient) -> Samples:
    resp = http.get("/metrics")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(resp.text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: Samples, name: str, **kw: str) -> float:
    return sum(
        v for (n, labels), v in samples.items() if n == name and set(kw.items()) <= set(labels)
    )


def _book(http: TestClient) -> list[str]:
    """A modern booking over the wire; returns the request-state tokens the replica sealed."""
    tokens: list[str] = []
    answer = modern_call(URL, "book_flight", {"destination": "Oslo"}, client=http)
    for reply in ("2026-12-24", "economy", True):
        state = answer.result["requestState"]
        tokens.append(state)
        key = next(iter(answer.result["inputRequests"]))
        answer = modern_call(
            URL,
            "book_flight",
            {"destination": "Oslo"},
            request_state=state,
            input_responses={key: accept(reply)},
            client=http,
        )
    assert answer.result["content"][0]["text"].startswith("Booked")
    return tokens


def test_replica_metrics_count_rounds_seals_and_unseals_by_kid(
    replica: Replica, http: TestClient
) -> None:
    _book(http)
    kid = replica.codec.kids[0]
    m = scrape(http)
    assert value(m, "mcpfleet_rounds_total", kind="asking", component="book_flight") == 3
    assert value(m, "mcpfleet_rounds_total", kind="final", outcome="ok") == 1
    assert value(m, "mcpfleet_requeststate_seals_total", kid=kid) == 3
    assert value(m, "mcpfleet_requeststate_unseals_total", kid=kid) == 3
    assert value(m, "mcpfleet_keyring_info", kids=kid, phase="stable") == 1
    assert value(m, "mcpfleet_replica_build_info", app="mcpfleet_examples.app:app") == 1
    assert value(m, "mcpfleet_replica_ready") == 1
    assert value(m, "mcpfleet_replica_draining") == 0


def test_rejections_are_counted_by_reason(replica: Replica, http: TestClient) -> None:
    token = _book(http)[0]
    # Flip a character inside the ciphertext: the seal no longer verifies.
    i = len(token) // 2
    tampered = token[:i] + ("A" if token[i] != "A" else "B") + token[i + 1 :]
    foreign = KeyRing.generate()
    for state in (tampered, "v1.not-a-token", "garbage"):
        refused = modern_call(
            URL, "book_flight", {"destination": "Oslo"}, request_state=state, client=http
        )
        assert refused.error is not None
    # A token for another tool: sealed by this replica, bound to a different request.
    wrong = modern_call(
        URL, "confirm_purchase", {"item": "x", "amount_eur": 1}, request_state=token, client=http
    )
    assert wrong.error is not None
    m = scrape(http)
    assert value(m, "mcpfleet_requeststate_rejections_total", reason="tampered") == 1
    assert value(m, "mcpfleet_requeststate_rejections_total", reason="malformed") == 2
    assert value(m, "mcpfleet_requeststate_rejections_total", reason="request_binding") == 1
    assert value(m, "mcpfleet_requeststate_rejections_total") == 4
    assert foreign.kids[0] not in str(m)


def test_every_boundary_reason_maps_to_a_bounded_label() -> None:
    assert rejection_label("expired") == "expired"
    assert rejection_label("unknown key") == "unknown_kid"
    assert rejection_label("bind_principal returned int, expected str or None") == "principal"
    assert rejection_label("something new in a later mcp") == "other"
    labels = set(REJECTION_REASONS.values())
    assert labels == {
        "expired",
        "tampered",
        "unknown_kid",
        "audience",
        "malformed",
        "request_binding",
        "principal",
        "future",
        "codec_error",
    }


def test_reload_results_and_a_refused_ring_are_reported(replica: Replica, http: TestClient) -> None:
    keys = replica.config.keys_dir
    staged = replica.codec.ring.stage()
    write_ring(keys, staged)
    # The watcher runs in the lifespan too; check() makes this test not wait for it.
    replica.watcher.check()
    m = scrape(http)
    assert value(m, "mcpfleet_keyring_reloads_total", result="loaded") >= 1
    assert value(m, "mcpfleet_keyring_info", kids=",".join(staged.kids), phase="staged") == 1
    assert value(m, "mcpfleet_keyring_keys") == 2
    assert value(m, "mcpfleet_keyring_reload_failing") == 0
    write_volume(keys, {"keyring.json": b"{not json"})
    replica.watcher.check()
    m = scrape(http)
    assert value(m, "mcpfleet_keyring_reloads_total", result="error") == 1
    assert value(m, "mcpfleet_keyring_reload_failing") == 1
    assert value(m, "mcpfleet_keyring_info", kids=",".join(staged.kids)) == 1, "good ring kept"
    write_ring(keys, staged)
    replica.watcher.check()
    assert value(scrape(http), "mcpfleet_keyring_reload_failing") == 0


def test_gate_state_is_exported(replica: Replica, http: TestClient) -> None:
    replica.state.draining = True
    m = scrape(http)
    assert value(m, "mcpfleet_replica_draining") == 1
    assert value(m, "mcpfleet_replica_ready") == 0


def test_no_rejection_counting_outlives_the_replica(replica: Replica) -> None:
    with TestClient(build_asgi(replica)):
        assert replica.metrics._filter in logging.getLogger("mcp.server.request_state").filters
    assert replica.metrics._filter not in logging.getLogger("mcp.server.request_state").filters


def test_replicas_of_one_app_object_never_stack_middlewares(tmp_path: Path) -> None:
    from mcpfleet.replica.middleware import PrometheusMiddleware

    write_ring(tmp_path / "keys", KeyRing.generate())
    config = ReplicaConfig(keys_dir=tmp_path / "keys")
    first = Replica(config, KeyRing.generate())
    second = Replica(config, KeyRing.generate())
    assert first.mcp_app is second.mcp_app
    ours = [mw for mw in second.mcp_app.middleware if isinstance(mw, PrometheusMiddleware)]
    assert ours == [second.rounds] and second.rounds.registry is second.metrics.registry


def test_rejections_are_counted_even_when_logging_is_quieter_than_warnings(
    replica: Replica, caplog: pytest.LogCaptureFixture
) -> None:
    boundary = logging.getLogger("mcp.server.request_state")
    root = logging.getLogger()
    saved = root.level
    root.setLevel(logging.ERROR)  # what --log-level ERROR does
    try:
        with TestClient(build_asgi(replica)) as http:
            refused = modern_call(
                URL, "book_flight", {"destination": "Oslo"}, request_state="junk", client=http
            )
            assert refused.error is not None
            m = scrape(http)
        assert boundary.level == logging.NOTSET, "the logger's level is restored"
    finally:
        root.setLevel(saved)
    assert value(m, "mcpfleet_requeststate_rejections_total", reason="malformed") == 1
    assert not [r for r in caplog.records if r.name == "mcp.server.request_state"], (
        "the rejection was counted, not logged below the configured level"
    )
