"""Re-homing (mcpfleet.router.rehome.Rehomer) driven alone: no ASGI server, no Redis.

The session table, the replica view and the replicas' pool are fakes that
keep what Redis and the replicas would; each test drives :meth:`Rehomer.gone`
(or the in-flight books) as the router does and checks what the client is
answered, what the table holds after, what the replicas were sent and what
the metrics count, against the contract of docs/rehome.md.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from mcpfleet.config import RouterConfig
from mcpfleet.contract import Attestation
from mcpfleet.router.decisions import Candidate
from mcpfleet.router.exchange import Exchange, RequestOutcome
from mcpfleet.router.h1client import ConnectFailed, Headers
from mcpfleet.router.health import Health
from mcpfleet.router.metrics import RouterMetrics
from mcpfleet.router.rehome import Lost, OwnerGone, Rehomer
from mcpfleet.router.reinit import InitRecord
from mcpfleet.router.route import SessionRoute
from mcpfleet.router.upstream import Failure

SESSION = "client-session-1"
OWNER = "r0"
#: The route of the session re-homed on r1 (which opened it as "new-on-r1").
NEW_ON_R1 = SessionRoute("r1", "new-on-r1")
PARAMS = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "c"}}
TOOL_CALL = json.dumps(
    {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "t"}}
).encode()
ELICIT_ANSWER = json.dumps({"jsonrpc": "2.0", "id": 3, "result": {"action": "accept"}}).encode()


# --------------------------------------------------------------------------- fakes


def stored(route: SessionRoute | None) -> str | None:
    return None if route is None else route.to_redis()


def read(raw: str | None) -> SessionRoute | None:
    return None if raw is None else SessionRoute.from_redis(raw)


class FakeSessions:
    """The part of SessionTable re-homing uses, over dicts of what Redis would hold
    (each route in its stored form)."""

    def __init__(self) -> None:
        self.routes: dict[str, str] = {SESSION: OWNER}
        self.init: dict[str, str] = {SESSION: InitRecord(PARAMS, "alice").to_json()}
        self.lost_marks: dict[str, str] = {}
        self.claims: set[str] = set()
        self.cache: dict[str, str] = {}
        self.down = False  # Redis does not answer
        #: Called at the lost read before the route is written (a race to stage).
        self.on_lost_read: Callable[[], None] | None = None

    def _redis(self) -> None:
        if self.down:
            raise RedisConnectionError("Redis unreachable")

    async def rehome_state(
        self, session: str, known: SessionRoute
    ) -> tuple[SessionRoute | None, str | None, str | None]:
        await asyncio.sleep(0)
        self._redis()
        route = read(self.routes.get(session))
        lost = self.lost_marks.get(session)
        if lost is None and route is not None and route != known:
            self.cache[session] = route.to_redis()
        return route, self.init.get(session), lost

    async def mark_lost(self, session: str, reason: str) -> None:
        self.lost_marks[session] = reason

    async def claim_move(self, session: str, seconds: float) -> bool:
        self._redis()
        if session in self.claims:
            return False
        self.claims.add(session)
        return True

    async def release_move(self, session: str) -> None:
        self.claims.discard(session)

    async def route(self, session: str, known: SessionRoute) -> SessionRoute | None:
        await asyncio.sleep(0)
        self._redis()
        route = read(self.routes.get(session))
        if route is not None and route != known:
            self.cache[session] = route.to_redis()
        return route

    async def move(self, session: str, route: SessionRoute) -> str | None:
        self._redis()
        if self.on_lost_read is not None:
            self.on_lost_read()
        lost = self.lost_marks.get(session)
        if lost is not None:
            return lost
        self.routes[session] = route.to_redis()
        self.claims.discard(session)
        self.cache[session] = route.to_redis()
        return None

    async def drop(self, session: str) -> None:
        for table in (self.routes, self.init, self.lost_marks, self.cache):
            table.pop(session, None)


def attestation(name: str, state: str = "serving") -> Attestation:
    return Attestation(
        name=name,
        address=f"http://{name}.test:8000",
        state=state,  # type: ignore[arg-type]
        kids=("k",),
        heartbeat=time.time(),
    )


class FakePlacement:
    """A re-home's place on a replica: a placement once the replica opened the session."""

    def __init__(self, view: FakeView, name: str) -> None:
        self.view, self.name = view, name

    def opened(self) -> None:
        self.view.note_placement(self.name)

    def __enter__(self) -> FakePlacement:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class FakeView:
    """The replica view: ``r0`` (the gone owner, no longer serving) and live replicas."""

    def __init__(self, *serving: str) -> None:
        self.replicas = {name: attestation(name) for name in serving}
        self.placed: list[str] = []

    def serving(self, exclude: set[str] | frozenset[str] = frozenset()) -> list[Candidate]:
        return [
            Candidate(a.name, 0, 0)
            for a in self.replicas.values()
            if a.state == "serving" and a.name not in exclude
        ]

    def get(self, name: str) -> Attestation | None:
        return self.replicas.get(name)

    def note_placement(self, name: str) -> None:
        self.placed.append(name)

    def placing(self, name: str) -> FakePlacement:
        return FakePlacement(self, name)

    async def after_refusal(self, name: str, address: str) -> bool:
        return False


class FakeResponse:
    def __init__(
        self, status: int, headers: dict[str, str] | None = None, body: bytes = b""
    ) -> None:
        self.status = status
        self.headers = Headers({k.lower(): v for k, v in (headers or {}).items()})
        self.raw_headers = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
        self.body = body

    async def read(self) -> bytes:
        return self.body

    def release(self) -> None:
        pass


def opened(session: str, principal: str = "alice", allowed: bool = True) -> FakeResponse:
    """A replica's 200 to the re-home's ``initialize``."""
    headers = {
        "Mcp-Session-Id": session,
        "X-Mcpfleet-Principal": principal,
        "content-type": "application/json",
    }
    if not allowed:
        headers["X-Mcpfleet-Rehome"] = "0"
    result = {
        "jsonrpc": "2.0",
        "id": "mcpfleet-rehome",
        "result": {"protocolVersion": "2025-11-25"},
    }
    return FakeResponse(200, headers, json.dumps(result).encode())


Reply = FakeResponse | BaseException | Callable[[], Any]


class FakePool:
    """The replicas' answers to the re-home's requests, by replica name; records them."""

    def __init__(self, initialize: dict[str, Reply]) -> None:
        self.initialize = initialize
        self.sent: list[tuple[str, str, bytes]] = []  # (replica, what, header block)
        self.gate: asyncio.Event | None = None  # when set: initialize waits for it

    def requests(self, what: str) -> list[str]:
        return [name for name, w, _ in self.sent if w == what]

    async def request(
        self, address: str, method: bytes, target: bytes, headers: bytes, body: bytes
    ) -> FakeResponse:
        name = address.removeprefix("http://").split(".")[0]
        what = "DELETE" if method == b"DELETE" else json.loads(body)["method"]
        self.sent.append((name, what, headers))
        if what != "initialize":
            return FakeResponse(202 if method == b"POST" else 200)
        if self.gate is not None:
            await self.gate.wait()
        reply = self.initialize.get(name, ConnectFailed(OSError("refused")))
        if callable(reply) and not isinstance(reply, FakeResponse):
            reply = await reply()
        if isinstance(reply, BaseException):
            raise reply
        return reply


class FakeUpstream:
    def __init__(self, pool: FakePool, accepting: set[str] | None = None) -> None:
        self.pool = pool
        self.accepting = accepting or set()

    async def accepts(self, address: str) -> bool:
        return address in self.accepting


class Client:
    """One request's exchange, and what the router answered on it."""

    def __init__(self, method: str = "POST", body: bytes = TOOL_CALL) -> None:
        self.messages: list[dict[str, Any]] = []
        scope = {
            "type": "http",
            "method": method,
            "path": "/mcp",
            "headers": [
                (b"authorization", b"Bearer current-token"),
                (b"mcp-session-id", SESSION.encode()),
                (b"content-type", b"application/json"),
            ],
        }
        self.x = Exchange(scope, self._receive, self._send, {}, body, 0.0, SESSION)

    async def _receive(self) -> dict[str, Any]:
        raise AssertionError("re-homing never reads the client's request")

    async def _send(self, message: Any) -> None:
        self.messages.append(message)

    @property
    def status(self) -> int | None:
        starts = [m for m in self.messages if m["type"] == "http.response.start"]
        return starts[0]["status"] if starts else None

    @property
    def body(self) -> bytes:
        return b"".join(
            m.get("body", b"") for m in self.messages if m["type"] == "http.response.body"
        )

    def header(self, name: bytes) -> bytes | None:
        start = next(m for m in self.messages if m["type"] == "http.response.start")
        return dict(start["headers"]).get(name)


class Rig:
    def __init__(
        self,
        initialize: dict[str, Reply] | None = None,
        *,
        rehome: bool = True,
        serving: tuple[str, ...] = ("r1",),
        timeout: float = 5.0,
        accepting: set[str] | None = None,
    ) -> None:
        self.config = RouterConfig(
            redis_url="redis://127.0.0.1:1/0",
            fleet="unit",
            rehome_sessions=rehome,
            rehome_timeout=timeout,
        )
        self.sessions = FakeSessions()
        self.view = FakeView(*serving)
        self.pool = FakePool({"r1": opened("new-on-r1")} if initialize is None else initialize)
        self.upstream = FakeUpstream(self.pool, accepting)
        self.metrics = RouterMetrics()
        self.health = Health()
        fakes: Any = (self.sessions, self.view, self.upstream)
        self.rehomer = Rehomer(self.config, *fakes, self.metrics, self.health)

    async def gone(
        self, client: Client, cause: OwnerGone = OwnerGone.REFUSED, rehomed: bool = False
    ) -> SessionRoute | RequestOutcome:
        return await self.rehomer.gone(client.x, SessionRoute(OWNER), cause, rehomed)

    def count(self, metric: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(metric, labels) or 0.0

    def rehomed(self, cause: OwnerGone = OwnerGone.REFUSED) -> float:
        return self.count("mcpfleet_router_sessions_rehomed_total", cause=cause.value)

    def lost(self, reason: Lost) -> float:
        return self.count("mcpfleet_router_sessions_lost_total", reason=reason.value)


async def until(condition: Callable[[], bool], what: str) -> None:
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never happened: {what}")


# --------------------------------------------------------------------------- the move


async def test_an_idle_session_moves_to_a_live_replica_with_the_current_credential() -> None:
    rig = Rig()
    client = Client()
    route = await rig.gone(client)
    assert route == NEW_ON_R1
    assert client.messages == [], "the router forwards along the new route: nothing answered yet"
    assert rig.sessions.routes[SESSION] == "r1 new-on-r1", "the route in Redis names the new owner"
    assert rig.sessions.claims == set(), "the claim goes with the move"
    assert rig.pool.requests("initialize") == ["r1"]
    assert rig.pool.requests("notifications/initialized") == ["r1"]
    init_headers = next(h for _, w, h in rig.pool.sent if w == "initialize")
    assert b"authorization: Bearer current-token" in init_headers
    assert b"mcp-session-id" not in init_headers.lower(), "the old id is not the new session's"
    assert rig.rehomed() == 1


async def test_concurrent_requests_of_a_session_share_one_move_led_by_the_first() -> None:
    rig = Rig()
    rig.pool.gate = asyncio.Event()
    clients = [Client() for _ in range(3)]
    moves = [asyncio.ensure_future(rig.gone(c)) for c in clients]
    await until(lambda: rig.pool.requests("initialize") == ["r1"], "the leader's initialize")
    await asyncio.sleep(0.01)
    assert not any(m.done() for m in moves), "the followers wait for the leader's move"
    assert rig.pool.requests("initialize") == ["r1"], "one re-open, not one per request"
    rig.pool.gate.set()
    routes = await asyncio.gather(*moves)
    assert routes == [NEW_ON_R1] * 3
    assert all(c.messages == [] for c in clients)
    assert rig.pool.requests("initialize") == ["r1"]
    assert rig.rehomed() == 1


async def test_a_move_another_router_leads_is_awaited_and_its_route_taken() -> None:
    rig = Rig()
    rig.sessions.claims.add(SESSION)  # another router claimed the move
    client = Client()
    waiting = asyncio.ensure_future(rig.gone(client))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    rig.sessions.routes[SESSION] = "r2 other-routers-id"  # that router's move lands
    assert await asyncio.wait_for(waiting, 2) == SessionRoute("r2", "other-routers-id")
    assert rig.sessions.cache[SESSION] == "r2 other-routers-id"
    assert rig.pool.sent == [], "this router opened nothing"


async def test_a_move_another_router_never_finishes_is_a_503_to_retry() -> None:
    rig = Rig(timeout=0.2)
    rig.sessions.claims.add(SESSION)
    client = Client()
    assert await rig.gone(client) is RequestOutcome.UNAVAILABLE
    assert client.status == 503 and client.header(b"retry-after") == b"1"
    assert rig.sessions.routes[SESSION] == OWNER, "still re-homable"


async def test_a_route_another_router_already_moved_is_taken_without_a_move() -> None:
    rig = Rig()
    rig.sessions.routes[SESSION] = "r2 moved-before"  # this router's cache was stale
    assert await rig.gone(Client()) == SessionRoute("r2", "moved-before")
    assert rig.pool.sent == []


async def test_a_stream_reconnect_whose_owner_died_is_re_homed() -> None:
    rig = Rig()
    assert await rig.gone(Client("GET", b""), OwnerGone.DIED) == NEW_ON_R1
    assert rig.rehomed(OwnerGone.DIED) == 1


# ------------------------------------------------------------------ work in flight: the 404


async def assert_lost(rig: Rig, client: Client, outcome: object, reason: Lost) -> None:
    assert outcome is RequestOutcome.OWNER_GONE
    assert client.status == 404
    assert b"Session not found" in client.body
    assert rig.lost(reason) == 1
    assert SESSION not in rig.sessions.routes, "the session is ended, never re-homed"
    assert rig.pool.requests("initialize") == []
    assert rig.rehomed() == 0


async def test_a_session_with_a_request_in_flight_on_this_router_gets_the_404() -> None:
    rig = Rig()
    rig.rehomer.enter(SESSION)
    client = Client()
    await assert_lost(rig, client, await rig.gone(client), Lost.IN_FLIGHT)


async def test_a_session_whose_requests_all_ended_is_re_homed() -> None:
    rig = Rig()
    rig.rehomer.enter(SESSION)
    rig.rehomer.enter(SESSION)
    rig.rehomer.leave(SESSION)
    rig.rehomer.leave(SESSION)
    assert await rig.gone(Client()) == NEW_ON_R1


async def test_an_elicitation_answer_to_the_gone_owner_gets_the_404() -> None:
    rig = Rig()
    client = Client(body=ELICIT_ANSWER)
    await assert_lost(rig, client, await rig.gone(client), Lost.ANSWER_ORPHANED)


async def test_a_session_another_router_marked_lost_gets_the_404() -> None:
    rig = Rig()
    rig.sessions.lost_marks[SESSION] = Lost.DRAIN_DEADLINE.value
    client = Client()
    await assert_lost(rig, client, await rig.gone(client), Lost.DRAIN_DEADLINE)


async def test_a_post_the_dying_owner_dropped_gets_the_404() -> None:
    rig = Rig()
    client = Client()
    await assert_lost(rig, client, await rig.gone(client, OwnerGone.DIED), Lost.REQUEST_BROKE)


async def test_a_session_marked_lost_while_re_opened_gets_the_404_and_the_new_one_closed() -> None:
    rig = Rig()

    def mark() -> None:
        rig.sessions.lost_marks[SESSION] = Lost.REQUEST_BROKE.value

    rig.sessions.on_lost_read = mark
    client = Client()
    assert await rig.gone(client) is RequestOutcome.OWNER_GONE
    assert client.status == 404 and rig.lost(Lost.REQUEST_BROKE) == 1
    assert rig.pool.requests("DELETE") == ["r1"], "the session opened for it is closed"
    assert SESSION not in rig.sessions.routes


@pytest.mark.parametrize(
    ("outcome", "draining", "accepting", "marked"),
    [
        (Failure.UPSTREAM_BROKE, False, True, True),
        (Failure.DROPPED, False, True, True),
        (200, False, False, False),  # a whole answer from a serving owner
        (200, True, True, False),  # draining, but its port still takes connections
        (200, True, False, True),  # draining, and gone: its shutdown may have cut the call
    ],
)
async def test_a_request_cut_with_its_owner_marks_the_session_lost(
    outcome: int | Failure, draining: bool, accepting: bool, marked: bool
) -> None:
    rig = Rig(accepting={attestation(OWNER).address} if accepting else set())
    rig.view.replicas[OWNER] = attestation(OWNER, "draining" if draining else "serving")
    await rig.rehomer.ended(SESSION, OWNER, attestation(OWNER).address, outcome)
    assert (SESSION in rig.sessions.lost_marks) is marked


# --------------------------------------------------------------------------- the re-open fails


async def test_a_replica_that_refuses_to_open_the_session_again_ends_it_with_the_404() -> None:
    rig = Rig({"r1": FakeResponse(400, {"content-type": "application/json"}, b"{}")})
    client = Client()
    assert await rig.gone(client) is RequestOutcome.OWNER_GONE
    assert client.status == 404 and rig.lost(Lost.REFUSED) == 1
    assert SESSION not in rig.sessions.routes
    assert rig.sessions.claims == set()


async def test_a_401_of_the_live_replica_is_relayed_and_the_session_stays_re_homable() -> None:
    challenge = 'Bearer error="invalid_token"'
    rig = Rig({"r1": FakeResponse(401, {"WWW-Authenticate": challenge}, b"expired")})
    client = Client()
    assert await rig.gone(client) is RequestOutcome.CLIENT_ERROR
    assert client.status == 401 and client.body == b"expired"
    assert client.header(b"www-authenticate") == challenge.encode()
    assert rig.sessions.routes[SESSION] == OWNER and rig.sessions.claims == set()
    rig.pool.initialize["r1"] = opened("new-on-r1")
    assert await rig.gone(Client()) == NEW_ON_R1, "the next request with a good token moves it"


async def test_no_replica_taking_the_connection_is_a_503_and_the_session_stays() -> None:
    rig = Rig({}, serving=("r1", "r2"))  # every connect refused
    client = Client()
    assert await rig.gone(client) is RequestOutcome.NO_REPLICA
    assert client.status == 503 and client.header(b"retry-after") == b"1"
    assert sorted(rig.pool.requests("initialize")) == ["r1", "r2"], "each live replica tried"
    assert rig.sessions.routes[SESSION] == OWNER and rig.sessions.claims == set()
    assert rig.lost(Lost.REFUSED) == 0


async def test_a_replica_that_does_not_answer_in_time_fails_over_to_the_next() -> None:
    rig = Rig({"r1": TimeoutError(), "r2": opened("new-on-r2")}, serving=("r1", "r2"))
    assert await rig.gone(Client()) == SessionRoute("r2", "new-on-r2")


async def test_a_re_home_past_its_deadline_is_a_503_and_the_claim_released() -> None:
    async def never() -> FakeResponse:
        await asyncio.Event().wait()
        raise AssertionError

    rig = Rig({"r1": never}, timeout=0.2)
    client = Client()
    assert await rig.gone(client) is RequestOutcome.UNAVAILABLE
    assert client.status == 503 and b"timed out" in client.body
    assert rig.sessions.routes[SESSION] == OWNER and rig.sessions.claims == set()


async def test_a_re_home_cancelled_midway_releases_its_claim_for_the_next_request() -> None:
    rig = Rig()
    rig.pool.gate = asyncio.Event()
    moving = asyncio.ensure_future(rig.gone(Client()))
    await until(lambda: rig.pool.requests("initialize") == ["r1"], "the re-open under way")
    assert rig.sessions.claims == {SESSION}
    moving.cancel()  # the client went away: its request's task is cancelled
    with pytest.raises(asyncio.CancelledError):
        await moving
    assert rig.sessions.claims == set(), (
        "no answer was sent, and the claim is released all the same"
    )
    rig.pool.gate.set()
    assert await rig.gone(Client()) == NEW_ON_R1, "the next request leads a new move"


async def test_another_principals_credential_gets_the_404_and_leaves_the_session_untouched() -> (
    None
):
    rig = Rig({"r1": opened("opened-for-mallory", principal="mallory")})
    client = Client()
    assert await rig.gone(client) is RequestOutcome.OWNER_GONE
    assert client.status == 404
    assert rig.pool.requests("DELETE") == ["r1"], "the session opened for it is closed"
    assert rig.sessions.routes[SESSION] == OWNER, "its owner's next request re-homes it"
    assert SESSION in rig.sessions.init and rig.sessions.claims == set()


async def test_an_app_that_no_longer_allows_re_homing_ends_the_session_with_the_404() -> None:
    rig = Rig({"r1": opened("new-on-r1", allowed=False)})
    client = Client()
    assert await rig.gone(client) is RequestOutcome.OWNER_GONE
    assert client.status == 404 and rig.pool.requests("DELETE") == ["r1"]
    assert rig.count("mcpfleet_router_owner_gone_total", reason="refused") == 1
    assert SESSION not in rig.sessions.routes


async def test_redis_down_during_a_re_home_is_a_503_and_the_router_degraded() -> None:
    rig = Rig()
    rig.sessions.down = True
    client = Client()
    assert await rig.gone(client) is RequestOutcome.UNAVAILABLE
    assert client.status == 503 and b"directory unavailable" in client.body
    assert rig.health.degraded
    rig.sessions.down = False
    assert await rig.gone(Client()) == NEW_ON_R1, "re-homed once Redis answers"


# --------------------------------------------------------------------------- no move at all


async def test_without_re_homing_a_gone_owners_session_gets_the_404() -> None:
    rig = Rig(rehome=False)
    client = Client()
    assert await rig.gone(client, OwnerGone.DEREGISTERED) is RequestOutcome.OWNER_GONE
    assert client.status == 404 and SESSION not in rig.sessions.routes
    assert rig.count("mcpfleet_router_owner_gone_total", reason="deregistered") == 1
    assert rig.pool.sent == []


async def test_a_delete_of_a_gone_owners_session_gets_the_404_not_a_move() -> None:
    rig = Rig()
    client = Client("DELETE", b"")
    assert await rig.gone(client) is RequestOutcome.OWNER_GONE
    assert client.status == 404 and rig.pool.sent == []


async def test_a_delete_on_a_stale_route_goes_to_the_route_another_router_moved_it_to() -> None:
    # This router still caches the old owner; another router re-homed the session:
    # the DELETE ends it where it lives now (the caller forwards it), not with a 404.
    rig = Rig()
    rig.sessions.routes[SESSION] = "r2 moved-before"
    client = Client("DELETE", b"")
    assert await rig.gone(client) == SessionRoute("r2", "moved-before")
    assert client.status is None and rig.sessions.routes[SESSION] == "r2 moved-before"
    assert rig.sessions.cache[SESSION] == "r2 moved-before" and rig.pool.sent == []
    assert rig.count("mcpfleet_router_owner_gone_total", reason="refused") == 0


async def test_a_delete_of_a_gone_owner_with_redis_down_is_a_503_and_the_session_stays() -> None:
    rig = Rig()
    rig.sessions.down = True
    client = Client("DELETE", b"")
    assert await rig.gone(client) is RequestOutcome.UNAVAILABLE
    assert client.status == 503 and rig.sessions.routes[SESSION] == OWNER


async def test_a_session_record_that_does_not_parse_gets_the_404() -> None:
    rig = Rig()
    rig.sessions.init[SESSION] = "{not json"
    client = Client()
    assert await rig.gone(client) is RequestOutcome.OWNER_GONE
    assert client.status == 404 and rig.pool.sent == []


async def test_an_owner_gone_again_right_after_a_move_is_a_503_and_the_session_stays() -> None:
    rig = Rig()
    client = Client()
    assert await rig.gone(client, rehomed=True) is RequestOutcome.UNAVAILABLE
    assert client.status == 503 and rig.sessions.routes[SESSION] == OWNER
    assert rig.pool.sent == []


async def test_a_request_waiting_on_a_move_that_failed_tries_its_own() -> None:
    replies = [FakeResponse(401, {"WWW-Authenticate": "Bearer"}, b"expired"), opened("new-on-r1")]

    async def in_turn() -> FakeResponse:
        return replies.pop(0)  # the leader's credential expired, the follower's is good

    rig = Rig({"r1": in_turn})
    rig.pool.gate = asyncio.Event()
    leader, follower = Client(), Client()
    first = asyncio.ensure_future(rig.gone(leader))
    await until(lambda: rig.pool.requests("initialize") == ["r1"], "the leader's initialize")
    second = asyncio.ensure_future(rig.gone(follower))
    await asyncio.sleep(0.01)
    rig.pool.gate.set()
    assert await first is RequestOutcome.CLIENT_ERROR and leader.status == 401
    assert await second == NEW_ON_R1, "the follower re-homes with its own credential"
    assert follower.messages == []
    assert rig.pool.requests("initialize") == ["r1", "r1"]
