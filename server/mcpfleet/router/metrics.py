"""The router's Prometheus metrics: one place for their names, labels and meaning.

Labels are bounded: route kind, outcome, lookup source and replica name (the
fleet's pods). Never a session id, a user or a key.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST, choose_encoder


class RouterMetrics:
    """Metrics of one router process, in their own registry."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        #: Proxied requests being handled now (their answers' streams included): one
        #: integer the event loop moves, read only when scraped.
        self.in_flight = 0
        Gauge(
            "mcpfleet_router_requests_in_flight",
            "Requests the router is handling now, open streams (GET streams, listen "
            "streams, a paused tool's response) included; what router.autoscaling.mcp "
            "scales the routers on.",
            registry=r,
        ).set_function(self._in_flight)
        self.requests = Counter(
            "mcpfleet_router_requests_total",
            "Requests the router handled, by route kind and outcome.",
            ["route", "outcome"],
            registry=r,
        )
        self.lookups = Counter(
            "mcpfleet_router_session_lookups_total",
            "Session owner lookups, by where the answer came from (cache, redis, miss, unknown).",
            ["source"],
            registry=r,
        )
        self.owner_gone = Counter(
            "mcpfleet_router_owner_gone_total",
            "Requests answered 404 because the session's owner left, by how it was noticed.",
            ["reason"],
            registry=r,
        )
        self.sessions = Gauge(
            "mcpfleet_router_replica_sessions",
            "Live sessions per replica, as the replicas attest them.",
            ["replica"],
            registry=r,
        )
        self.replicas = Gauge(
            "mcpfleet_router_replicas",
            "Replicas known to the router, by state.",
            ["state"],
            registry=r,
        )
        self.latency = Histogram(
            "mcpfleet_router_proxy_seconds",
            "Time from a request's arrival to the upstream response headers, by route kind.",
            ["route"],
            registry=r,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
        )
        self.degraded = Gauge(
            "mcpfleet_router_degraded",
            "1 while Redis is unreachable and the router routes from its caches.",
            registry=r,
        )
        self.retries = Counter(
            "mcpfleet_router_resends_total",
            "Requests resent to another replica because none processed them, by reason.",
            ["reason"],
            registry=r,
        )

        self.rehomed = Counter(
            "mcpfleet_router_sessions_rehomed_total",
            "Handshake sessions opened again on a live replica because their own was gone "
            "(--rehome-sessions), by how the owner's absence was noticed.",
            ["cause"],
            registry=r,
        )
        self.lost = Counter(
            "mcpfleet_router_sessions_lost_total",
            "Handshake sessions ended with the 404 instead of re-homed (--rehome-sessions) "
            "because work of theirs was in flight when their replica went, or the live "
            "replica refused to open them again, by reason.",
            ["reason"],
            registry=r,
        )

        #: Labelled children of the per-request metrics, by label values (bounded:
        #: route kinds x outcomes).
        self._requests: dict[tuple[str, str], Any] = {}
        self._latency: dict[str, Any] = {}

        self.cancelled = Counter(
            "mcpfleet_router_cancelled_total",
            "Requests whose client went away before the answer was complete, cancelled on "
            "the replica (connection closed; for a session, notifications/cancelled sent), "
            "by route kind.",
            ["route"],
            registry=r,
        )

    def _in_flight(self) -> float:
        return float(self.in_flight)

    def request_done(self, route: str, outcome: str) -> None:
        """Count one request: its labelled child looked up once, then kept (a
        ``labels()`` call costs a lock and a tuple key per request)."""
        key = (route, outcome)
        child = self._requests.get(key)
        if child is None:
            child = self._requests[key] = self.requests.labels(route, outcome)
        child.inc()

    def observe_latency(
        self, route: str, seconds: float, exemplar: dict[str, str] | None = None
    ) -> None:
        """One request's latency; ``exemplar``: its trace's ids (tracing on, sampled)."""
        child = self._latency.get(route)
        if child is None:
            child = self._latency[route] = self.latency.labels(route)
        child.observe(seconds, exemplar)

    def observe_view(self, states: dict[str, str], sessions: dict[str, int]) -> None:
        self.replicas.labels("serving").set(sum(1 for s in states.values() if s == "serving"))
        self.replicas.labels("draining").set(sum(1 for s in states.values() if s == "draining"))
        self.sessions.clear()
        for name, count in sessions.items():
            self.sessions.labels(name).set(count)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def render_for(self, accept: str) -> tuple[bytes, str]:
        """The exposition a scraper's ``Accept`` header asks for, and its content type:
        OpenMetrics (with the histograms' exemplars) or Prometheus' text format."""
        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type
