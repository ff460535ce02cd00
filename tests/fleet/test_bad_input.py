"""Bad input gets a clear error, loses nothing, and the fleet keeps serving."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from fleetkit.clients.wire import modern_call
from mcpfleet.dev.fleet import LocalFleet, Proc, http_ok, mcpfleet_argv
from mcpfleet.dev.ports import free_port
from mcpfleet.dev.wait import wait_for
from mcpfleet.keys.files import write_ring, write_volume
from mcpfleet.keys.ring import KeyRing

HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}


def _still_serving(fleet: LocalFleet) -> None:
    answer = modern_call(fleet.url, "confirm_purchase", {"item": "pen", "amount_eur": 2})
    assert answer.status == 200 and answer.result["resultType"] == "input_required"


@pytest.mark.parametrize(
    ("session", "status", "message"),
    [
        ("0123456789abcdef0123456789abcdef", 404, "Session not found"),
        ("has space", 400, "malformed Mcp-Session-Id"),
        ("x" * 500, 400, "malformed Mcp-Session-Id"),
        ("caf\u00e9".encode(), 400, "malformed Mcp-Session-Id"),
    ],
    ids=["unknown", "space", "oversized", "non-ascii"],
)
def test_garbage_session_ids_get_a_spec_shaped_answer(
    fleet: LocalFleet, session: str | bytes, status: int, message: str
) -> None:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}})
    resp = httpx.post(
        fleet.url, content=body, headers={**HEADERS, "mcp-session-id": session}, timeout=5
    )
    assert resp.status_code == status
    error = resp.json()["error"]
    assert message in error["message"]
    assert "x-mcpfleet-replica" not in resp.headers, "answered by the router, no replica bothered"
    _still_serving(fleet)


@pytest.mark.parametrize("body", [b"not json", b"{", b"\xff\xfe\x00"])
def test_a_non_json_body_is_a_parse_error(fleet: LocalFleet, body: bytes) -> None:
    resp = httpx.post(fleet.url, content=body, headers=HEADERS, timeout=5)
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == -32700
    _still_serving(fleet)


def test_oversized_body_and_headers_are_refused(fleet: LocalFleet) -> None:
    big = b'{"jsonrpc":"2.0","id":1,"method":"ping","pad":"' + b"x" * (5 * 1024 * 1024) + b'"}'
    resp = httpx.post(fleet.url, content=big, headers=HEADERS, timeout=10)
    assert resp.status_code == 413
    resp = httpx.post(
        fleet.url, content=b"{}", timeout=5, headers={**HEADERS, "x-filler": "y" * 20_000}
    )
    assert resp.status_code == 431
    _still_serving(fleet)


def _serve(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mcpfleet.cli", "serve", "--port", str(free_port()), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )


def test_serve_refuses_a_malformed_key_file(tmp_path: Path) -> None:
    ring = KeyRing.generate()
    document = ring.to_document()
    write_volume(tmp_path / "keys", {"keyring.json": document[: len(document) // 2]})
    done = _serve(tmp_path, "--keys", str(tmp_path / "keys"))
    assert done.returncode == 2
    assert "no valid key ring" in done.stderr and "not valid JSON" in done.stderr
    secret = base64.urlsafe_b64encode(ring.keys[0].secret).decode().rstrip("=")
    assert secret[:12] not in done.stderr + done.stdout


def test_serve_refuses_a_short_key(tmp_path: Path) -> None:
    doc = {
        "version": 1,
        "phase": "stable",
        "keys": [
            {"kid": "00000000", "secret": base64.urlsafe_b64encode(b"k" * 16).decode().rstrip("=")}
        ],
    }
    write_volume(tmp_path / "keys", {"keyring.json": json.dumps(doc).encode()})
    done = _serve(tmp_path, "--keys", str(tmp_path / "keys"))
    assert done.returncode == 2
    assert "16 bytes; at least 32 bytes" in done.stderr


def test_serve_refuses_an_unknown_app(tmp_path: Path) -> None:
    write_ring(tmp_path / "keys", KeyRing.generate())
    for app, reason in [
        ("no_such_module:app", "cannot import module 'no_such_module'"),
        ("json:no_such_attr", "has no attribute 'no_such_attr'"),
        ("json:dumps", "not a FastMCP server"),
        ("json:JSONDecodeError", "not a FastMCP server"),
        ("json:__name__", "not a FastMCP server"),
        ("just-a-name", "must look like 'package.module:attribute'"),
    ]:
        done = _serve(tmp_path, "--keys", str(tmp_path / "keys"), "--app", app)
        assert done.returncode == 2, done.stderr
        assert reason in done.stderr


def test_a_replica_with_unreachable_redis_serves_and_says_why(tmp_path: Path) -> None:
    write_ring(tmp_path / "keys", KeyRing.generate())
    port, dead = free_port(), free_port()
    proc = Proc(
        "lonely",
        mcpfleet_argv(
            "serve",
            "--keys",
            str(tmp_path / "keys"),
            "--port",
            str(port),
            "--name",
            "lonely",
            "--redis",
            f"redis://127.0.0.1:{dead}/0",
        ),
        tmp_path / "lonely.log",
    )
    proc.start({"PATH": "/usr/bin:/bin"})
    try:
        wait_for(
            lambda: http_ok(f"http://127.0.0.1:{port}/readyz"),
            timeout=30,
            what="the replica",
            retry_on=(Exception,),
        )
        answer = modern_call(
            f"http://127.0.0.1:{port}/mcp", "confirm_purchase", {"item": "pen", "amount_eur": 2}
        )
        assert answer.status == 200 and answer.replica == "lonely"
        wait_for(
            lambda: "cannot reach Redis" in proc.tail(),
            timeout=10,
            what="the Redis error in the log",
            retry_on=(Exception,),
        )
        assert f"redis://127.0.0.1:{dead}/0" in proc.tail()
    finally:
        proc.stop()


def test_router_with_unreachable_redis_starts_degraded(tmp_path: Path) -> None:
    port, dead = free_port(), free_port()
    proc = Proc(
        "router",
        mcpfleet_argv("router", "--port", str(port), "--redis", f"redis://127.0.0.1:{dead}/0"),
        tmp_path / "router.log",
    )
    proc.start({"PATH": "/usr/bin:/bin"})
    try:
        wait_for(
            lambda: http_ok(f"http://127.0.0.1:{port}/healthz"),
            timeout=30,
            what="the router to answer",
            retry_on=(Exception,),
        )
        ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
        assert ready.status_code == 503 and ready.json()["degraded"] is True
        resp = httpx.post(
            f"http://127.0.0.1:{port}/mcp",
            timeout=5,
            headers=HEADERS,
            content=b'{"jsonrpc":"2.0","id":1,"method":"ping"}',
        )
        assert resp.status_code == 503 and resp.json()["error"]["message"] == "No serving replica"
        assert "Redis unreachable" in proc.tail()
    finally:
        proc.stop()


def test_cli_rejects_bad_flags_clearly() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mcpfleet.cli", "router", "--redis", "http://nope"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 2 and "a Redis URL starts with redis://" in done.stderr
