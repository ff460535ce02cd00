"""Rate refusals remembered by credential: the memory's bounds and expiry, and the replica's gates.

The replica's two gates are driven in-process around a stand-in for the app's
auth that counts the token checks it makes: a token refused under its
principal's rate is refused again in front of it, a token never refused pays
nothing, and caps are never remembered.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from mcp.server.auth.provider import AccessToken
from starlette.types import Receive, Scope, Send

from mcpfleet.contract import RedisKeys
from mcpfleet.limits import (
    MAX_REMEMBERED,
    REFUSED_HEADER,
    Limiter,
    LimitRules,
    Rate,
    RefusalMemory,
    address_key,
    credential_key,
    format_refused,
    parse_refused,
)
from mcpfleet.limits._refusals import MAX_SECONDS
from mcpfleet.replica.limitgate import LimitGate, RefusedCredentials
from mcpfleet.router.exchange import Exchange
from mcpfleet.router.refused import RefusedCredentials as RouterRefusals


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_refusal_is_held_until_its_time_then_forgotten() -> None:
    clock = Clock()
    memory = RefusalMemory(clock=clock)
    alice, bob = credential_key(b"Bearer alice"), credential_key(b"Bearer bob")
    memory.remember(alice, 0.75, "rounds")
    held = memory.held(alice)
    assert held is not None and held.limit == "rounds" and held.seconds == 0.75
    assert held.retry_seconds == 1
    assert memory.held(bob) is None, "a credential never refused is not held"
    clock.now += 0.5
    held = memory.held(alice)
    assert held is not None and abs(held.seconds - 0.25) < 1e-9
    clock.now += 0.25
    assert memory.held(alice) is None and len(memory) == 0, "forgotten at its time"


def test_a_longer_refusal_is_kept_and_none_lasts_past_the_most_seconds() -> None:
    clock = Clock()
    memory = RefusalMemory(clock=clock)
    key = credential_key(b"Bearer alice")
    memory.remember(key, 5.0, "rounds")
    memory.remember(key, 1.0, "rounds")
    held = memory.held(key)
    assert held is not None and held.seconds == 5.0 and len(memory) == 1
    memory.remember(key, 1e9, "rounds")
    held = memory.held(key)
    assert held is not None and held.seconds == MAX_SECONDS


def test_the_memory_stays_bounded_under_a_flood_of_new_credentials() -> None:
    clock = Clock()
    memory = RefusalMemory(size=1000, clock=clock)
    for i in range(20_000):
        memory.remember(credential_key(b"Bearer %d" % i), 30.0, "rounds")
        assert len(memory) <= 1000
    assert memory.held(credential_key(b"Bearer 19999")) is not None, "the newest are kept"
    assert memory.held(credential_key(b"Bearer 0")) is None, "the oldest went first"
    # What ended goes first: a full memory of ended refusals makes room without evicting.
    clock.now += 31.0
    memory.remember(credential_key(b"Bearer new"), 30.0, "rounds")
    assert len(memory) == 1
    assert RefusalMemory().size == MAX_REMEMBERED


def test_keys_are_digests_that_tell_a_token_from_an_address() -> None:
    token = credential_key(b"Bearer abc")
    assert b"abc" not in token and len(token) == 16
    assert credential_key(b"Bearer abc") == token != credential_key(b"Bearer abd")
    by_address = address_key(b"", b"203.0.113.5", b"127.0.0.1")
    assert by_address == address_key(b"", b"203.0.113.5", b"127.0.0.1")
    assert by_address != address_key(b"", b"203.0.113.6", b"127.0.0.1")
    assert by_address != address_key(b"", b"", b"203.0.113.5,127.0.0.1")
    assert address_key(b"Bearer abc", b"", b"") != token


def test_the_refused_header_round_trips_and_junk_is_not_one() -> None:
    value = format_refused(0.734, "rounds", "token").decode()
    assert parse_refused(value) == (0.734, "rounds", "token")
    assert parse_refused(format_refused(500, "rounds", "address").decode()) == (
        MAX_SECONDS,
        "rounds",
        "address",
    )
    junk = ("", "x; limit=rounds; by=token", "1; limit=rounds; by=me", "-1; limit=a; by=token")
    more = ("nan; limit=rounds; by=token", "1; limit=a b; by=token", "1")
    for bad in (None, *junk, *more):
        assert parse_refused(bad) is None, bad


def test_only_the_principals_own_rate_refuses_every_request() -> None:
    clock = Clock()
    rules = LimitRules(rounds=Rate(100, 100), tools={"slow": Rate(1, 1)})
    lim = Limiter(rules, RedisKeys("t"), clock=clock)

    async def run() -> None:
        assert await lim.round("p", "slow") is None
        tool = await lim.round("p", "slow")  # the tool's rate: other tools still pass
        assert tool is not None and tool.limit == "rounds" and not tool.principal_wide
        lim.set_rules(LimitRules(rounds=Rate(1, 1)))
        assert await lim.round("q") is None
        own = await lim.round("q")
        assert own is not None and own.principal_wide and own.limit == "rounds"

    asyncio.run(run())
    lim.credentials.remember(credential_key(b"Bearer x"), 5.0, "rounds")
    lim.set_rules(LimitRules(rounds=Rate(100, 100)))
    assert len(lim.credentials) == 0, "new rules forget the refusals of the old"


# --- the replica's gates, in-process --------------------------------------------------

TOKENS = {
    "Bearer alice-1": AccessToken(token="a1", client_id="app", scopes=[], subject="alice"),
    "Bearer alice-2": AccessToken(token="a2", client_id="app", scopes=[], subject="alice"),
    "Bearer bob": AccessToken(token="b", client_id="app", scopes=[], subject="bob"),
}


class User:
    def __init__(self, token: AccessToken) -> None:
        self.access_token = token


class Stack:
    """``RefusedCredentials`` -> a stand-in for the app's auth -> ``LimitGate`` -> the app."""

    def __init__(self, rules: LimitRules) -> None:
        self.clock = Clock()
        self.limiter = Limiter(rules, RedisKeys("t"), clock=self.clock)
        self.limiter.credentials.clock = self.clock
        self.token_checks = 0
        self.served = 0

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            self.served += 1
            await receive()
            headers = [(b"mcp-session-id", b"s%d" % self.served)]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": b"{}"})

        gate = LimitGate(app, self.limiter)

        async def auth(scope: Scope, receive: Receive, send: Send) -> None:
            self.token_checks += 1
            value = dict(scope["headers"]).get(b"authorization", b"").decode()
            await gate({**scope, "user": User(TOKENS[value])}, receive, send)

        self.asgi = RefusedCredentials(auth, self.limiter)

    def post(self, token: str, body: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
        return asyncio.run(_post(self.asgi, token, body))


async def _post(
    app: Callable[..., Any], token: str, body: dict[str, Any]
) -> tuple[int, dict[str, str], Any]:
    raw = json.dumps(body).encode()
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/mcp",
        "headers": [(b"authorization", token.encode()), (b"content-type", b"application/json")],
        "client": ("127.0.0.1", 5000),
    }
    sent: list[dict[str, Any]] = []
    messages = [{"type": "http.request", "body": raw, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    start = sent[0]
    headers = {k.decode(): v.decode() for k, v in start.get("headers", [])}
    body_out = b"".join(m.get("body", b"") for m in sent[1:])
    return start["status"], headers, json.loads(body_out) if body_out else None


def call(rid: int) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": {"name": "t"}}


def initialize(rid: int) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "method": "initialize", "params": {}}


def test_a_token_refused_under_its_rate_is_refused_again_before_its_token_is_checked() -> None:
    stack = Stack(LimitRules(rounds=Rate(1, 2)))
    assert [stack.post("Bearer alice-1", call(i))[0] for i in range(2)] == [200, 200]
    status, headers, body = stack.post("Bearer alice-1", call(3))
    assert status == 429 and body["error"]["data"] == {"limit": "rounds", "retryAfter": 1}
    refused = parse_refused(headers[REFUSED_HEADER.lower()])
    assert refused is not None and refused[1:] == ("rounds", "token") and 0 < refused[0] <= 1
    checks = stack.token_checks
    status, headers, body = stack.post("Bearer alice-1", call(4))
    assert status == 429 and body["id"] == 4 and headers["retry-after"] == "1"
    assert stack.token_checks == checks, "refused in front of the token check"
    # Not a request (a notification): never refused, as at the gate.
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert stack.post("Bearer alice-1", note)[0] == 200 and stack.token_checks == checks + 1
    # bob pays nothing; alice's other token is checked, and refused by her principal's rate.
    assert stack.post("Bearer bob", call(5))[0] == 200
    assert stack.post("Bearer alice-2", call(6))[0] == 429
    assert stack.token_checks == checks + 3
    stack.clock.now += 1.0  # the refusal's time passed: alice's first token is served again
    assert stack.post("Bearer alice-1", call(7))[0] == 200


def test_initialize_requests_are_rated_and_a_session_cap_is_never_remembered() -> None:
    stack = Stack(LimitRules(sessions=1, rounds=Rate(1, 3)))
    assert stack.post("Bearer alice-1", initialize(1))[0] == 200
    status, headers, body = stack.post("Bearer alice-1", initialize(2))
    assert status == 429 and body["error"]["data"]["limit"] == "sessions"
    assert REFUSED_HEADER.lower() not in headers and len(stack.limiter.credentials) == 0
    assert stack.post("Bearer alice-1", initialize(3))[0] == 429  # sessions again: a round
    status, headers, body = stack.post("Bearer alice-1", initialize(4))
    assert status == 429 and body["error"]["data"]["limit"] == "rounds", body
    assert REFUSED_HEADER.lower() in headers and len(stack.limiter.credentials) == 1
    served = stack.served
    assert stack.post("Bearer bob", initialize(5))[0] == 200 and stack.served == served + 1


# --- the router's memory --------------------------------------------------------------


BY_TOKEN = format_refused(0.5, "rounds", "token").decode()
BY_ADDRESS = format_refused(0.5, "rounds", "address").decode()


def exchange(body: dict[str, Any], *headers: tuple[bytes, bytes]) -> Exchange:
    async def nothing(*_: Any) -> Any:
        return None

    scope = {"method": "POST", "headers": list(headers), "client": ("10.0.0.1", 4000)}
    by_name = {k.decode(): v.decode() for k, v in headers}
    return Exchange(scope, nothing, nothing, by_name, json.dumps(body).encode(), 0.0, None)


def test_the_router_refuses_the_same_credential_only_and_only_requests() -> None:
    refused = RouterRefusals()
    alice = (b"authorization", b"Bearer alice-1")
    refused.learn_header(exchange(call(1), alice), BY_TOKEN)
    held = refused.held(exchange(call(2), alice))
    assert held is not None and held.limit == "rounds"
    assert refused.held(exchange(call(3), (b"authorization", b"Bearer bob"))) is None
    assert refused.held(exchange({"jsonrpc": "2.0", "method": "notifications/x"}, alice)) is None
    assert refused.held(exchange(call(4))) is None, "no credential: not alice's"
    # A cap's 429 (no header) is never remembered.
    bob = (b"authorization", b"Bearer bob")
    refused.learn_header(exchange(call(5), bob), None)
    assert refused.held(exchange(call(6), bob)) is None


def test_the_router_keys_an_unauthenticated_refusal_on_what_its_address_is_read_from() -> None:
    refused = RouterRefusals()
    behind = (b"x-forwarded-for", b"203.0.113.5")
    refused.learn_header(exchange(call(1), behind), BY_ADDRESS)
    assert refused.held(exchange(call(2), behind)) is not None
    assert refused.held(exchange(call(3), (b"x-forwarded-for", b"203.0.113.6"))) is None
    assert refused.held(exchange(call(4))) is None
    # An app without auth reads the address even of a request with a credential.
    token = (b"authorization", b"Bearer shared-key")
    refused.learn_header(exchange(call(5), token), BY_ADDRESS)
    assert refused.held(exchange(call(6), token)) is not None
    # Another key (the replica reads the same address, and refuses it itself).
    assert refused.held(exchange(call(7), token, behind)) is None
