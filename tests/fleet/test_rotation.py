"""Key ring rotation while modern rounds run across replicas, and tokens that must fail."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetkit import scenarios
from fleetkit.clients.wire import accept, modern_call
from fleetkit.fleet import FleetOptions, ProcessFleet, local_fleet
from mcpfleet.dev.fleet import Proc, http_ok, mcpfleet_argv
from mcpfleet.dev.ports import free_port
from mcpfleet.dev.wait import wait_for

from .conftest import shared

STATE_TTL = 4.0


@pytest.fixture(scope="module")
def rotating_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessFleet]:
    """A fleet whose request-state tokens live STATE_TTL seconds, so a rotation is quick."""
    args = ("--state-ttl", str(STATE_TTL))
    with (
        local_fleet(tmp_path_factory.mktemp("rot"), FleetOptions(replica_args=args)) as lf,
        shared(lf),
    ):
        yield lf


def _first_round(url: str) -> tuple[str, str | None]:
    answer = modern_call(url, "confirm_purchase", {"item": "kettle", "amount_eur": 30})
    assert answer.status == 200, answer.body
    assert answer.result["resultType"] == "input_required"
    return answer.result["requestState"], answer.replica


def _replay(url: str, token: str) -> dict[str, object] | None:
    answer = modern_call(
        url,
        "confirm_purchase",
        {"item": "kettle", "amount_eur": 30},
        request_state=token,
        input_responses={"ok": accept(True)},
    )
    return answer.error


async def test_full_rotation_under_load_fails_no_round(rotating_fleet: ProcessFleet) -> None:
    lf = rotating_fleet
    old_token, _ = _first_round(lf.url)
    await scenarios.rotation_under_load(lf, STATE_TTL)

    # A token sealed under the retired key is refused, for that reason.
    error = _replay(lf.url, old_token)
    assert error is not None and error["message"] == "Invalid or expired requestState"
    logs = "\n".join(tail for _, tail in lf.logs())
    assert "requestState rejected on tools/call: unknown key" in logs


@pytest.mark.parametrize(
    ("mangle", "reason"),
    [
        (lambda t: t[:-2] + ("AA" if t[-2:] != "AA" else "BB"), "seal"),
        (lambda t: t[:40], "malformed"),
        (lambda t: t + "x", "malformed"),
    ],
    ids=["tampered", "truncated", "extended"],
)
def test_tampered_and_truncated_tokens_are_refused(
    rotating_fleet: ProcessFleet,
    mangle,
    reason: str,  # type: ignore[no-untyped-def]
) -> None:
    token, _ = _first_round(rotating_fleet.url)
    error = _replay(rotating_fleet.url, mangle(token))
    assert error is not None and error["message"] == "Invalid or expired requestState"
    logs = "\n".join(tail for _, tail in rotating_fleet.logs())
    assert f"requestState rejected on tools/call: {reason}" in logs
    # ... and the genuine token still completes the purchase.
    answer = modern_call(
        rotating_fleet.url,
        "confirm_purchase",
        {"item": "kettle", "amount_eur": 30},
        request_state=token,
        input_responses={"ok": accept(True)},
    )
    assert answer.error is None
    text = answer.result["content"][0]["text"]
    assert text.startswith("Purchased kettle for EUR 30.00.")


def test_a_token_of_another_audience_is_refused(
    rotating_fleet: ProcessFleet, tmp_path: Path
) -> None:
    """Same keys, different audience: a token minted by another service must not verify."""
    port = free_port()
    other = Proc(
        "other",
        mcpfleet_argv(
            "serve",
            "--keys",
            str(rotating_fleet.keys_dir),
            "--port",
            str(port),
            "--name",
            "other",
            "--audience",
            "another-service",
        ),
        tmp_path / "other.log",
    )
    other.start(rotating_fleet.env())
    try:
        wait_for(
            lambda: http_ok(f"http://127.0.0.1:{port}/readyz"),
            timeout=30,
            what="the other service",
            retry_on=(Exception,),
        )
        token, replica = _first_round(f"http://127.0.0.1:{port}/mcp")
        assert replica == "other"
        error = _replay(rotating_fleet.url, token)
        assert error is not None and error["message"] == "Invalid or expired requestState"
        logs = "\n".join(tail for _, tail in rotating_fleet.logs())
        assert "requestState rejected on tools/call: audience" in logs
    finally:
        other.stop()
    assert other.popen is not None and other.popen.returncode is not None, "it was stopped"
