"""notifications/tasks on listen streams in one process: granted ids, owners, frames."""

from __future__ import annotations

import asyncio
import contextvars
from collections import Counter
from typing import Any

import pytest
from mcp.shared.exceptions import MCPError
from mcp_types import SubscriptionFilter, SubscriptionsListenRequestParams

from mcpfleet.notify import FleetBus, TaskStatusChanged
from mcpfleet.notify._bus import decode, encode
from mcpfleet.notify._listen import ListenStreams
from mcpfleet.notify._taskstatus import MAX_TASK_IDS, TaskWatch, requested_task_ids

pytestmark = pytest.mark.unit

#: Who the listen request being served is (the real lookup reads the request's context).
OWNER: contextvars.ContextVar[str] = contextvars.ContextVar("owner")
META = "io.modelcontextprotocol/subscriptionId"


class Counts:
    def __init__(self) -> None:
        self.seen: Counter[tuple[str, str]] = Counter()

    def published(self, kind: str) -> None:
        self.seen["published", kind] += 1

    def delivered(self, kind: str) -> None:
        self.seen["delivered", kind] += 1

    def dropped(self, reason: str) -> None:
        self.seen["dropped", reason] += 1

    def fanout(self, seconds: float) -> None:
        pass

    def streams(self, delta: int) -> None:
        pass


class Store:
    """Tasks by id: their owner and status; read as each owner's ``tasks/get`` reads."""

    def __init__(self) -> None:
        self.tasks: dict[str, tuple[str, str]] = {}
        self.declared = True
        self.reads = 0
        self.failing = False

    async def detail(self, task_id: str) -> dict[str, Any] | None:
        self.reads += 1
        if self.failing:
            raise TimeoutError
        found = self.tasks.get(task_id)
        if found is None or found[0] != OWNER.get():
            return None
        return {"taskId": task_id, "status": found[1], "lastUpdatedAt": str(self.reads)}


class Lookup:
    def __init__(self, store: Store) -> None:
        self.store = store

    def declared(self, ctx: Any) -> bool:
        return self.store.declared

    async def detail(self, task_id: str) -> dict[str, Any] | None:
        return await self.store.detail(task_id)


class Session:
    def __init__(self) -> None:
        self.frames: asyncio.Queue[Any] = asyncio.Queue()

    async def send_notification(self, notification: Any, related_request_id: Any) -> None:
        self.frames.put_nowait(notification)


class Ctx:
    def __init__(self, request_id: int) -> None:
        self.request_id = request_id
        self.session = Session()


def params(**notifications: Any) -> SubscriptionsListenRequestParams:
    return SubscriptionsListenRequestParams(notifications=SubscriptionFilter(**notifications))


async def open_stream(
    streams: ListenStreams, owner: str, request_id: int, **notifications: Any
) -> tuple[Ctx, asyncio.Task[Any], Any]:
    """A stream of ``owner`` (its handler in a task of its own); its acknowledgement."""
    ctx = Ctx(request_id)

    async def run() -> Any:
        OWNER.set(owner)
        return await streams(ctx, params(**notifications))  # type: ignore[arg-type]

    handler = asyncio.create_task(run())
    ack = await asyncio.wait_for(ctx.session.frames.get(), 2)
    assert ack.method == "notifications/subscriptions/acknowledged"
    return ctx, handler, ack


async def frames(ctx: Ctx, wait: float = 0.2) -> list[dict[str, Any]]:
    """The ``notifications/tasks`` params the stream got within ``wait`` seconds."""
    out = []
    try:
        while True:
            frame = await asyncio.wait_for(ctx.session.frames.get(), wait)
            assert frame.method == "notifications/tasks"
            out.append(frame.params)
    except TimeoutError:
        return out


@pytest.fixture
def store() -> Store:
    return Store()


@pytest.fixture
def streams(store: Store) -> ListenStreams:
    counts = Counts()
    streams = ListenStreams(FleetBus("c", deadline=1.0, observer=counts), counts)
    streams.tasks = Lookup(store)
    return streams


def test_task_frames_round_trip_and_bad_ones_are_refused() -> None:
    event = TaskStatusChanged("t1", "completed")
    assert decode(encode(event, now=3.0)) == (event, 3.0)
    for junk in (
        b'{"k":"task","t":1,"i":"t1","s":"done"}',
        b'{"k":"task","t":1,"s":"working"}',
        b'{"k":"task","t":1,"i":"","s":"working"}',
        b'{"k":"task","t":1,"i":"' + b"x" * 300 + b'","s":"working"}',
    ):
        assert decode(junk) is None


def test_task_ids_are_a_bounded_list_of_strings() -> None:
    assert requested_task_ids(SubscriptionFilter(tools_list_changed=True)) is None
    assert requested_task_ids(SubscriptionFilter(taskIds=["a", "b", "a"])) == ["a", "b"]
    for bad in ("a", [1], [""], ["x" * 257], ["t"] * (MAX_TASK_IDS + 1)):
        with pytest.raises(MCPError):
            requested_task_ids(SubscriptionFilter(taskIds=bad))
    assert requested_task_ids(SubscriptionFilter(taskIds=["t"] * MAX_TASK_IDS)) == ["t"]


async def test_the_owner_hears_each_change_of_its_task_and_another_principal_none(
    store: Store, streams: ListenStreams
) -> None:
    store.tasks["t1"] = ("alice", "working")
    alice, alice_run, alice_ack = await open_stream(streams, "alice", 1, taskIds=["t1"])
    bob, bob_run, bob_ack = await open_stream(streams, "bob", 2, taskIds=["t1"])
    assert alice_ack.params.notifications.model_extra == {"taskIds": ["t1"]}
    assert bob_ack.params.notifications.model_extra == {"taskIds": []}
    first = await frames(alice)
    assert [(f["taskId"], f["status"], f["_meta"][META]) for f in first] == [("t1", "working", 1)]
    for status in ("input_required", "working", "completed"):
        store.tasks["t1"] = ("alice", status)
        await streams.bus.send(TaskStatusChanged("t1", status))
    assert [f["status"] for f in await frames(alice)] == ["input_required", "working", "completed"]
    assert await frames(bob) == []
    # Ended: the task is forgotten, a late announcement reads nothing.
    reads = store.reads
    await streams.bus.send(TaskStatusChanged("t1", "completed"))
    assert await frames(alice) == [] and store.reads == reads
    streams.close()
    await asyncio.wait_for(asyncio.gather(alice_run, bob_run), 2)


async def test_a_repeated_status_is_sent_once_and_an_unread_task_is_counted(
    store: Store, streams: ListenStreams
) -> None:
    store.tasks["t1"] = ("alice", "working")
    alice, run, _ = await open_stream(streams, "alice", 1, taskIds=["t1"])
    assert len(await frames(alice)) == 1
    await streams.bus.send(TaskStatusChanged("t1", "working"))
    assert await frames(alice) == []
    store.failing = True
    await streams.bus.send(TaskStatusChanged("t1", "completed"))
    assert await frames(alice) == []
    counts = streams.observer
    assert isinstance(counts, Counts) and counts.seen["dropped", "redis"] == 1
    streams.close()
    await asyncio.wait_for(run, 2)


async def test_task_ids_without_the_extension_declared_are_refused(
    store: Store, streams: ListenStreams
) -> None:
    store.declared = False
    with pytest.raises(MCPError) as refused:
        await streams(Ctx(1), params(taskIds=["t1"]))  # type: ignore[arg-type]
    assert refused.value.error.code == -32021
    assert streams.open == 0


async def test_an_app_without_tasks_does_not_honour_task_ids(streams: ListenStreams) -> None:
    streams.tasks = None
    _, run, ack = await open_stream(streams, "alice", 1, taskIds=["t1"], tools_list_changed=True)
    assert ack.params.notifications.model_extra == {}
    assert ack.params.notifications.tools_list_changed is True
    streams.close()
    await asyncio.wait_for(run, 2)


async def test_a_change_published_before_the_grant_is_read_after_it(store: Store) -> None:
    """Subscribed first, granted after: nothing falls between the two."""
    store.tasks["t1"] = ("alice", "working")
    watch = TaskWatch(Lookup(store), ["t1", "t2"])
    assert watch.wants(TaskStatusChanged("t2", "working"))
    OWNER.set("alice")
    first = await watch.grant()
    assert [f["status"] for f in first] == ["working"] and watch.granted == ["t1"]
    assert not watch.wants(TaskStatusChanged("t2", "working"))
    store.tasks["t1"] = ("alice", "failed")
    frame = await watch.frame(TaskStatusChanged("t1", "failed"))
    assert frame is not None and frame["status"] == "failed"
    assert not watch.wants(TaskStatusChanged("t1", "failed"))
