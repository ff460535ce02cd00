"""The fleet on a real Redis Cluster (3 masters, 3 replicas) through ``redis+cluster://``.

Every component connects under its own ACL user (created on all six nodes,
with the rules of the cluster's key names). Both eras through the router,
sticky sessions, re-homing, the registry, once-flows (replays on every replica,
concurrent replays) run on it; the keys are where the contract says (a
session's on its own slot, spread over the masters; the registry on one slot),
and ``ACL LOG`` stays empty on every node.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from redis.crc import key_slot

from fleetkit import scenarios
from fleetkit.apps.onceapp import EFFECTS_ENV
from fleetkit.clients.listen import listening
from fleetkit.clients.rawsession import bounded, metric_sum, open_sessions
from fleetkit.clients.wire import Answer, accept, modern_call
from fleetkit.clusterrig import RedisClusterRig, cluster_fleet, redis_cluster
from fleetkit.fleet import FleetOptions
from fleetkit.redisrig import RedisFleet, acl_log
from mcpfleet import redisconn
from mcpfleet.dev.wait import wait_for
from mcpfleet.fleetclient import connect
from mcpfleet.limits._store import RateStore
from mcpfleet.once import ONCE_META_KEY, RETRY_CODE
from mcpfleet.registry import read_replicas, read_replicas_sync
from mcpfleet_examples.app import WEEKLY_REPORT

from .conftest import shared

pytestmark = pytest.mark.fleet

REHOMED = "mcpfleet_router_sessions_rehomed_total"
HEADERS = {
    "content-type": "application/json",
    "accept": "application/json, text/event-stream",
    "mcp-protocol-version": "2025-11-25",
}


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterRig]:
    with redis_cluster(tmp_path_factory.mktemp("cluster")) as each:
        for node in each.nodes:
            acl_log(node, reset=True)
        yield each


@pytest.fixture(scope="module")
def blue(rig: RedisClusterRig, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisFleet]:
    options = FleetOptions(fleet="blue", routers=2, router_args=("--rehome-sessions",))
    with cluster_fleet(tmp_path_factory.mktemp("blue"), options, rig) as lf, shared(lf):
        yield lf


@pytest.fixture(scope="module")
def effects(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("effects") / "effects.log"


@pytest.fixture(scope="module")
def once(
    rig: RedisClusterRig, tmp_path_factory: pytest.TempPathFactory, effects: Path
) -> Iterator[RedisFleet]:
    options = FleetOptions(
        fleet="once", app="fleetkit.apps.onceapp:app", env={EFFECTS_ENV: str(effects)}
    )
    with cluster_fleet(tmp_path_factory.mktemp("once"), options, rig) as lf, shared(lf):
        yield lf


async def test_modern_rounds_spread_on_a_cluster(blue: RedisFleet) -> None:
    await scenarios.modern_rounds_spread(blue)


async def test_an_event_published_on_one_replica_reaches_listen_streams_on_every_replica(
    blue: RedisFleet,
) -> None:
    """The fleet bus on a cluster: a listen stream on each replica, subscribed to
    ``report://weekly``; ``create_task`` run on replica 0 publishes ``resources/updated``
    (one ``PUBLISH`` on the cluster, carried to every node's subscribers): every stream
    gets it, those on the two replicas that did not run the tool included."""
    urls = {name: f"{m.url}/mcp" for name, m in blue.members.items()}
    timeout = httpx.Timeout(10, read=None)
    async with httpx.AsyncClient(timeout=timeout) as http, contextlib.AsyncExitStack() as stack:
        streams = {}
        for n, (name, url) in enumerate(urls.items()):
            ctx = listening(http, url, 50 + n, resourceSubscriptions=[WEEKLY_REPORT])
            streams[name] = await stack.enter_async_context(ctx)
            ack = await streams[name].next_event(10)
            assert ack.method == "notifications/subscriptions/acknowledged", ack.message
        async with connect(urls["replica-0"], "modern") as client:
            result = await client.call_tool("create_task", {"project": "cluster"})
        assert str(result.data).startswith("Created"), result.data
        for name, listener in streams.items():
            frame = await listener.next_event(10)
            assert frame.method == "notifications/resources/updated", (name, frame.message)
            assert frame.message is not None
            assert frame.message["params"]["uri"] == WEEKLY_REPORT, (name, frame.message)


async def test_a_rounds_lease_is_taken_and_read_on_the_cluster_as_the_replica(
    blue: RedisFleet, rig: RedisClusterRig
) -> None:
    """The limits' bucket on a cluster, through the replica's own client, ACL user and
    driver: a lease of 5 taken (its reply, one status line, read through the cluster's
    client), then the bucket's last round, then a refusal with the wait until the next;
    the bucket is a key on its slot's master. A reply the limiter could not read would
    make every check fall back to the replica's memory, with rounds still served."""
    user, password_file = blue.users["replica"]
    files = redisconn.RedisFiles(password_file=password_file)
    client = redisconn.async_client(
        redisconn.settings(f"redis+cluster://{user}@{rig.url_hosts}", files), timeout=1
    )
    key = blue.keys.limit("rounds", "addr-cluster-test")
    try:
        store = RateStore(redisconn.DirectCommands(client))
        assert await store.take(key, 10.0, 6, 5) == (5, 0.0, 1)
        assert await store.take(key, 10.0, 6, 5) == (1, 0.0, 0)
        granted, wait, left = await store.take(key, 10.0, 6, 5)
        assert (granted, left) == (0, 0) and 0.05 < wait <= 0.1, wait
    finally:
        await client.aclose()
    with contextlib.closing(rig.admin()) as admin:
        assert admin.get(key) is not None  # denials: test_nothing_was_denied_on_any_node


async def test_handshake_sessions_stick_on_a_cluster(blue: RedisFleet) -> None:
    await scenarios.handshake_session_sticks(blue)
    await scenarios.concurrent_handshake_sessions(blue, 20)


async def test_session_routes_spread_over_the_masters_each_session_on_one_slot(
    blue: RedisFleet, rig: RedisClusterRig
) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        sessions = await open_sessions(blue.url, http, 24)
    keys = blue.keys
    with contextlib.closing(rig.admin()) as admin:
        for s in sessions:
            assert admin.get(keys.session(s.session)) is not None
    holders = {rig.node_of(keys.session(s.session)).name for s in sessions}
    assert len(holders) >= 2, holders  # 24 random ids on one master of three: never
    for s in sessions:
        slot = key_slot(keys.session(s.session).encode())
        assert key_slot(keys.session_init(s.session).encode()) == slot
        assert key_slot(keys.session_lost(s.session).encode()) == slot
        assert key_slot(keys.session_moving(s.session).encode()) == slot
    # The router's batched lookups: router 1 never saw these sessions; it finds every
    # route (one MGET per slot, one round trip per node) and each ping reaches its owner.
    async with httpx.AsyncClient(timeout=30) as http:

        async def ping(session: str) -> httpx.Response:
            body = '{"jsonrpc":"2.0","id":2,"method":"ping"}'
            headers = {**HEADERS, "mcp-session-id": session}
            return await http.post(blue.router_url(1), content=body, headers=headers)

        answers = await asyncio.gather(*(ping(s.session) for s in sessions))
    assert [a.status_code for a in answers] == [200] * len(sessions)
    assert [a.headers["x-mcpfleet-replica"] for a in answers] == [s.replica for s in sessions]


async def test_the_registry_lives_on_one_slot_and_reads_as_each_user(
    blue: RedisFleet, rig: RedisClusterRig
) -> None:
    keys = blue.keys
    assert key_slot(keys.replicas.encode()) == key_slot(keys.replica("replica-0").encode())
    wait_for(lambda: len(blue.attestations()) == 3, timeout=30, what="three replicas attested")
    user, password_file = blue.users["router"]
    files = redisconn.RedisFiles(password_file=password_file)
    router = redisconn.async_client(
        redisconn.settings(f"redis+cluster://{user}@{rig.url_hosts}", files), timeout=1
    )
    try:
        assert set(await read_replicas(router, keys)) == set(blue.attestations())
    finally:
        await router.aclose()
    user, password_file = blue.users["operator"]
    files = redisconn.RedisFiles(password_file=password_file)
    operator = redisconn.sync_client(
        redisconn.settings(f"redis+cluster://{user}@{rig.url_hosts}", files), timeout=1
    )
    try:
        assert set(read_replicas_sync(operator, keys)) == set(blue.attestations())
    finally:
        operator.close()


async def test_idle_sessions_of_a_sigkilled_replica_are_rehomed_on_a_cluster(
    blue: RedisFleet,
) -> None:
    before = metric_sum(httpx.get(f"http://127.0.0.1:{blue.router_ports[0]}/metrics").text, REHOMED)
    async with httpx.AsyncClient(timeout=30) as http:
        sessions = await open_sessions(blue.url, http, 9)
        victim = Counter(s.replica for s in sessions).most_common(1)[0][0]
        on_victim = [s for s in sessions if s.replica == victim]
        blue.kill(victim)
        answers = await bounded(sessions, lambda s: s.ping())
    assert Counter(a.status_code for a in answers) == {200: len(sessions)}
    after = metric_sum(httpx.get(f"http://127.0.0.1:{blue.router_ports[0]}/metrics").text, REHOMED)
    assert after - before == len(on_victim)
    await asyncio.to_thread(blue.add_replica, f"{victim}-new")


def _count(effects: Path, order: str) -> int:
    if not effects.exists():
        return 0
    return sum(1 for ln in effects.read_text().splitlines() if ln.startswith(f"{order} "))


def _final(url: str, order: str, state: str) -> Answer:
    return modern_call(
        url, "charge", {"order": order}, request_state=state, input_responses={"ok": accept(True)}
    )


def _ask(url: str, order: str) -> str:
    first = modern_call(url, "charge", {"order": order})
    assert first.result.get("resultType") == "input_required", first.body
    return str(first.result["requestState"])


def _text(answer: Answer) -> str:
    return str((answer.result.get("content") or [{}])[0].get("text"))


def test_a_final_round_replayed_on_every_replica_runs_once_on_a_cluster(
    once: RedisFleet, effects: Path, rig: RedisClusterRig
) -> None:
    state = _ask(once.url, "c-1")
    assert _text(_final(once.url, "c-1", state)) == "c-1: charged"
    for replica in once.members.values():
        replay = _final(f"{replica.url}/mcp", "c-1", state)
        assert _text(replay) == "c-1: charged", replay.body
        assert replay.result["_meta"][ONCE_META_KEY] == {"replayed": True}
    assert _count(effects, "c-1") == 1
    with contextlib.closing(rig.admin()) as admin:
        ledger = [k for k in admin.scan_iter(match=f"{once.keys.prefix}:once:*")]
    assert ledger and all(b":once:{" in k for k in ledger), ledger


def test_twenty_concurrent_replays_charge_once_on_a_cluster(
    once: RedisFleet, effects: Path
) -> None:
    state = _ask(once.url, "c-race")
    answers: list[Answer] = []
    start = threading.Barrier(20)

    def replay() -> None:
        start.wait(timeout=30)
        answers.append(_final(once.url, "c-race", state))

    threads = [threading.Thread(target=replay) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(answers) == 20
    assert _count(effects, "c-race") == 1
    for answer in answers:
        err = answer.error
        assert _text(answer) == "c-race: charged" or (err and err["code"] == RETRY_CODE), (
            answer.body
        )


def test_nothing_was_denied_on_any_node(
    blue: RedisFleet, once: RedisFleet, rig: RedisClusterRig
) -> None:
    """Every scenario above ran as the components' users: ACL LOG stays empty everywhere."""
    users = set()
    for node in rig.masters:
        with contextlib.closing(node.admin()) as admin:
            users |= {c["user"] for c in admin.client_list()}
    assert {blue.users["replica"][0], blue.users["router"][0]} <= users, users
    assert "default" not in users
    for node in rig.nodes:
        assert acl_log(node) == [], f"{node.name}: a component sent a command outside its rules"
    wait_for(lambda: len(blue.attestations()) == 3, timeout=30, what="three replicas attested")
