"""Large answers through the router, in both eras and both response modes.

One replica of ``fleetkit.apps.streamapp`` (its ``blob`` tool answers as much text as
asked) behind one router; a second such fleet whose replica runs FastMCP's JSON
response mode for every request (``FASTMCP_JSON_RESPONSE``), for the handshake
era's JSON answers. Each answer size, 20 times in a row on one keep-alive
client connection, must come back 200 with exactly the bytes the replica
answers when asked directly: how the replica's writes are split into reads on
the way must never matter (the router relays a body of any size; see
docs/routing.md).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from fleetkit.apps.blobtext import blob_text
from fleetkit.clients.wire import MODERN, MODERN_META, response_body
from fleetkit.fleet import FleetOptions, local_fleet
from mcpfleet.dev.fleet import LocalFleet

from .conftest import shared

APP = "fleetkit.apps.streamapp:app"
HANDSHAKE = "2025-11-25"
KIB = 1024
#: Answer texts, in characters (the body adds the JSON-RPC envelope, and SSE framing).
SIZES = [1 * KIB, 64 * KIB, 65 * KIB, 256 * KIB, 1024 * KIB, 8192 * KIB]
CALLS = 20
_ACCEPT = "application/json, text/event-stream"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFleet]:
    options = FleetOptions(replicas=1, app=APP, fleet="large")
    with local_fleet(tmp_path_factory.mktemp("large"), options) as lf, shared(lf):
        yield lf


@pytest.fixture(scope="module")
def json_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFleet]:
    options = FleetOptions(
        replicas=1, app=APP, fleet="largejson", env={"FASTMCP_JSON_RESPONSE": "true"}
    )
    with local_fleet(tmp_path_factory.mktemp("largejson"), options) as lf, shared(lf):
        yield lf


def _replica_url(lf: LocalFleet) -> str:
    (member,) = lf.members.values()
    return f"{member.url}/mcp"


class Caller:
    """``blob`` calls in one era and response mode, to any URL of the fleet."""

    def __init__(self, http: httpx.Client, era: str, streamed: bool) -> None:
        self.http = http
        self.era = era
        self.streamed = streamed
        self.headers = {"content-type": "application/json", "accept": _ACCEPT}

    def open(self, url: str) -> None:
        """A handshake session through ``url`` (the router): ``initialize``, then
        ``notifications/initialized``."""
        if self.era != "handshake":
            self.headers |= {
                "mcp-protocol-version": MODERN,
                "mcp-method": "tools/call",
                "mcp-name": "blob",
            }
            return
        init = {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": HANDSHAKE,
                "capabilities": {},
                "clientInfo": {"name": "large-answers", "version": "1"},
            },
        }
        resp = self.http.post(url, content=json.dumps(init), headers=self.headers)
        assert resp.status_code == 200, resp.text
        self.headers |= {
            "mcp-session-id": resp.headers["mcp-session-id"],
            "mcp-protocol-version": HANDSHAKE,
        }
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        ack = self.http.post(url, content=json.dumps(note), headers=self.headers)
        assert ack.status_code == 202, ack.text

    def call(self, url: str, size: int) -> httpx.Response:
        params: dict[str, Any] = {"name": "blob", "arguments": {"size": size}}
        if self.era == "modern":
            params["_meta"] = dict(MODERN_META)
            if self.streamed:  # a round that asked for progress is answered in SSE mode
                params["_meta"]["progressToken"] = "large"
        body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params}
        return self.http.post(url, content=json.dumps(body), headers=self.headers)


def unstamped(body: bytes) -> bytes:
    """An answer without its SSE event ids (a replica with an event store stamps each
    event with an id of its own: the same answer twice differs only there)."""
    return re.sub(rb"(?m)^id: [^\r\n]*\r?\n", b"", body)


@pytest.mark.parametrize(
    ("era", "streamed"),
    [("modern", False), ("modern", True), ("handshake", True), ("handshake", False)],
    ids=["modern-json", "modern-sse", "handshake-sse", "handshake-json"],
)
def test_answers_up_to_8_mib_come_back_whole_every_time(
    era: str, streamed: bool, request: pytest.FixtureRequest
) -> None:
    lf: LocalFleet = request.getfixturevalue(
        "json_fleet" if era == "handshake" and not streamed else "fleet"
    )
    router, replica = lf.url, _replica_url(lf)
    started = time.perf_counter()
    with httpx.Client(timeout=60) as http:
        caller = Caller(http, era, streamed)
        caller.open(router)
        for size in SIZES:
            direct = caller.call(replica, size)
            assert direct.status_code == 200, direct.text[:300]
            mode = direct.headers["content-type"].split(";")[0]
            assert mode == ("text/event-stream" if streamed else "application/json")
            message = response_body(direct)
            assert message["result"]["content"][0]["text"] == blob_text(size), "the replica's own"
            failures = []
            for n in range(CALLS):
                resp = caller.call(router, size)
                if resp.status_code != 200 or unstamped(resp.content) != unstamped(direct.content):
                    failures.append((n, resp.status_code, len(resp.content), resp.text[:200]))
            assert not failures, (
                f"{size} characters: {len(failures)} of {CALLS} not whole, "
                f"answer {len(direct.content)} bytes: {failures[:3]}"
            )
    took = time.perf_counter() - started
    print(f"\n{era}, {mode}: {len(SIZES)} sizes x {CALLS} calls in {took:.1f} s")
