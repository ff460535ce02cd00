"""Guard tools that ask their users for input, on both protocol eras, from one description.

A tool describes its questions as a function of the answers so far
(``next_question(answers) -> Question | None``) and hands it to :func:`ask`
(or :func:`ask_then`), which runs it on whichever era the request negotiated:

* modern (2026-07-28): each call answers at most one question. The client's
  answer is folded into the answers carried in ``request_state`` (sealed by
  the framework, so any replica of a fleet may serve the next round), and the
  call returns an ``InputRequiredResult`` for the next question, or the final
  answers when none is left;
* handshake era (<= 2025-11-25): ``ctx.elicit`` for each question in turn,
  the tool paused in the process that owns the session.

Declines and cancels end the flow with an :class:`Outcome` the tool reports,
never an exception. The request state is mcpfleet's own envelope
(``{"v": 1, "answers": ..., "pending": key}``, and ``"flow": id`` with
``"end": time`` for a once-flow), so any answer key is free for the tool to use.

``ask_then(..., once=True)`` makes the end of a modern-era tool flow happen once
per flow, fleet-wide: a replay of the final round, on any replica, returns the
original result without running ``finish`` again (:mod:`mcpfleet.once`).

Example::

    @mcp.tool
    async def confirm(item: str, ctx: Context) -> str | InputRequiredResult:
        def finish(outcome: Outcome) -> str:
            if outcome.done and outcome.answers["ok"]:
                return f"bought {item}"
            return "nothing bought"

        return await ask_then(ctx, first_missing([Question("ok", f"Buy {item}?", bool)]), finish)
"""

from __future__ import annotations

import inspect
import json
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast

from fastmcp import Context
from fastmcp.exceptions import ToolError
from fastmcp.server.elicitation import (
    AcceptedElicitation,
    ElicitConfig,
    handle_elicit_accept,
    parse_elicit_response_type,
)
from fastmcp.tools.base import Tool, ToolResult
from mcp_types import ElicitRequest, ElicitRequestFormParams, ElicitResult, InputRequiredResult
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel

from mcpfleet.once import flow_end, new_flow_id, run_once, valid_flow_id

__all__ = [
    "Answers",
    "NextQuestion",
    "Outcome",
    "Question",
    "ask",
    "ask_then",
    "first_missing",
    "is_modern",
]

Answers = dict[str, Any]
T = TypeVar("T")

#: Version of the request-state envelope this module writes.
_STATE_VERSION = 1
#: Where the pending key lived before the envelope (read, never written).
_LEGACY_PENDING = "_pending"
#: How many response types' elicitation configs are kept (:func:`_elicit_config`).
_CONFIG_LIMIT = 512
_CONFIGS: dict[tuple[str, Any], ElicitConfig] = {}
#: FastMCP's ``handle_elicit_accept`` builds ``AcceptedElicitation[Any]`` on every
#: accepted answer. pydantic keeps a parametrized generic in a weak cache: once
#: garbage collection freed it, the next answer rebuilt the class (~1.5 ms). A
#: reference held here keeps it built for the process's life.
_ACCEPTED_ANY = AcceptedElicitation[Any]


@dataclass(frozen=True)
class Question:
    """One thing to ask: ``key`` names the answer, ``response_type`` as for ``ctx.elicit``."""

    key: str
    message: str
    response_type: Any


@dataclass(frozen=True)
class Outcome:
    """How a flow ended: ``done`` with all answers, or ``declined``/``cancelled`` at ``key``."""

    status: Literal["done", "declined", "cancelled"]
    answers: Answers
    key: str | None = None

    @property
    def done(self) -> bool:
        return self.status == "done"


NextQuestion = Callable[[Answers], "Question | None"]


def is_modern(ctx: Context) -> bool:
    """True when this request negotiated the modern (stateless, guard) era, or when
    the tool runs as an MCP task.

    A task's worker has no request, so no protocol version: but tasks exist on
    the modern era only (the tasks extension is negotiated there alone), and
    the engine re-runs a task tool that returned an ``InputRequiredResult``
    with the client's answers on ``ctx.input_responses`` and its state on
    ``ctx.request_state``, as a modern round does. So a guard flow inside a
    task asks the modern way (``input_required``, answered with
    ``tasks/update``); the handshake way (``ctx.elicit``) the engine refuses.
    """
    if ctx.is_background_task:
        return True
    rc = ctx.request_context
    return rc is not None and rc.protocol_version in MODERN_PROTOCOL_VERSIONS


def first_missing(questions: list[Question]) -> NextQuestion:
    """A flow that asks a fixed list of questions in order."""

    def next_question(answers: Answers) -> Question | None:
        return next((q for q in questions if q.key not in answers), None)

    return next_question


def _config_key(response_type: Any) -> tuple[str, Any] | None:
    """What identifies a response type's config: the type itself, or the JSON of
    FastMCP's dict/list shorthand (values, not identities); None if neither."""
    if isinstance(response_type, dict | list):
        try:
            return ("json", json.dumps(response_type))
        except (TypeError, ValueError):
            return None
    try:
        hash(response_type)
    except TypeError:
        return None
    return ("type", response_type)


def _elicit_config(response_type: Any) -> ElicitConfig:
    """FastMCP's elicitation config (schema, validating type) for ``response_type``,
    built once per response type.

    ``parse_elicit_response_type`` generates the JSON schema on every call
    (hundreds of microseconds), and a modern-era flow asks for it on every
    round. The config depends on the response type alone, so it is kept,
    bounded (:data:`_CONFIG_LIMIT`, oldest dropped first: a tool that makes new
    types per call costs rebuilds, never memory). Callers never change it.
    """
    key = _config_key(response_type)
    if key is None:
        return parse_elicit_response_type(response_type)
    config = _CONFIGS.get(key)
    if config is None:
        config = parse_elicit_response_type(response_type)
        if len(_CONFIGS) >= _CONFIG_LIMIT:
            del _CONFIGS[next(iter(_CONFIGS))]
        _CONFIGS[key] = config
    return config


def _jsonable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return value


@dataclass(frozen=True)
class _Restored:
    """What an earlier round of this flow sealed: answers, the pending key, the flow id."""

    answers: Answers
    pending: str | None
    flow: str | None
    continued: bool
    #: A once-flow's end (wall clock), sealed by its first round; None before it existed.
    end: float | None = None


def _end(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _restore(ctx: Context) -> _Restored:
    """The answers so far, the key of the question the client was asked, the flow id."""
    raw = ctx.request_state
    if raw is None:
        return _Restored({}, None, None, continued=False)
    # The framework unsealed and authenticated this: it is what an earlier round wrote.
    state = json.loads(raw)
    if not isinstance(state, dict):
        raise ValueError("request state is not an object")
    if state.get("v") == _STATE_VERSION:
        answers, pending = state.get("answers"), state.get("pending")
        if not isinstance(answers, dict) or not (pending is None or isinstance(pending, str)):
            raise ValueError("request state does not hold answers and a pending key")
        flow = state.get("flow")
        return _Restored(
            answers,
            pending,
            flow if valid_flow_id(flow) else None,
            continued=True,
            end=_end(state.get("end")),
        )
    # A round sealed before the envelope existed (a replica of an older version).
    pending = state.pop(_LEGACY_PENDING, None)
    return _Restored(state, pending if isinstance(pending, str) else None, None, continued=True)


def _fold(
    ctx: Context, answers: Answers, pending: str | None, next_question: NextQuestion
) -> Outcome | None:
    """Fold the client's answer to the pending question into ``answers``."""
    if pending is None:  # a flow's first round: nothing was asked (no params read again)
        return None
    responses = ctx.input_responses
    if not responses or pending not in responses:
        return None
    result = responses[pending]
    if not isinstance(result, ElicitResult):
        raise ValueError(f"expected an elicitation result for {pending!r}")
    if result.action != "accept":
        return Outcome(
            status="declined" if result.action == "decline" else "cancelled",
            answers=answers,
            key=pending,
        )
    question = next_question(answers)
    if question is None or question.key != pending:
        raise ValueError(f"answer for {pending!r} does not match the flow")
    config = _elicit_config(question.response_type)
    accepted = handle_elicit_accept(config, result.content)
    answers[pending] = _jsonable(accepted.data)
    return None


async def ask(ctx: Context, next_question: NextQuestion) -> Outcome | InputRequiredResult:
    """Run a question flow on whichever era this request negotiated.

    Returns the :class:`Outcome` once the flow ended, or (modern era) the
    ``InputRequiredResult`` the tool must return to ask the next question.
    :func:`ask_then` does that branching for you.
    """
    result, _, _ = await _ask(ctx, next_question, once=False)
    return result


def _modern_round(
    ctx: Context, next_question: NextQuestion, once: bool
) -> tuple[Outcome | InputRequiredResult, str | None, float | None]:
    """One modern-era round: the outcome (or next question), the flow id to claim if any,
    and the flow's end."""
    restored = _restore(ctx)
    answers, flow, end = restored.answers, restored.flow, restored.end
    if once and restored.continued and flow is None:
        # Sealed without a flow id: by a round without once, or an older replica.
        raise ToolError(
            "This request continues a flow that was not started with exactly-once protection; "
            "start the action again."
        )
    if once and end is not None and time.time() > end:
        # Its claim lives until the end (plus a margin): past it, a replay could run again.
        raise ToolError("This action's confirmation expired; start the action again.")
    if once and flow is None:
        flow, end = new_flow_id(), flow_end(ctx.fastmcp)
    # Only a round that continued a flow can be a replay of its end.
    claim = flow if once and restored.continued else None
    ended = _fold(ctx, answers, restored.pending, next_question)
    if ended is not None:
        return ended, claim, end
    question = next_question(answers)
    if question is None:
        return Outcome(status="done", answers=answers), claim, end
    config = _elicit_config(question.response_type)
    request = ElicitRequest(
        params=ElicitRequestFormParams(message=question.message, requested_schema=config.schema)
    )
    envelope: dict[str, Any] = {"v": _STATE_VERSION, "answers": answers, "pending": question.key}
    if flow is not None:
        envelope["flow"] = flow
        if end is not None:
            envelope["end"] = round(end, 3)
    state = json.dumps(envelope, separators=(",", ":"))
    request_state = InputRequiredResult(input_requests={question.key: request}, request_state=state)
    return request_state, None, end


async def _ask(
    ctx: Context, next_question: NextQuestion, *, once: bool
) -> tuple[Outcome | InputRequiredResult, str | None, float | None]:
    if is_modern(ctx):
        return _modern_round(ctx, next_question, once)

    answers: Answers = {}
    while (question := next_question(answers)) is not None:
        result = await ctx.elicit(question.message, question.response_type)
        if not isinstance(result, AcceptedElicitation):
            status: Literal["declined", "cancelled"] = (
                "declined" if result.action == "decline" else "cancelled"
            )
            return Outcome(status=status, answers=answers, key=question.key), None, None
        answers[question.key] = _jsonable(result.data)
    return Outcome(status="done", answers=answers), None, None


async def _call(finish: Callable[[Outcome], T | Awaitable[T]], outcome: Outcome) -> T:
    result = finish(outcome)
    if inspect.isawaitable(result):
        return await result
    return result


def _called_tool(ctx: Context) -> str:
    """The name of the tool this request calls; refuses anything but a tool call."""
    rc = ctx.request_context
    # FastMCP's escape hatch to the SDK's request context: the JSON-RPC method and params.
    srctx = rc._srctx if rc is not None else None
    params = srctx.params if srctx is not None else None
    if srctx is None or srctx.method != "tools/call" or not params or "name" not in params:
        raise TypeError("ask_then(once=True) guards tools: one-time actions are tool calls")
    return str(params["name"])


async def _tool_of(ctx: Context) -> Tool:
    """The tool this request calls (a replay converts the stored value as it does)."""
    name = _called_tool(ctx)
    tool = await ctx.fastmcp.get_tool(name)
    if tool is None:
        raise ToolError(f"Unknown tool: {name!r}")
    return tool


async def ask_then(
    ctx: Context,
    next_question: NextQuestion,
    finish: Callable[[Outcome], T | Awaitable[T]],
    *,
    once: bool = False,
) -> T | InputRequiredResult:
    """Run the flow; return the next question's ``InputRequiredResult``, or ``finish(outcome)``.

    A tool, prompt or resource returns what this returns, whatever the era.
    ``finish`` may be a plain function or a coroutine function.

    ``once=True`` (tools only) makes the end of the flow happen once per flow
    across the fleet, for one-time actions (a purchase, a booking). On the
    modern era the flow's first round mints a flow id into the sealed request
    state; when the flow ends (done, declined or cancelled), the replica claims
    the id in the fleet's ledger (Redis; in-process when standalone) before
    ``finish`` runs, and stores the tool's result with the claim. A replay of
    that final round, on any replica, returns the stored result, with
    ``_meta["mcpfleet.dev/once"] == {"replayed": True}``, without running
    ``finish``. Two replays racing: ``finish`` runs once; the other gets the
    stored result after a bounded wait, or a retryable error. A ledger that
    cannot be asked fails the round with a retryable error
    (:class:`~mcpfleet.once.FlowUnavailable`) and never runs ``finish``; a
    replay of a flow whose ``finish`` started on a replica that died before
    storing its result gets :class:`~mcpfleet.once.FlowOutcomeUnknown`. A
    once-flow ends one token TTL (of the replica that served its first round)
    after its first round: a later round is refused, so the ledger's claim,
    which lives past that end, outlives every token of the flow.
    On the handshake era a flow lives in one request of one process, so there
    is no final round to replay: ``finish`` runs once per call, as without
    ``once``.

    With ``once``, a replay's value is a ``ToolResult`` the tool's own
    conversion made from the stored value (FastMCP passes it through as is),
    so the original answer and every replay carry the same content and
    structured content; the tool's declared return type, and so its output
    schema, stay as they are.
    """
    if once:
        _refuse_once_outside_a_tool_call(ctx)
    outcome, claim, end = await _ask(ctx, next_question, once=once)
    if isinstance(outcome, InputRequiredResult):
        return outcome
    if claim is None:
        return await _call(finish, outcome)
    return await _finish_once(ctx, claim, finish, outcome, end)


def _refuse_once_outside_a_tool_call(ctx: Context) -> None:
    """``ask_then(once=True)`` serves a tool called in a request; anything else is refused."""
    if ctx.is_background_task:
        # A task runs at least once (a lost worker's task runs again from its
        # start) and its worker has no request naming the tool a replay's
        # stored value would be converted by: refused, rather than half kept.
        raise ToolError(
            "ask_then(once=True) is not available inside an MCP task: "
            "call the tool without a task, or make its action idempotent"
        )
    if is_modern(ctx):
        _called_tool(ctx)  # a prompt or resource is refused at its first round


async def _finish_once(
    ctx: Context,
    claim: str,
    finish: Callable[[Outcome], T | Awaitable[T]],
    ended: Outcome,
    end: float | None,
) -> T:
    """The end of once-flow ``claim``: ``finish`` under the ledger's claim, or a replay."""

    async def finish_once() -> T:
        return await _call(finish, ended)

    async def convert(value: Any) -> ToolResult:
        return (await _tool_of(ctx)).convert_result(value)

    # finish's value, or a replay's ToolResult (FastMCP passes a ToolResult through as is).
    return cast(T, await run_once(ctx.fastmcp, claim, finish_once, convert, end=end))
