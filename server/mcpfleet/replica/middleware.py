"""Prometheus metrics for every round of a FastMCP app's tools, prompts and resources.

A *round* is the server's work between receiving input and either asking for
more (an **asking** round) or answering (the **final** round). The two
protocol eras reach the same shape differently, and this middleware counts
both on one scale:

* **modern** (2026-07-28): every request is one round. A tool, prompt or
  resource that returns an ``InputRequiredResult`` asks; anything else is
  final. A request carrying ``input_responses`` or ``request_state``
  *continues* a call; one without them *starts* one.
* **handshake** (``<= 2025-11-25``): one request holds the whole call, paused
  in this process. Each ``elicitation/create`` (or sampling / roots request)
  the tool sends to the client ends an asking round; the client's answer
  starts the next round, and the result ends the final one. Round duration
  therefore excludes the time the user spends answering, as in the modern era.

A 3-question booking is 3 asking rounds and 1 final round in either era.

Metrics (names and labels are a contract; see docs/observability.md):

* ``mcpfleet_rounds_total{kind, component_type, component, era, outcome, step}``
* ``mcpfleet_elicitation_responses_total{era, action, component_type, component}``
* ``mcpfleet_round_duration_seconds{component_type, component, kind, era}``

Labels are bounded: ``component`` is a name the server resolved (a tool or
prompt that was found; a resource's registered URI or URI template), or
``"unknown"``. Never arguments, URIs a client made up, session ids or answers.

Use it in any FastMCP app::

    from prometheus_client import generate_latest
    from starlette.responses import Response
    from mcpfleet import PrometheusMiddleware

    mcp.add_middleware(PrometheusMiddleware())  # prometheus_client's default registry

    @mcp.custom_route("/metrics", methods=["GET"])
    async def metrics(request):
        return Response(generate_latest(), media_type="text/plain; version=0.0.4")

``mcpfleet serve`` installs one in every replica and serves it on ``/metrics``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from fastmcp import FastMCP
from fastmcp.exceptions import DisabledError, NotFoundError
from fastmcp.prompts.base import InputRequiredPromptResult, PromptResult
from fastmcp.resources.base import InputRequiredResourceResult, ResourceResult
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from fastmcp.server.middleware.middleware import _dispatch_phase
from fastmcp.tools.base import InputRequiredToolResult, ToolResult
from mcp_types import (
    CallToolRequestParams,
    ElicitResult,
    GetPromptRequestParams,
    ReadResourceRequestParams,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram

from mcpfleet import tracing

__all__ = [
    "ASKING_METHODS",
    "ROUND_BUCKETS",
    "UNKNOWN",
    "PrometheusMiddleware",
]

ComponentType = Literal["tool", "prompt", "resource"]

#: The label value for a component the server did not resolve.
UNKNOWN: Final = "unknown"

#: Server-to-client requests that ask the client (its user) for input on a
#: handshake-era connection: each one ends an asking round.
ASKING_METHODS: Final = frozenset({"elicitation/create", "sampling/createMessage", "roots/list"})

#: Round durations are server time only (never the user's think time): mostly
#: milliseconds, with a tail for tools that do real work.
ROUND_BUCKETS: Final = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)

_ASKING_RESULTS = (InputRequiredToolResult, InputRequiredPromptResult, InputRequiredResourceResult)

#: How often, at most, the resource label table is re-read after a miss.
_REFRESH_INTERVAL = 5.0


@dataclass
class _Round:
    """One call in progress: which component, which era, and where the current round began."""

    component_type: ComponentType
    component: str
    era: str
    step: str
    started: float = field(default_factory=time.perf_counter)


class _ResourceLabels:
    """Maps a read URI to a bounded label: a registered URI, a URI template, or ``unknown``.

    Template resources are read at URIs that embed their parameters (often user
    data), so the label is the template, never the URI. The table is re-read
    from the server when a URI matches nothing, at most every few seconds, so a
    flood of made-up URIs costs one listing per interval, not one per request.
    """

    def __init__(self) -> None:
        self._static: frozenset[str] = frozenset()
        self._templates: list[Any] = []
        self._loaded_at = float("-inf")

    def _match(self, uri: str) -> str | None:
        if uri in self._static:
            return uri
        for template in self._templates:
            if template.matches(uri) is not None:
                return str(template.uri_template)
        return None

    async def label(self, server: FastMCP[Any], uri: str) -> str:
        found = self._match(uri)
        if found is not None:
            return found
        now = time.monotonic()
        if now - self._loaded_at < _REFRESH_INTERVAL:
            return UNKNOWN
        self._loaded_at = now
        try:
            resources = await server.list_resources(run_middleware=False)
            templates = await server.list_resource_templates(run_middleware=False)
        except Exception:  # counting must never fail a read: label it unknown instead
            return UNKNOWN
        self._static = frozenset(str(r.uri) for r in resources)
        self._templates = list(templates)
        return self._match(uri) or UNKNOWN


class PrometheusMiddleware(Middleware):
    """Counts asking and final rounds, elicitation answers and round latency.

    :param registry: where the metrics are registered; prometheus_client's
        default registry when omitted. Use one registry per middleware (two
        middlewares cannot share one: the metric names would collide).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = REGISTRY if registry is None else registry
        r = self.registry
        self.rounds = Counter(
            "mcpfleet_rounds_total",
            "Rounds of tools, prompts and resources: asking (requested input) or final "
            "(answered), by era, outcome (ok, error, aborted) and step (start, continue).",
            ["kind", "component_type", "component", "era", "outcome", "step"],
            registry=r,
        )
        self.responses = Counter(
            "mcpfleet_elicitation_responses_total",
            "Clients' answers to elicitations, by era and action (accept, decline, cancel).",
            ["era", "action", "component_type", "component"],
            registry=r,
        )
        self.duration = Histogram(
            "mcpfleet_round_duration_seconds",
            "Server time of one round (the user's time to answer excluded), by component and kind.",
            ["component_type", "component", "kind", "era"],
            registry=r,
            buckets=ROUND_BUCKETS,
        )
        self._resources = _ResourceLabels()
        #: Handshake-era asks sent and not yet answered: tools paused on their user
        #: (a count the replica attests; a scale-in would cut them).
        self.paused = 0
        #: Each metric's children by label values, as ``labels()`` made them: a round
        #: finds its own in one dict lookup (``labels()`` checks, converts and
        #: locks on every call). As bounded as the labels (module docstring).
        self._children: dict[tuple[str, ...], Any] = {}
        self._active: ContextVar[_Round | None] = ContextVar(
            f"mcpfleet_round_{id(self)}", default=None
        )
        self._wrapped_key = f"_mcpfleet_round_observer_{id(self)}"
        cls = type(self)
        self._typed_first = (
            cls.on_message is Middleware.on_message and cls.on_request is Middleware.on_request
        )

    async def __call__(self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]) -> Any:
        # A tool call's pass (FastMCP's "all" phase, or "typed") goes straight to
        # on_call_tool when on_message and on_request are the base class's
        # pass-throughs (a subclass that overrides either takes the base class's
        # way): building them around the hook costs every round three coroutines
        # and their closures. Any other message takes the base class's way.
        if (
            context.method == "tools/call"
            and self._typed_first
            and _dispatch_phase.get() != "outer"
        ):
            return await self.on_call_tool(context, call_next)
        return await super().__call__(context, call_next)

    # --- the three component hooks ---------------------------------------------------------

    async def on_call_tool(
        self,
        context: MiddlewareContext[CallToolRequestParams],
        call_next: CallNext[CallToolRequestParams, ToolResult],
    ) -> ToolResult:
        msg = context.message
        continues = msg.input_responses is not None or msg.request_state is not None
        result: ToolResult = await self._observe(
            context, call_next, "tool", msg.name, continues, msg.input_responses
        )
        return result

    async def on_get_prompt(
        self,
        context: MiddlewareContext[GetPromptRequestParams],
        call_next: CallNext[GetPromptRequestParams, PromptResult],
    ) -> PromptResult:
        result: PromptResult = await self._observe(
            context, call_next, "prompt", context.message.name, None, None
        )
        return result

    async def on_read_resource(
        self,
        context: MiddlewareContext[ReadResourceRequestParams],
        call_next: CallNext[ReadResourceRequestParams, ResourceResult],
    ) -> ResourceResult:
        await self.check_resource_access(context)
        result: ResourceResult = await self._observe(
            context, call_next, "resource", str(context.message.uri), None, None
        )
        return result

    # --- one round ---------------------------------------------------------------------------

    async def _observe(
        self,
        context: MiddlewareContext[Any],
        call_next: Callable[[MiddlewareContext[Any]], Awaitable[Any]],
        ctype: ComponentType,
        name: str,
        continues: bool | None,
        responses: Mapping[str, Any] | None,
    ) -> Any:
        ctx = context.fastmcp_context
        rc = ctx.request_context if ctx is not None else None
        if ctx is None or rc is None:
            # A programmatic call outside any MCP request is not a round on the wire.
            return await call_next(context)
        modern = rc.protocol_version in MODERN_PROTOCOL_VERSIONS
        era = "modern" if modern else "handshake"
        if modern and continues is None:
            responses = ctx.input_responses
            continues = responses is not None or ctx.request_state is not None
        if ctype == "resource":
            label = await self._resources.label(ctx.fastmcp, name)
        else:
            label = name  # provisional: replaced by "unknown" if the server did not find it
        answers = list(responses.values()) if modern and responses else []
        current = _Round(ctype, label, era, "continue" if modern and continues else "start")
        if not modern:
            self._watch_session(rc.session)
        token = self._active.set(current)
        try:
            result = await call_next(context)
        except (NotFoundError, DisabledError):
            current.component = UNKNOWN
            self._count_responses(current, answers)
            self._final(current, "error")
            raise
        except asyncio.CancelledError:
            self._count_responses(current, answers)
            self._final(current, "aborted")
            raise
        except Exception:
            self._count_responses(current, answers)
            self._final(current, "error")
            raise
        finally:
            self._active.reset(token)
        # Counted once the component is known to exist: until then its name is
        # only what the client sent.
        self._count_responses(current, answers)
        self._settle(current, result, modern)
        return result

    def _settle(self, current: _Round, result: Any, modern: bool) -> None:
        """Count the round ``result`` ended: asking, or final (ok or error)."""
        if isinstance(result, _ASKING_RESULTS):
            if modern:
                if tracing.ON:
                    _note_questions(result)
                self._end(current, "asking", "ok")
            else:
                # The framework refuses an InputRequiredResult on a handshake-era
                # connection: the client receives an error, so count one.
                self._final(current, "error")
        elif isinstance(result, ToolResult) and result.is_error:
            self._final(current, "error")
        else:
            self._final(current, "ok")

    def _end(self, r: _Round, kind: str, outcome: str) -> None:
        if tracing.ON:
            _note_round(r, kind, outcome)
        self._child(
            self.rounds, "r", kind, r.component_type, r.component, r.era, outcome, r.step
        ).inc()
        self._child(self.duration, "d", r.component_type, r.component, kind, r.era).observe(
            time.perf_counter() - r.started, tracing.exemplar() if tracing.ON else None
        )

    def _child(self, metric: Any, tag: str, *values: str) -> Any:
        """``metric.labels(*values)``, kept (``tag`` names the metric in the key)."""
        key = (tag, *values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def _final(self, r: _Round, outcome: str) -> None:
        self._end(r, "final", outcome)

    def _count_responses(self, r: _Round, results: Iterable[Any]) -> None:
        for result in results:
            if isinstance(result, ElicitResult):
                self._child(
                    self.responses, "a", r.era, result.action, r.component_type, r.component
                ).inc()

    # --- handshake era: rounds end when the server asks the client ----------------------------

    def _watch_session(self, session: Any) -> None:
        """Wrap this request's ``ServerSession.send_request`` once, to see each ask.

        The SDK builds a ``ServerSession`` per inbound request, so the wrapper
        lives exactly as long as this call. It attributes each ask to the
        innermost round of *this* middleware running in the caller's context.
        """
        state = vars(session)
        if state.get(self._wrapped_key):
            return
        send_request = session.send_request
        active = self._active

        async def observed_send_request(request: Any, *args: Any, **kwargs: Any) -> Any:
            current = active.get()
            if current is None or getattr(request, "method", None) not in ASKING_METHODS:
                return await send_request(request, *args, **kwargs)
            self._end(current, "asking", "ok")
            self.paused += 1
            try:
                result = await send_request(request, *args, **kwargs)
            finally:
                self.paused -= 1
                current.started = time.perf_counter()
                current.step = "continue"
            if isinstance(result, ElicitResult):
                self.responses.labels(
                    current.era, result.action, current.component_type, current.component
                ).inc()
            return result

        state["send_request"] = observed_send_request
        state[self._wrapped_key] = True


def _note_round(r: _Round, kind: str, outcome: str) -> None:
    """The round on the current span (FastMCP's span of the request, when tracing is
    on): its kind, era, step and outcome. A handshake-era call is several rounds in
    one request: each is an event, and the attributes tell the last."""
    tracing.note("mcpfleet.round.kind", kind)
    tracing.note("mcpfleet.round.era", r.era)
    tracing.note("mcpfleet.round.step", r.step)
    tracing.note("mcpfleet.round.outcome", outcome)
    if r.era == "handshake":
        tracing.event(
            "mcpfleet.round", {"mcpfleet.round.kind": kind, "mcpfleet.round.step": r.step}
        )


def _note_questions(result: Any) -> None:
    """How many questions an asking round put to the client (its ``inputRequests``)."""
    asked = getattr(getattr(result, "input_required", None), "input_requests", None)
    if asked is not None:
        tracing.note("mcpfleet.round.questions", len(asked))
