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
(``{"v": 1, "answers": ..., "pending": key}``), so any answer key is free for
the tool to use.

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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from fastmcp import Context
from fastmcp.server.elicitation import (
    AcceptedElicitation,
    handle_elicit_accept,
    parse_elicit_response_type,
)
from mcp_types import ElicitRequest, ElicitRequestFormParams, ElicitResult, InputRequiredResult
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel

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
    """True when this request negotiated the modern (stateless, guard) era."""
    rc = ctx.request_context
    return rc is not None and rc.protocol_version in MODERN_PROTOCOL_VERSIONS


def first_missing(questions: list[Question]) -> NextQuestion:
    """A flow that asks a fixed list of questions in order."""

    def next_question(answers: Answers) -> Question | None:
        return next((q for q in questions if q.key not in answers), None)

    return next_question


def _jsonable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return value


def _restore(ctx: Context) -> tuple[Answers, str | None]:
    """The answers so far and the key of the question the client was asked, if any."""
    raw = ctx.request_state
    if raw is None:
        return {}, None
    # The framework unsealed and authenticated this: it is what an earlier round wrote.
    state = json.loads(raw)
    if not isinstance(state, dict):
        raise ValueError("request state is not an object")
    if state.get("v") == _STATE_VERSION:
        answers, pending = state.get("answers"), state.get("pending")
        if not isinstance(answers, dict) or not (pending is None or isinstance(pending, str)):
            raise ValueError("request state does not hold answers and a pending key")
        return answers, pending
    # A round sealed before the envelope existed (a replica of an older version).
    pending = state.pop(_LEGACY_PENDING, None)
    return state, pending if isinstance(pending, str) else None


def _fold(
    ctx: Context, answers: Answers, pending: str | None, next_question: NextQuestion
) -> Outcome | None:
    """Fold the client's answer to the pending question into ``answers``."""
    responses = ctx.input_responses
    if pending is None or not responses or pending not in responses:
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
    config = parse_elicit_response_type(question.response_type)
    accepted = handle_elicit_accept(config, result.content)
    answers[pending] = _jsonable(accepted.data)
    return None


async def ask(ctx: Context, next_question: NextQuestion) -> Outcome | InputRequiredResult:
    """Run a question flow on whichever era this request negotiated.

    Returns the :class:`Outcome` once the flow ended, or (modern era) the
    ``InputRequiredResult`` the tool must return to ask the next question.
    :func:`ask_then` does that branching for you.
    """
    if is_modern(ctx):
        answers, pending = _restore(ctx)
        ended = _fold(ctx, answers, pending, next_question)
        if ended is not None:
            return ended
        question = next_question(answers)
        if question is None:
            return Outcome(status="done", answers=answers)
        config = parse_elicit_response_type(question.response_type)
        request = ElicitRequest(
            params=ElicitRequestFormParams(message=question.message, requested_schema=config.schema)
        )
        state = json.dumps(
            {"v": _STATE_VERSION, "answers": answers, "pending": question.key},
            separators=(",", ":"),
        )
        return InputRequiredResult(input_requests={question.key: request}, request_state=state)

    answers = {}
    while (question := next_question(answers)) is not None:
        result = await ctx.elicit(question.message, question.response_type)
        if not isinstance(result, AcceptedElicitation):
            status: Literal["declined", "cancelled"] = (
                "declined" if result.action == "decline" else "cancelled"
            )
            return Outcome(status=status, answers=answers, key=question.key)
        answers[question.key] = _jsonable(result.data)
    return Outcome(status="done", answers=answers)


async def ask_then(
    ctx: Context,
    next_question: NextQuestion,
    finish: Callable[[Outcome], T | Awaitable[T]],
) -> T | InputRequiredResult:
    """Run the flow; return the next question's ``InputRequiredResult``, or ``finish(outcome)``.

    A tool, prompt or resource returns what this returns, whatever the era.
    ``finish`` may be a plain function or a coroutine function.
    """
    outcome = await ask(ctx, next_question)
    if isinstance(outcome, InputRequiredResult):
        return outcome
    result = finish(outcome)
    if inspect.isawaitable(result):
        return await result
    return result
