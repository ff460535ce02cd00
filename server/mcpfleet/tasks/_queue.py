"""Where the fleet's task queue lives: one Docket per fleet, in the fleet's Redis."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mcpfleet.config import ReplicaConfig
from mcpfleet.contract import RedisKeys
from mcpfleet.redisconn import RedisFiles, queue_target, settings


@dataclass(frozen=True)
class FleetQueue:
    """Where and how the replicas' shared task queue runs."""

    #: The Docket name: every key and channel of the queue starts with it.
    name: str
    #: The Redis URL, credential-free (``memory://`` for a standalone replica).
    url: str
    #: The redis-py credential provider, or None.
    credential_provider: Any
    #: This replica's worker name (its replica name).
    worker_name: str
    #: Seconds after which a task whose worker stopped renewing its lease is
    #: delivered to another worker.
    redelivery_timeout: float
    #: Tasks one replica's worker runs at once.
    concurrency: int
    #: Seconds a task request (a creation, ``tasks/get|update|cancel``) may
    #: wait on the queue's Redis, whose client has no read timeout of its own.
    deadline: float = 10.0
    #: The queue's Redis is reached through Sentinel: a creation waits (at most
    #: :data:`~mcpfleet.tasks.REPLICATION_WAIT`) until a replica of the master has it.
    replicated: bool = False


def fleet_queue(
    *,
    fleet: str,
    redis_url: str | None,
    redis_files: RedisFiles,
    replica: str,
    redelivery_timeout: float,
    concurrency: int,
    deadline: float = 10.0,
) -> FleetQueue:
    """The queue of ``fleet``: in its Redis, or in this process when standalone."""
    name = RedisKeys(fleet).tasks
    if not redis_url:
        url, provider = "memory://", None
    else:
        redis = settings(redis_url, redis_files)
        url, provider = queue_target(redis)
    return FleetQueue(
        name=name,
        url=url,
        credential_provider=provider,
        worker_name=replica,
        redelivery_timeout=redelivery_timeout,
        concurrency=concurrency,
        deadline=deadline,
        replicated=bool(redis_url) and redis.parsed.sentinel,
    )


def fleet_queue_of(config: ReplicaConfig, replica: str) -> FleetQueue:
    """The queue a replica with ``config`` and name ``replica`` serves and works."""
    return fleet_queue(
        fleet=config.fleet,
        redis_url=config.redis_url,
        redis_files=config.redis_files,
        replica=replica,
        redelivery_timeout=config.tasks_redelivery,
        concurrency=config.tasks_concurrency,
        deadline=config.tasks_deadline,
    )
