"""The fleet's side of MCP tasks: the queue's place, its credentials, its ACL, the snapshots.

The pure parts run everywhere; the wiring of FastMCP's tasks engine runs where
the [tasks] extra is installed (``make test-tasks``).
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import quote

import pytest

from mcpfleet.config import ReplicaConfig
from mcpfleet.contract import TASK_QUEUE_COMMANDS, RedisKeys
from mcpfleet.redisconn import (
    RedisConfigError,
    RedisFiles,
    RedisSettings,
    parse_url,
    queue_target,
    settings,
)
from mcpfleet.tasks import (
    CREDENTIAL_HEADERS,
    FleetQueue,
    fleet_queue,
    fleet_queue_of,
    scrub_snapshot,
)

pytestmark = pytest.mark.unit

SECRET = "s3cret-password-never-shown"
BEARER = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJl"


def snapshot() -> str:
    token = {
        "token": BEARER,
        "client_id": "app",
        "scopes": ["read"],
        "claims": {"sub": "alice"},
    }
    return json.dumps(
        {
            "access_token_json": json.dumps(token),
            "http_headers": {
                "Authorization": f"Bearer {BEARER}",
                "cookie": "sid=1",
                "proxy-authorization": "Basic eA==",
                "user-agent": "tests",
            },
            "origin_request_id": "1",
            "session_id": None,
            "owning_tool_name": "double",
            "owning_tool_version": None,
        }
    )


def test_a_scrubbed_snapshot_keeps_the_callers_identity_and_none_of_its_credentials() -> None:
    out = scrub_snapshot(snapshot())
    assert BEARER not in out and "sid=1" not in out and "Basic" not in out
    data = json.loads(out)
    assert data["http_headers"] == {"user-agent": "tests"}
    token = json.loads(data["access_token_json"])
    assert token["token"] == ""
    assert (token["client_id"], token["claims"], token["scopes"]) == (
        "app",
        {"sub": "alice"},
        ["read"],
    )
    assert data["owning_tool_name"] == "double"
    assert {"authorization", "cookie", "proxy-authorization"} == CREDENTIAL_HEADERS


def test_an_anonymous_snapshot_is_scrubbed_to_no_headers_and_no_token() -> None:
    raw = json.dumps({"access_token_json": None, "http_headers": {"authorization": "x"}})
    assert json.loads(scrub_snapshot(raw)) == {"access_token_json": None, "http_headers": None}


def test_the_queue_lies_under_the_fleets_prefix() -> None:
    assert RedisKeys("blue").tasks == "mcpfleet:blue:tasks"
    q = fleet_queue(
        fleet="blue",
        redis_url="redis://127.0.0.1:6379/2",
        redis_files=RedisFiles(),
        replica="r0",
        redelivery_timeout=7,
        concurrency=3,
    )
    assert q == FleetQueue("mcpfleet:blue:tasks", "redis://127.0.0.1:6379/2", None, "r0", 7, 3)


def test_a_standalone_replica_keeps_its_queue_in_memory(tmp_path: Path) -> None:
    q = fleet_queue_of(ReplicaConfig(keys_dir=tmp_path, fleet="dev"), "r0")
    assert (q.url, q.name, q.worker_name) == ("memory://", "mcpfleet:dev:tasks", "r0")
    assert (q.redelivery_timeout, q.concurrency) == (30.0, 10)


def test_the_queue_url_never_carries_the_password_from_a_file(tmp_path: Path) -> None:
    pw = tmp_path / "pw"
    pw.write_text(SECRET + "\n")
    url, provider = queue_target(
        settings("redis://replica@10.0.0.1:6380/3", RedisFiles(password_file=pw))
    )
    assert url == "redis://10.0.0.1:6380/3"
    assert provider.get_credentials() == ("replica", SECRET)


def test_the_queue_url_never_carries_the_password_from_a_url_read_from_a_file() -> None:
    s = settings(f"redis://replica:{SECRET}@h:6379/0", source="file")
    url, provider = queue_target(s)
    assert SECRET not in url and url == "redis://h:6379/0"
    assert provider.get_credentials() == ("replica", SECRET)


def test_the_queue_url_keeps_tls_and_its_files(tmp_path: Path) -> None:
    files = RedisFiles(
        ca_file=tmp_path / "ca.pem", cert_file=tmp_path / "c.pem", key_file=tmp_path / "k.pem"
    )
    # Built as settings() builds it once the files are checked (they are not read here).
    s = RedisSettings(url="rediss://h:6380/0", parsed=parse_url("rediss://h:6380/0"), files=files)
    url, provider = queue_target(s)
    assert url == (
        "rediss://h:6380/0?ssl_cert_reqs=required"
        f"&ssl_ca_certs={quote(str(files.ca_file), safe='')}"
        f"&ssl_certfile={quote(str(files.cert_file), safe='')}"
        f"&ssl_keyfile={quote(str(files.key_file), safe='')}"
    )
    assert provider is None


def test_a_sentinel_url_stays_one_for_the_queue_with_the_masters_credentials_apart(
    tmp_path: Path,
) -> None:
    pw = tmp_path / "pw"
    pw.write_text(SECRET + "\n")
    s = settings(
        "redis+sentinel://replica@s1:26379,[fd00::2]:26380/mymaster/2",
        RedisFiles(password_file=pw),
    )
    url, provider = queue_target(s)
    assert url == "redis+sentinel://s1:26379,[fd00::2]:26380/mymaster/2"
    assert provider.get_credentials() == ("replica", SECRET)
    queues = {
        url: fleet_queue(
            fleet="f",
            redis_url=url,
            redis_files=RedisFiles(),
            replica="r0",
            redelivery_timeout=30,
            concurrency=1,
        )
        for url in ("redis+sentinel://s1:26379/mymaster/0", "redis://h:6379/0")
    }
    assert [(q.url, q.replicated) for q in queues.values()] == [
        ("redis+sentinel://s1:26379/mymaster/0", True),
        ("redis://h:6379/0", False),
    ]


def test_a_unix_socket_is_refused_for_the_queue_saying_why() -> None:
    with pytest.raises(RedisConfigError, match="MCP tasks need a Redis reached over TCP"):
        queue_target(settings("unix:///run/redis.sock?db=1"))


def test_the_replicas_queue_rules_are_a_selector_on_the_queues_keys_and_channels_only() -> None:
    rules = RedisKeys("blue").acl_rules("replica")
    start = next(i for i, r in enumerate(rules) if r.startswith("("))
    end = next(i for i in range(start, len(rules)) if rules[i].endswith(")"))
    root, selector = rules[:start], rules[start : end + 1]
    assert selector[0] == "(~mcpfleet:blue:tasks:*" and selector[-1].endswith(")")
    assert [r for r in selector if r[0] in "~&%("] == [
        "(~mcpfleet:blue:tasks:*",
        "&mcpfleet:blue:tasks:*",
        "&mcpfleet:blue:tasks:cancel:*",
    ]
    assert [r.rstrip(")") for r in selector if r.startswith("+")] == [
        f"+{c}" for c in TASK_QUEUE_COMMANDS
    ]
    # Lua scripts are loaded, never flushed (SCRIPT FLUSH has no key to scope it).
    assert "+script|load" in selector and "+script" not in selector
    # The routes and the once-ledger gain no command from the queue.
    assert "+xadd" not in root and "+hset" not in root
    assert not [r for r in root if "tasks" in r]
    assert not [r for r in RedisKeys("blue").acl_rules("router") if "tasks" in r]
    # The operator reads the task-seal ledgers only (ZCOUNT), never the queue.
    operator = RedisKeys("blue").acl_rules("operator")
    assert [r for r in operator if "tasks" in r] == ["%R~mcpfleet:blue:tasks:sealed:*"]
    assert RedisKeys("blue").task_seals("k1") == "mcpfleet:blue:tasks:sealed:k1"


def test_an_app_without_a_tasks_extension_is_left_alone() -> None:
    from fastmcp import FastMCP

    from mcpfleet.tasks import has_tasks_extension, install_tasks

    app = FastMCP("plain")
    queue = FleetQueue("mcpfleet:t:tasks", "memory://", None, "r0", 5, 2)
    assert not has_tasks_extension(app)
    assert install_tasks(app, queue) is False


@pytest.mark.tasks
def test_the_apps_tasks_extension_is_replaced_by_one_on_the_fleets_queue() -> None:
    pytest.importorskip("fastmcp_tasks", reason="the [tasks] extra: make test-tasks")
    from datetime import timedelta

    from fastmcp import FastMCP
    from fastmcp_tasks import TasksExtension

    from mcpfleet.tasks import TASKS_EXTENSION_ID, install_tasks

    app = FastMCP("with-tasks")
    theirs = TasksExtension(
        url="redis://elsewhere:6379/0",
        name="their-queue",
        reconnection_delay=timedelta(seconds=9),
    )
    app.add_extension(theirs)

    @app.tool(task=True)
    async def work() -> int:
        return 1

    queue = FleetQueue("mcpfleet:t:tasks", "redis://h:6379/0", None, "r0", 5, 2)
    assert install_tasks(app, queue) is True
    ours = app._extensions[TASKS_EXTENSION_ID]
    assert ours is not theirs and isinstance(ours, TasksExtension)
    s = ours.docket_settings
    assert (s.url, s.name, s.worker_name, s.concurrency) == (
        "redis://h:6379/0",
        "mcpfleet:t:tasks",
        "r0",
        2,
    )
    assert s.redelivery_timeout == timedelta(seconds=5)
    assert s.reconnection_delay == timedelta(seconds=9), "the app's own tuning is kept"


@pytest.mark.tasks
def test_the_engines_snapshots_are_scrubbed_before_its_codec_encodes_them() -> None:
    pytest.importorskip("fastmcp_tasks", reason="the [tasks] extra: make test-tasks")
    from fastmcp import FastMCP
    from fastmcp_tasks import TasksExtension, context

    from mcpfleet.tasks import install_tasks

    app = FastMCP("with-tasks")
    app.add_extension(TasksExtension())
    install_tasks(app, FleetQueue("mcpfleet:t:tasks", "memory://", None, "r0", 5, 2))
    install_tasks(app, FleetQueue("mcpfleet:t:tasks", "memory://", None, "r0", 5, 2))
    codec = context.snapshot_codec()  # type: ignore[attr-defined]
    stored = codec.encode(snapshot())
    assert BEARER not in stored and "sid=1" not in stored
    assert json.loads(codec.decode(stored))["owning_tool_name"] == "double"


@pytest.mark.tasks
def test_the_engine_hooks_are_installed_once_and_report_to_the_last_wired_replica() -> None:
    """Wiring a second app replaces nothing twice; the hooks then report to its replica
    (the first one's sealer no longer seals), and detached they pass the engine's own
    codec through, still scrubbing."""
    pytest.importorskip("fastmcp_tasks", reason="the [tasks] extra: make test-tasks")
    import importlib

    from fastmcp import FastMCP
    from fastmcp_tasks import TasksExtension

    from mcpfleet.keys.ring import KeyRing
    from mcpfleet.tasks import RingSnapshotCodec, wire_tasks
    from mcpfleet.tasks._engine_hooks import ENGINE_HOOKS

    extension = importlib.import_module("fastmcp_tasks.extension")
    context = importlib.import_module("fastmcp_tasks.context")
    components = importlib.import_module("fastmcp_tasks.components")
    handlers = importlib.import_module("fastmcp_tasks.handlers")

    def replaced() -> tuple[object, ...]:
        return (
            extension.create_task,
            context.snapshot_codec,
            components.reentrant_task_fn,
            handlers.mark_cancelled,
            context.restore_task_snapshot,
            context.TaskContextSnapshot.save,
            handlers.refresh_snapshot_ttl,
            extension.tasks_get,
        )

    def app() -> FastMCP:
        server = FastMCP("with-tasks")
        server.add_extension(TasksExtension())
        return server

    queue = FleetQueue("mcpfleet:t:tasks", "memory://", None, "r0", 5, 2)
    ring = KeyRing.generate()
    sealer = RingSnapshotCodec(lambda: ring)
    first = wire_tasks(app(), queue, sealer=sealer)
    try:
        hooks = replaced()
        assert all(getattr(hook, "_mcpfleet_hook", False) for hook in hooks)
        assert ENGINE_HOOKS.fleet is first
        assert context.snapshot_codec().inner is sealer
        second = wire_tasks(app(), queue)
        assert replaced() == hooks, "no engine function is wrapped twice"
        assert second is not None and ENGINE_HOOKS.fleet is second
        assert context.snapshot_codec().inner is not sealer
    finally:
        ENGINE_HOOKS.detach()
    assert ENGINE_HOOKS.fleet is None
    codec = context.snapshot_codec()
    assert codec.inner is not sealer and BEARER not in codec.encode(snapshot())


async def test_a_bounded_call_answers_within_its_deadline_saying_the_outcome_is_unknown() -> None:
    import asyncio

    from mcp.shared.exceptions import MCPError

    from mcpfleet.tasks import bounded

    async def stalled() -> int:
        await asyncio.sleep(30)
        return 1

    async def quick(n: int) -> int:
        return n

    assert await bounded(quick, 1.0, "this request")(2) == 2
    with pytest.raises(
        MCPError, match=r"did not answer within 0\.05 s; the outcome of x is unknown"
    ):
        await bounded(stalled, 0.05, "x")()


def test_a_tasks_tool_is_named_from_its_component_key() -> None:
    from mcpfleet.tasks._fleet import tool_of, tool_of_key

    assert tool_of("tool:double@") == "double"
    assert tool_of("tool:report@1.2") == "report"
    assert tool_of("tool:a:b@") == "a:b"
    assert tool_of("") == "other"
    assert tool_of_key("not a task key") == "other"


def test_task_tool_labels_are_bounded() -> None:
    from mcpfleet.tasks import MAX_TOOL_LABELS, FleetTasks

    seen: list[tuple[str, str]] = []
    queue = FleetQueue("mcpfleet:t:tasks", "memory://", None, "r0", 5, 2)
    handle = FleetTasks(object(), queue, lambda tool, event: seen.append((tool, event)))
    for i in range(MAX_TOOL_LABELS + 10):
        handle.event(f"tool{i}", "created")
    handle.event("tool0", "completed")
    names = {tool for tool, _ in seen}
    assert len(names) == MAX_TOOL_LABELS + 1 and "other" in names
    assert seen[-1] == ("tool0", "completed"), "a tool counted once keeps its name"


def test_a_replica_without_an_engine_running_has_nothing_to_drain_or_read() -> None:
    import asyncio

    from mcpfleet.tasks import FleetTasks

    queue = FleetQueue("mcpfleet:t:tasks", "memory://", None, "r0", 5, 2)
    handle = FleetTasks(object(), queue, None)
    assert handle.busy() == 0
    assert handle.stop_taking() is False
    assert asyncio.run(handle.hand_back(None, 1.0)) == 0
    assert asyncio.run(handle.queue_depth(None)) is None


def test_the_task_metrics_count_each_event_under_its_own_name(tmp_path: Path) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from mcpfleet.keys.ring import KeyRing
    from mcpfleet.replica.gate import GateState
    from mcpfleet.replica.metrics import ReplicaMetrics
    from mcpfleet.tasks import TASK_EVENTS

    ring = KeyRing.generate()
    metrics = ReplicaMetrics(app="a:b", ring=lambda: ring, gate=GateState(name="r0"))
    assert b"mcpfleet_tasks_" not in metrics.render(), "none for an app without task tools"
    metrics.enable_tasks(lambda: 3)
    for event in TASK_EVENTS:
        metrics.task_event("double", event)
    metrics.task_queue_depth(7)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(metrics.render().decode())
        for s in f.samples
    }
    assert samples[("mcpfleet_tasks_created_total", (("tool", "double"),))] == 1
    assert samples[("mcpfleet_tasks_input_requests_total", (("tool", "double"),))] == 1
    assert samples[("mcpfleet_tasks_unreplicated_total", (("tool", "double"),))] == 1
    for status in ("completed", "error", "failed", "cancelled"):
        key = ("mcpfleet_tasks_finished_total", (("status", status), ("tool", "double")))
        assert samples[key] == 1, status
    assert samples[("mcpfleet_tasks_running", ())] == 3
    assert samples[("mcpfleet_tasks_queue_depth", ())] == 7
    assert samples[("mcpfleet_tasks_queue_read_timestamp_seconds", ())] > 0


@pytest.mark.tasks
def test_snapshots_sealed_under_the_ring_open_with_any_of_its_keys_and_fail_closed_else() -> None:
    pytest.importorskip("fastmcp_tasks", reason="the [tasks] extra: make test-tasks")
    from fastmcp_tasks.encryption import SnapshotDecryptionError

    from mcpfleet.keys.ring import KeyRing
    from mcpfleet.tasks import RingSnapshotCodec

    rings = [KeyRing.generate()]
    rings.append(rings[0].stage())
    rings.append(rings[1].promote())
    rings.append(rings[2].retire())
    current = [rings[0]]
    seen: list[tuple[str, str]] = []
    codec = RingSnapshotCodec(lambda: current[0], lambda event, kid: seen.append((event, kid)))
    old, new = rings[0].kids[0], rings[3].kids[0]
    sealed_old = codec.encode(snapshot())
    assert sealed_old.startswith(f"mcpfleet:v1:{old}:") and BEARER not in sealed_old
    for ring in rings[1:3]:  # staged and promoted: the old key still opens
        current[0] = ring
        assert json.loads(codec.decode(sealed_old))["owning_tool_name"] == "double"
    sealed_new = codec.encode(snapshot())
    assert sealed_new.startswith(f"mcpfleet:v1:{new}:")
    current[0] = rings[3]
    assert json.loads(codec.decode(sealed_new))["owning_tool_name"] == "double"
    with pytest.raises(SnapshotDecryptionError, match=f"sealed with key {old}"):
        codec.decode(sealed_old)
    with pytest.raises(SnapshotDecryptionError, match="not sealed by the fleet"):
        codec.decode(snapshot())
    tampered = sealed_new[:-8] + ("A" * 8 if not sealed_new.endswith("A" * 8) else "B" * 8)
    with pytest.raises(SnapshotDecryptionError, match="tampered"):
        codec.decode(tampered)
    assert ("seal", old) in seen and ("unseal", new) in seen
