"""A replica's own Prometheus metrics: request state, the key ring, and the process.

One place for their names, labels and meaning (the rounds themselves are
counted by :class:`~mcpfleet.replica.middleware.PrometheusMiddleware`, registered
in the same registry and served on the same ``/metrics``):

* ``mcpfleet_requeststate_seals_total{kid}`` / ``..._unseals_total{kid}``: which
  key sealed and which key opened each token, so a person (and the operator)
  see when an old key stops being used. A kid is the public 4-byte key id
  every token carries, never key material.
* ``mcpfleet_requeststate_rejections_total{reason}``: tokens refused, by
  reason (``expired``, ``tampered``, ``unknown_kid``, ``audience``,
  ``malformed``, ``request_binding``, ``principal``, ``future``,
  ``codec_error``, ``other``).
* ``mcpfleet_keyring_info{kids, phase}``, ``mcpfleet_keyring_keys``, reloads by
  result, the time of the last good load, and whether the ring on disk is one
  the replica refused.
* ``mcpfleet_once_total{outcome}``: final rounds of exactly-once flows
  (``ask_then(..., once=True)``) by what the ledger said: ``claimed`` (finish
  ran), ``replayed`` (the stored result returned), ``unavailable`` (the ledger
  could not be asked: the retryable error), ``full`` (Redis near its
  maxmemory: the retryable error), ``pending`` (a replay gave up waiting for a
  racing claimer), ``unkept`` (a replay of a result not kept), ``unknown`` (a
  replay of a flow whose claimer died mid-``finish``: outcome unknown).
* ``mcpfleet_redis_memory_ratio``: Redis's used memory over its maxmemory, as
  this replica reads it each second, whatever ``--once-memory-limit`` (0 when
  Redis has no maxmemory or was not read);
  once-flows are refused past ``--once-memory-limit``.
* ``mcpfleet_replica_build_info``, live handshake sessions, requests in flight,
  listening streams, ready and draining state.
* MCP tasks (:mod:`mcpfleet.tasks`), only for an app with task tools: the
  ``mcpfleet_tasks_*`` metrics, declared in :mod:`mcpfleet.replica.taskmetrics`
  and added to this registry by :meth:`ReplicaMetrics.enable_tasks`.
* Notifications (:mod:`mcpfleet.notify`): ``mcpfleet_listen_streams`` (the
  ``subscriptions/listen`` streams open here),
  ``mcpfleet_events_published_total{kind}`` (events this replica put on the
  fleet's bus: ``tools``, ``prompts``, ``resources`` list changes, ``resource``
  updates, ``task`` status changes), ``mcpfleet_events_delivered_total{kind}``
  (frames written to this replica's listen streams and handshake sessions),
  ``mcpfleet_events_dropped_total{reason}`` (``redis``: a publish Redis did
  not take within the deadline, or a task's status a stream could not read
  within the tasks deadline; ``slow``: a stream ended at its buffer's bound, or
  an event dropped for a handshake session past its queue; ``malformed``: a
  frame on the channel that is not an event; ``store``: an SSE event not stored
  for resumption), and ``mcpfleet_events_fanout_seconds`` (from an
  event's publication, on any replica, to its arrival here).

Gauges that mirror state (sessions, the ring) are read at scrape time by
collectors, so the request path pays nothing for them.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, choose_encoder
from prometheus_client.registry import Collector

from mcpfleet import __version__
from mcpfleet.keys.ring import KeyRing
from mcpfleet.limits import LIMIT_NAMES
from mcpfleet.notify import DROP_REASONS, KINDS
from mcpfleet.once import OnceOutcome
from mcpfleet.replica.gate import GateState
from mcpfleet.replica.taskmetrics import TaskMetrics

#: The logger ``mcp``'s request-state boundary reports every rejection on.
BOUNDARY_LOGGER: Final = "mcp.server.request_state"
_REJECTED_PREFIX = "requestState rejected"

#: ``mcp``'s rejection reasons (its log text) mapped to bounded label values.
REJECTION_REASONS: Final[dict[str, str]] = {
    "expired": "expired",
    "seal": "tampered",
    "unknown key": "unknown_kid",
    "audience": "audience",
    "malformed": "malformed",
    "non-string requestState": "malformed",
    "request binding": "request_binding",
    "principal": "principal",
    "principal drift": "principal",
    "principal binding error": "principal",
    "minted in the future": "future",
    "codec error": "codec_error",
}


def exposition(registries: Sequence[CollectorRegistry], accept: str) -> tuple[bytes, str]:
    """``registries`` exposed in the format a scraper's ``Accept`` header asks for, and its
    content type: OpenMetrics (the round histogram's exemplars with it) when asked,
    else Prometheus' text format. OpenMetrics ends once (``# EOF``), after the last."""
    encoder, content_type = choose_encoder(accept)
    parts = [encoder(r) for r in registries]
    if content_type.startswith("application/openmetrics-text"):
        parts = [p.removesuffix(b"# EOF\n") for p in parts[:-1]] + parts[-1:]
    return b"".join(parts), content_type


def rejection_label(reason: str) -> str:
    """The label for one of ``mcp``'s rejection reasons; anything new is ``other``."""
    if reason.startswith("bind_principal returned"):
        return "principal"
    return REJECTION_REASONS.get(reason, "other")


def _package_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "unknown"


class _RejectionFilter(logging.Filter):
    """Counts the boundary's rejections as it logs them; never drops a record.

    ``mcp`` answers every refused token with one frozen wire error and names
    the real reason only in this log line, after checks the codec never sees
    (expiry, audience, request binding). Reading the reason here counts every
    rejection exactly once, codec-level or claim-level.
    """

    def __init__(self, count: Callable[[str], None]) -> None:
        super().__init__()
        self._count = count
        #: Records below this level are counted but not passed on (see ``watch_rejections``).
        self.passes_from = logging.NOTSET

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and record.msg.startswith(_REJECTED_PREFIX):
            args = record.args
            reason = args[-1] if isinstance(args, tuple) and args else ""
            self._count(rejection_label(str(reason)))
        return record.levelno >= self.passes_from


class _StateCollector(Collector):
    """Key ring identity and gate state, read when Prometheus scrapes."""

    def __init__(self, ring: Callable[[], KeyRing], gate: GateState) -> None:
        self._ring = ring
        self._gate = gate

    def collect(self) -> Iterator[GaugeMetricFamily | InfoMetricFamily]:
        ring = self._ring()
        info = InfoMetricFamily(
            "mcpfleet_keyring",
            "The loaded key ring: its kids in order (the first seals) and rotation phase.",
            labels=["kids", "phase"],
        )
        info.add_metric([",".join(ring.kids), ring.phase], {})
        yield info
        yield GaugeMetricFamily(
            "mcpfleet_keyring_keys", "Keys in the loaded key ring.", value=len(ring.kids)
        )
        st = self._gate
        now = time.monotonic()
        live = sum(1 for seen in list(st.sessions.values()) if now - seen < st.session_idle)
        yield GaugeMetricFamily(
            "mcpfleet_replica_sessions",
            "Live handshake-era sessions this replica owns.",
            value=live,
        )
        yield GaugeMetricFamily(
            "mcpfleet_replica_requests_in_flight",
            "Requests being served (listening streams excluded).",
            value=st.inflight,
        )
        yield GaugeMetricFamily(
            "mcpfleet_replica_streams", "Open standalone listening streams.", value=st.streams
        )
        yield GaugeMetricFamily(
            "mcpfleet_replica_draining", "1 once the replica drains.", value=int(st.draining)
        )
        yield GaugeMetricFamily(
            "mcpfleet_replica_ready",
            "1 while the replica takes new sessions and rounds.",
            value=int(not st.draining),
        )


class ReplicaMetrics:
    """The metrics of one replica process, in their own registry."""

    content_type = CONTENT_TYPE_LATEST
    #: The metrics of the app's MCP tasks, once :meth:`enable_tasks` added them.
    tasks: TaskMetrics

    def __init__(self, *, app: str, ring: Callable[[], KeyRing], gate: GateState) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self._codec_children: dict[tuple[str, str], Any] = {}
        self.seals = Counter(
            "mcpfleet_requeststate_seals",
            "Request-state tokens sealed, by the kid of the sealing key.",
            ["kid"],
            registry=r,
        )
        self.unseals = Counter(
            "mcpfleet_requeststate_unseals",
            "Request-state tokens opened, by the kid of the key that opened them.",
            ["kid"],
            registry=r,
        )
        self.rejections = Counter(
            "mcpfleet_requeststate_rejections",
            "Request-state tokens refused, by reason.",
            ["reason"],
            registry=r,
        )
        self.reloads = Counter(
            "mcpfleet_keyring_reloads",
            "New key ring versions seen on disk, by result (loaded, unchanged, error).",
            ["result"],
            registry=r,
        )
        self.last_reload = Gauge(
            "mcpfleet_keyring_last_reload_timestamp_seconds",
            "When the ring in use was loaded (Unix time).",
            registry=r,
        )
        self.reload_failing = Gauge(
            "mcpfleet_keyring_reload_failing",
            "1 while the newest ring on disk is one this replica refused (it keeps the last "
            "good ring).",
            registry=r,
        )
        self.once = Counter(
            "mcpfleet_once",
            "Final rounds of exactly-once guard flows, by what the fleet's ledger said.",
            ["outcome"],
            registry=r,
        )
        for outcome in OnceOutcome:
            self.once.labels(outcome.value)
        self.redis_memory = Gauge(
            "mcpfleet_redis_memory_ratio",
            "Redis used memory over its maxmemory, as this replica last read it (0: no maxmemory).",
            registry=r,
        )
        self.limited_total = Counter(
            "mcpfleet_limited",
            "Requests refused under a limit per principal (mcpfleet.limits), by limit"
            " (sessions, rounds, tasks) and tool (empty for a request naming none).",
            ["limit", "tool"],
            registry=r,
        )
        self.limit_failures = Counter(
            "mcpfleet_limit_checks_failed",
            "Limit checks Redis could not answer within the deadline, by limit: checked in"
            " this replica's memory instead (docs/limits.md).",
            ["limit"],
            registry=r,
        )
        self.limit_principals = Gauge(
            "mcpfleet_limit_principals_limited",
            "Principals this replica refused under a limit within the last minute, by limit.",
            ["limit"],
            registry=r,
        )
        build = Gauge(
            "mcpfleet_replica_build_info",
            "The replica's software: mcpfleet, fastmcp and mcp versions, and the app served.",
            ["version", "fastmcp_version", "mcp_version", "app"],
            registry=r,
        )
        build.labels(__version__, _package_version("fastmcp"), _package_version("mcp"), app).set(1)
        Gauge(
            "mcpfleet_replica_start_time_seconds",
            "When the replica started (Unix time).",
            registry=r,
        ).set_to_current_time()
        self.last_reload.set_to_current_time()
        self.reload_failing.set(0)
        r.register(_StateCollector(ring, gate))
        self._notifications(r)
        self._filter = _RejectionFilter(self._rejected)
        self._saved_level = logging.NOTSET

    def _notifications(self, r: CollectorRegistry) -> None:
        """The listen streams' and the fleet bus's metrics (:mod:`mcpfleet.notify`)."""
        self.listen_streams = Gauge(
            "mcpfleet_listen_streams",
            "subscriptions/listen streams open on this replica.",
            registry=r,
        )
        self.events_published = Counter(
            "mcpfleet_events_published",
            "Events this replica published on the fleet's bus, by kind.",
            ["kind"],
            registry=r,
        )
        self.events_delivered = Counter(
            "mcpfleet_events_delivered",
            "Events written to this replica's listen streams and handshake sessions, by kind.",
            ["kind"],
            registry=r,
        )
        self.events_dropped = Counter(
            "mcpfleet_events_dropped",
            "Events lost here, by reason (redis: not published within the deadline; slow: a"
            " stream ended at its buffer's bound, or a session's queue full; malformed: not an"
            " event; store: an SSE event not stored for resumption).",
            ["reason"],
            registry=r,
        )
        self.events_fanout = Histogram(
            "mcpfleet_events_fanout_seconds",
            "From an event's publication (any replica) to its arrival on this replica.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=r,
        )
        for kind in KINDS:
            self.events_published.labels(kind)
            self.events_delivered.labels(kind)
        for reason in DROP_REASONS:
            self.events_dropped.labels(reason)

    # --- observers wired by the replica --------------------------------------------------

    def published(self, kind: str) -> None:
        self.events_published.labels(kind).inc()

    def delivered(self, kind: str) -> None:
        self.events_delivered.labels(kind).inc()

    def dropped(self, reason: str) -> None:
        self.events_dropped.labels(reason).inc()

    def fanout(self, seconds: float) -> None:
        self.events_fanout.observe(seconds)

    def streams(self, delta: int) -> None:
        self.listen_streams.inc(delta)

    def limited(self, limit: str, tool: str) -> None:
        self.limited_total.labels(limit, tool).inc()

    def failed(self, limit: str) -> None:
        self.limit_failures.labels(limit).inc()

    def watch_limits(self, limited_recently: Callable[[str], int]) -> None:
        """Report the principals refused lately, per limit, from ``limited_recently``."""
        for limit in LIMIT_NAMES:
            self.limit_principals.labels(limit).set_function(
                functools.partial(limited_recently, limit)
            )
            self.limit_failures.labels(limit)  # 0 from the start: a rate() has a series

    def codec_event(self, event: str, value: str) -> None:
        """The codec's observer: seals and unseals by kid.

        The codec's own rejections are not counted here: the boundary logs
        every rejection (the codec's included), and :meth:`watch_rejections`
        counts each once.
        """
        child = self._codec_children.get((event, value))
        if child is None:
            # Kept per (event, kid): a round finds its counter in one lookup. Kids are
            # the ring's own (an unseal is counted once the token verified).
            if event == "seal":
                child = self.seals.labels(value)
            elif event == "unseal":
                child = self.unseals.labels(value)
            else:
                return
            self._codec_children[(event, value)] = child
        child.inc()

    def once_outcome(self, outcome: OnceOutcome) -> None:
        """The once-ledger's observer."""
        self.once.labels(outcome.value).inc()

    def reload_result(self, result: str) -> None:
        """The key ring watcher's observer: ``loaded``, ``unchanged`` or ``error``."""
        self.reloads.labels(result).inc()
        if result == "error":
            self.reload_failing.set(1)
        else:
            self.reload_failing.set(0)
            if result == "loaded":
                self.last_reload.set_to_current_time()

    def enable_tasks(self, running: Callable[[], int]) -> None:
        """Add the task metrics (an app with task tools); ``running`` is read at scrape."""
        self.tasks = TaskMetrics(self.registry, running)

    def task_event(self, tool: str, event: str) -> None:
        """:mod:`mcpfleet.tasks`' observer (``TaskObserver``)."""
        self.tasks.task_event(tool, event)

    def snapshot_event(self, event: str, kid: str) -> None:
        """:class:`mcpfleet.tasks.RingSnapshotCodec`'s observer: seals and unseals by kid."""
        self.tasks.snapshot_event(event, kid)

    def task_queue_depth(self, depth: int) -> None:
        self.tasks.task_queue_depth(depth)

    def _rejected(self, reason: str) -> None:
        self.rejections.labels(reason).inc()

    def watch_rejections(self) -> None:
        """Start counting the request-state boundary's rejections (one replica per process).

        The boundary logs rejections at WARNING. When logging is configured
        quieter than that (``--log-level ERROR``), the logger is opened to
        WARNING so every rejection is still counted, and the filter drops the
        records the configured level would have hidden.
        """
        logger = logging.getLogger(BOUNDARY_LOGGER)
        self._saved_level = logger.level
        configured = logger.getEffectiveLevel()
        if configured > logging.WARNING:
            logger.setLevel(logging.WARNING)
            self._filter.passes_from = configured
        logger.addFilter(self._filter)

    def unwatch_rejections(self) -> None:
        logger = logging.getLogger(BOUNDARY_LOGGER)
        logger.removeFilter(self._filter)
        logger.setLevel(self._saved_level)
        self._filter.passes_from = logging.NOTSET

    def render(self) -> bytes:
        return generate_latest(self.registry)
