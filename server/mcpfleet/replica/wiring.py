"""The replica's parts made from its settings, each wired to the replica's metrics.

The limiter with its rules' watcher (the flags' rules, under the watched limits
file's), the store of the handshake sessions' SSE streams in the fleet's Redis,
and the app's MCP tasks on the fleet's one queue: what
:class:`~mcpfleet.replica.runtime.Replica` builds once, at start-up.
"""

from __future__ import annotations

from typing import Any

from mcpfleet.config import ReplicaConfig
from mcpfleet.contract import RedisKeys
from mcpfleet.keys.codec import ReloadableCodec
from mcpfleet.limits import Limiter, RulesWatcher
from mcpfleet.notify import RedisEventStore
from mcpfleet.replica.metrics import ReplicaMetrics
from mcpfleet.tasks import (
    FleetTasks,
    RingSnapshotCodec,
    fleet_queue_of,
    has_tasks_extension,
    wire_tasks,
)


def limits(config: ReplicaConfig, metrics: ReplicaMetrics) -> tuple[Limiter, RulesWatcher | None]:
    """The limits per principal: the flags' rules, under the limits file's when set."""
    base = config.limit_rules()
    limiter = Limiter(
        base, RedisKeys(config.fleet), observer=metrics, deadline=config.redis_deadline
    )
    metrics.watch_limits(limiter.limited_recently)
    watcher = None
    if config.limits_file is not None:
        watcher = RulesWatcher(config.limits_file, base, limiter.set_rules)
        watcher.check()
    return limiter, watcher


def event_store(config: ReplicaConfig, metrics: ReplicaMetrics) -> RedisEventStore | None:
    """The handshake SSE streams' store in the fleet's Redis; None standalone or off."""
    if not config.redis_url or config.sse_events == 0:
        return None
    return RedisEventStore(
        RedisKeys(config.fleet),
        deadline=config.redis_deadline,
        observer=metrics,
        events=config.sse_events,
        ttl=config.sse_ttl,
    )


def fleet_tasks(
    app: Any,
    config: ReplicaConfig,
    name: str,
    codec: ReloadableCodec,
    metrics: ReplicaMetrics,
    limiter: Limiter,
) -> FleetTasks | None:
    """The app's tasks on the fleet's queue, under the limits in force; None without tasks."""
    if not has_tasks_extension(app):
        return None
    sealer = None
    if config.tasks_encrypt:
        sealer = RingSnapshotCodec(lambda: codec.ring, metrics.snapshot_event)
    return wire_tasks(
        app,
        fleet_queue_of(config, name),
        metrics.task_event,
        sealer,
        # The rules in force (flags, under the watched limits file).
        limits=lambda: limiter.rules,
        on_limited=metrics.limited,
    )
