"""Authorization through the fleet: a team's own app with FastMCP's JWT auth.

Three replicas of ``ownapp`` (deploy/own-app: ``RemoteAuthProvider`` over a
``JWTVerifier`` with the public key from a file) behind the router, tokens for
alice and bob signed by the tests (:mod:`fleetkit.clients.jwtkit`). The router forwards
``Authorization``; the replicas verify it, bind each handshake-era session to
the credential that opened it, and bind each request state to its principal.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastmcp import Client

from fleetkit.clients.jwtkit import TokenIssuer
from fleetkit.clients.wire import Answer, accept, initialize_body, modern_call
from fleetkit.fleet import FleetOptions, local_fleet
from mcpfleet.contract import ROUTER_ERROR_HEADER, SESSION_ENDED_HEADER
from mcpfleet.dev.fleet import LocalFleet
from mcpfleet.dev.ports import free_port

from .conftest import shared

pytestmark = pytest.mark.fleet

OWN_APP = Path(__file__).resolve().parents[2] / "deploy" / "own-app"
HANDSHAKE = "2025-11-25"
JSON_SSE = {"content-type": "application/json", "accept": "application/json, text/event-stream"}


@pytest.fixture(scope="module")
def issuer() -> TokenIssuer:
    return TokenIssuer()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, issuer: TokenIssuer) -> Iterator[LocalFleet]:
    workdir = tmp_path_factory.mktemp("auth")
    key = issuer.write_public_key(workdir / "jwt-public.pem")
    port = free_port()
    env = {**issuer.app_env(key, f"http://127.0.0.1:{port}"), "PYTHONPATH": str(OWN_APP)}
    with (
        local_fleet(workdir, FleetOptions(app="ownapp.server:mcp", env=env, port=port)) as lf,
        shared(lf),
    ):
        yield lf


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def sse_json(resp: httpx.Response) -> dict[str, Any]:
    if resp.headers.get("content-type", "").startswith("text/event-stream"):
        data = [ln[5:].strip() for ln in resp.text.splitlines() if ln.startswith("data:")]
        return dict(json.loads(data[-1]))
    return dict(resp.json())


def open_session(http: httpx.Client, url: str, token: str) -> str:
    """A handshake-era session opened with ``token``: initialize, then initialized."""
    resp = http.post(
        url, content=initialize_body("auth-test"), headers={**JSON_SSE, **bearer(token)}
    )
    assert resp.status_code == 200, resp.text
    session = resp.headers["mcp-session-id"]
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    done = http.post(url, json=note, headers=session_headers(session, token))
    assert done.status_code == 202, done.text
    return session


def session_headers(session: str, token: str) -> dict[str, str]:
    return {
        **JSON_SSE,
        **bearer(token),
        "mcp-session-id": session,
        "mcp-protocol-version": HANDSHAKE,
    }


def whoami(http: httpx.Client, url: str, session: str, token: str) -> httpx.Response:
    body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "whoami"}}
    return http.post(url, json=body, headers=session_headers(session, token))


def test_no_token_or_an_expired_one_gets_401_naming_the_routers_metadata(
    fleet: LocalFleet, issuer: TokenIssuer
) -> None:
    router = fleet.url.removesuffix("/mcp")
    for headers in ({}, bearer(issuer.token("alice", expires_in=-120)), bearer("not-a-jwt")):
        resp = httpx.post(fleet.url, content=initialize_body("x"), headers={**JSON_SSE, **headers})
        assert resp.status_code == 401, resp.text
        challenge = resp.headers["www-authenticate"]
        assert f'resource_metadata="{router}/.well-known/oauth-protected-resource/mcp"' in challenge
    meta = httpx.get(f"{router}/.well-known/oauth-protected-resource/mcp")
    assert meta.status_code == 200
    assert meta.json()["resource"] == f"{router}/mcp"
    assert meta.json()["authorization_servers"] == [f"{issuer.issuer}/"]
    answer = modern_call(fleet.url, "whoami", {})
    assert answer.status == 401


def test_both_eras_work_with_tokens_through_the_router(
    fleet: LocalFleet, issuer: TokenIssuer
) -> None:
    alice = issuer.token("alice")
    first = modern_call(
        fleet.url, "place_order", {"item": "tea", "quantity": 2}, headers=bearer(alice)
    )
    assert first.result.get("resultType") == "input_required", first.body
    final = modern_call(
        fleet.url,
        "place_order",
        {"item": "tea", "quantity": 2},
        request_state=first.result["requestState"],
        input_responses={"confirm": accept(True)},
        headers=bearer(alice),
    )
    assert final.result["content"][0]["text"] == "Ordered 2 x tea for alice.", final.body

    async def confirm(message: str, response_type: Any, params: Any, context: Any) -> Any:
        return response_type(value=True)

    async def handshake() -> str:
        async with Client(fleet.url, auth=alice, mode="legacy", elicitation_handler=confirm) as c:
            result = await c.call_tool("place_order", {"item": "jam", "quantity": 1})
            return str(result.data)

    import asyncio

    assert asyncio.run(handshake()) == "Ordered 1 x jam for alice."


def test_another_user_can_neither_use_nor_end_a_live_session(
    fleet: LocalFleet, issuer: TokenIssuer
) -> None:
    alice, bob = issuer.token("alice"), issuer.token("bob")
    with httpx.Client(timeout=10) as http:
        session = open_session(http, fleet.url, alice)
        # (Responses are checked from variables: an assertion's report never shows a token.)
        mine = whoami(http, fleet.url, session, alice)
        assert "signed in as alice" in mine.text
        # bob, with a valid token of his own, on alice's session: a call, a stream, a DELETE.
        attempts = [
            whoami(http, fleet.url, session, bob),
            http.get(
                fleet.url, headers={**session_headers(session, bob), "accept": "text/event-stream"}
            ),
            http.delete(fleet.url, headers=session_headers(session, bob)),
        ]
        for refused in attempts:
            assert refused.status_code == 404, refused.text
            assert ROUTER_ERROR_HEADER.lower() not in refused.headers, "the owner answered"
            assert SESSION_ENDED_HEADER.lower() not in refused.headers, "internal: stripped"
        # a client cannot make the router forget a session with the replica's mark
        forged = whoami(http, fleet.url, session, bob)
        assert forged.status_code == 404
        again = whoami(http, fleet.url, session, alice)
        assert again.status_code == 200, again.text
        assert "signed in as alice" in again.text
        # alice ends her own session: now it is gone for everyone
        ended = http.delete(fleet.url, headers=session_headers(session, alice))
        assert ended.status_code < 300, ended.text
        gone = whoami(http, fleet.url, session, alice)
        assert gone.status_code == 404


def test_a_request_claiming_the_ended_mark_does_not_end_a_session(
    fleet: LocalFleet, issuer: TokenIssuer
) -> None:
    alice = issuer.token("alice")
    with httpx.Client(timeout=10) as http:
        session = open_session(http, fleet.url, alice)
        forged = {**session_headers(session, issuer.token("bob")), SESSION_ENDED_HEADER: "1"}
        body = {"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": {"name": "whoami"}}
        refused = http.post(fleet.url, json=body, headers=forged)
        assert refused.status_code == 404
        still = whoami(http, fleet.url, session, alice)
        assert still.status_code == 200


def test_bobs_replay_of_alices_request_state_is_refused(
    fleet: LocalFleet, issuer: TokenIssuer
) -> None:
    alice, bob = issuer.token("alice"), issuer.token("bob")
    args = {"item": "cake", "quantity": 3}
    first = modern_call(fleet.url, "place_order", args, headers=bearer(alice))
    state = first.result["requestState"]

    def confirm(token: str) -> Answer:
        return modern_call(
            fleet.url,
            "place_order",
            args,
            request_state=state,
            input_responses={"confirm": accept(True)},
            headers=bearer(token),
        )

    stolen = confirm(bob)
    assert stolen.error is not None, stolen.body
    assert stolen.error["message"] == "Invalid or expired requestState"
    own = confirm(alice)
    assert own.result["content"][0]["text"] == "Ordered 3 x cake for alice."


def test_no_token_appears_in_any_log_line(fleet: LocalFleet, issuer: TokenIssuer) -> None:
    token = issuer.token("carol")
    with httpx.Client(timeout=10) as http:
        session = open_session(http, fleet.url, token)
        whoami(http, fleet.url, session, issuer.token("mallory"))
        whoami(http, fleet.url, session, token)
    modern_call(fleet.url, "whoami", {}, headers=bearer(token))
    assert len(issuer.issued) > 5
    logs = list(fleet.logs())
    assert any("credential does not match" in text for _, text in logs), "the logs were read"
    for name, text in logs:
        for issued in issuer.issued:
            for part in issued.split("."):
                assert part not in text, f"{name} logged (part of) a token"
        assert not re.search(r"Bearer\s+[A-Za-z0-9_-]{8,}", text), f"{name} logged a credential"
