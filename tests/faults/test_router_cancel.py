"""A client that goes away mid-tool cancels the tool on the replica, through the router.

The spec: "Closing the SSE response stream MUST be treated by the server as
cancellation of that request." The fault app's tools record ``cancelled`` (with
the time) when their request is cancelled. A modern-era call is answered as
JSON: its client closes the connection; a handshake-era call streams (SSE): its
client closes the stream. Either way the router closes its upstream request,
and for a session tells the owner with ``notifications/cancelled``.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from fleetkit.apps.faultapp import EFFECTS_ENV
from fleetkit.faulttable import FaultTable
from fleetkit.fleet import FleetOptions, local_fleet
from mcpfleet.dev.fleet import LocalFleet
from mcpfleet.dev.wait import wait_for

from .routerkit import (
    Effects,
    modern_body,
    modern_headers,
    open_session,
    session_call,
    session_headers,
)

TRIALS = 5
#: How soon the replica must see the cancellation (measured figures are printed).
CANCEL_WITHIN = 0.1


@pytest.fixture(scope="module")
def cancel_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalFleet, Effects]]:
    workdir = tmp_path_factory.mktemp("cancel")
    effects = workdir / "effects.log"
    options = FleetOptions(
        replicas=2, app="fleetkit.apps.faultapp:app", env={EFFECTS_ENV: str(effects)}
    )
    with local_fleet(workdir / "fleet", options) as lf:
        yield lf, Effects(effects)


def _send(port: int, body: bytes, headers: dict[str, str]) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    lines = ["POST /mcp HTTP/1.1", "host: 127.0.0.1", f"content-length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    sock.sendall("\r\n".join([*lines, "", ""]).encode() + body)
    return sock


def _cancelled_metric(lf: LocalFleet) -> float:
    text = httpx.get(f"http://127.0.0.1:{lf.router_ports[0]}/metrics", timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("mcpfleet_router_cancelled_total{")
    )


@pytest.mark.parametrize("era", ["modern", "handshake"])
def test_a_client_leaving_mid_tool_cancels_the_tool_on_the_replica(
    cancel_fleet: tuple[LocalFleet, Effects], fault_table: FaultTable, era: str
) -> None:
    lf, effects = cancel_fleet
    mode = "JSON, connection closed" if era == "modern" else "SSE, stream closed"
    row = fault_table.row(f"client leaves mid-tool: {era} ({mode})")
    port = lf.router_ports[0]
    counted = _cancelled_metric(lf)
    delays: list[float] = []
    for i in range(TRIALS):
        order = f"{era}-{i}"
        args = {"order": order, "seconds": 30}
        if era == "modern":
            body, headers = modern_body("slow_effect", args), modern_headers("slow_effect")
        else:
            with httpx.Client(timeout=10) as http:
                session, _ = open_session(http, lf.url, order)
            body, headers = session_call("slow_effect", args), session_headers(session)
        sock = _send(port, json.dumps(body).encode(), headers)
        wait_for(lambda o=order: effects.when(o, "effect") is not None, timeout=10, what="start")
        if era == "handshake":
            sock.recv(1)  # the stream's response head arrived: the stream is open
        closed = time.time()
        sock.close()
        wait_for(
            lambda o=order: effects.when(o, "cancelled") is not None,
            timeout=5,
            what=f"{order}'s tool to see its cancellation",
        )
        seen = effects.when(order, "cancelled")
        assert seen is not None
        delays.append(seen - closed)
        row.attempts += 1
    row.worst_seconds = max(delays)
    row.notes = (
        f"replica saw the cancellation after {', '.join(f'{d * 1000:.0f}' for d in delays)} ms"
    )
    assert effects.count("done") == {}, "no cancelled tool ran to its end"
    assert _cancelled_metric(lf) - counted == TRIALS
    assert max(delays) < CANCEL_WITHIN, row.notes
